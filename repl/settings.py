"""The one settings object of a REPL session.

Slash commands and command-line flags both write into :class:`Settings`
through the command table in :mod:`repl.commands`; nothing else changes it.
This module imports nothing heavy, so ``infer.py --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

# The processors a user can pick, in the order /help lists them, with the
# arguments each takes after the name (the first is always the temperature).
PROCESSOR_ARGS: dict[str, tuple[str, ...]] = {
    "greedy": ("temperature",),
    "multinomial": ("temperature",),
    "topk": ("temperature", "top_k"),
    "nucleus": ("temperature", "top_p"),
    "topknucleus": ("temperature", "top_k", "top_p"),
}

# The decoding strategies, in the order a prompt runs them.
STRATEGIES: tuple[str, ...] = ("speculative", "ngram", "target", "drafter")
STRATEGY_LABELS: dict[str, str] = {
    "speculative": "Speculative",
    "ngram": "NASD",
    "target": "Target AR",
    "drafter": "Drafter AR",
}

NGRAM_STORAGES: tuple[str, ...] = ("basic", "onelevel")

# Draft-length policies (generation.gamma_policy builds them); "confidence"
# alone takes a threshold T in (0, 1).
GAMMA_POLICIES: tuple[str, ...] = ("constant", "heuristic", "confidence", "model")


@dataclass(frozen=True)
class ProcessorSpec:
    """Which logits processor to build, and with what arguments.

    ``top_k`` and ``top_p`` are None for the processors that do not take them.
    """

    name: str = "greedy"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def is_greedy(self) -> bool:
        return self.name == "greedy"

    def args(self) -> tuple:
        """The argument values in command order, e.g. (0.7, 0.9) for nucleus."""
        return tuple(getattr(self, a) for a in PROCESSOR_ARGS[self.name])

    def command_text(self) -> str:
        """The text after ``/processor`` that selects exactly this processor."""
        if self.is_greedy:
            return "greedy"
        return " ".join([self.name, *(_fmt(v) for v in self.args())])

    def describe(self) -> str:
        """Human form: ``nucleus(temperature=0.7, top_p=0.9)``; plain ``greedy``."""
        if self.is_greedy:
            return "greedy"
        inner = ", ".join(f"{a}={_fmt(v)}" for a, v in zip(PROCESSOR_ARGS[self.name], self.args()))
        return f"{self.name}({inner})"

    def build(self):
        """The processor object (imports the sampling module, hence torch, lazily)."""
        import sampling

        classes = {
            "greedy": sampling.GreedyProcessor,
            "multinomial": sampling.MultinomialProcessor,
            "topk": sampling.TopKProcessor,
            "nucleus": sampling.NucleusProcessor,
            "topknucleus": sampling.TopKNucleusProcessor,
        }
        kwargs = dict(zip(PROCESSOR_ARGS[self.name], self.args()))
        return classes[self.name](**kwargs)


def _fmt(value) -> str:
    """Numbers as a user would type them: 1.0 -> "1.0", 0.90 -> "0.9", 40 -> "40"."""
    return repr(value) if isinstance(value, float) else str(value)


@dataclass
class Settings:
    """Everything a prompt run depends on, with the documented defaults."""

    gamma: int = 4
    length: int = 128
    processor: ProcessorSpec = field(default_factory=ProcessorSpec)
    speculative: bool = True
    ngram: bool = True
    target: bool = True
    drafter: bool = False
    cache: bool = True
    chat: bool = True
    debug: bool = False
    ngram_storage: str = "basic"
    ngram_n: int = 3
    top_k_filler: int = 3
    reset_in_between: bool = True
    seed: int = 42
    gamma_policy: str = "constant"
    gamma_threshold: float = 0.4  # used by the "confidence" policy only

    def gamma_policy_text(self) -> str:
        """``constant``, or ``confidence 0.4`` with its threshold."""
        if self.gamma_policy == "confidence":
            return f"confidence {_fmt(self.gamma_threshold)}"
        return self.gamma_policy

    def enabled_strategies(self) -> list[str]:
        return [s for s in STRATEGIES if getattr(self, s)]

    def to_dict(self) -> dict:
        """A JSON-ready copy (the processor as its command text and parts)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        p = self.processor
        out["processor"] = {"name": p.name, **dict(zip(PROCESSOR_ARGS[p.name], p.args()))}
        return out


def settings_from_dict(data: dict) -> Settings:
    """The inverse of :meth:`Settings.to_dict`, for a trace file: unknown keys
    are ignored and missing ones keep their defaults. Raises ValueError or
    TypeError on values of the wrong shape."""
    if not isinstance(data, dict):
        raise TypeError("settings must be an object")
    known = {f.name for f in fields(Settings)}
    values = {k: v for k, v in data.items() if k in known and k != "processor"}
    processor = data.get("processor")
    if processor is not None:
        if not isinstance(processor, dict) or processor.get("name") not in PROCESSOR_ARGS:
            raise ValueError(f"unknown processor {processor!r}")
        values["processor"] = ProcessorSpec(**processor)
    return Settings(**values)
