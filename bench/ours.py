"""Our strategies as benchmark variants: each variant is an engine ``Strategy``."""

from __future__ import annotations

import torch

from bench.variants import Variant
from engine import CrossTokenizerOptions, EngineState, Strategy, run_strategy
from engine.named import named_strategy
from utils.defaults import DEFAULTS


def our_strategy(variant: Variant, *, cross: CrossTokenizerOptions = CrossTokenizerOptions(),
                 tree_sample: bool = DEFAULTS.tree_sample, **options) -> Strategy:
    """The strategy of one of our variants keyed by its name (``engine.named``), inspector off; its
    storage is put in the engine state by the executor, and self-drafters are built once per pair."""
    return named_strategy(variant, cross=cross, tree_sample=tree_sample, inspect=False, **options)


def our_call(strategy: Strategy, models, ids: list[int], *, state: EngineState,
             generator: torch.Generator):
    """A zero-argument function that runs ``strategy`` on ``ids`` and returns its GenerationResult; for
    NASD the engine feeds the prompt to ``state``'s storage inside the timed call, as its own cost."""
    return lambda: run_strategy(strategy, models, ids, state=state, generator=generator)
