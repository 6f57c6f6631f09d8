"""Our four strategies behind one call shape, for the benchmark."""

from __future__ import annotations

import inspect


def make_storage(kind: str, n: int, vocab_size: int):
    """An empty n-gram storage: ``basic`` (every order up to n) or ``onelevel``."""
    from ngram_assisted import NGramStorage, OneLevelNGramStorage

    if kind == "basic":
        return NGramStorage(n, vocab_size)
    if kind == "onelevel":
        return OneLevelNGramStorage(n, vocab_size)
    raise ValueError(f"unknown n-gram storage {kind!r} (choose basic or onelevel)")


def engine_takes_policies() -> bool:
    """Whether both drafting strategies accept ``gamma_policy=`` (the engine's newer API)."""
    from generation import speculative_generate
    from ngram_assisted import ngram_assisted_speculative_generate

    return all("gamma_policy" in inspect.signature(f).parameters
               for f in (speculative_generate, ngram_assisted_speculative_generate))


def our_call(strategy: str, gamma: int | None, models, ids: list[int], *, processor,
             max_gen_len: int, generator, storage=None, filler_top_k: int = 1,
             stop_if_unknown: bool = True, gamma_policy=None):
    """A zero-argument function that runs one of our decodes and returns its GenerationResult.

    For NASD the storage is reset here, before the clock starts; the engine
    fills it with the prompt itself (inside the timed call, as its own cost).
    ``gamma_policy`` (a ``generation.gamma_policy`` object, None for constant
    gamma) is passed only when given, so an engine without the keyword still
    runs the constant variants.
    """
    from generation import autoregressive_generate, speculative_generate
    from ngram_assisted import ngram_assisted_speculative_generate

    common = dict(logits_processor=processor, max_gen_len=max_gen_len,
                  eos_tokens_id=list(models.end_tokens), generator=generator)
    if strategy in ("target", "drafter"):
        model = models.target if strategy == "target" else models.drafter
        return lambda: autoregressive_generate(ids, model, **common)
    if gamma_policy is not None:
        common["gamma_policy"] = gamma_policy
    if strategy == "speculative":
        return lambda: speculative_generate(ids, models.drafter, models.target, gamma=gamma,
                                            vocab_size=getattr(models, "vocab_size", None), **common)
    if strategy == "ngram":
        storage.reset()
        return lambda: ngram_assisted_speculative_generate(
            ids, storage, models.target, gamma=gamma, filler_top_k=filler_top_k,
            stop_if_unknown=stop_if_unknown, **common)
    raise ValueError(f"unknown strategy {strategy!r}")
