"""Building a cross-tokenizer drafter for a loaded pair, and a decode that uses it."""

from __future__ import annotations

import torch

from cross_tokenizer.drafter import METHODS, CrossTokenizerDrafter
from cross_tokenizer.vocab_map import VocabMap, build_vocab_map
from generation.common import check_gamma, check_request
from generation.result import GenerationResult
from generation.verify import verify_loop
from sampling import LogitsProcessor
from utils.vocab import end_token_ids, logits_width


def vocab_map_of(pair) -> VocabMap:
    """The pair's shared-vocabulary map, built once and kept on the pair."""
    vmap = getattr(pair, "_cross_vocab_map", None)
    if vmap is None:
        drafter_size = min(len(pair.drafter_tokenizer), logits_width(pair.drafter))
        vmap = build_vocab_map(pair.tokenizer, pair.drafter_tokenizer,
                               target_size=pair.vocab_size, drafter_size=drafter_size)
        pair._cross_vocab_map = vmap
    return vmap


def _drafter_ends(pair) -> list[int]:
    ends = getattr(pair, "_cross_drafter_ends", None)
    if ends is None:
        ends = pair._cross_drafter_ends = end_token_ids(pair.drafter_tokenizer, pair.drafter)
    return ends


def _target_end(pair) -> int | None:
    """The end token a drafter's end of turn becomes: the target's eos when it ends generation."""
    ends = list(pair.end_tokens)
    eos = pair.tokenizer.eos_token_id
    return eos if eos in ends else (ends[0] if ends else None)


def cross_tokenizer_drafter(pair, processor: LogitsProcessor, *, method: str = "slem",
                            use_cache: bool = True, generator: torch.Generator | None = None
                            ) -> CrossTokenizerDrafter:
    """A :class:`CrossTokenizerDrafter` for ``pair`` (a ``utils.models.ModelPair`` whose
    ``drafter_tokenizer`` differs from its ``tokenizer``), by ``method`` ``slem`` or ``tli``."""
    if method not in METHODS:
        raise ValueError(f"unknown cross-tokenizer method {method!r} (choose {' or '.join(METHODS)})")
    if getattr(pair, "is_encoder_decoder", False):
        raise ValueError("a drafter with another tokenizer needs decoder-only models")
    vmap = vocab_map_of(pair)
    if method == "tli" and vmap.shared == 0:
        raise ValueError("the two vocabularies share no token, so tli cannot draft: use /uag slem")
    return CrossTokenizerDrafter(
        pair.drafter, pair.tokenizer, pair.drafter_tokenizer, processor, vmap,
        method=method, use_cache=use_cache, generator=generator,
        target_end=_target_end(pair), drafter_ends=_drafter_ends(pair),
    )


def cross_tokenizer_generate(inputs, pair, *, logits_processor: LogitsProcessor, method: str = "slem",
                             gamma: int = 4, max_gen_len: int = 128, eos_tokens_id=None,
                             use_cache: bool = True, generator: torch.Generator | None = None,
                             trace: bool = True, interruptible: bool = False,
                             gamma_policy=None) -> GenerationResult:
    """Speculative decoding of ``inputs`` (the target's prompt ids) with a drafter of
    another tokenizer; lossless like ``generation.speculative_generate``."""
    prompt = check_request(inputs, max_gen_len, pair.target)
    gamma = check_gamma(gamma)
    drafter = cross_tokenizer_drafter(pair, logits_processor, method=method,
                                      use_cache=use_cache, generator=generator)
    return verify_loop(
        prompt, drafter, pair.target,
        logits_processor=logits_processor, gamma=gamma, max_gen_len=max_gen_len,
        eos_tokens_id=eos_tokens_id if eos_tokens_id is not None else pair.end_tokens,
        use_cache=use_cache, vocab_size=pair.vocab_size, generator=generator, trace=trace,
        interruptible=interruptible, gamma_policy=gamma_policy,
    )
