"""``--processor`` for the benchmark: the processor spec and grammar of ``sampling.spec``, the
REPL's too (one meaning of ``nucleus 0.7 0.9`` everywhere), turned into our processor and into the
equivalent settings of transformers' ``generate`` for the peers.

Forms: ``greedy``, ``multinomial T``, ``topk T K``, ``nucleus T P``, ``topknucleus T K P``.
"""

from __future__ import annotations

from sampling.spec import ProcessorSpec, parse_processor_words

__all__ = ["ProcessorSpec", "hf_sampling_kwargs", "make_processor", "parse_processor"]


def parse_processor(text: str) -> ProcessorSpec:
    """``"nucleus 0.7 0.9"`` -> ProcessorSpec, temperature 0 with a sampling processor becoming greedy as
    in the REPL; ``utils.options.OptionError`` with a one-line message."""
    return parse_processor_words(text.replace(",", " ").split())[0]


def make_processor(spec: ProcessorSpec):
    """Our engine's processor for ``spec`` (its range checks apply)."""
    return spec.build()


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
