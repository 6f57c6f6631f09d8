"""Short calls into ``engine.run_strategy`` for tests: every decode a test makes goes through the
engine's one way in, so a test cannot pass on a path the REPL never takes.

Each helper builds a ``Strategy`` and a pair (``engine.pair_of``) from model objects and returns the
``GenerationResult``. An n-gram storage a test built itself (pre-filled, or wrapped to misbehave)
is handed to the engine in an ``EngineState`` that already holds it.
"""

from __future__ import annotations

from engine import CrossTokenizerOptions, EngineState, NGramOptions, Strategy, pair_of, run_strategy

__all__ = ["autoregressive", "cross_tokenizer", "nasd", "speculative", "state_holding"]


def speculative(prompt, drafter, target, *, processor, gamma: int = 4, max_gen_len: int = 128, eos=None,
                use_cache: bool = True, vocab_size: int | None = None, generator=None, gamma_policy: str = "constant",
                tree: int = 0, tree_branch: int = 2, tree_sample: bool = False, inspect: bool = True,
                drafter_options=None, observer=None, interruptible: bool = False, state: EngineState | None = None,
                verify: str = "residual", prefills=()):
    """Speculative decoding of ``prompt`` with ``drafter`` for ``target`` (the "model" drafter)."""
    strategy = Strategy("speculative", drafter="model", drafter_options=drafter_options, gamma=gamma,
                        gamma_policy=gamma_policy, processor=processor, use_cache=use_cache,
                        max_gen_len=max_gen_len, tree=tree, tree_branch=tree_branch, tree_sample=tree_sample,
                        inspect=inspect, verify=verify)
    pair = pair_of(target, drafter, end_tokens=eos, vocab_size=vocab_size)
    return run_strategy(strategy, pair, prompt, state=state, generator=generator, observer=observer,
                        interruptible=interruptible, prefills=prefills)


def cross_tokenizer(prompt, pair, *, method: str, processor, gamma: int = 4, max_gen_len: int = 128,
                    use_cache: bool = True, generator=None, gamma_policy: str = "constant"):
    """Speculative decoding of ``prompt`` (the target's ids) on ``pair``, whose drafter has a
    tokenizer of its own (``drafter_tokenizer`` set), drafting by ``method`` ("slem" or "tli").
    The pair goes in as it is, so the engine's "model" drafter is the one that notices the two
    tokenizers and hands the pair to the cross-tokenizer drafter."""
    strategy = Strategy("speculative", drafter="model", drafter_options=CrossTokenizerOptions(method),
                        gamma=gamma, gamma_policy=gamma_policy, processor=processor, use_cache=use_cache,
                        max_gen_len=max_gen_len)
    return run_strategy(strategy, pair, prompt, generator=generator)


def state_holding(storage, vocab_size: int | None = None) -> EngineState:
    """An ``EngineState`` whose n-gram storage is ``storage`` (kept as it is: not emptied), for runs
    whose loop compares over ``vocab_size`` tokens (None: the storage's own vocabulary)."""
    state = EngineState()
    state.storage = storage
    state.storage_key = (storage.kind, storage.n, vocab_size or storage.vocab_size)
    return state


def nasd(prompt, storage, target, *, processor, gamma: int = 4, filler_top_k: int = 1, max_gen_len: int = 128,
         eos=None, use_cache: bool = True, stop_if_unknown: bool = True, confident_start: bool = True,
         generator=None, gamma_policy: str = "constant", tree: int = 0, tree_branch: int = 2,
         inspect: bool = True, observer=None, interruptible: bool = False, verify: str = "residual", prefills=()):
    """NASD of ``prompt`` over ``storage`` (what it holds is kept) verified by ``target``."""
    options = NGramOptions(storage=storage.kind, n=storage.n, top_k_filler=filler_top_k,
                           stop_if_unknown=stop_if_unknown, confident_start=confident_start, reset=False)
    strategy = Strategy("ngram", drafter="ngram", drafter_options=options, gamma=gamma, gamma_policy=gamma_policy,
                        processor=processor, use_cache=use_cache, max_gen_len=max_gen_len, tree=tree,
                        tree_branch=tree_branch, inspect=inspect, verify=verify)
    vocab = min(target.config.vocab_size, storage.vocab_size)
    pair = pair_of(target, end_tokens=eos, vocab_size=vocab)
    return run_strategy(strategy, pair, prompt, state=state_holding(storage, vocab), generator=generator,
                        observer=observer, interruptible=interruptible, prefills=prefills)


def autoregressive(prompt, model, *, processor, max_gen_len: int = 128, eos=None, use_cache: bool = True,
                   generator=None, interruptible: bool = False):
    """Plain decoding of ``prompt`` with ``model`` (run as the pair's target)."""
    strategy = Strategy("target", processor=processor, use_cache=use_cache, max_gen_len=max_gen_len)
    return run_strategy(strategy, pair_of(model, end_tokens=eos), prompt, generator=generator,
                        interruptible=interruptible)
