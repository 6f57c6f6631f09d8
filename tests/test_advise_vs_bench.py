"""``scripts/advise_vs_bench.py``'s fresh runs: which methods it runs again, in which order, and the
speedups it works out from those runs alone (the benchmark's best read on fresh runs, not on the
runs that chose it)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

import engine
from advisor.advise import WARM_TOKENS
from scripts import advise_vs_bench as avb


@dataclass(frozen=True)
class FakeMethod:
    """A grid point: its key, and a strategy that says which method and length it runs."""

    key: str

    def strategy(self, **fields):
        return ("method", self.key, fields["max_gen_len"])


@dataclass
class FakeResult:
    """What ``advisor.advise.Timing.add`` reads of a run."""

    tokens: list
    seconds: float
    target_calls: int = 1
    decode_seconds: float | None = None
    first_tokens: int = 1
    first_token_s: float | None = None


@dataclass
class Runs:
    """A stand-in for ``engine.run_strategy``: each run's (what, prompt) in order, and seconds per token by method."""

    per_token_s: dict
    seen: list = field(default_factory=list)

    def __call__(self, strategy, pair, prompt, state=None):
        key = "target" if not isinstance(strategy, tuple) else strategy[1]
        length = strategy.max_gen_len if key == "target" else strategy[2]
        self.seen.append((key, prompt[0], length))
        return FakeResult(tokens=list(range(length)), seconds=self.per_token_s[key][prompt[0]] * length)


def test_recheck_warms_then_runs_target_ar_first_and_turns_the_methods_each_prompt(monkeypatch):
    methods = [FakeMethod("a"), FakeMethod("b"), FakeMethod("c")]
    prompts = [[0], [1]]
    per_token = {"target": {0: 0.10, 1: 0.20}, "a": {0: 0.05, 1: 0.10}, "b": {0: 0.04, 1: 0.16},
                 "c": {0: 0.10, 1: 0.10}}
    runs = Runs(per_token)
    monkeypatch.setattr(engine, "run_strategy", runs)
    out = avb.recheck(None, prompts, methods, 16, state=None, passes=2)
    assert runs.seen[:3] == [("a", 0, WARM_TOKENS), ("b", 0, WARM_TOKENS), ("c", 0, WARM_TOKENS)]
    timed = [(k, p) for k, p, n in runs.seen[3:]]
    assert all(n == 16 for _, _, n in runs.seen[3:])
    # each prompt: target AR, then the methods with their order turned by one from the prompt before
    assert timed == [("target", 0), ("a", 0), ("b", 0), ("c", 0),
                     ("target", 1), ("b", 1), ("c", 1), ("a", 1),
                     ("target", 0), ("c", 0), ("a", 0), ("b", 0),
                     ("target", 1), ("a", 1), ("b", 1), ("c", 1)]
    # speedups over the target AR runs of the recheck: tokens over seconds pooled over prompts and passes
    ar_rate = 64 / (2 * 16 * (0.10 + 0.20))
    for key in "abc":
        rate = 64 / (2 * 16 * (per_token[key][0] + per_token[key][1]))
        assert out[key]["speedup"] == pytest.approx(rate / ar_rate)
    assert out["target"]["speedup"] == 1.0
    # decisive: pooled over the runs "b" is 1.5x; the mean of its per-prompt ratios would be 1.875x
    assert out["a"]["speedup"] == pytest.approx(2.0) and out["b"]["speedup"] == pytest.approx(1.5)


def test_recheck_runs_the_benchmarks_three_best_and_the_first_pick_once_each():
    grid = [FakeMethod(k) for k in ("p", "q", "r", "s", "t")]
    rows = {"target": {"speedup": 1.0}, "p": {"speedup": 1.2}, "q": {"speedup": 1.6}, "r": {"speedup": 1.5},
            "s": {"speedup": 1.4}, "t": {"speedup": None}}
    assert [m.key for m in avb.recheck_methods(grid, rows, "p")] == ["q", "r", "s", "p"]
    assert [m.key for m in avb.recheck_methods(grid, rows, "r")] == ["q", "r", "s"]
    assert [m.key for m in avb.recheck_methods(grid, rows, "t")] == ["q", "r", "s", "t"]
