"""Our strategies as benchmark variants: each variant is an engine ``Strategy``."""

from __future__ import annotations

import torch

from bench.variants import Variant
from engine import CrossTokenizerOptions, EngineState, Strategy, run_strategy
from engine.named import named_strategy
from utils.defaults import DEFAULTS


def our_strategy(variant: Variant, *, cross: CrossTokenizerOptions = CrossTokenizerOptions(),
                 tree_sample: bool = DEFAULTS.tree_sample, **options) -> Strategy:
    """The strategy of one of our variants keyed by its name (``engine.named``), inspector off: the
    benchmark never shows its numbers. The executor puts the variant's own storage in the engine
    state before the clock starts (``ngram.reset`` is False); self-drafters are built once per pair
    (:func:`bench.session.prepare_self_drafters`)."""
    return named_strategy(variant, cross=cross, tree_sample=tree_sample, inspect=False, **options)


def our_call(strategy: Strategy, models, ids: list[int], *, state: EngineState,
             generator: torch.Generator):
    """A zero-argument function that runs ``strategy`` on ``ids`` and returns its GenerationResult.

    For NASD the engine feeds the prompt to the storage that ``state`` holds
    (inside the timed call, as its own cost); what else the storage holds is
    the caller's choice (``bench.executor``: empty, or a session's earlier steps).
    """
    return lambda: run_strategy(strategy, models, ids, state=state, generator=generator)
