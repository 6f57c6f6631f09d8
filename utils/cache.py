"""KV-cache helpers shared by every decoding loop.

The rule the loops follow: a forward pass feeds only the tokens the cache has
not seen, and a rollback goes through the cache's public API (``crop`` on a
transformers ``Cache``) or, for the legacy tuple format, slices the tensors.
"""

from __future__ import annotations

import inspect

import torch
from transformers import Cache, DynamicCache

# A legacy cache: one (key, value) pair per layer, each (batch, heads, seq, head_dim).
LegacyCache = tuple[tuple[torch.Tensor, torch.Tensor], ...]

_LOGITS_KWARG: dict[type, str | None] = {}


def new_cache(model) -> DynamicCache:
    """An empty dynamic cache for ``model``."""
    return DynamicCache(config=model.config)


def cache_length(cache: Cache | LegacyCache | None) -> int:
    """Number of positions a cache holds (0 for no cache)."""
    if cache is None:
        return 0
    if isinstance(cache, Cache):
        return cache.get_seq_length()
    if len(cache) == 0:
        return 0
    return cache[0][0].shape[-2]


def crop_cache(cache: Cache | LegacyCache | None, length: int):
    """Roll a cache back so that it holds its first ``length`` positions.

    Returns the cache (the same object for ``Cache`` instances, a new tuple for
    the legacy format). Cropping to a length at or beyond the current one is a
    no-op.
    """
    if length < 0:
        raise ValueError(f"cannot crop a cache to a negative length ({length})")
    if cache is None or cache_length(cache) <= length:
        return cache
    if isinstance(cache, Cache):
        cache.crop(length)
        return cache
    return tuple((k[..., :length, :], v[..., :length, :]) for k, v in cache)


def _logits_kwarg(model) -> str | None:
    """The forward keyword that limits which positions get logits, if any."""
    cls = type(model)
    if cls not in _LOGITS_KWARG:
        params = inspect.signature(model.forward).parameters
        _LOGITS_KWARG[cls] = next(
            (name for name in ("logits_to_keep", "num_logits_to_keep") if name in params),
            None,
        )
    return _LOGITS_KWARG[cls]


def forward_unseen(model, ids: torch.Tensor, cache, keep: int):
    """Run ``model`` on the tokens of ``ids`` that ``cache`` has not seen.

    ids: (1, L) the whole sequence so far. cache: a cache holding fewer than L
    positions, or None to recompute the whole sequence (no cache).
    Returns (logits of the last ``keep`` positions, shape (keep, V), the cache).
    """
    seen = cache_length(cache)
    if seen >= ids.shape[1]:
        raise ValueError(f"cache holds {seen} positions, nothing new to feed of {ids.shape[1]}")
    kwargs = {}
    name = _logits_kwarg(model)
    if name is not None:
        kwargs[name] = keep
    out = model(
        input_ids=ids[:, seen:],
        past_key_values=cache,
        use_cache=cache is not None,
        **kwargs,
    )
    return out.logits[0, -keep:], out.past_key_values if cache is not None else None
