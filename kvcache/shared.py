"""A drafter's cache made from the target's: what can be shared, and how (the self-drafters').

A self-drafter has the target's architecture, so for the tokens already
committed it can read the target's own KV cache instead of computing one
(Draft&Verify, Zhang et al. 2023, drafts on the full model's cache). Two ways:

- **view** (``self:skip``, ``self:int8``: the drafter computes in the target's
  dtype): the drafter is fed over the target's own layers at its layer positions
  (all of them, or only the kept ones), as the target is fed
  (``CachedModel.beside``: on the static path, at the target's slots, rolled back
  by length). It appends its draft positions to those layers and rolls them back
  before the target verifies, so the target's cache is left as it was.
- **copy** (``self:bf16``, ``self:fp16``): the drafter keeps a cache of its
  own, and each round appends the target's newly committed positions to it,
  cast to its dtype (:func:`append_committed`); its draft positions are
  dropped at the end of each round.

Either way the drafter pays no prefill and no catch-up forward. Sharing needs
every layer to be croppable (attention layers; recurrent state is refused and
the drafter keeps a cache of its own); the copy also needs plain full-attention
layers, whose positions are addressable (a sliding layer keeps only a window;
a static layer holds position i at slot i).
"""

from __future__ import annotations

from kvcache.cache import _croppable, _layers


def can_view(target_cache) -> bool:
    """Whether a drafter may write into (and crop) the target's layers."""
    layers = _layers(target_cache)
    return bool(layers) and all(_croppable(layer) for layer in layers)


def can_copy(target_cache) -> bool:
    """Whether the target's committed positions can be copied by position (full-attention layers only)."""
    layers = _layers(target_cache)
    return bool(layers) and all(type(layer).__name__ in ("DynamicLayer", "StaticLayer") for layer in layers)


def committed_positions(target_cache, start: int, stop: int) -> list[tuple]:
    """The target's keys and values at positions [start, stop): one (keys, values) pair per
    layer, each (batch, heads, stop - start, head_dim), views of the target's tensors."""
    return [(layer.keys[:, :, start:stop], layer.values[:, :, start:stop]) for layer in _layers(target_cache)]


def append_committed(own, target_cache, start: int, stop: int, dtype) -> None:
    """Append the target's positions [start, stop) to ``own``, cast to ``own``'s dtype.

    ``own``: a cache with one layer per target layer holding positions [0, start); ``dtype``:
    the drafter's.
    Keys and values are (batch, heads, positions, head_dim).
    """
    if stop <= start:
        return
    for mine, (keys, values) in zip(_layers(own), committed_positions(target_cache, start, stop)):
        mine.update(keys.to(dtype), values.to(dtype))

