"""Parse a ``--drafter self:...`` value into a :class:`SelfDraftSpec` (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

PREFIX = "self:"
PRECISIONS = {"bf16": "bfloat16", "fp16": "float16"}
KINDS = ("bf16", "fp16", "int8", "skip")
# How ``self:int8`` quantises (``selfdraft.copies``): torch's dynamic int8, int8 weights with
# bfloat16 activations (torch's weight-only kernel), optimum-quanto, torchao. None named: the device's default.
INT8_ROUTES = ("torch", "weight-only", "quanto", "torchao")
USAGE = ("use self:bf16, self:fp16, self:int8 (or self:int8=" + "|".join(INT8_ROUTES) + "), "
         "self:skip=L1,L2,... (layer numbers from 0) or self:skip=auto")


class SelfDraftSpecError(ValueError):
    """A ``self:`` drafter that cannot be parsed; the message is one line."""


@dataclass(frozen=True)
class SelfDraftSpec:
    """One self-drafter: ``kind`` in KINDS; ``layers`` the skipped layers (skip only);
    ``auto`` True when the layers are to be searched for (``self:skip=auto``); ``route``
    the int8 route named (int8 only; "" for the device's default)."""

    kind: str
    layers: tuple[int, ...] = ()
    auto: bool = False
    route: str = ""

    @property
    def label(self) -> str:
        """``self:bf16``, ``self:int8=weight-only``, ``self:skip=3,5,7``, ``self:skip=auto``."""
        if self.kind != "skip":
            return f"{PREFIX}{self.kind}" + (f"={self.route}" if self.route else "")
        return f"{PREFIX}skip=" + ("auto" if self.auto else ",".join(map(str, self.layers)))


def is_self_draft(text: str | None) -> bool:
    return text is not None and str(text).strip().lower().startswith(PREFIX)


def _layers(text: str, raw: str) -> tuple[int, ...]:
    try:
        layers = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise SelfDraftSpecError(f"--drafter {raw}: layer numbers must be integers separated by commas; {USAGE}") from None
    if not layers:
        raise SelfDraftSpecError(f"--drafter {raw}: name at least one layer to skip; {USAGE}")
    if layers[0] < 0:
        raise SelfDraftSpecError(f"--drafter {raw}: layer numbers start at 0; {USAGE}")
    return tuple(layers)


def parse_self_draft(text: str) -> SelfDraftSpec:
    """``self:bf16`` -> SelfDraftSpec("bf16"); ``self:skip=3,5`` -> SelfDraftSpec("skip", (3, 5))."""
    raw = str(text).strip()
    body = raw[len(PREFIX):].strip().lower() if is_self_draft(raw) else ""
    kind, _, arg = body.partition("=")
    kind = kind.strip()
    if kind not in KINDS:
        raise SelfDraftSpecError(f"unknown self-drafter --drafter {raw}: {USAGE}")
    if kind == "int8" and arg:
        if arg.strip() not in INT8_ROUTES:
            raise SelfDraftSpecError(f"--drafter {raw}: unknown int8 route {arg.strip()!r}; {USAGE}")
        return SelfDraftSpec("int8", route=arg.strip())
    if kind != "skip":
        if arg:
            raise SelfDraftSpecError(f"--drafter {raw}: {PREFIX}{kind} takes no argument; {USAGE}")
        return SelfDraftSpec(kind)
    if arg.strip() == "auto":
        return SelfDraftSpec("skip", auto=True)
    return SelfDraftSpec("skip", _layers(arg, raw))
