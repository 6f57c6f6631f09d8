"""The model policy: each round's gamma from the speedup model, fed with what the run measures."""

from __future__ import annotations

import time
from collections.abc import Callable

from analysis.speedup import SEARCH_GAMMA, CostModel
from generation.gamma_policies.acceptance import Acceptance
from generation.gamma_policies.base import check_kind
from generation.gamma_policies.costs import Costs
from generation.gamma_policies.estimates import Rate
from generation.gamma_policies.looks import FIRST_LOOK as FIRST_LOOK_ROUNDS
from generation.gamma_policies.prediction import best as best_of, predicted as predicted_speeds
from generation.gamma_policies.schedule import Schedule
from generation.result import Round


class ModelPolicy:
    """Pick each round's gamma in 0..max_gamma to maximise predicted tokens per second.

    From learned per-position acceptance and proposal rates (:class:`Acceptance`) and costs
    (:class:`Costs`) it predicts each gamma's tokens per second with the speedup model of Leviathan et
    al. 2023 (sec. 3), a rate per position, and picks the largest, ties to the smaller; 0 (a plain
    step) wins when verifying more costs more than the accepted drafts save (the usual NASD case on a
    CPU). Probes and looks follow :class:`Schedule`; a new drafter kind starts afresh. ``clock``: None
    counts other host work as zero (simulations).
    """

    name = "model"
    threshold = None
    FIRST_LOOK = FIRST_LOOK_ROUNDS

    def __init__(self, max_gamma: int = SEARCH_GAMMA, *, probes: tuple[int, ...] = (1, 2, 4, 8, 0),
                 explore_every: int = 16, reprobe_every: int = 128, decay: float = 0.98,
                 cost_alpha: float = 0.2, prior: float = 0.5, prior_weight: float = 2.0,
                 clock: Callable[[], float] | None = time.perf_counter):
        self.max_gamma, self.clock = max_gamma, clock
        self.probes, self.explore_every, self.reprobe_every = probes, explore_every, reprobe_every
        self.decay, self.prior, self.prior_weight = decay, prior, prior_weight
        self.cost_alpha = cost_alpha
        self.kind: str | None = None
        self._reset()

    def _reset(self) -> None:
        """Forget everything learned (a new drafter kind; the schedule and costs depend on it)."""
        self.acceptance = Acceptance(self.max_gamma, decay=self.decay, prior=self.prior,
                                     prior_weight=self.prior_weight)
        self.costs = Costs(self.cost_alpha, catches_up=self.kind == "model")
        self.schedule = None if self.kind is None else Schedule(
            self.kind, self.max_gamma, probes=self.probes, explore_every=self.explore_every,
            reprobe_every=self.reprobe_every)
        self._prefill = True            # the next round is a generation's first

    def begin(self, drafter_kind: str) -> None:
        check_kind(drafter_kind)
        if drafter_kind != self.kind:
            self.kind = drafter_kind
            self._reset()
        self.acceptance.new_prompt()
        self.costs.begin()
        self.schedule.begin()
        self._prefill = True

    def next_gamma(self) -> int:
        if self.schedule is None:
            raise RuntimeError("call begin(drafter_kind) before next_gamma()")
        if self._prefill:
            return self.schedule.first(self.best()[0])
        if self.schedule.pending:
            return self.schedule.probe()
        return self.schedule.choose(self.best()[0])

    def observe(self, rnd: Round) -> None:
        now = self.clock() if self.clock is not None else None
        self.acceptance.learn(rnd)
        self.costs.observe(rnd, now, prefill=self._prefill)
        self.schedule.observe(rnd)
        self._prefill = False

    @property
    def rounds(self) -> int:
        """Rounds observed since the policy started (or last met a new drafter kind)."""
        return self.costs.rounds

    @property
    def accept(self) -> list[Rate]:
        """The decayed counts behind c_0..c_{max-1}."""
        return self.acceptance.accept

    def rates(self) -> list[float]:
        """c_0..c_{max-1}: each shrunk toward the one before (position 0 toward the prior)."""
        return self.acceptance.rates()

    def propose_rates(self) -> list[float]:
        """q_0..q_{max-1}, shrunk the same way from a prior of 1 (drafters draft when asked)."""
        return self.acceptance.propose_rates()

    def cost_model(self) -> CostModel | None:
        """The measured costs, or None before any verify time was measured."""
        return self.costs.model()

    def predicted(self) -> list[float]:
        """Predicted tokens per second for gamma = 0..max_gamma ([] before any cost is known)."""
        return predicted_speeds(self.acceptance, self.costs, self.max_gamma)

    def best(self) -> tuple[int, float]:
        """(gamma, predicted tokens/s) of the exploiting choice; ties go to the smaller gamma."""
        return best_of(self.predicted(), self.max_gamma)
