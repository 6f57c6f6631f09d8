"""What the model policy knows about acceptance: the rates c_i and q_i, position by position."""

from __future__ import annotations

from generation.gamma_policies.estimates import Rate
from generation.result import Round


def _shrunk(counts: list[Rate], prior: float, weight: float) -> list[float]:
    """Each rate shrunk toward the one before it (the first toward ``prior``), so
    positions never reached borrow the last measured rate."""
    out = []
    for rate in counts:
        prior = rate.value(prior, weight)
        out.append(prior)
    return out


class Acceptance:
    """Per-position acceptance, learned from the rounds observed.

    ``c_i``: P(draft i proposed and accepted | drafts 0..i-1 accepted), a drafter that stopped before i
    counting as a miss; ``q_i``: P(draft i proposed | 0..i-1 proposed), so a drafter that often knows
    no continuation is predicted to draft, and cost, less. The per-position version of Leviathan et al.
    2023's alpha (sec. 3). Counts decay by ``decay`` per trial; c_0 starts at ``prior``; at each new
    prompt the counts keep ``CARRY`` of their weight (acceptance belongs to the prompt).
    """

    CARRY = 0.25            # weight kept from earlier prompts' acceptance counts at each begin

    def __init__(self, max_gamma: int, *, decay: float, prior: float, prior_weight: float):
        self.decay, self.prior, self.prior_weight = decay, prior, prior_weight
        self.accept = [Rate() for _ in range(max_gamma)]     # c_i
        self.propose = [Rate() for _ in range(max_gamma)]    # q_i

    def new_prompt(self) -> None:
        """A new prompt: its own rounds soon dominate what earlier prompts taught."""
        for rate in self.accept + self.propose:
            rate.scale(self.CARRY)

    def learn(self, rnd: Round) -> None:
        asked = min(rnd.gamma, len(self.accept))
        drafted = len(rnd.drafted)
        for i in range(asked):                              # q_i: was position i proposed?
            self.propose[i].add(i < drafted, self.decay)
            if i >= drafted:
                break
        for i in range(min(rnd.accepted, len(self.accept))):   # c_i: accepted drafts
            self.accept[i].add(True, self.decay)
        first_miss = rnd.accepted
        # The round yielded nothing at first_miss when the draft there was rejected or
        # the drafter stopped before it; an end token or the budget cut says nothing.
        if rnd.token is not None and first_miss < asked:
            self.accept[first_miss].add(False, self.decay)

    def rates(self) -> list[float]:
        """c_0..c_{max-1}: each shrunk toward the one before (position 0 toward the prior)."""
        return _shrunk(self.accept, self.prior, self.prior_weight)

    def propose_rates(self) -> list[float]:
        """q_0..q_{max-1}, shrunk the same way from a prior of 1 (drafters draft when asked)."""
        return _shrunk(self.propose, 1.0, self.prior_weight)
