"""Decoding loops: autoregressive, the verify loop, the drafter contract and the model drafter.

Names are imported lazily (PEP 562), so ``infer.py --replay`` reads the result types without torch.
"""

from utils.lazy import lazy_exports

_EXPORTS = {
    "ContextLengthError": "generation.common",
    "StrategyRefused": "generation.common",
    "Drafter": "generation.drafter",
    "GenerationResult": "generation.result",
    "LoopOptions": "generation.options",
    "ModelDrafter": "generation.model_drafter",
    "Round": "generation.result",
    "autoregressive_generate": "generation.autoregressive",
    "first_divergence": "generation.result",
    "verify_loop": "generation.verify",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
