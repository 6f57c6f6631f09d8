"""Logits processors shared by every decoding strategy.

Names are imported lazily (PEP 562), so ``sampling.spec`` (the torch-free
:class:`~sampling.spec.ProcessorSpec`) can be read without importing torch.
"""

from importlib import import_module

_EXPORTS = {
    "GreedyProcessor": "sampling.processors",
    "LogitsProcessor": "sampling.processors",
    "MultinomialProcessor": "sampling.processors",
    "NucleusProcessor": "sampling.processors",
    "ProcessorSpec": "sampling.spec",
    "TopKNucleusProcessor": "sampling.processors",
    "TopKProcessor": "sampling.processors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sampling' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
