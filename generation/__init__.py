"""Decoding strategies: autoregressive, speculative, and the verify loop they share."""

from generation.autoregressive import autoregressive_generate
from generation.common import ContextLengthError
from generation.result import GenerationResult, Round, first_divergence
from generation.speculative import ModelDrafter, speculative_generate
from generation.verify import Drafter, verify_loop

__all__ = [
    "ContextLengthError",
    "Drafter",
    "GenerationResult",
    "ModelDrafter",
    "Round",
    "autoregressive_generate",
    "first_divergence",
    "speculative_generate",
    "verify_loop",
]
