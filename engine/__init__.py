"""The engine API every front end calls: a strategy is a value, and one function runs it.

    from engine import Strategy, NGramOptions, EngineState, run_strategy
    result = run_strategy(Strategy("ngram", drafter="ngram", drafter_options=NGramOptions(n=3)),
                          pair, prompt_ids, state=EngineState())

``load_pair(target, drafter, ...)`` loads the pair every front end runs on (two models,
or a drafter made from the target; see ``engine.loading``); ``pair_of(target, drafter)``
wraps models already in memory; ``load_served_pair(url)`` makes a pair whose target is behind a
serving engine (``remote``, docs/server.md).

A drafting method is a :class:`Drafter` (``generation.drafter``: the contract,
every ability a method with its default) plus a factory registered with
:func:`register_drafter`; the REPL, the benchmark, the self-test and the
architecture tests then run it unchanged.
"""

from engine.drafters import DRAFTERS, DraftContext, register_drafter
from engine.loading import load_pair
from engine.pair import pair_of
from engine.served_pair import load_served_pair, served_pair_of
from engine.run import decodes_alone, decodes_alone_reason, loop_vocab_size, run_strategy
from engine.state import EngineState
from engine.strategy import (DEFAULT_GAMMA, MAX_GAMMA, MAX_HYBRID_MATCH, CrossTokenizerOptions, HybridOptions,
                             LookaheadOptions, NGramOptions, Strategy, lookahead_strategy)
from generation.drafter import Drafter, DrafterReport
from generation.observer import NoObserver, Observer

__all__ = [
    "CrossTokenizerOptions",
    "DEFAULT_GAMMA",
    "DRAFTERS",
    "DraftContext",
    "Drafter",
    "DrafterReport",
    "EngineState",
    "HybridOptions",
    "LookaheadOptions",
    "MAX_GAMMA",
    "MAX_HYBRID_MATCH",
    "NGramOptions",
    "NoObserver",
    "Observer",
    "Strategy",
    "decodes_alone",
    "decodes_alone_reason",
    "load_pair",
    "lookahead_strategy",
    "pair_of",
    "load_served_pair",
    "served_pair_of",
    "loop_vocab_size",
    "register_drafter",
    "run_strategy",
]
