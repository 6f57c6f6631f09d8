"""What a drafter that drafts from its target's hidden states shares: taking them from the target.

The target's ``CachedModel`` keeps each forward's hidden states (``keep_hidden``; the verify
pass's included) as ``target.hidden = (start, rows)``. A drafter built on
:class:`TargetHiddenStates` (the MTP layers, an EAGLE-3 head) gathers them position by position
into ``rows`` (tensors of consecutive positions from 0) up to ``rows_end``, and trims them itself
when the sequence is rolled back.
"""

from __future__ import annotations

import torch

from generation.drafter import Drafter


class TargetHiddenStates(Drafter):
    """A drafter that reads the target's kept hidden states; subclasses set ``target`` in
    ``attach_target`` and reset ``rows`` / ``rows_end`` in ``begin``."""

    target = None
    rows: list[torch.Tensor]
    rows_end: int = 0

    def fill_target(self, ids: torch.Tensor) -> None:
        """Make sure the target's hidden states of slots 0..n-2 are at hand: in the first round
        the target prefills the prompt here (the verify then feeds the last token and the drafts)."""
        wanted = ids.shape[1] - 1
        self._collect(wanted)
        if self.rows_end < wanted and self.target.length < wanted:
            self.target.forward(ids[:, :wanted], keep=1)
            self._collect(wanted)
        if self.rows_end < wanted:
            raise RuntimeError(f"the target kept no hidden states for positions {self.rows_end}..{wanted - 1}")

    def _collect(self, upto: int) -> None:
        """Take the target's hidden states of positions [rows_end, upto) from its last forward."""
        if upto <= self.rows_end or self.target is None or self.target.hidden is None:
            return
        start, rows = self.target.hidden
        if start > self.rows_end or start + rows.shape[0] < upto:
            return
        self.rows.append(rows[self.rows_end - start:upto - start])
        self.rows_end = upto
