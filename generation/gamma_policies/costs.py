"""What the model policy knows about cost: drafter steps, verify forwards by width, host time."""

from __future__ import annotations

from analysis.acceptance import verify_width
from analysis.speedup import CostModel
from generation.gamma_policies.estimates import Mean, Recent
from generation.result import Round


class Costs:
    """Seconds per round's pieces, learned from the rounds observed: ``draft_step_s`` (a moving mean),
    ``verify_s`` by width (the median of the last five, so one slow forward does not mislead it for
    long) and ``other_s`` (wall time between rounds less draft and verify, a moving mean).

    They belong to the machine and the models, so they persist across generations; a generation's
    first round (the prefill) is not used. Unmeasured widths come from ``analysis.speedup.CostModel``,
    its table rebuilt at a new width and every ``TABLE_REFRESH`` rounds. ``catches_up``: the drafter
    catches up on skipped tokens (a model drafter).
    """

    TABLE_REFRESH = 8       # rounds between rebuilds of the verify-cost table

    def __init__(self, cost_alpha: float, *, catches_up: bool):
        self.cost_alpha, self.catches_up = cost_alpha, catches_up
        self.verify_s: dict[int, Recent] = {}
        self.draft_step_s = Mean()
        self.other_s = Mean()
        self.rounds = 0                             # observed, prefill rounds included
        self._mark: float | None = None             # the clock at the last observed round
        self._table: list[float] | None = None      # verify seconds by width, 1..max+1
        self._drafted_none = False                  # the last observed round drafted nothing
        # A tree round that drafted k along its line verified its whole tree: the width
        # it really fed, by k (the median of the last few), prices rounds of k drafts.
        self.tree_width: dict[int, Recent] = {}

    def begin(self) -> None:
        self._mark = None       # the wall time before a generation's first round is not a round's

    def observe(self, rnd: Round, now: float | None, *, prefill: bool) -> None:
        """Learn from a finished round (``now``: the clock, None without one);
        a generation's first round (``prefill``) teaches nothing."""
        # After a round without drafts a model drafter first catches up on the tokens it
        # skipped, in the same forward as its first draft: that round's draft time is
        # not the price of its drafts.
        caught_up = self.catches_up and self._drafted_none
        if not prefill:
            self._learn(rnd, now, caught_up)
        self._mark = now
        self._drafted_none = not rnd.drafted
        self.rounds += 1

    def _learn(self, rnd: Round, now: float | None, caught_up: bool) -> None:
        drafted = len(rnd.drafted)
        width = verify_width(rnd)  # a tree round verified tree_size + 1 tokens, not drafted + 1
        if rnd.verify_s > 0:
            self.verify_s.setdefault(width, Recent()).add(rnd.verify_s)
        if rnd.tree_size:
            self.tree_width.setdefault(drafted, Recent()).add(width)
        if drafted and rnd.draft_s > 0 and not caught_up:
            self.draft_step_s.add(rnd.draft_s / drafted, self.cost_alpha)
        if now is not None and self._mark is not None:
            other = max(0.0, now - self._mark - rnd.draft_s - rnd.verify_s)
            self.other_s.add(other, self.cost_alpha)
        # Costs drift slowly, and a rebuild costs ~50 us: rebuild when a width is new,
        # and every few rounds after that.
        recent = self.verify_s.get(width)
        if (recent is not None and recent.count == 1) or self.rounds % self.TABLE_REFRESH == 0:
            self._table = None

    def model(self) -> CostModel | None:
        """The measured costs, or None before any verify time was measured."""
        if not self.verify_s:
            return None
        return CostModel(draft_step_s=self.draft_step_s.value,
                         verify_s={w: m.value for w, m in self.verify_s.items()},
                         other_per_round_s=self.other_s.value)

    def width(self, drafted: int) -> int:
        """Tokens a round of ``drafted`` drafts feeds the verify: drafted + 1 for a chain,
        the tree's nodes + 1 as measured for tree rounds."""
        recent = self.tree_width.get(drafted)
        return max(drafted + 1, round(recent.value)) if recent is not None else drafted + 1

    def verify_table(self, max_gamma: int) -> list[float]:
        """Verify seconds of a round of k drafts, k = 0..max_gamma, priced at the width such rounds fed
        (k + 1, or the whole tree)."""
        if self._table is None:
            costs = self.model()
            self._table = [costs.verify(self.width(k)) for k in range(max_gamma + 1)]
        return self._table
