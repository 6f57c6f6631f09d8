"""The target's keys and values over a recorded output, computed once per prompt and copied into
every replay that feeds the target.

A drafter that drafts on the target's own cache (a self-drafter) needs the target to hold every
committed token before it drafts: in a run the verifies put them there, in a replay
(``advisor.replay``) the target is fed the kept tokens each round, one forward a round, which
made such a replay cost about what a real run's drafting and verifying cost. Under greedy
decoding the committed tokens are the recorded output, so their keys and values can be computed
once (:class:`Stores`: the prompt but its last token in one forward, as a run's prefill feeds
it, then the rest of prompt and output in one more), and each feed of a replay appends the
stored positions it asks for instead (:class:`StoredTarget`), counted as the forward it stands
for. One store serves every γ, policy, tree and hybrid of every drafter on that prompt.

The stored values of the output's positions come from one wide forward where a run computes them
in its verifies (a few positions a forward) and the old replay in its feeds: the same keys and
values up to the rounding of a wider matrix product (a cast copy, ``self:fp16``, rounds them
to its own dtype anyway), so a replay that reads them is labelled ``rounding``, not ``exact``
(``advisor.rank.EXACTNESS``). ``tests/test_advisor_replay.py`` holds the replays that read them to
``engine.run_strategy``'s counts.

Only a plain cache qualifies (full-attention layers, addressable by position); a target that
keeps hidden states or shared keys for its drafter, snapshots a layer or runs stepwise is fed
for real, as before.
"""

from __future__ import annotations

import torch

from kvcache.cache import CachedModel, _layers
from model_drafters.selfdraft.shared_cache import append_committed, can_copy

BUDGET_BYTES = 1 << 30      # stores kept at once (1 GiB); past it a store is rebuilt when asked again


class Stores:
    """Per recorded prompt, the target's cache over its prompt and output (built when first asked)."""

    def __init__(self, pair, budget_bytes: int = BUDGET_BYTES):
        self.pair = pair
        self.budget = budget_bytes
        self._kept: dict[int, tuple[object, int]] = {}
        self._bytes = 0
        self.built = 0                 # stores computed (a test counts them)

    def get(self, index: int, record, output) -> tuple[object, int]:
        """(cache, positions it holds) for record ``index`` with ``output`` (its output as replayed):
        every position a replay can commit, prompt + output but the output's last token."""
        kept = self._kept.get(index)
        length = len(record.prompt) + len(output) - 1
        if kept is not None and kept[1] >= length:
            return kept
        cache = self._build(list(record.prompt) + list(output[:-1]), len(record.prompt))
        self.built += 1
        size = _bytes(cache)
        if self._bytes + size <= self.budget:
            self._kept[index] = (cache, length)
            self._bytes += size
        return cache, length

    @torch.inference_mode()
    def _build(self, tokens: list[int], prompt_length: int):
        from kvcache.probe import cached_model
        from utils.devices import model_device

        target = cached_model(self.pair.target)
        target.begin(tokens[:prompt_length])
        ids = torch.tensor([tokens], dtype=torch.long, device=model_device(self.pair.target))
        if prompt_length > 1:
            target.forward(ids[:, :prompt_length - 1], keep=1)          # the prefill a run feeds
        if ids.shape[1] > target.length:
            target.forward(ids, keep=1)
        return target.cache


def _bytes(cache) -> int:
    return sum(t.numel() * t.element_size() for layer in _layers(cache)
               for t in (layer.keys, layer.values) if isinstance(t, torch.Tensor))


class StoredTarget(CachedModel):
    """The target of one replayed prompt: a feed of committed tokens (``forward``) appends their
    stored keys and values (:class:`Stores`) to its cache and counts one forward, as the forward
    it stands for would; it returns no logits (a replay's feed reads none). Anything it cannot
    serve from the store (a target keeping hidden states, tokens off the record) runs for real."""

    def __init__(self, model, path: str, reason: str, load, tokens: list[int]):
        super().__init__(model, path=path, reason=reason)
        self._load = load               # () -> (cache, length): the store, built on the first feed
        self._store = None              # held for this prompt's replay once loaded
        self._tokens = tokens           # prompt + output: what a feed must be a prefix of

    def _stored(self, ids: torch.Tensor) -> bool:
        if self.keep_hidden or self.keep_kv_states or self.cache is None or not can_copy(self.cache):
            return False
        seen, stop = self.length, ids.shape[1]       # the positions before ``seen`` were checked when fed
        return stop <= len(self._tokens) and ids[0, seen:stop].tolist() == self._tokens[seen:stop]

    def _forward(self, ids: torch.Tensor, keep: int):
        if not self._stored(ids):
            return super()._forward(ids, keep)
        if self._store is None:
            self._store = self._load()
        cache, length = self._store
        seen, stop = self.length, ids.shape[1]
        if stop > length:
            return super()._forward(ids, keep)
        dtype = _layers(cache)[0].keys.dtype
        append_committed(self.cache, cache, seen, stop, dtype)
        self.forwards += 1
        self._length = stop
        return None


def stored_target(pair, stores: Stores | None, index: int, record, output) -> CachedModel:
    """The target a replay of ``record`` feeds: a :class:`StoredTarget` where the probe put the
    target on the plain cached path (and ``stores`` is given), else ``kvcache.probe.cached_model``'s."""
    from kvcache.probe import cached_model

    base = cached_model(pair.target)
    if stores is None or type(base) is not CachedModel or base.path != "cached" or base.encoder_decoder \
            or base.own_cache:
        return base
    return StoredTarget(pair.target, base.path, base.reason, lambda: stores.get(index, record, output),
                        list(record.prompt) + list(output))
