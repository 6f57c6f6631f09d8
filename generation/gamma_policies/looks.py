"""How the model policy looks at drafting while not drafting is best, per drafter kind."""

from __future__ import annotations

from generation.result import Round

FIRST_LOOK = 8          # n-gram drafts asked in a generation's first (prefill) round
MAX_IDLE_GAP = 512      # the longest a model drafter goes without a look when it does not pay
NGRAM_LOOK_GAP = 4      # rounds between looks at gamma 1 while n-gram drafts do not pay...
NGRAM_MAX_GAP = 8       # ...growing to this while the looks keep failing


class ModelLooks:
    """A model drafter: while not drafting is best, gamma 0, and now and then 1.

    Each look makes the drafter catch up on every token it skipped, so looks grow rarer while they
    confirm 0: after ``explore_every`` (16) rounds, then 32, 64, ... up to ``MAX_IDLE_GAP``. No look in a
    generation where the drafter has not drafted yet (it would prefill the whole prompt).
    """

    def __init__(self, explore_every: int, max_gamma: int):
        self.explore_every = explore_every
        self._wait, self._gap = 0, explore_every
        self._warm = False      # the drafter has drafted in this generation (its cache holds the prompt)

    def begin(self) -> None:
        self._warm = False

    def first(self, best: int) -> int:
        return best

    def idle(self) -> int:
        if not self._warm:
            return 0
        self._wait += 1
        if not self.explore_every or self._wait < self._gap:
            return 0
        self._wait = 0
        self._gap = min(2 * self._gap, MAX_IDLE_GAP)
        return 1

    def drafting(self) -> None:
        """Drafting pays again: the looks start from the shortest gap next time."""
        self._wait, self._gap = 0, self.explore_every

    def extend(self, gamma: int) -> int:
        return gamma

    def observe(self, rnd: Round) -> None:
        self._warm = self._warm or len(rnd.drafted) > 0


class NgramLooks:
    """An n-gram drafter: looks are cheap, and acceptance comes in runs.

    While n-gram drafts do not pay, a look at gamma 1 every few rounds (free when the storage knows no
    continuation); a rejected look doubles the gap (``NGRAM_LOOK_GAP`` up to ``NGRAM_MAX_GAP``), an
    accepted one resets it. After a fully accepted round it asks for one draft more than that round had.
    A generation's first round asks for at least ``FIRST_LOOK`` drafts: verified inside the prefill,
    they cost next to nothing and show how well the storage knows the prompt.
    """

    def __init__(self, explore_every: int, max_gamma: int):
        self.max_gamma = max_gamma
        self._wait, self._gap, self._looking = 0, NGRAM_LOOK_GAP, False
        self._run = 0           # drafts of the last round when all were accepted, else 0

    def begin(self) -> None:
        self._run = 0

    def first(self, best: int) -> int:
        return max(best, min(FIRST_LOOK, self.max_gamma))

    def idle(self) -> int:
        self._wait += 1
        if self._wait < self._gap:
            return 0
        self._wait = 0
        self._looking = True
        return 1

    def drafting(self) -> None:
        self._gap = NGRAM_LOOK_GAP

    def extend(self, gamma: int) -> int:
        """At least one more draft than a fully accepted last round had (a passage being copied)."""
        return max(gamma, min(self._run + 1, self.max_gamma)) if self._run else gamma

    def observe(self, rnd: Round) -> None:
        drafted = len(rnd.drafted)
        if self._looking and drafted:
            self._gap = NGRAM_LOOK_GAP if rnd.accepted > 0 else min(2 * self._gap, NGRAM_MAX_GAP)
        self._looking = False
        self._run = drafted if drafted and rnd.accepted == drafted and rnd.token is not None else 0


LOOKS = {"model": ModelLooks, "ngram": NgramLooks}
