"""Our strategies as benchmark variants: each variant is an engine ``Strategy``."""

from __future__ import annotations

import torch

from bench.variants import Variant
from utils.defaults import DEFAULTS
from engine import (
    CrossTokenizerOptions, EngineState, HybridOptions, LookaheadOptions, NGramOptions, Strategy, lookahead_strategy,
    run_strategy,
)
from engine.kinds import variant_drafter

# Our drafting strategies (and the peers that draft through our verify loop) and the engine drafter each uses.
DRAFTER_OF = {"speculative": "model", "ngram": "ngram", "arctic_suffix": "arctic_suffix"}


def our_strategy(variant: Variant, *, processor, max_gen_len: int, ngram: NGramOptions,
                 tree_branch: int = DEFAULTS.tree_branch, tree_sample: bool = DEFAULTS.tree_sample,
                 cross: CrossTokenizerOptions = CrossTokenizerOptions(), arctic=None,
                 fresh: bool = True, compile: str = "off") -> Strategy:
    """The engine strategy of one of our variants, keyed by the variant's name (so each
    variant keeps its own gamma policy for the whole benchmark).

    The n-gram storage is not reset by the engine (``ngram.reset`` is False): the
    executor puts the variant's own storage in the engine state, emptied or kept,
    before the clock starts. ``arctic``: the ``arctic_suffix`` peer's
    ``bench.arctic.ArcticOptions``. ``cross`` says how the drafter model drafts should
    its tokenizer differ from the target's (the engine decides when it does).
    The per-token inspector is off: the benchmark never shows its numbers, so
    it times the decode without recording them. A variant with a self-drafter
    spec (``speculative[self:int8]@4``) drafts with that self-drafter (the strategy drafter its
    kind names, ``engine.kinds.variant_drafter``), built once per pair by
    :func:`bench.session.prepare_self_drafters`.
    A hybrid variant (``speculative+hybrid4@4``) drafts from ``ngram``'s storage in rounds whose
    match is at least L tokens (``engine.strategy.HybridOptions``).
    A lookahead variant (``lookahead[5,3,5]@2``) is ``engine.lookahead_strategy`` with its
    (W, N, G); its n-gram pool starts empty when ``fresh`` (the paper's way) and keeps what a
    session's earlier steps found otherwise. ``compile``: the run's compile path (``--compile``,
    ``engine.Strategy.compile``), the same for every variant.
    """
    if variant.strategy not in ("speculative", "ngram", "target", "drafter", "arctic_suffix", "lookahead"):
        raise ValueError(f"unknown strategy {variant.strategy!r}")
    if variant.strategy == "lookahead":
        window, ngram_size, guesses = variant.lookahead_shape
        return lookahead_strategy(LookaheadOptions(window, ngram_size, guesses, reset=fresh), key=variant.name,
                                  processor=processor, max_gen_len=max_gen_len, inspect=False, compile=compile)
    drafter = DRAFTER_OF.get(variant.strategy)
    options = {"ngram": ngram, "model": cross, "arctic_suffix": arctic}.get(drafter)
    if getattr(variant, "hybrid", 0) and drafter == "model":  # the storage drafts where its match is long
        options = HybridOptions(variant.hybrid, ngram, cross)
    if getattr(variant, "drafter", ""):  # a drafter built beside the pair (--self-drafters), by its kind
        drafter, options = variant_drafter(variant.drafter), variant.drafter
    return Strategy(key=variant.name, drafter=drafter, drafter_options=options,
                    model="drafter" if variant.strategy == "drafter" else "target",
                    gamma=variant.gamma or 1, gamma_policy=variant.policy,  # AR: gamma unused
                    processor=processor, max_gen_len=max_gen_len,
                    tree=getattr(variant, "tree", 0), tree_branch=tree_branch, tree_sample=tree_sample,
                    verify=getattr(variant, "verify", DEFAULTS.verify), inspect=False, compile=compile)


def our_call(strategy: Strategy, models, ids: list[int], *, state: EngineState,
             generator: torch.Generator):
    """A zero-argument function that runs ``strategy`` on ``ids`` and returns its GenerationResult.

    For NASD the engine feeds the prompt to the storage that ``state`` holds
    (inside the timed call, as its own cost); what else the storage holds is
    the caller's choice (``bench.executor``: empty, or a session's earlier steps).
    """
    return lambda: run_strategy(strategy, models, ids, state=state, generator=generator)
