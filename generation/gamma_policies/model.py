"""The model policy: each round's gamma from the speedup model, fed with what the run measures."""

from __future__ import annotations

import time
from collections.abc import Callable

from analysis.speedup import CostModel, throughput_by_gamma
from generation.gamma_policies.base import check_kind
from generation.gamma_policies.estimates import Mean, Rate, Recent
from generation.result import Round


class ModelPolicy:
    """Pick each round's gamma in 0..max_gamma to maximise predicted tokens per second.

    Estimates, from the rounds it observes:

    * ``c_i``: P(the drafter proposes a token at position i and the target
      accepts it | drafts 0..i-1 were accepted). A drafter that stops before
      position i counts as a miss (that round yields no token there).
    * ``q_i``: P(the drafter proposes position i | it proposed 0..i-1), so an
      n-gram drafter that often knows no continuation is predicted to draft,
      and to cost, less than it is asked for.
    * costs: seconds per drafter step, target verify seconds by width (tokens
      fed at once: drafts + 1), and other host seconds per round (wall time
      between two observed rounds minus their draft and verify time).

    A round of gamma drafts yields, in expectation (Leviathan et al. 2023, sec. 3,
    with a rate per position)

        E(gamma) = sum_{i=0..gamma} prod_{j<i} c_j   tokens,

    and costs draft_step * D + E[verify(1 + drafted)] + other, with D the
    expected drafted count from q. The policy picks the gamma with the largest
    E / cost; gamma = 0 (a plain target step) wins when verifying more tokens
    costs more than the accepted drafts save (the usual NASD case on a CPU for
    prompts that do not repeat themselves).

    Rates start at a prior (``prior`` with ``prior_weight`` pseudo-trials at
    position 0; each later position is shrunk toward the estimate before it,
    so positions never reached borrow the last measured rate). Verify costs at
    widths not measured yet are interpolated or extrapolated by
    ``analysis.speedup.CostModel``. The first rounds try a few widths
    (``probes``) so the cost curve is learned early; after that every
    ``explore_every``-th round tries a neighbour of the current choice
    (gamma + 1 and gamma - 1 in turn), which keeps the costs around the choice
    fresh and lets acceptance that has risen (or fallen) be noticed, and every
    ``reprobe_every``-th round tries the next probe width again. A width's
    verify cost is the median of its last five measurements, so one slow
    forward does not mislead it for long. A model drafter that skipped rounds
    must catch up on the skipped tokens when it drafts again, so while not
    drafting is best for a model drafter the policy looks (gamma 1) ever more
    rarely and does not re-probe (see ``_idle``). For an n-gram drafter a look
    is cheap, so while not drafting is best it looks every 4 to 8 rounds
    (``_ngram_idle``); and since copied passages make acceptance come in runs,
    after an n-gram round whose drafts were all accepted it asks for at least
    one more draft than that round had.

    What it learned persists across generations (the costs belong to the
    machine and the models); acceptance, which belongs to the prompt, keeps a
    quarter of its weight at each new generation; a new drafter kind starts it
    afresh. The first round of each generation carries the prompt's prefill,
    so its times are not used, and with an n-gram drafter it asks for at least
    ``FIRST_LOOK`` drafts: verifying them inside the prefill costs next to
    nothing and shows how well the storage knows this prompt. ``clock`` measures the wall time between rounds (None: other host
    work counts as zero, for simulations).
    """

    name = "model"
    threshold = None
    TABLE_REFRESH = 8       # rounds between rebuilds of the verify-cost table
    MAX_IDLE_GAP = 512      # the longest a model drafter goes without a look when it does not pay
    CARRY = 0.25            # weight kept from earlier prompts' acceptance counts at each begin
    FIRST_LOOK = 8          # n-gram drafts asked in a generation's first (prefill) round
    NGRAM_LOOK_GAP = 4      # rounds between looks at gamma 1 while n-gram drafts do not pay...
    NGRAM_MAX_GAP = 8      # ...growing to this while the looks keep failing

    def __init__(self, max_gamma: int = 16, *, probes: tuple[int, ...] = (1, 2, 4, 8, 0),
                 explore_every: int = 16, reprobe_every: int = 128, decay: float = 0.98,
                 cost_alpha: float = 0.2,
                 prior: float = 0.5, prior_weight: float = 2.0,
                 clock: Callable[[], float] | None = time.perf_counter):
        self.max_gamma = max_gamma
        self.probes = tuple(g for g in probes if 0 <= g <= max_gamma)
        self.explore_every = explore_every
        self.reprobe_every = reprobe_every
        self.decay = decay
        self.cost_alpha = cost_alpha
        self.prior = prior
        self.prior_weight = prior_weight
        self.clock = clock
        self.kind: str | None = None
        self._reset()

    def _reset(self) -> None:
        self.accept = [Rate() for _ in range(self.max_gamma)]     # c_i
        self.propose = [Rate() for _ in range(self.max_gamma)]    # q_i
        self.verify_s: dict[int, Recent] = {}
        self.draft_step_s = Mean()
        self.other_s = Mean()
        self.rounds = 0               # observed over the policy's life
        self._round_in_generation = 0
        self._last_mark: float | None = None
        self._asked_none = False
        self._pending_probes = list(self.probes)
        self._reprobe_turn = 0
        self._chosen = 0              # rounds it chose for (not the first of a generation, no probe)
        self._explore_turn = 0
        self._idle_wait, self._idle_gap = 0, self.explore_every
        self._ngram_wait, self._ngram_gap, self._looking = 0, self.NGRAM_LOOK_GAP, False
        self._run = 0                 # drafts of the last round when all were accepted, else 0
        self._drafter_warm = False
        self._choice = 0
        self._table: list[float] | None = None      # verify seconds by width, 1..max+1

    # ---------------------------------------------------------------- the loop's interface

    def begin(self, drafter_kind: str) -> None:
        check_kind(drafter_kind)
        if drafter_kind != self.kind:
            self.kind = drafter_kind
            self._reset()
        for rate in self.accept + self.propose:     # a new prompt: its own rounds soon dominate
            rate.scale(self.CARRY)
        self._round_in_generation = 0
        self._last_mark = None
        self._run = 0
        self._drafter_warm = False    # the drafter has drafted in this generation (its cache holds the prompt)

    def next_gamma(self) -> int:
        if self._round_in_generation == 0:
            # The first round's target forward is the prompt's prefill: a few more tokens
            # in it cost next to nothing, so n-gram drafts are a free look at acceptance.
            best = self._exploit()
            return max(best, min(self.FIRST_LOOK, self.max_gamma)) if self.kind == "ngram" else best
        if self._pending_probes:
            return self._pending_probes.pop(0)
        gamma = self._choose()
        if self.kind == "ngram" and self._run:
            # Acceptance comes in runs (a passage being copied): after a round whose
            # drafts were all accepted, ask for at least one more than it drafted.
            gamma = max(gamma, min(self._run + 1, self.max_gamma))
        return gamma

    def _choose(self) -> int:
        """The exploiting choice, or now and then an exploring one."""
        best = self._exploit()
        self._chosen += 1
        if best == 0:
            return self._idle() if self.kind == "model" else self._ngram_idle()
        self._idle_wait, self._idle_gap = 0, self.explore_every
        self._ngram_gap = self.NGRAM_LOOK_GAP
        if self.reprobe_every and self.probes and self._chosen % self.reprobe_every == 0:
            self._reprobe_turn += 1
            return self.probes[(self._reprobe_turn - 1) % len(self.probes)]
        if self.explore_every and self._chosen % self.explore_every == 0:
            return self._neighbour(best)
        return best

    def observe(self, rnd: Round) -> None:
        now = self.clock() if self.clock is not None else None
        self._learn_acceptance(rnd)
        if self._round_in_generation > 0:
            self._learn_costs(rnd, now)
        self._last_mark = now
        drafted = len(rnd.drafted)
        self._drafter_warm = self._drafter_warm or drafted > 0
        if self._looking and drafted:
            accepted = rnd.accepted > 0
            self._ngram_gap = (self.NGRAM_LOOK_GAP if accepted
                               else min(2 * self._ngram_gap, self.NGRAM_MAX_GAP))
        self._looking = False
        self._run = drafted if drafted and rnd.accepted == drafted and rnd.token is not None else 0
        self._asked_none = drafted == 0
        self._round_in_generation += 1
        self.rounds += 1

    # ---------------------------------------------------------------- what it predicts

    def rates(self) -> list[float]:
        """c_0..c_{max-1}: each shrunk toward the one before (position 0 toward the prior)."""
        out, prior = [], self.prior
        for rate in self.accept:
            prior = rate.value(prior, self.prior_weight)
            out.append(prior)
        return out

    def propose_rates(self) -> list[float]:
        """q_0..q_{max-1}, shrunk the same way from a prior of 1 (drafters draft when asked)."""
        out, prior = [], 1.0
        for rate in self.propose:
            prior = rate.value(prior, self.prior_weight)
            out.append(prior)
        return out

    def cost_model(self) -> CostModel | None:
        """The measured costs, or None before any verify time was measured."""
        if not self.verify_s:
            return None
        return CostModel(draft_step_s=self.draft_step_s.value,
                         verify_s={w: m.value for w, m in self.verify_s.items()},
                         other_per_round_s=self.other_s.value)

    def predicted(self) -> list[float]:
        """Predicted tokens per second for gamma = 0..max_gamma ([] before any cost is known)."""
        if not self.verify_s:
            return []
        if self._table is None:
            costs = self.cost_model()
            self._table = [costs.verify(w) for w in range(1, self.max_gamma + 2)]
        return throughput_by_gamma(self.rates(), self.propose_rates(), self._table,
                                   draft_step_s=self.draft_step_s.value, other_s=self.other_s.value)

    def best(self) -> tuple[int, float]:
        """(gamma, predicted tokens/s) of the exploiting choice; ties go to the smaller gamma."""
        speeds = self.predicted()
        if not speeds:
            return min(self.max_gamma, 4), 0.0
        gamma = max(range(len(speeds)), key=lambda g: (speeds[g], -g))
        return gamma, speeds[gamma]

    # ---------------------------------------------------------------- learning

    def _exploit(self) -> int:
        self._choice = self.best()[0]
        return self._choice

    def _idle(self) -> int:
        """Gamma while not drafting pays for a model drafter: 0, and now and then 1.

        Each look (gamma 1) makes the drafter catch up on every token it skipped,
        so the looks grow rarer while they keep confirming 0: after 16 rounds,
        then 32, 64, ... at most ``MAX_IDLE_GAP``. In a generation where the
        drafter has not drafted yet, a look would make it prefill the whole
        prompt (on a CPU without native bfloat16, seconds for a bf16 drafter),
        so there it does not look at all.
        """
        if not self._drafter_warm:
            return 0
        self._idle_wait += 1
        if not self.explore_every or self._idle_wait < self._idle_gap:
            return 0
        self._idle_wait = 0
        self._idle_gap = min(2 * self._idle_gap, self.MAX_IDLE_GAP)
        return 1

    def _ngram_idle(self) -> int:
        """Gamma while n-gram drafts do not pay: 0, and every few rounds a look at 1.

        A look costs nothing when the storage knows no continuation and one
        wider verify when it drafts; looks whose draft was rejected double the
        gap (4, 8, ... at most ``NGRAM_MAX_GAP`` rounds), an accepted one resets it,
        so a passage starting to repeat is noticed within a few rounds.
        """
        self._ngram_wait += 1
        if self._ngram_wait < self._ngram_gap:
            return 0
        self._ngram_wait = 0
        self._looking = True
        return 1

    def _neighbour(self, best: int) -> int:
        self._explore_turn += 1
        step = 1 if self._explore_turn % 2 else -1
        other = best + step
        if not 0 <= other <= self.max_gamma:
            other = best - step
        return min(max(other, 0), self.max_gamma)

    def _learn_acceptance(self, rnd: Round) -> None:
        asked = min(rnd.gamma, self.max_gamma)
        drafted = len(rnd.drafted)
        for i in range(min(asked, self.max_gamma)):          # q_i: was position i proposed?
            self.propose[i].add(i < drafted, self.decay)
            if i >= drafted:
                break
        for i in range(min(rnd.accepted, self.max_gamma)):   # c_i: accepted drafts
            self.accept[i].add(True, self.decay)
        first_miss = rnd.accepted
        # The round yielded nothing at first_miss when the draft there was rejected or
        # the drafter stopped before it; an end token or the budget cut says nothing.
        if rnd.token is not None and first_miss < min(asked, self.max_gamma):
            self.accept[first_miss].add(False, self.decay)

    def _learn_costs(self, rnd: Round, now: float | None) -> None:
        drafted = len(rnd.drafted)
        width = drafted + 1
        if rnd.verify_s > 0:
            self.verify_s.setdefault(width, Recent()).add(rnd.verify_s)
        # After a round without drafts a model drafter first catches up on the tokens it
        # skipped, in the same forward as its first draft: that round's draft time is
        # not the price of its drafts.
        caught_up = self.kind == "model" and self._asked_none
        if drafted and rnd.draft_s > 0 and not caught_up:
            self.draft_step_s.add(rnd.draft_s / drafted, self.cost_alpha)
        if now is not None and self._last_mark is not None:
            other = max(0.0, now - self._last_mark - rnd.draft_s - rnd.verify_s)
            self.other_s.add(other, self.cost_alpha)
        # The verify table is rebuilt when a width is measured for the first time and
        # every few rounds after that (costs drift slowly; rebuilding costs ~50 us).
        if self.verify_s.get(width) is not None and self.verify_s[width].count == 1:
            self._table = None
        elif self.rounds % self.TABLE_REFRESH == 0:
            self._table = None
