"""A model's forward timed by shape: B sequences of w new tokens over a cache of L tokens.

What changes with the load is the price of a forward, not what a drafter's rounds accept:
``analysis.whatif`` projects a run's speedup over batch size from its own rounds and these
prices. Each forward runs on transformers' own cache (``kvcache.cache.new_cache``), filled
once per batch size with L random tokens per sequence; each timed forward is rolled back
(``kvcache.cache.drop_last``), and every timer waits for the device on both sides
(``generation.timing.timed``). The first turn warms up; a cost is the median of the rest.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch

from generation.timing import timed
from kvcache.cache import cache_keyword, drop_last, new_cache
from utils.devices import model_device

BATCHES = (1, 2, 4, 8, 16, 32)
REPEATS = 5
MIN_CELL_S = 0.05      # a cell's turns go on (up to 4 x REPEATS) until they add up to this much


@torch.inference_mode()
def time_shapes(model, batches: Sequence[int], widths: Sequence[int], context: int, vocab_size: int,
                repeats: int = REPEATS) -> dict[tuple[int, int], float]:
    """Seconds of ``model``'s forward over (B, w) new tokens on a cache of ``context`` tokens per
    sequence, for every B in ``batches`` and w in ``widths``: ``{(B, w): seconds}``."""
    device, keyword = model_device(model), cache_keyword(model)
    gen = torch.Generator().manual_seed(0)
    costs: dict[tuple[int, int], float] = {}
    for batch in batches:
        cache = new_cache(model)
        prefix = torch.randint(1, vocab_size, (batch, max(1, context)), generator=gen).to(device)
        model(input_ids=prefix, use_cache=True, **{keyword: cache})
        turns: dict[int, list[float]] = {w: [] for w in widths}
        for turn in range(4 * repeats + 1):
            if turn > repeats and all(sum(seen) >= MIN_CELL_S for seen in turns.values()):
                break                                             # a fast forward is timed more often
            for width in widths:
                ids = torch.randint(1, vocab_size, (batch, width), generator=gen).to(device)
                seconds = timed(lambda: model(input_ids=ids, use_cache=True, **{keyword: cache}), model)
                drop_last(cache, width)
                if turn:                                          # the first turn warms up
                    turns[width].append(seconds)
        for width, seen in turns.items():
            costs[(batch, width)] = statistics.median(seen)
        del cache
    return costs
