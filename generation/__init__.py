"""Decoding strategies: autoregressive, speculative, and the verify loop they share.

Names are imported lazily (PEP 562), so ``from generation.result import ...``
works without importing torch: ``infer.py --replay`` renders a saved trace
through the same result types without loading a model or torch.
"""

from importlib import import_module

_EXPORTS = {
    "ContextLengthError": "generation.common",
    "Drafter": "generation.verify",
    "GenerationResult": "generation.result",
    "ModelDrafter": "generation.speculative",
    "Round": "generation.result",
    "autoregressive_generate": "generation.autoregressive",
    "first_divergence": "generation.result",
    "speculative_generate": "generation.speculative",
    "verify_loop": "generation.verify",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'generation' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
