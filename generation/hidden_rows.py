"""What a drafter that drafts from its target's hidden states shares: taking them from the target.

The target's ``CachedModel`` keeps each forward's hidden states (``keep_hidden``) as
``target.hidden = (start, rows)``; :class:`TargetHiddenStates` gathers them into ``rows`` up to
``rows_end`` and trims them on rollback. :class:`HeadDrafter` holds what every such drafter shares:
its q processor, the last proposal's draft logits and its forward count.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from generation.drafter import Drafter, DrafterReport
from generation.model_drafter import draft_tokens
from kvcache.cache import RollbackStats
from sampling import LogitsProcessor


class HeadDrafter(Drafter):
    """A drafter made of ``module``, run on the target's own states (``target``, set in
    ``attach_target``), q from ``processor``; ``_logits`` holds the last proposal's draft logits and
    ``_forwards`` counts the module's forwards, both reset by :meth:`begin`."""

    kind = "model"

    def __init__(self, module, processor: LogitsProcessor, *, vocab_size: int | None = None,
                 generator: torch.Generator | None = None):
        self.processor = processor
        self.vocab_size = vocab_size
        self.generator = generator
        self.device = next(module.parameters()).device
        self.target = None
        self._logits: list[torch.Tensor] = []
        self._forwards = 0

    @property
    def calls(self) -> int:
        """The module's forwards since begin."""
        return self._forwards

    def begin(self, prompt: list[int]) -> None:
        self._logits, self._forwards = [], 0

    def draft_logits(self) -> torch.Tensor | None:
        return torch.cat(self._logits) if self._logits else None

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to k drafts, each drawn from q = processor(the module's logits) by the shared draw loop
        (``generation.model_drafter.draft_tokens``): (k',), (k', V). A subclass gives the one step
        (:meth:`chain_step`) and settles its own state once the chain is drawn (:meth:`chain_drawn`)."""
        n = ids.shape[1]
        self._logits = []
        if n < 2 or k < 1:                    # no target state yet for a one-token prompt
            return ids.new_empty(0), None
        self.fill_target(ids)
        step = self.chain_step(ids, n)

        def recorded(seq: torch.Tensor) -> torch.Tensor:          # (1, n + d) -> draft d's logits, (1, V)
            self._logits.append(step(seq)[:, :self.vocab_size])
            return self._logits[-1]

        drafts, probs = draft_tokens(recorded, ids.to(self.device), k, self.processor, self.generator,
                                     None, stop_below)
        steps = len(self._logits)             # a chain stopped early ran one step past its drafts
        self._logits = self._logits[:len(drafts)]
        self.chain_drawn(n, steps, drafts)
        return drafts.to(ids.device), probs.to(ids.device)

    def chain_step(self, ids: torch.Tensor, n: int):
        """The one step of a chain over the ``n`` committed ``ids``: a function from the sequence so
        far, (1, n + d), to the module's logits for draft d, (1, V) or wider."""
        raise NotImplementedError

    def chain_drawn(self, n: int, steps: int, drafts: torch.Tensor) -> None:
        """After a chain: ``steps`` steps ran (one past the drafts when it stopped early). Default: nothing."""


class TargetHiddenStates(HeadDrafter):
    """A head drafter that reads the target's kept hidden states into ``rows`` (up to
    ``rows_end``), with ``committed`` tokens in the sequence and its own ``stats``; :meth:`begin`
    resets them."""

    def __init__(self, module, processor: LogitsProcessor, *, vocab_size: int | None = None,
                 generator: torch.Generator | None = None):
        super().__init__(module, processor, vocab_size=vocab_size, generator=generator)
        self.rows: list[torch.Tensor] = []   # target hidden states not yet read, (m, H) each
        self.rows_end = 0                    # the slot after the last row held
        self.committed = 0                   # tokens in the sequence
        self.stats = RollbackStats()

    def begin(self, prompt: list[int]) -> None:
        super().begin(prompt)
        self.rows, self.rows_end = [], 0
        self.committed = len(prompt)
        self.stats = RollbackStats()

    def report(self) -> DrafterReport:
        return replace(super().report(), rollback=self.stats.to_dict())

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
