"""Begin many generations from one prompt's prefill.

A check that draws many samples from the same prompt (the self-test's sampling
checks) would otherwise prefill both models once per draw. ``prefill(model,
prompt)`` feeds the prompt once, all but its last token, and keeps that cache;
``engine.run_strategy(..., prefills=[...])`` hands such prefills to the run, and
every ``CachedModel.begin`` of one of those models on that prompt, with the cache
on, starts from a copy of it instead of an empty cache. The generation's first
forward then feeds the prompt's last token together with its drafts: the split
prefill the engine already makes for models whose caches are snapshotted.
Everything after ``begin`` (drafting, verifying, the accept rule, rollbacks)
runs unchanged. A generation's ``forwards`` do not include the shared prefill.

``prefill(..., replay_first=True)`` also keeps each generation's first forward from
it (the prompt's last token and the drafts, on that cache): a later generation whose
first forward feeds the same tokens gets those logits and a copy of the cache after
them instead of running it again. Draws that all propose the same drafts (a
deterministic drafter) then pay the target's forward once, and every draw still runs
its own drafter, accept rule, generator draws and rollback.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from kvcache.cache import Prefill
from kvcache.probe import cached_model


def prefill(model, prompt: Iterable[int], *, replay_first: bool = False) -> Prefill:
    """Feed ``prompt`` (the encoder's ids for a seq2seq model) to ``model`` once, cache on;
    with ``replay_first``, generations begun from it answer a repeated first forward from memory."""
    prompt = tuple(int(t) for t in prompt)
    cached = cached_model(model)
    with torch.inference_mode():
        start = cached.begin(list(prompt))     # snapshotted models have fed start[:-1] already
        if cached.length < len(start) - 1:
            ids = torch.tensor([start[:-1]], dtype=torch.long, device=cached.device)  # (1, L-1)
            cached.forward(ids, keep=1)
    return Prefill(model, prompt, cached.cache, cached.length, cached.encoder_outputs, replay_first)
