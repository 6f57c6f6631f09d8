"""Building a cross-tokenizer drafter for a loaded pair, and drafter AR's inputs on the drafter's own
ids (:func:`drafter_inputs`); what is worth building once per pair the engine keeps and hands in."""

from __future__ import annotations

import torch

from model_drafters.cross_tokenizer.drafter import METHODS, CrossTokenizerDrafter
from model_drafters.cross_tokenizer.prompt import drafter_prompt
from model_drafters.cross_tokenizer.vocab_map import VocabMap, build_vocab_map
from sampling import LogitsProcessor
from utils.vocab import end_token_ids, logits_width


def has_own_tokenizer(pair) -> bool:
    """Whether the pair's drafter reads and writes ids of a tokenizer of its own: the kind's test
    of a pair (``utils.models.ModelPair.shares_tokenizer`` is the one fact it reads)."""
    return not pair.shares_tokenizer


def vocab_map_of(pair) -> VocabMap:
    """The pair's shared-vocabulary map (built anew: the engine keeps one per pair)."""
    drafter_tok = pair.drafter_tok
    drafter_size = min(len(drafter_tok), logits_width(pair.drafter))
    return build_vocab_map(pair.tokenizer, drafter_tok, target_size=pair.vocab_size, drafter_size=drafter_size)


def drafter_ends(pair) -> list[int]:
    """The ids that end a generation in the drafter's own vocabulary."""
    return end_token_ids(pair.drafter_tok, pair.drafter)


def drafter_inputs(pair, prompt_ids: list[int], ends: list[int] | None = None) -> tuple[list[int], list[int]]:
    """The drafter's own prompt ids for the target's ``prompt_ids``, and its own end tokens
    (``ends``, when the caller kept them; drafter AR on a pair whose drafter has another tokenizer)."""
    ends = drafter_ends(pair) if ends is None else ends
    return drafter_prompt(pair.tokenizer, pair.drafter_tok, prompt_ids), ends


def _target_end(pair) -> int | None:
    """The end token a drafter's end of turn becomes: the target's eos when it ends generation."""
    ends = list(pair.end_tokens)
    eos = pair.tokenizer.eos_token_id
    return eos if eos in ends else (ends[0] if ends else None)


def cross_tokenizer_drafter(pair, processor: LogitsProcessor, *, method: str = "slem",
                            use_cache: bool = True, generator: torch.Generator | None = None,
                            vmap: VocabMap | None = None, ends: list[int] | None = None
                            ) -> CrossTokenizerDrafter:
    """A :class:`CrossTokenizerDrafter` for ``pair`` (a ``utils.models.ModelPair``; its drafter
    has ``drafter_tokenizer`` of its own, or shares the target's), by ``method`` ``slem`` or ``tli``.
    ``vmap`` and ``ends``: the pair's vocabulary map and drafter end tokens, when the caller kept
    them (built here otherwise)."""
    if method not in METHODS:
        raise ValueError(f"unknown cross-tokenizer method {method!r} (choose {' or '.join(METHODS)})")
    if pair.is_encoder_decoder:
        raise ValueError("a drafter with another tokenizer needs decoder-only models")
    vmap = vocab_map_of(pair) if vmap is None else vmap
    ends = drafter_ends(pair) if ends is None else ends
    if method == "tli" and vmap.shared == 0:
        raise ValueError("the two vocabularies share no token, so tli cannot draft: use /uag slem")
    return CrossTokenizerDrafter(
        pair.drafter, pair.tokenizer, pair.drafter_tok, processor, vmap,
        method=method, use_cache=use_cache, generator=generator,
        target_end=_target_end(pair), drafter_ends=ends,
    )
