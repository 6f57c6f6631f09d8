"""Decoding strategies: autoregressive, speculative, and the verify loop they share.

Names are imported lazily (PEP 562), so ``from generation.result import ...``
works without importing torch: ``infer.py --replay`` renders a saved trace
through the same result types without loading a model or torch.
"""

from utils.lazy import lazy_exports

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


__getattr__ = lazy_exports(__name__, _EXPORTS)
