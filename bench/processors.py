"""``--processor`` for the benchmark: one spec, turned into our processor and HF's settings.

Forms (numbers optional, defaults as in ``sampling``)::

    greedy
    multinomial T
    topk T K
    nucleus T P
    topknucleus T K P
"""

from __future__ import annotations

from dataclasses import dataclass

# name -> parameter names in the order they are written.
_PARAMS = {
    "greedy": (),
    "multinomial": ("temperature",),
    "topk": ("temperature", "top_k"),
    "nucleus": ("temperature", "top_p"),
    "topknucleus": ("temperature", "top_k", "top_p"),
}
_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 0.9}


@dataclass(frozen=True)
class ProcessorSpec:
    name: str = "greedy"
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    @property
    def is_greedy(self) -> bool:
        return self.name == "greedy"

    def describe(self) -> str:
        values = [getattr(self, p) for p in _PARAMS[self.name]]
        return " ".join([self.name, *(f"{v:g}" for v in values)])


def parse_processor(text: str) -> ProcessorSpec:
    """``"nucleus 0.7 0.9"`` -> ProcessorSpec; ValueError with a one-line message."""
    words = text.replace(",", " ").split()
    if not words or words[0].lower() not in _PARAMS:
        raise ValueError(f"unknown processor {text!r} (choose from {', '.join(_PARAMS)})")
    name, params = words[0].lower(), _PARAMS[words[0].lower()]
    if len(words) - 1 > len(params):
        raise ValueError(f"{name} takes at most {len(params)} numbers ({' '.join(params) or 'none'})")
    values = dict(_DEFAULTS)
    for param, word in zip(params, words[1:]):
        try:
            values[param] = int(word) if param == "top_k" else float(word)
        except ValueError:
            raise ValueError(f"{name}: {param} must be a number, got {word!r}") from None
    return ProcessorSpec(
        name,
        temperature=values["temperature"] if "temperature" in params else 1.0,
        top_k=values["top_k"] if "top_k" in params else None,
        top_p=values["top_p"] if "top_p" in params else None,
    )


def make_processor(spec: ProcessorSpec):
    """Our engine's processor for ``spec`` (its range checks apply)."""
    from sampling import (
        GreedyProcessor, MultinomialProcessor, NucleusProcessor, TopKNucleusProcessor, TopKProcessor,
    )

    t = spec.temperature
    if spec.name == "greedy":
        return GreedyProcessor()
    if spec.name == "multinomial":
        return MultinomialProcessor(t)
    if spec.name == "topk":
        return TopKProcessor(t, spec.top_k)
    if spec.name == "nucleus":
        return NucleusProcessor(t, spec.top_p)
    return TopKNucleusProcessor(t, spec.top_k, spec.top_p)


def hf_sampling_kwargs(spec: ProcessorSpec) -> dict:
    """The same decoding rule as ``generate`` settings (filters off unless asked for)."""
    if spec.is_greedy:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": spec.temperature,
        "top_k": spec.top_k or 0,
        "top_p": spec.top_p if spec.top_p is not None else 1.0,
    }
