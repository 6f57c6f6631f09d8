"""``--processor`` for the benchmark: the REPL's own spec and parser (one meaning
of ``nucleus 0.7 0.9`` everywhere), turned into our processor and into the
equivalent settings of transformers' ``generate`` for the peers.

Forms: ``greedy``, ``multinomial T``, ``topk T K``, ``nucleus T P``, ``topknucleus T K P``.
"""

from __future__ import annotations

from repl.commands import parse_processor as _parse_words
from sampling.spec import ProcessorSpec

__all__ = ["ProcessorSpec", "hf_sampling_kwargs", "make_processor", "parse_processor"]


def parse_processor(text: str) -> ProcessorSpec:
    """``"nucleus 0.7 0.9"`` -> ProcessorSpec; ValueError (CommandError) with a one-line message.

    Temperature 0 with a sampling processor becomes greedy, as in the REPL.
    """
    return _parse_words(text.replace(",", " ").split()).changes["processor"]


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
