"""The drafter registry: a drafting method is a ``generation.drafter.Drafter`` and a factory.

``factory(pair, strategy, state, context)`` returns a fresh Drafter for one run (``strategy``'s
``drafter_options`` are its to read; ``state`` the ``EngineState`` kept across prompts). Registering
one under a new name makes ``Strategy(drafter=name)`` run it in every front end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from engine.kinds import KINDS, kind_of_pair
from engine.state import MATCH_STORAGES
from engine.strategy import HybridOptions, LookaheadOptions, NGramOptions
from engine.widths import verify_costs
from generation.common import check_request
from utils.devices import model_device
from generation.drafter import Drafter
from generation.model_drafter import ModelDrafter
from kvcache.static import static_capacity
from ngram_assisted import HybridDrafter, MatchDrafter, NGramDrafter
from ngram_assisted.lookahead import LookaheadDrafter, NGramPool
from ngram_assisted.sam import corpus_automaton, read_corpus
from utils.options import check_int


@dataclass(frozen=True)
class DraftContext:
    """What one run gives its drafter: the processor its q comes from, the run's generator (shared with
    the accept rule), the vocabulary compared over, the prompt, the budget and the prefills."""

    processor: object
    generator: torch.Generator | None
    vocab_size: int
    prompt: list[int]
    max_gen_len: int
    prefills: tuple = ()


DrafterFactory = Callable[..., Drafter]
DRAFTERS: dict[str, DrafterFactory] = {}


def register_drafter(kind: str, factory: DrafterFactory) -> DrafterFactory:
    """Make ``Strategy(drafter=kind)`` build its drafter with ``factory``; returns the factory."""
    DRAFTERS[kind] = factory
    return factory


def model_drafter(pair, strategy, state, context: DraftContext) -> Drafter:
    """Speculative decoding's drafter: the pair's drafter model (its context must fit too).

    The one place the engine chooses how a drafter model drafts: the first kind of
    ``engine.kinds.KINDS`` that owns the pair makes it, else ``generation.model_drafter.ModelDrafter``.
    With :class:`HybridOptions` whose L is above 0 it drafts beside a model-free storage
    (:func:`hybrid_drafter`); a kind that cannot says so in one line.
    """
    options = strategy.drafter_options
    kind = kind_of_pair(pair)
    if isinstance(options, HybridOptions):
        if options.min_match > 0 and kind is not None and kind.hybrid is not None:
            raise ValueError(kind.hybrid)
        model = model_drafter(pair, replace(strategy, drafter_options=options.model), state, context)
        return hybrid_drafter(pair, options, model, state, context) if options.min_match > 0 else model
    if kind is not None:
        return kind.draft(pair, strategy, state, context)
    check_request(context.prompt, context.max_gen_len, pair.drafter)
    return ModelDrafter(pair.drafter, context.processor, use_cache=strategy.use_cache,
                        vocab_size=context.vocab_size, generator=context.generator, prefills=context.prefills,
                        compile=strategy.compile,
                        capacity=static_capacity(len(context.prompt), context.max_gen_len, strategy.tree))


def hybrid_drafter(pair, options: HybridOptions, model: Drafter, state, context: DraftContext) -> HybridDrafter:
    """``model`` beside the storage of ``options.retrieval`` (``sam`` over the context in place of
    an n-gram table, which carries no match length), kept in the state's hybrid slot."""
    retrieval = options.retrieval
    if retrieval.storage not in MATCH_STORAGES:
        retrieval = NGramOptions(storage="sam", reset=retrieval.reset)
    return HybridDrafter(model, match_drafter(pair, retrieval, state, context.vocab_size, hybrid=True),
                         options.min_match)


def ngram_drafter(pair, strategy, state, context: DraftContext) -> Drafter:
    """NASD's drafter over the state's n-gram storage (emptied first when ``reset``); the match
    storages (``suffix``, ``sam``) draft through :class:`ngram_assisted.MatchDrafter`."""
    options = strategy.drafter_options or NGramOptions()
    if options.storage in MATCH_STORAGES:
        costs = verify_costs(pair, state, strategy.gamma, context.vocab_size) if options.fill_width else None
        return match_drafter(pair, options, state, context.vocab_size, verify_costs=costs)
    storage = state.ngram_storage(options, context.vocab_size)
    if options.reset:
        storage.reset()
    top_k = check_int(options.top_k_filler, "top_k_filler", 1)
    return NGramDrafter(storage, filler_top_k=top_k, stop_if_unknown=options.stop_if_unknown,
                        confident_start=options.confident_start, device=model_device(pair.target))


def match_drafter(pair, options: NGramOptions, state, vocab_size: int, *, hybrid: bool = False,
                  verify_costs: dict[int, float] | None = None) -> MatchDrafter:
    """A :class:`MatchDrafter` over the state's ``suffix`` or ``sam`` storage of ``options`` (NASD's,
    or with ``hybrid`` the hybrid's), emptied first when ``options.reset``; ``verify_costs``
    (the target's forward seconds by width) makes it fill its chain rounds."""
    corpus = corpus_of(pair, options.corpus, state) if options.storage == "sam" and options.corpus else None
    storage = state.ngram_storage(options, vocab_size, corpus, hybrid=hybrid)
    if options.reset:
        storage.reset()
    return MatchDrafter(storage, factor=options.factor, device=model_device(pair.target), verify_costs=verify_costs)


def corpus_of(pair, path: str, state):
    """The suffix automaton of the text file ``path`` tokenised with the pair's tokenizer: built
    once per pair and file (kept in ``state``), shared by every prompt."""
    if pair.tokenizer is None:
        raise ValueError("a corpus needs the target's tokenizer, and this pair has none")
    return state.for_pair(pair, f"corpus:{path}", lambda: corpus_automaton(read_corpus(path, pair.tokenizer)))


def lookahead_drafter(pair, strategy, state, context: DraftContext) -> Drafter:
    """Lookahead decoding's drafter with ``strategy.drafter_options``; its candidates verify as a token
    tree (``engine.lookahead_strategy``). The pool lives in ``state`` per (N, G), emptied when ``reset``."""
    options = strategy.drafter_options or LookaheadOptions()
    if not isinstance(options, LookaheadOptions):
        raise ValueError(f"the lookahead drafter takes LookaheadOptions, got {type(options).__name__}")
    if strategy.tree < 1:
        raise ValueError("lookahead verifies its candidates as a token tree: give the strategy tree > 0 "
                         "(engine.lookahead_strategy builds it)")
    pool = state.for_pair(pair, f"lookahead_pool:{options.ngram}:{options.guesses}",
                          lambda: NGramPool(options.guesses))
    if options.reset:
        pool.clear()
    return LookaheadDrafter(options.window, options.ngram, options.guesses, pool)


register_drafter("model", model_drafter)
register_drafter("ngram", ngram_drafter)
register_drafter("lookahead", lookahead_drafter)
for _kind in KINDS:                  # the drafters a kind names for itself (``cross_tokenizer``, ``self``)
    for _name, _factory in _kind.factories:
        register_drafter(_name, _factory)
