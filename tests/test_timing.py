"""``generation.timing.time_target``: a width's cost as a ratio to the one-token step, and what a
machine whose speed moves between forwards does to it.

The forwards here are given, not timed: a fake cache records each forward's width and a fake clock
charges it a fixed cost times a drift that grows with every forward (a machine slowing by 4% a
forward, as a busy neighbour arrives). Bracketed, each width's ratio is to the mean of the steps
timed just before and after it, and a steady drift cancels to the last digit; timed against the
turn's one step, the same drift reads every width too dear, the more so the later it comes.
"""

from __future__ import annotations

import pytest
import torch

import generation.timing
from generation.timing import time_target

COST = {1: 1.0, 2: 1.3, 3: 1.5, 4: 1.9, 5: 2.0}      # seconds of each width at the machine's first speed
DRIFT = 0.04                                          # each forward 4% slower than the one before


class FakeCache:
    def __init__(self):
        self.widths: list[int] = []

    def begin(self, ids):
        pass

    def checkpoint(self):
        pass

    def rollback(self, length):
        pass

    def forward(self, ids, keep):
        self.widths.append(keep)


@pytest.fixture
def drifting(monkeypatch):
    cache = FakeCache()

    def timed(fn, model):
        fn()
        return COST[cache.widths[-1]] * (1 + DRIFT * (len(cache.widths) - 1))

    monkeypatch.setattr(generation.timing, "cached_model", lambda target: cache)
    monkeypatch.setattr(generation.timing, "timed", timed)
    return cache


def ratios(timing) -> dict[int, float]:
    return {w: s / timing.verify_s[1] for w, s in timing.verify_s.items()}


def test_bracketed_widths_keep_their_ratio_on_a_drifting_machine(drifting):
    timing = time_target(object(), torch.tensor([[1, 2, 3]]), widths=(1, 2, 3, 4, 5), repeats=3, bracketed=True)
    assert ratios(timing) == pytest.approx({w: c / COST[1] for w, c in COST.items()}, rel=1e-12)
    # the prefill, then 4 turns of a step before the first width and one after each width
    assert drifting.widths == [1] + [1, 2, 1, 3, 1, 4, 1, 5, 1] * 4
    assert len(timing.step_samples) == 3


def test_mutation_ratios_to_the_turns_one_step_read_the_drift(drifting):
    # The same machine timed as before bracketing: every width over its turn's first step. Its
    # ratios take in the drift since that step (width 5, four forwards later, reads about 16% dear).
    timing = time_target(object(), torch.tensor([[1, 2, 3]]), widths=(1, 2, 3, 4, 5), repeats=3)
    off = {w: r / (COST[w] / COST[1]) - 1 for w, r in ratios(timing).items() if w > 1}
    assert min(off.values()) > 0.02 and off[5] > 0.10
    assert drifting.widths == [1] + [1, 2, 3, 4, 5] * 4
