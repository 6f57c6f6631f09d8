"""Which processor to build, as a value: the REPL, the benchmark and the engine share it.

Torch-free: the REPL's settings hold a :class:`ProcessorSpec` and ``infer.py
--help`` must not import torch; :meth:`ProcessorSpec.build` imports the
processors only when one is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from utils.options import OptionError, closest, finite_number, whole_number

# The processors a user can pick, in the order /help lists them, with the
# arguments each takes after the name (the first is always the temperature).
PROCESSOR_ARGS: dict[str, tuple[str, ...]] = {
    "greedy": ("temperature",),
    "multinomial": ("temperature",),
    "topk": ("temperature", "top_k"),
    "nucleus": ("temperature", "top_p"),
    "topknucleus": ("temperature", "top_k", "top_p"),
}

# The processor classes in sampling.processors, by name.
_CLASSES = {
    "greedy": "GreedyProcessor",
    "multinomial": "MultinomialProcessor",
    "topk": "TopKProcessor",
    "nucleus": "NucleusProcessor",
    "topknucleus": "TopKNucleusProcessor",
}


@dataclass(frozen=True)
class ProcessorSpec:
    """Which logits processor to build, and with what arguments (``top_k``, ``top_p`` None where unused)."""

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
        return " ".join([self.name, *(fmt_number(v) for v in self.args())])

    def describe(self) -> str:
        """Human form: ``nucleus(temperature=0.7, top_p=0.9)``; plain ``greedy``."""
        if self.is_greedy:
            return "greedy"
        inner = ", ".join(f"{a}={fmt_number(v)}" for a, v in zip(PROCESSOR_ARGS[self.name], self.args()))
        return f"{self.name}({inner})"

    def build(self):
        """The processor object."""
        # Imported here, not at the top: the processors import torch, and this
        # module is read by ``infer.py --help``, which must start without it.
        from sampling import processors

        kwargs = dict(zip(PROCESSOR_ARGS[self.name], self.args()))
        return getattr(processors, _CLASSES[self.name])(**kwargs)


def as_processor(processor):
    """The logits processor ``processor`` stands for: a :class:`ProcessorSpec` (what the front ends'
    settings hold) built, a processor object as it is."""
    return processor.build() if isinstance(processor, ProcessorSpec) else processor


def parse_processor_words(words: list[str]) -> tuple[ProcessorSpec, tuple[str, ...]]:
    """The processor grammar, ``NAME [ARGS]`` (``nucleus 0.7 0.9``) -> the spec and its notices, one
    meaning for ``/processor`` and both front ends' ``--processor``. Temperature 0 with a sampling
    processor becomes greedy, with a notice; ``utils.options.OptionError`` (one line) otherwise."""
    if not words:
        raise OptionError("missing processor name")
    name, rest = words[0].lower(), words[1:]
    if name not in PROCESSOR_ARGS:
        raise OptionError(
            f"unknown processor {words[0]!r}{closest(name, PROCESSOR_ARGS)}; choose one of {', '.join(PROCESSOR_ARGS)}"
        )
    expected = PROCESSOR_ARGS[name]
    if name == "greedy" and not rest:
        return ProcessorSpec("greedy"), ()
    if len(rest) != len(expected):
        raise OptionError(f"{name} takes {' '.join(a.upper() for a in expected)}, got {len(rest)} values")
    values = dict(zip(expected, rest))
    temperature = finite_number(values["temperature"], "temperature")
    if temperature < 0:
        raise OptionError(f"temperature must be >= 0, got {temperature}")
    top_k = whole_number(values["top_k"], "top_k", 1, 10**9) if "top_k" in values else None
    top_p = finite_number(values["top_p"], "top_p") if "top_p" in values else None
    if top_p is not None and not 0 < top_p <= 1:
        raise OptionError(f"top_p must be in (0, 1], got {top_p}")
    if name == "greedy":
        return ProcessorSpec("greedy", temperature or 1.0), ()
    if temperature == 0:
        notice = f"temperature 0 means always taking the most likely token: using greedy instead of {name}"
        return ProcessorSpec("greedy"), (notice,)
    return ProcessorSpec(name, temperature, top_k, top_p), ()


def fmt_number(value) -> str:
    """Numbers as a user would type them: 1.0 -> "1.0", 0.90 -> "0.9", 40 -> "40"."""
    return repr(value) if isinstance(value, float) else str(value)
