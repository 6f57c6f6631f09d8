"""Building a cross-tokenizer drafter for a loaded pair, and a decode that uses it.

The engine (``engine.drafters``) builds its drafter here whenever a pair's
drafter has a tokenizer of its own, and runs drafter AR on the drafter's own
ids (:func:`drafter_inputs`).
"""

from __future__ import annotations

import torch

from cross_tokenizer.drafter import METHODS, CrossTokenizerDrafter
from cross_tokenizer.prompt import drafter_prompt
from cross_tokenizer.vocab_map import VocabMap, build_vocab_map
from generation.common import check_gamma, check_request
from generation.result import GenerationResult
from generation.verify import verify_loop
from sampling import LogitsProcessor
from utils.vocab import end_token_ids, logits_width


def has_own_tokenizer(pair) -> bool:
    """Whether the pair's drafter reads and writes ids of a tokenizer of its own
    (``utils.models.ModelPair.drafter_tokenizer`` is set only then)."""
    return getattr(pair, "drafter_tokenizer", None) is not None


def _drafter_tokenizer(pair):
    """The tokenizer of the drafter's ids: its own, or the target's when they share one."""
    return pair.drafter_tokenizer if has_own_tokenizer(pair) else pair.tokenizer


def vocab_map_of(pair) -> VocabMap:
    """The pair's shared-vocabulary map, built once and kept on the pair."""
    vmap = getattr(pair, "_cross_vocab_map", None)
    if vmap is None:
        drafter_tok = _drafter_tokenizer(pair)
        drafter_size = min(len(drafter_tok), logits_width(pair.drafter))
        vmap = build_vocab_map(pair.tokenizer, drafter_tok,
                               target_size=pair.vocab_size, drafter_size=drafter_size)
        pair._cross_vocab_map = vmap
    return vmap


def _drafter_ends(pair) -> list[int]:
    ends = getattr(pair, "_cross_drafter_ends", None)
    if ends is None:
        ends = pair._cross_drafter_ends = end_token_ids(_drafter_tokenizer(pair), pair.drafter)
    return ends


def drafter_inputs(pair, prompt_ids: list[int]) -> tuple[list[int], list[int]]:
    """The drafter's own prompt ids for the target's ``prompt_ids``, and its own end tokens
    (drafter AR on a pair whose drafter has another tokenizer)."""
    return drafter_prompt(pair.tokenizer, _drafter_tokenizer(pair), prompt_ids), _drafter_ends(pair)


def _target_end(pair) -> int | None:
    """The end token a drafter's end of turn becomes: the target's eos when it ends generation."""
    ends = list(pair.end_tokens)
    eos = pair.tokenizer.eos_token_id
    return eos if eos in ends else (ends[0] if ends else None)


def cross_tokenizer_drafter(pair, processor: LogitsProcessor, *, method: str = "slem",
                            use_cache: bool = True, generator: torch.Generator | None = None
                            ) -> CrossTokenizerDrafter:
    """A :class:`CrossTokenizerDrafter` for ``pair`` (a ``utils.models.ModelPair``; its drafter
    has ``drafter_tokenizer`` of its own, or shares the target's), by ``method`` ``slem`` or ``tli``."""
    if method not in METHODS:
        raise ValueError(f"unknown cross-tokenizer method {method!r} (choose {' or '.join(METHODS)})")
    if getattr(pair, "is_encoder_decoder", False):
        raise ValueError("a drafter with another tokenizer needs decoder-only models")
    vmap = vocab_map_of(pair)
    if method == "tli" and vmap.shared == 0:
        raise ValueError("the two vocabularies share no token, so tli cannot draft: use /uag slem")
    return CrossTokenizerDrafter(
        pair.drafter, pair.tokenizer, _drafter_tokenizer(pair), processor, vmap,
        method=method, use_cache=use_cache, generator=generator,
        target_end=_target_end(pair), drafter_ends=_drafter_ends(pair),
    )


def cross_tokenizer_generate(inputs, pair, *, logits_processor: LogitsProcessor, method: str = "slem",
                             gamma: int = 4, max_gen_len: int = 128, eos_tokens_id=None,
                             use_cache: bool = True, generator: torch.Generator | None = None,
                             interruptible: bool = False, gamma_policy=None) -> GenerationResult:
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
        use_cache=use_cache, vocab_size=pair.vocab_size, generator=generator,
        interruptible=interruptible, gamma_policy=gamma_policy,
    )
