"""The target of a replay: a cached model whose verifies are answered from target AR's recorded output.

Under greedy decoding every lossless strategy commits target AR's tokens, so a drafter's run can be
replayed without the target's verify forwards: :class:`RecordedTarget` returns, at each position it
is fed, a logits row built from the record (the output token first, then the recorded top-k, else
zero; a zero row off the output, which no rule reads past the first rejection).

What it keeps between rounds follows what the drafter reads (its kind's ``target_reads``): only its
length; or its cache, filled from a store made once per prompt (:class:`Stores`; one wide forward,
so such a replay is labelled ``rounding``, not ``exact``); or, for hidden states, shared keys or a
cache the store cannot serve, the real forward with only its logits replaced.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from advisor.memo import Proposals
from kvcache.cache import CachedModel, _layers
from kvcache.shared import can_copy

BUDGET_BYTES = 1 << 30      # stores kept at once (1 GiB); past it a store is rebuilt when asked again


class Stores:
    """Per recorded prompt, the target's cache over its prompt and output (built when first asked),
    and the rows a :class:`RecordedTarget` answers with."""

    def __init__(self, pair, budget_bytes: int = BUDGET_BYTES):
        self.pair = pair
        self.budget = budget_bytes
        self._kept: dict[int, tuple[object, int]] = {}
        self._bytes = 0
        self.built = 0                 # stores computed (a test counts them)
        self._rows: dict[int, dict] = {}
        self.proposals = Proposals()   # the self-drafters' proposals by position, for every method

    def rows(self, index: int) -> dict:
        """The recorded target's rows of record ``index``, built once and shared by every method."""
        return self._rows.setdefault(index, {})

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


def append_positions(cache, store, positions: Sequence[int]) -> None:
    """Append to every layer of ``cache`` the ``store``'s keys and values at ``positions`` (a
    negative position: zeros), cast to the layer's dtype where it has one."""
    if not positions:
        return
    layers = _layers(store)
    run = 0                     # the common case: stored positions in a row, then positions off the output
    while run < len(positions) and positions[run] == positions[0] + run >= 0:
        run += 1
    if all(p < 0 for p in positions[run:]):
        start = positions[0] if run else 0
        for mine, theirs in zip(_layers(cache), layers):
            keys, values = theirs.keys[:, :, start:start + run], theirs.values[:, :, start:start + run]
            if run < len(positions):
                shape = (*keys.shape[:2], len(positions) - run, keys.shape[3])
                keys = torch.cat([keys, keys.new_zeros(shape)], dim=2)
                values = torch.cat([values, values.new_zeros(shape)], dim=2)
            _append(mine, keys, values)
        return
    device = layers[0].keys.device
    index = torch.tensor([max(p, 0) for p in positions], dtype=torch.long, device=device)
    missing = torch.tensor([p < 0 for p in positions], dtype=torch.bool, device=device)
    for mine, theirs in zip(_layers(cache), layers):
        keys, values = theirs.keys.index_select(-2, index), theirs.values.index_select(-2, index)
        keys[:, :, missing], values[:, :, missing] = 0, 0
        _append(mine, keys, values)


def _append(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Append ``keys`` and ``values`` to ``layer``, cast to its dtype where it has one."""
    held = getattr(layer, "keys", None)
    dtype = held.dtype if isinstance(held, torch.Tensor) else keys.dtype
    layer.update(keys.to(dtype), values.to(dtype))


ROWS_ONLY, STORED, REAL = "rows", "stored", "real"


class RecordedTarget(CachedModel):
    """One recorded prompt's target for a replay through the verify loop.

    ``base``: the target as the probe feeds it (a stepwise target counts a forward per token, as in a
    run); ``output``: the record's output, cut to the budget; ``reads``: ``""``, ``"cache"`` or
    ``"states"``; ``load``: () -> (cache, length), the prompt's store; ``quiet``: a context that hides
    the target's own forwards from a hook counting the drafter's.
    """

    def __init__(self, base: CachedModel, record, output: Sequence[int], vocab_size: int, *, reads: str = "",
                 load: Callable[[], tuple[object, int]] | None = None,
                 quiet: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
                 rows: dict | None = None):
        super().__init__(base.model, path=base.path, reason=base.reason)
        self._device = base.device
        self.output = tuple(output)
        self._top = record.top
        self._vocab = vocab_size
        self._row_cache = rows if rows is not None else {}   # output index -> its row (shared per record)
        self._reads = reads
        self._load = load
        self._store = None
        self._quiet = quiet
        self._start = 0              # length of the sequence begin() returned (the prompt, or the decoder start)
        self._restores = False       # rows only, for a cache a run restores from snapshots
        self._verifying = False
        self.verify_widths: list[int | None] = []
        self.copied = 0              # positions whose keys and values came from the store after the prompt

    # ------------------------------------------------------------ what it keeps

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def mode(self) -> str:
        if self.keep_hidden or self.keep_kv_states or self._reads == "states" or self.own_cache:
            return REAL
        if self._reads == "cache":
            return STORED if self._load is not None and self.cache is not None and can_copy(self.cache) else REAL
        return ROWS_ONLY

    def begin(self, prompt: list[int], prefills=()) -> list[int]:
        self.verify_widths = []
        self.copied = 0
        self._verifying = False
        with self._quiet():
            start = super().begin(prompt, ())
        self._start = len(start)
        self._restores = self.needs_snapshots
        return start

    # ------------------------------------------------------------------ rows

    def _row_of(self, index: int) -> torch.Tensor:
        """The row that decides output position ``index`` (zeros past the output); read-only, shared."""
        key = index if 0 <= index < len(self.output) else -1
        row = self._row_cache.get((key, self._vocab))
        if row is not None:
            return row
        row = torch.zeros(self._vocab, dtype=torch.float32, device=self.device)
        if key >= 0:
            token = self.output[index]
            others = [t for t in self._top[index] if t != token and t < self._vocab]
            ids = torch.tensor([token, *others], dtype=torch.long, device=self.device)
            row[ids] = torch.arange(len(others) + 1, 0, -1, dtype=torch.float32, device=self.device)
        self._row_cache[(key, self._vocab)] = row
        return row

    def _rows(self, positions: Sequence[int], on_path: Sequence[bool], keep: int) -> torch.Tensor:
        """(keep, V): for each of the last ``keep`` fed tokens, the recorded row after it where its
        prefix is the output's, else zeros."""
        rows = [self._row_of(p + 1 - self._start) if ok else self._row_of(-1)
                for p, ok in zip(positions[-keep:], on_path[-keep:])]
        return torch.stack(rows)

    def _on_output(self, position: int, token: int) -> bool:
        index = position - self._start
        return index < 0 or (index < len(self.output) and self.output[index] == token)

    # --------------------------------------------------------------- forwards

    def checkpoint(self) -> None:
        self._verifying = True
        if self.mode == REAL:
            super().checkpoint()
        else:
            self._checkpoint_length = self.length

    def forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        if self._verifying:
            self._verifying = False
            seen = self.length
            self.verify_widths.append(ids.shape[1] - seen if seen > 0 else None)
        return super().forward(ids, keep)

    def _forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        seen, stop = self.length, ids.shape[1]
        first = min(seen, stop - keep)          # what the cache holds is committed: the output's
        on_path, ok = [True] * first, True
        for position, token in enumerate(ids[0, first:].tolist(), start=first):
            ok = ok and self._on_output(position, token)
            on_path.append(ok)
        positions = list(range(stop))
        mode = self.mode
        if mode == REAL:
            with self._quiet():
                super()._forward(ids, keep)
        else:
            if mode == STORED:
                self._copy(positions[seen:], on_path[seen:])
            self.forwards += 1
            self._length = stop
        return self._rows(positions, on_path, keep)

    def forward_masked(self, tokens: torch.Tensor, position_ids: torch.Tensor, attention_mask, keep: int):
        if self._verifying:
            self._verifying = False
            self.verify_widths.append(tokens.shape[1] if self.length > 0 else None)
        fed, positions = tokens[0].tolist(), position_ids[0].tolist()
        on_path = self._tree_on_path(fed, positions, attention_mask)
        mode = self.mode
        if mode == REAL:
            with self._quiet():
                super().forward_masked(tokens, position_ids, attention_mask, keep)
        else:
            if mode == STORED:
                self._copy(positions, on_path)
            self.forwards += 1
            self._length += len(fed)
        return self._rows(positions, on_path, keep)

    def _tree_on_path(self, fed: list[int], positions: list[int], attention_mask) -> list[bool]:
        """Per token of a masked block, whether it and every block token it sees are the output's."""
        mask = attention_mask if isinstance(attention_mask, torch.Tensor) else next(iter(attention_mask.values()))
        m = len(fed)
        seen = mask[0, 0, -m:, -m:] == 0                          # (m, m): block token j visible to token i
        own = torch.tensor([self._on_output(p, t) for p, t in zip(positions, fed)], device=seen.device)
        return (~(seen & ~own.view(1, m)).any(dim=1)).tolist()

    def stored(self) -> tuple[object, int] | None:
        """(the store's cache over the prompt and output, the positions it holds) where this target
        copies its keys and values from a store (``mode`` is STORED; built when first asked), else None."""
        if self.mode != STORED:
            return None
        if self._store is None:
            with self._quiet():
                self._store = self._load()
        return self._store

    def _copy(self, positions: Sequence[int], on_path: Sequence[bool]) -> None:
        """Append the store's keys and values at ``positions`` (zeros where off the output)."""
        store, length = self.stored()
        wanted = [p if ok and p < length else -1 for p, ok in zip(positions, on_path)]
        append_positions(self.cache, store, wanted)
        self.copied += sum(p >= self._start for p in wanted)

    # --------------------------------------------------------------- rollback

    def _rollback(self, length: int) -> None:
        if self.mode != ROWS_ONLY:
            super()._rollback(length)
            return
        if self._length <= length:
            return
        # A cache restored from snapshots goes back to the checkpoint, and the next verify re-feeds.
        self._length = self._checkpoint_length if self._restores else length

    def keep_block(self, block: int, kept: list[int]) -> None:
        if self.mode != ROWS_ONLY:
            super().keep_block(block, kept)
            return
        if self._restores:
            self._rollback(self._length - block + len(kept))
            return
        self._length += len(kept) - block

    def attention_kinds(self) -> dict[str, int | None]:
        if self.mode == ROWS_ONLY:
            return {"full_attention": None}
        return super().attention_kinds()


def recorded_target(pair, record, output, vocab_size: int, *, reads: str, stores: Stores | None, index: int,
                    quiet=contextlib.nullcontext, rows: dict | None = None) -> RecordedTarget:
    """The :class:`RecordedTarget` of record ``index`` (``output``: its output as replayed), its
    keys and values copied from ``stores`` where the drafter reads the target's cache."""
    from kvcache.probe import cached_model

    base = cached_model(pair.target)
    load = None
    if reads == "cache" and stores is not None and type(base) is CachedModel and base.path == "cached" \
            and not base.encoder_decoder and not base.own_cache:
        load = lambda: stores.get(index, record, output)          # noqa: E731
    return RecordedTarget(base, record, output, vocab_size, reads=reads, load=load, quiet=quiet, rows=rows)
