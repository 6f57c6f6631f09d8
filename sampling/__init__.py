"""Logits processors shared by every decoding strategy.

Names are imported lazily (PEP 562), so ``sampling.spec`` (the torch-free
:class:`~sampling.spec.ProcessorSpec`) can be read without importing torch.
"""

from utils.lazy import lazy_exports

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


__getattr__ = lazy_exports(__name__, _EXPORTS)
