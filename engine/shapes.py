"""A model's forward timed by shape: B sequences of w new tokens over a cache of L tokens.

The prices ``analysis.whatif`` projects a run's rounds with. Each forward runs on transformers' own
cache, filled once per batch size, rolled back after each timed forward, timed behind device syncs;
the first turn warms up and a cost is the median of the rest.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from analysis.roofline import ModelShape
from generation.timing import timed
from kvcache.cache import cache_keyword, drop_last, new_cache
from utils.devices import model_device
from utils.machine_load import other_load, read_load

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


def drafter_shape_costs(pair, batches: Sequence[int], context: int) -> dict[tuple[int, int], float] | None:
    """The pair's drafter model's forward by batch at width 1 (``time_shapes``), where it is a model of
    its own that runs alone on its own cache; None where it is the target's weights drafting on the
    target's cache, drafts from the target's state, or has a tokenizer of its own."""
    from engine.run import decodes_alone
    from kvcache.probe import runs_alone

    drafter = pair.drafter
    if (drafter is None or drafter is pair.target or pair.drafts_on_target_cache or not pair.shares_tokenizer
            or not runs_alone(drafter) or not decodes_alone(drafter)):
        return None
    return time_shapes(drafter, batches, (1,), context, pair.vocab_size)


def _between(points: dict[int, float], x: int) -> float:
    """``points`` ({x: seconds}) read at ``x``: linear between the nearest two measured on either side,
    the last segment carried on past either end (one point: its value). A forward's cost is flat while
    its weights' reads bound it and grows linearly with the tokens fed once its arithmetic does, so a
    straight line between two timed shapes is exact on either side of that bend."""
    if x in points:
        return points[x]
    xs = sorted(points)
    if len(xs) == 1:
        return points[xs[0]]
    i = min(max(1, sum(1 for k in xs if k < x)), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    return max(0.0, points[x0] + (x - x0) / (x1 - x0) * (points[x1] - points[x0]))


def read_between(table: dict[tuple[int, int], float], batch: int, width: int) -> float:
    """A ``{(B, w): seconds}`` table read at (``batch``, ``width``): each measured batch size read at
    ``width`` (:func:`_between` over its widths), then those read at ``batch`` (bilinear inside the grid)."""
    by_batch: dict[int, dict[int, float]] = {}
    for (b, w), seconds in table.items():
        by_batch.setdefault(b, {})[w] = seconds
    return _between({b: _between(ws, width) for b, ws in by_batch.items()}, batch)


@dataclass(frozen=True)
class PairShapes:
    """The pair's forwards timed by shape for a projection: the target's ``{(B, w): seconds}``, the
    drafter's at width 1 where it is a model of its own (``drafter_shape_costs``, else None), the
    context they were timed over, and the cores other processes used meanwhile (None: unknown).
    ``where``: the machine they were timed on and the file they were read from ("": timed here now)."""

    target: dict[tuple[int, int], float]
    drafter: dict[tuple[int, int], float] | None
    context: int
    other_load: float | None
    where: str = ""

    def target_s(self, batch: int, width: int) -> float:
        """The target's forward at (``batch``, ``width``): timed, or read between those timed."""
        return read_between(self.target, batch, width)

    def drafter_s(self, batch: int) -> float | None:
        """The drafter model's own forward at ``batch`` (width 1), None where it has none."""
        return None if self.drafter is None else read_between(self.drafter, batch, 1)

    def to_dict(self) -> dict:
        rows = lambda table: [[b, w, s] for (b, w), s in sorted(table.items())]      # noqa: E731
        return {"context": self.context, "target": rows(self.target),
                "drafter": rows(self.drafter) if self.drafter is not None else None, "other_load": self.other_load}

    @classmethod
    def from_dict(cls, data: dict, where: str) -> PairShapes:
        """The shapes :meth:`to_dict` wrote; ValueError (one line) for anything else."""
        def table(rows) -> dict[tuple[int, int], float]:
            out = {(int(b), int(w)): float(s) for b, w, s in rows}
            if not out or any(s <= 0 for s in out.values()) or any(b < 1 or w < 1 for b, w in out):
                raise ValueError("a shape table needs positive batch sizes, widths and seconds")
            return out
        try:
            target = table(data["target"])
            drafter = table(data["drafter"]) if data.get("drafter") is not None else None
            return cls(target, drafter, int(data["context"]), data.get("other_load"), where)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"not a shape table: {type(e).__name__} {e}") from None


def time_by_context(pair, widths: Sequence[int], contexts: Sequence[int]) -> tuple[dict, dict]:
    """The target at batch 1 at each of ``widths`` over a cache of each of ``contexts`` tokens
    ({L: {(1, w): seconds}}), and the pair's drafter model of its own at width 1 at each
    ({L: table, or None where it has none}: ``drafter_shape_costs``)."""
    target = {c: time_shapes(pair.target, (1,), widths, c, pair.vocab_size) for c in contexts}
    drafter = {c: drafter_shape_costs(pair, (1,), c) for c in contexts}
    return target, drafter


def surface_of(target: dict, drafter: dict, load: float | None = None, where: str = "") -> list[PairShapes]:
    """:func:`time_by_context`'s tables as one ``PairShapes`` per context (batch 1), the form a cost
    table keeps them in (``advisor.costs.CostTable.by_context``)."""
    return [PairShapes(target[c], drafter.get(c), c, load, where) for c in sorted(target)]


def read_by_context(surface: Sequence[PairShapes], contexts: Sequence[int], widths: Sequence[int]
                    ) -> tuple[dict, dict]:
    """``surface`` (forwards at batch 1 timed over caches of a few lengths, one ``PairShapes`` each) read
    at each of ``contexts`` and ``widths``, in :func:`time_by_context`'s form: each width read at each
    timed length (:func:`read_between`), then those read at the context, linear in L between the
    nearest two timed lengths (attention's reads and products grow linearly with the cache), the last
    segment carried on past either end. The drafter's where every length has it, else None."""
    target = {c: {(1, w): _between({s.context: s.target_s(1, w) for s in surface}, c) for w in widths}
              for c in contexts}
    own = all(s.drafter is not None for s in surface)
    drafter = {c: ({(1, 1): _between({s.context: s.drafter_s(1) for s in surface}, c)} if own else None)
               for c in contexts}
    return target, drafter


def coarse_widths(widths: Sequence[int]) -> list[int]:
    """The widths timed above batch size 1: 1 to 4, then 6, 8, 12, 16, 24, 32, ... under the widest,
    and the widest; a width between is read between them (``read_between``). Batched, a forward's
    cost grows close to linearly in the tokens fed (read-between errors within 10% on the default
    target at batch 2 to 32, docs/results.md), while at batch 1 this CPU's costs jump between
    neighbouring widths, so batch 1 is timed at every width. ``widths`` themselves where they are fewer."""
    most = max(widths)
    ladder = {1, 2, 3, 4} | {base * 2**k for base in (6, 8) for k in range(12)}
    coarse = sorted({w for w in ladder if w < most} | {most})
    return coarse if len(coarse) < len(set(widths)) else sorted(set(widths))


def time_pair_shapes(pair, widths: Sequence[int], context: int, batches: Sequence[int] = BATCHES) -> PairShapes:
    """The target over a cache of ``context`` tokens at every batch size, at batch 1 at every width
    in ``widths`` (1 always) and above it at their :func:`coarse_widths`, and its drafter model at
    width 1; the machine's other load read around them."""
    before = read_load()
    every = sorted({1, *widths})
    target = time_shapes(pair.target, [b for b in batches if b == 1], every, context, pair.vocab_size)
    target.update(time_shapes(pair.target, [b for b in batches if b != 1], coarse_widths(every), context,
                              pair.vocab_size))
    drafter = drafter_shape_costs(pair, batches, context)
    return PairShapes(target, drafter, context, other_load(before, read_load()))


def model_shape(model) -> ModelShape:
    """``model``'s shape as ``analysis.roofline`` prices it: its parameters and their bytes, its layers,
    the width attention's products run at, and the bytes of keys and values a token keeps."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    params = [p for p in model.parameters()]
    count = sum(p.numel() for p in params)
    weight_bytes = sum(p.numel() * p.element_size() for p in params) / max(1, count)
    layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    heads = int(getattr(config, "num_attention_heads", 1) or 1)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    head_dim = int(getattr(config, "head_dim", 0) or (hidden // heads if heads else 0))
    kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
    floating = next((p.dtype for p in params if p.is_floating_point()), torch.float32)
    kv_bytes = 2 * layers * kv_heads * head_dim * torch.finfo(floating).bits // 8
    return ModelShape(count, weight_bytes, layers, heads * head_dim, kv_bytes, str(floating).removeprefix("torch."))
