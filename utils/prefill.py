"""Begin many generations from one prompt's prefill.

A check that draws many samples from the same prompt (the self-test's sampling
checks) would otherwise prefill both models once per draw. ``prefill(model,
prompt)`` feeds the prompt once, all but its last token, and keeps that cache;
inside ``with starting_from(prefills):`` every ``CachedModel.begin`` of one of
those models on that prompt, with the cache on, starts from a copy of it
instead of an empty cache. The generation's first forward then feeds the
prompt's last token together with its drafts: the split prefill the engine
already makes for models whose caches are snapshotted. Everything after
``begin`` (drafting, verifying, the accept rule, rollbacks) runs unchanged.
A generation's ``forwards`` do not include the shared prefill.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Prefill:
    """One model's cache after a prompt minus its last token; never fed again (begin copies it)."""

    model: object
    prompt: tuple[int, ...]
    cache: object
    length: int                 # positions of the (decoder) sequence the cache holds
    encoder_outputs: object     # an encoder-decoder model's encoder outputs, else None


_ACTIVE: ContextVar[tuple[Prefill, ...]] = ContextVar("prefills", default=())


def prefill(model, prompt: Iterable[int]) -> Prefill:
    """Feed ``prompt`` (the encoder's ids for a seq2seq model) to ``model`` once, cache on."""
    from utils.cache import CachedModel

    prompt = tuple(int(t) for t in prompt)
    cached = CachedModel(model, use_cache=True)
    with torch.inference_mode():
        start = cached.begin(list(prompt))     # snapshotted models have fed start[:-1] already
        if cached.length < len(start) - 1:
            ids = torch.tensor([start[:-1]], dtype=torch.long, device=cached.device)  # (1, L-1)
            cached.forward(ids, keep=1)
    return Prefill(model, prompt, cached.cache, cached.length, cached.encoder_outputs)


@contextmanager
def starting_from(prefills: Iterable[Prefill]) -> Iterator[None]:
    """Within the block, a generation of a prefilled model on its prompt begins from a copy of its prefill."""
    token = _ACTIVE.set(_ACTIVE.get() + tuple(prefills))
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active_prefill(model, prompt: Iterable[int]) -> Prefill | None:
    """The prefill a generation of ``model`` on ``prompt`` begins from, or None (an empty cache)."""
    active = _ACTIVE.get()
    if not active:
        return None
    prompt = tuple(prompt)
    return next((p for p in reversed(active) if p.model is model and p.prompt == prompt), None)
