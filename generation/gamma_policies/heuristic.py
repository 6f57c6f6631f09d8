"""transformers' heuristic schedule: +2 after a fully accepted round, else -1."""

from __future__ import annotations

from generation.gamma_policies.base import check_kind
from generation.result import Round


class HeuristicPolicy:
    """transformers' heuristic schedule: +2 after a fully accepted round, else -1 (min 1), restarting at
    ``gamma`` every generation (``heuristic_transient``), without an upper bound. A round with no
    drafts says nothing about acceptance and leaves the value as it was."""

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
