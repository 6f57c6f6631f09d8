"""The target logits rows that decided each emitted token, kept small and on the device.

A greedy run of the target keeps, per emitted position, the top-k of the row that decided it
(``analysis.divergence`` reads them). Each round appends device tensors (no host sync) and the run
reads them back once at its end; memory is ``width`` values and ids per row.
"""

from __future__ import annotations

import torch

from analysis.divergence import Row

DECISION_WIDTH = 8      # the top-k kept per row: enough to show the runner-up and the rest of the race


class DecisionLog:
    """The rows of one run: :meth:`add` per round, :meth:`read` once at the end."""

    def __init__(self, width: int = DECISION_WIDTH):
        self.width = width
        self._parts: list[tuple] = []               # per round: the top-k (values, ids), (m, width) each
        self._kept: list[list[int] | int] = []      # per round: the rows kept (a list) or the first n

    def add(self, logits: torch.Tensor, kept: list[int] | int) -> None:
        """Keep rows of ``logits`` (m, V): the offsets ``kept`` (a tree's kept nodes), or the first
        ``kept`` rows (a chain's emitted positions, a step's one row). Device work only: one top-k
        (each op a launch on a GPU's step; the casts and the joining wait for :meth:`read`)."""
        if isinstance(kept, int):
            logits = logits[:kept]
        if logits.shape[0] == 0 or (not isinstance(kept, int) and not kept):
            return
        top = logits.topk(min(self.width, logits.shape[-1]), dim=-1)                 # (m, w) twice
        self._parts.append((top.values, top.indices))
        self._kept.append(kept)

    def read(self) -> list[Row]:
        """Every kept row in emitted order (one host sync for the whole run)."""
        if not self._parts:
            return []
        # float32 holds a half or single logit exactly, and a token id below 2**24 (no float64: MPS lacks it)
        values = torch.cat([v for v, _ in self._parts]).float()
        ids = torch.cat([i for _, i in self._parts]).float()
        width = values.shape[-1]
        flat = torch.cat([values, ids], dim=-1).tolist()                             # (rows, 2 * width)
        rows, at = [], 0
        for (part, _), kept in zip(self._parts, self._kept):
            for r in (range(part.shape[0]) if isinstance(kept, int) else kept):
                rows.append(Row(tuple(flat[at + r][:width]), tuple(int(i) for i in flat[at + r][width:])))
            at += part.shape[0]
        return rows
