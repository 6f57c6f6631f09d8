"""The drafter registry: a drafting method is a ``generation.drafter.Drafter`` and a factory.

A factory is called once per run as ``factory(pair, strategy, state, context)``
and returns a fresh Drafter: ``pair`` has ``target``, ``drafter``,
``end_tokens`` and ``vocab_size``; ``strategy`` is the
:class:`engine.strategy.Strategy` (its ``drafter_options`` are the factory's
to read); ``state`` the :class:`engine.state.EngineState` kept across prompts;
``context`` the run's :class:`DraftContext`. Registering a factory under a
new kind makes ``Strategy(drafter=kind)`` run it in every front end.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from cross_tokenizer import cross_tokenizer_drafter, drafter_ends, has_own_tokenizer, vocab_map_of
from engine.state import MATCH_STORAGES
from engine.strategy import CrossTokenizerOptions, HybridOptions, LookaheadOptions, NGramOptions
from engine.widths import verify_costs
from generation.common import check_request
from utils.devices import model_device
from generation.drafter import Drafter
from generation.model_drafter import ModelDrafter
from ngram_assisted import HybridDrafter, MatchDrafter, NGramDrafter
from ngram_assisted.lookahead import LookaheadDrafter, NGramPool
from ngram_assisted.sam import corpus_automaton, read_corpus
from eagle3 import Eagle3Drafter, eagle3_target
from gemma4_assistant import AssistantDrafter, assistant_target
from mtp import MtpDrafter, mtp_target
from selfdraft.build import build_self_drafter
from selfdraft.drafter import SelfDrafter
from selfdraft.mark import self_draft_target
from selfdraft.spec import parse_self_draft


@dataclass(frozen=True)
class DraftContext:
    """What one run gives its drafter: the built processor (the drafter's q
    comes from it), the run's generator (drafts and the accept rule draw from
    the same one), the vocabulary the loop compares over, the prompt, the
    length budget and the prefills the run may begin from."""

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

    This is the one place the engine chooses how a drafter model drafts: one
    whose tokenizer differs from the target's (``pair.drafter_tokenizer`` set)
    drafts through the ``cross_tokenizer`` drafter; a drafter model made from
    the target (``--drafter self:...``) drafts on the target's own cache
    (``selfdraft.drafter.SelfDrafter``); the target's own MTP layers (``--drafter mtp``)
    from the target's hidden states (``mtp.MtpDrafter``), as does an EAGLE-3 head (``--drafter eagle3:PATH``,
    ``eagle3.Eagle3Drafter``); a Gemma 4 assistant (``--drafter gemma4-assistant:PATH``) from the
    target's cache and hidden states (``gemma4_assistant.AssistantDrafter``); any other through its own cache
    (``generation.model_drafter.ModelDrafter``). With :class:`HybridOptions` whose L
    is above 0, that drafter drafts beside a model-free storage (:func:`hybrid_drafter`).
    """
    options = strategy.drafter_options
    if isinstance(options, HybridOptions):
        if options.min_match > 0 and mtp_target(pair.drafter) is pair.target and pair.drafter is not None:
            raise ValueError("the hybrid drafter (/hybrid) does not take the MTP drafter yet: set /hybrid 0")
        if options.min_match > 0 and assistant_target(pair.drafter) is pair.target and pair.drafter is not None:
            raise ValueError("the hybrid drafter (/hybrid) does not take the Gemma 4 assistant yet: set /hybrid 0")
        if options.min_match > 0 and eagle3_target(pair.drafter) is pair.target and pair.drafter is not None:
            raise ValueError("the hybrid drafter (/hybrid) does not take an EAGLE-3 head yet: set /hybrid 0")
        model = model_drafter(pair, replace(strategy, drafter_options=options.model), state, context)
        return hybrid_drafter(pair, options, model, state, context) if options.min_match > 0 else model
    if mtp_target(pair.drafter) is pair.target and pair.drafter is not None:
        return MtpDrafter(pair.drafter, context.processor, vocab_size=context.vocab_size,
                          generator=context.generator)
    if assistant_target(pair.drafter) is pair.target and pair.drafter is not None:
        return AssistantDrafter(pair.drafter, context.processor, vocab_size=context.vocab_size,
                                generator=context.generator)
    if eagle3_target(pair.drafter) is pair.target and pair.drafter is not None:
        return Eagle3Drafter(pair.drafter, context.processor, vocab_size=context.vocab_size,
                             generator=context.generator)
    if has_own_tokenizer(pair):
        return DRAFTERS["cross_tokenizer"](pair, strategy, state, context)
    check_request(context.prompt, context.max_gen_len, pair.drafter)
    if self_draft_target(pair.drafter) is pair.target:
        return SelfDrafter(pair.drafter, context.processor, use_cache=strategy.use_cache,
                           vocab_size=context.vocab_size, generator=context.generator)
    return ModelDrafter(pair.drafter, context.processor, use_cache=strategy.use_cache,
                        vocab_size=context.vocab_size, generator=context.generator, prefills=context.prefills)


def hybrid_drafter(pair, options: HybridOptions, model: Drafter, state, context: DraftContext) -> HybridDrafter:
    """``model`` beside the storage of ``options.retrieval`` (``sam`` over the context in place of
    an n-gram table, which carries no match length), kept in the state's hybrid slot."""
    retrieval = options.retrieval
    if retrieval.storage not in MATCH_STORAGES:
        retrieval = NGramOptions(storage="sam", reset=retrieval.reset)
    return HybridDrafter(model, match_drafter(pair, retrieval, state, context.vocab_size, hybrid=True),
                         options.min_match)


def self_drafter(pair, strategy, state, context: DraftContext) -> SelfDrafter:
    """A self-drafter built from the pair's target: ``drafter_options`` is its spec
    (``"self:int8"``, ``"self:skip=3,5"``, ...), built once per pair and kept in ``state``;
    None for the pair's own drafter, which must then be made from the target."""
    spec = strategy.drafter_options
    if spec is None:
        model = pair.drafter
        if self_draft_target(model) is not pair.target:
            raise ValueError("this pair's drafter is not made from its target: pass a self: spec")
    else:
        model = self_draft_model(pair, spec, state)
    return SelfDrafter(model, context.processor, use_cache=strategy.use_cache, vocab_size=context.vocab_size,
                       generator=context.generator)


def self_draft_model(pair, spec: str, state):
    """The self-draft model ``spec`` made from ``pair.target``, built once per pair and spec (kept in ``state``)."""
    return state.for_pair(pair, spec, lambda: build_self_drafter(pair.target, parse_self_draft(spec)))


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
    top_k = options.top_k_filler
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k_filler must be an integer >= 1, got {top_k!r}")
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


def cross_drafter(pair, strategy, state, context: DraftContext) -> Drafter:
    """A drafter model with a tokenizer of its own (SLEM or TLI, Timor et al. 2025), by
    ``strategy.drafter_options`` (:class:`CrossTokenizerOptions`; SLEM when None)."""
    options = strategy.drafter_options
    if options is None:
        options = CrossTokenizerOptions()
    if not isinstance(options, CrossTokenizerOptions):
        raise ValueError(f"the model drafter takes CrossTokenizerOptions, got {type(options).__name__}")
    return cross_tokenizer_drafter(pair, context.processor, method=options.method,
                                   use_cache=strategy.use_cache, generator=context.generator,
                                   vmap=state.for_pair(pair, "vocab_map", lambda: vocab_map_of(pair)),
                                   ends=state.for_pair(pair, "drafter_ends", lambda: drafter_ends(pair)))


def lookahead_drafter(pair, strategy, state, context: DraftContext) -> Drafter:
    """Lookahead decoding's drafter (``ngram_assisted.lookahead``) with ``strategy.drafter_options``
    (:class:`LookaheadOptions`). Its candidates are verified as a token tree, so the strategy
    must ask for trees (``engine.lookahead_strategy`` builds one that does). The n-gram pool
    lives in ``state`` for the pair (one per N and G), emptied first when ``reset``."""
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
register_drafter("cross_tokenizer", cross_drafter)
register_drafter("ngram", ngram_drafter)
register_drafter("self", self_drafter)
register_drafter("lookahead", lookahead_drafter)
