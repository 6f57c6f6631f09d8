"""The one verify loop behind speculative decoding and NASD.

A drafter proposes up to gamma tokens (with their probabilities when it has
them); the target scores them all in one forward pass; the accept rule keeps a
prefix and adds one target token; caches are rolled back to what was kept; the
drafter is told what the sequence became. Strategies differ only in the drafter.
"""

from __future__ import annotations

from typing import Protocol

import torch

from generation.accept import accept_drafts
from generation.common import cut_at_end, end_tokens, model_device, timed_run
from generation.result import GenerationResult, Round
from sampling import LogitsProcessor
from utils.cache import crop_cache, forward_unseen, new_cache


class Drafter(Protocol):
    """Where drafts come from."""

    calls: int          # drafter forward passes so far (0 for a storage)
    wants_top_k: int    # >1: give update() the target's top-k ids at each verified position

    def begin(self, prompt: list[int]) -> None:
        """Start a new generation from ``prompt``."""

    def propose(self, ids: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to k draft ids, shape (k',), and their probabilities (k', V) or None.

        ids: (1, L) the sequence so far, on the target's device.
        """

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        """The tokens appended this round, and (when asked for) the target's top-k
        ids at each of their positions."""


@torch.inference_mode()
def verify_loop(
    prompt: list[int],
    drafter: Drafter,
    target,
    *,
    logits_processor: LogitsProcessor,
    gamma: int,
    max_gen_len: int,
    eos_tokens_id,
    use_cache: bool = True,
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
    trace: bool = False,
    interruptible: bool = False,
) -> GenerationResult:
    """Draft, verify, accept, roll back; repeat until an end token or the budget.

    ``vocab_size`` limits the distributions to a vocabulary the drafter shares
    with the target (pairs whose embedding matrices are padded differently).
    The target cache holds exactly the kept sequence minus its last token after
    every round.
    """
    device = model_device(target)
    eos = end_tokens(eos_tokens_id)
    ids = torch.tensor([prompt], dtype=torch.long, device=device)   # (1, L)
    cache = new_cache(target) if use_cache else None
    result = GenerationResult(trace=[] if trace else None)
    with timed_run(result, device, interruptible=interruptible):
        drafter.begin(prompt)
        generated = 0
        while generated < max_gen_len:
            ids, cache, new, stop = _round(
                ids, cache, drafter, target, logits_processor, generator, result,
                k_max=min(gamma, max_gen_len - generated - 1), vocab_size=vocab_size, eos=eos,
            )
            generated += len(new)
            if stop:
                result.stop_reason = "eos"
                break
    result.tokens = ids[0, len(prompt):].tolist()
    result.drafter_calls = drafter.calls
    return result


def _round(ids, cache, drafter, target, processor, generator, result, *, k_max, vocab_size, eos):
    """One round; returns (ids, cache, tokens appended, whether an end token ended it)."""
    draft, q = drafter.propose(ids, k_max) if k_max > 0 else (ids.new_empty(0), None)
    k = draft.shape[0]
    logits, cache = forward_unseen(target, torch.cat([ids, draft.view(1, -1)], dim=1), cache, keep=k + 1)
    result.target_calls += 1
    if vocab_size is not None:
        logits = logits[:, :vocab_size]                                 # (k+1, V)
    p = processor(logits)
    n, token = accept_drafts(p, q, draft, processor.sample, generator)
    # The round's single host sync: n, the target token, the drafts, the top-k.
    top_k = logits.topk(drafter.wants_top_k, dim=-1).indices if drafter.wants_top_k > 1 else None
    parts = [n.view(1), token.view(1), draft]
    if top_k is not None:
        parts.append(top_k.flatten())
    flat = torch.cat(parts).tolist()
    n, token, drafts = flat[0], flat[1], flat[2:2 + k]
    new, stop = cut_at_end(drafts[:n] + [token], eos)
    ids = torch.cat([ids, torch.tensor([new], dtype=torch.long, device=ids.device)], dim=1)
    cache = crop_cache(cache, ids.shape[1] - 1)
    top_k_rows = None
    if top_k is not None:
        width, rows = drafter.wants_top_k, flat[2 + k:]
        top_k_rows = [rows[i * width:(i + 1) * width] for i in range(len(new))]
    drafter.update(new, top_k_rows)
    _count(result, drafts, n, new)
    return ids, cache, new, stop


def _count(result: GenerationResult, drafts: list[int], n: int, new: list[int]) -> None:
    """Add one round to the result's counters and trace.

    drafts: all drafts proposed; n: how many the target accepted; new: what was
    appended. When an end token among the accepted drafts ends the output, the
    drafts after it are dropped from the round (they were never needed), so they
    count as neither drafted nor rejected.
    """
    token_in = len(new) > n                      # the target's own token was appended
    kept = n if token_in else len(new)
    drafted = drafts if token_in else drafts[:kept]
    result.rounds += 1
    result.drafted += len(drafted)
    result.accepted += kept
    if result.trace is not None:
        result.trace.append(Round(
            drafted=tuple(drafted),
            accepted=kept,
            token=new[-1] if token_in else None,
            bonus=token_in and n == len(drafts) > 0,
        ))
