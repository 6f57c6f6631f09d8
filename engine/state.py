"""What the engine keeps between prompts: the n-gram storage, the γ policies, and what it built
once for the loaded pair (self-draft models, a cross-tokenizer vocabulary map, lookahead's n-gram pool)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.strategy import NGramOptions, Strategy
from generation.gamma_policies import make_policy
from ngram_assisted import NGramStorage, OneLevelNGramStorage, RecyclingStorage, SAMStorage, SuffixStorage
from utils.options import MATCH_STORAGES, NGRAM_STORAGES

# The class of each storage name the front ends offer (utils.options.NGRAM_STORAGES, in its order);
# the MATCH_STORAGES among them match the sequence's tail and draft through ngram_assisted.MatchDrafter.
STORAGE_CLASSES = dict(zip(NGRAM_STORAGES, (NGramStorage, OneLevelNGramStorage, RecyclingStorage,
                                            SuffixStorage, SAMStorage), strict=True))


@dataclass
class EngineState:
    """Kept by a front end across prompts and passed to every ``run_strategy``: NASD's and the hybrid's
    n-gram storages (rebuilt when kind, N or vocabulary change), one γ policy per strategy key (fresh
    when its name, γ or threshold change) and what was built once for a pair (:meth:`for_pair`)."""

    storage: object = None
    storage_key: tuple | None = None
    hybrid_storage: object = None       # the hybrid's own storage (speculative's), beside NASD's
    hybrid_storage_key: tuple | None = None
    policies: dict[str, tuple[tuple, object]] = field(default_factory=dict)
    built: dict[str, tuple[object, object]] = field(default_factory=dict)  # name -> (pair, value)

    def for_pair(self, pair, name: str, build: Callable[[], object]):
        """``build()``'s value for ``pair`` under ``name``: built on first use, kept for this pair
        object, built again when another pair comes (the REPL loaded new models)."""
        for other in [n for n, (owner, _) in self.built.items() if owner is not pair]:
            del self.built[other]  # another pair's models: let them go
        if name not in self.built:
            self.built[name] = (pair, build())
        return self.built[name][1]

    def ngram_storage(self, options: NGramOptions, vocab_size: int, corpus=None, *, hybrid: bool = False):
        """The storage of ``options`` over ``vocab_size`` tokens (``sam``: over the ``corpus`` automaton, if
        any). ``hybrid``: the hybrid's own, so neither learns the other's outputs."""
        kept, kept_key = (self.hybrid_storage, self.hybrid_storage_key) if hybrid else (self.storage, self.storage_key)
        key = storage_key(options, vocab_size, corpus)
        if kept is None or key != kept_key:
            kept = new_storage(options, vocab_size, corpus)
            if hybrid:
                self.hybrid_storage, self.hybrid_storage_key = kept, key
            else:
                self.storage, self.storage_key = kept, key
        return kept

    def gamma_policy(self, strategy: Strategy):
        """The γ policy object of ``strategy.key`` for this strategy's policy, γ and threshold."""
        spec = (strategy.gamma_policy, strategy.gamma, strategy.gamma_threshold)
        kept = self.policies.get(strategy.key)
        if kept is None or kept[0] != spec:
            kept = self.policies[strategy.key] = (spec, make_policy(*spec))
        return kept[1]


def new_storage(options: NGramOptions, vocab_size: int, corpus=None):
    """A fresh storage of ``options``' kind (see :meth:`EngineState.ngram_storage`)."""
    if options.storage not in STORAGE_CLASSES:
        raise ValueError(f"unknown n-gram storage {options.storage!r} (choose {' or '.join(STORAGE_CLASSES)})")
    if options.storage == "suffix":
        return SuffixStorage(vocab_size, max_pattern=options.max_pattern, max_outputs=options.max_outputs)
    if options.storage == "sam":
        return SAMStorage(vocab_size, corpus=corpus)
    return STORAGE_CLASSES[options.storage](options.n, vocab_size)


def storage_key(options: NGramOptions, vocab_size: int, corpus=None) -> tuple:
    """What a kept storage must match to be reused: its kind and vocabulary, and what shapes it
    (N; ``suffix``: P and M; ``sam``: the corpus automaton, by identity)."""
    if options.storage == "suffix":
        return ("suffix", vocab_size, options.max_pattern, options.max_outputs)
    if options.storage == "sam":
        return ("sam", vocab_size, id(corpus) if corpus is not None else None)
    return (options.storage, options.n, vocab_size)
