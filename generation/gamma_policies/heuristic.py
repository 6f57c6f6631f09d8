"""transformers' heuristic schedule: +2 after a fully accepted round, else -1."""

from __future__ import annotations

from generation.gamma_policies.base import check_kind
from generation.result import Round


class HeuristicPolicy:
    """transformers' heuristic schedule: +2 after a fully accepted round, else -1 (min 1).

    Starts at ``gamma`` at every generation (transformers' ``heuristic_transient``;
    its plain ``heuristic`` carries the value over to the next call). The value
    has no upper bound, as in transformers; the loop caps it by the budget.
    A round with no drafts (an n-gram drafter that knew no continuation) says
    nothing about acceptance and leaves the value as it was.
    """

    name = "heuristic"
    threshold = None

    def __init__(self, gamma: int):
        self.start = gamma
        self.gamma = gamma

    def begin(self, drafter_kind: str) -> None:
        check_kind(drafter_kind)
        self.gamma = self.start

    def next_gamma(self) -> int:
        return self.gamma

    def observe(self, rnd: Round) -> None:
        drafted = len(rnd.drafted)
        if drafted == 0:
            return
        if rnd.accepted == drafted:
            self.gamma += 2
        else:
            self.gamma = max(1, self.gamma - 1)
