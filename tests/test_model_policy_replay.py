"""The model gamma policy replayed on long synthetic runs: its choices must not change.

A characterisation test. Each scenario drives a ``ModelPolicy`` through
hundreds of rounds (model and n-gram drafters, accepted and rejected drafts,
drafters that stop early, end tokens, length-budget caps, stretches where not
drafting is best, several ``begin`` calls and drafter switches) with a
deterministic fake clock, and compares every gamma it asked for, and its final
predictions, with ``tests/data/model_policy_replay.json``. That file was
recorded from the policy as it stood before it was split into parts; rewrite
it (``python -m tests.test_model_policy_replay --record``) only for a change
of behaviour that is meant.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from generation.gamma_policies import ModelPolicy, estimates
from generation.result import Round

DATA = Path(__file__).parent / "data" / "model_policy_replay.json"

# A world: (accept, propose, draft_step_s, verify_base_s, verify_slope, host_s, p_end).
GOOD_MODEL = (0.8, 1.0, 0.02, 0.10, 0.05, 0.004, 0.03)
BAD_MODEL = (0.1, 1.0, 0.30, 0.10, 0.30, 0.004, 0.0)
COPYING = (0.97, 0.9, 0.0005, 0.10, 0.08, 0.002, 0.02)
FREE_TEXT = (0.05, 0.3, 0.0005, 0.10, 0.7, 0.002, 0.0)
MIXED = (0.55, 0.7, 0.01, 0.10, 0.15, 0.003, 0.05)

# name -> (max_gamma, keyword arguments, fake clock?, generations: (kind, rounds, world))
SCENARIOS = {
    "model_good_then_idle": (8, {}, True, [
        ("model", 220, GOOD_MODEL), ("model", 1100, BAD_MODEL), ("model", 90, BAD_MODEL),
        ("model", 150, GOOD_MODEL), ("model", 120, MIXED)]),
    "ngram_copying_and_free": (16, {}, False, [
        ("ngram", 260, FREE_TEXT), ("ngram", 140, COPYING), ("ngram", 200, FREE_TEXT),
        ("ngram", 80, MIXED), ("ngram", 160, COPYING)]),
    "switching_kinds": (4, dict(probes=(1, 3, 0, 9), explore_every=5, reprobe_every=7, decay=0.9,
                                cost_alpha=0.5, prior=0.3, prior_weight=1.0), True, [
        ("model", 40, MIXED), ("ngram", 30, COPYING), ("ngram", 35, FREE_TEXT),
        ("model", 50, BAD_MODEL), ("model", 25, GOOD_MODEL), ("ngram", 45, MIXED),
        ("model", 30, MIXED)]),
    "no_exploration": (6, dict(probes=(), explore_every=0, reprobe_every=0), True, [
        ("model", 120, MIXED), ("model", 200, BAD_MODEL), ("ngram", 150, FREE_TEXT),
        ("ngram", 120, COPYING)]),
}


def _play_round(rng, k, first, world):
    """One synthetic round asked for k drafts: (Round, seconds it took on the fake clock)."""
    accept, propose, draft_step, verify_base, slope, host, p_end = world
    drafted = 0
    while drafted < k and rng.random() < propose:
        drafted += 1
    accepted = 0
    while accepted < drafted and rng.random() < accept:
        accepted += 1
    token = None if rng.random() < p_end else 7       # an end token inside the accepted drafts
    spike = 20.0 if rng.random() < 0.02 else 1.0      # another process stole a forward
    verify_s = verify_base * (1 + slope * drafted) * spike + (5.0 if first else 0.0)
    if rng.random() < 0.01:
        verify_s = 0.0                                # an untimed round
    draft_s = draft_step * drafted * (1.0 + 0.1 * rng.random())
    rnd = Round(tuple(range(drafted)), accepted, token, token is not None and accepted == drafted > 0,
                k, draft_s, verify_s)
    return rnd, draft_s + verify_s + host * (1 + rng.random())


def replay(name, make=ModelPolicy):
    """Drive one scenario; returns what the policy chose and, at the end, predicted."""
    max_gamma, kwargs, timed, generations = SCENARIOS[name]
    now = [1000.0]
    policy = make(max_gamma, clock=(lambda: now[0]) if timed else None, **kwargs)
    rng = random.Random(name)
    asked = []
    for kind, rounds, world in generations:
        policy.begin(kind)
        for r in range(rounds):
            k = policy.next_gamma()
            asked.append(k)
            if r == rounds - 1:
                k = min(k, rng.randrange(3))          # the length budget caps the last round
            rnd, seconds = _play_round(rng, k, r == 0, world)
            now[0] += seconds
            policy.observe(rnd)
    gamma, speed = policy.best()
    return {"asked": asked, "best": [gamma, speed], "predicted": policy.predicted(),
            "rates": policy.rates(), "propose_rates": policy.propose_rates(), "rounds": policy.rounds}


def _recorded():
    return json.loads(DATA.read_text())


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_model_policy_replays_exactly_as_recorded(name):
    got, want = replay(name), _recorded()[name]
    first = next((i for i, (a, b) in enumerate(zip(got["asked"], want["asked"])) if a != b), None)
    assert first is None, f"gamma differs first at round {first}"
    assert got == want          # floats too: the same arithmetic in the same order


def test_scenarios_cover_what_the_policy_does():
    """The runs hold idle stretches, long drafts, probes and every width up to the cap."""
    for name, (max_gamma, _, _, _) in SCENARIOS.items():
        asked = _recorded()[name]["asked"]
        assert asked.count(0) >= 20 and max(asked) == max_gamma, name
        assert len(set(asked)) >= min(max_gamma + 1, 6), name


@pytest.mark.parametrize("change", [
    dict(decay=0.97), dict(prior=0.45), dict(prior_weight=2.5), dict(cost_alpha=0.25),
    dict(explore_every=17), dict(reprobe_every=127), dict(probes=(1, 2, 4, 0)),
])
def test_replay_notices_a_changed_setting(change):
    """Mutation check: the recorded runs have the power to tell a slightly different policy."""
    want = _recorded()
    def make(max_gamma, **kwargs):
        return ModelPolicy(max_gamma, **{**kwargs, **change})
    assert any(replay(name, make) != want[name] for name in SCENARIOS)


def test_replay_notices_a_changed_verify_median(monkeypatch):
    """Mutation check on the estimates: a median over 4 samples instead of 5."""
    init = estimates.Recent.__init__
    monkeypatch.setattr(estimates.Recent, "__init__", lambda self, keep=5: init(self, keep - 1))
    want = _recorded()
    assert any(replay(name)["asked"] != want[name]["asked"] for name in SCENARIOS)


if __name__ == "__main__" and sys.argv[1:] == ["--record"]:
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps({name: replay(name) for name in sorted(SCENARIOS)}) + "\n")
    print(f"wrote {DATA}")
