"""When the model policy explores instead of taking its best predicted gamma."""

from __future__ import annotations

from generation.gamma_policies.looks import LOOKS
from generation.result import Round


class Schedule:
    """Turns the best predicted gamma into the gamma a round asks for.

    The first rounds try the ``probes`` widths so the cost curve is learned early; every
    ``explore_every``-th round tries a neighbour of the choice (keeping its costs fresh and noticing
    acceptance that moved), every ``reprobe_every``-th the next probe again. While not drafting is best,
    and in a generation's first round, the drafter kind's looks decide (``looks``).
    """

    def __init__(self, kind: str, max_gamma: int, *, probes: tuple[int, ...],
                 explore_every: int, reprobe_every: int):
        self.max_gamma = max_gamma
        self.probes = tuple(g for g in probes if 0 <= g <= max_gamma)
        self.explore_every, self.reprobe_every = explore_every, reprobe_every
        self.looks = LOOKS[kind](explore_every, max_gamma)
        self.pending = list(self.probes)    # probes not tried yet
        self._chosen = 0                    # rounds chosen for (not a generation's first, no probe)
        self._reprobe_turn = self._explore_turn = 0

    def begin(self) -> None:
        self.looks.begin()

    def first(self, best: int) -> int:
        """A generation's first round (its target forward is the prompt's prefill)."""
        return self.looks.first(best)

    def probe(self) -> int:
        return self.pending.pop(0)

    def choose(self, best: int) -> int:
        """The exploiting choice, or now and then an exploring one."""
        self._chosen += 1
        if best == 0:
            return self.looks.extend(self.looks.idle())
        self.looks.drafting()
        return self.looks.extend(self._explore(best))

    def observe(self, rnd: Round) -> None:
        self.looks.observe(rnd)

    def _explore(self, best: int) -> int:
        if self.reprobe_every and self.probes and self._chosen % self.reprobe_every == 0:
            self._reprobe_turn += 1
            return self.probes[(self._reprobe_turn - 1) % len(self.probes)]
        if self.explore_every and self._chosen % self.explore_every == 0:
            return self._neighbour(best)
        return best

    def _neighbour(self, best: int) -> int:
        self._explore_turn += 1
        step = 1 if self._explore_turn % 2 else -1
        other = best + step
        if not 0 <= other <= self.max_gamma:
            other = best - step
        return min(max(other, 0), self.max_gamma)
