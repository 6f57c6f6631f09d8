"""A goodness-of-fit test for sampled tokens against an exactly known distribution.

Pearson's chi-square with sparse outcomes pooled, and its p-value from the
regularised upper incomplete gamma function (``torch.special.gammaincc``). Used by the
architecture tests and the self-test, so both judge sampling the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass

import torch

# Outcomes expected fewer times than this are pooled into one bin.
MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class FitResult:
    """The outcome of comparing sampled counts with exact probabilities. ``impossible``: outcomes
    sampled although their probability is 0 (proof of a wrong sampler: p-value 0); ``worst``: the
    outcome furthest from its expectation in standard deviations, observed and expected."""

    statistic: float
    dof: int
    p_value: float
    samples: int
    impossible: tuple = ()
    worst: tuple = ()

    def describe(self, name: Callable[[Hashable], str] = repr) -> str:
        """One line: the test's result and the most deviant outcome, written by ``name``
        (``repr`` of the outcome by default; the self-test gives the decoded text)."""
        if self.impossible:
            return f"sampled {name(self.impossible[0])}, which has probability 0 under the target"
        text = f"chi-square {self.statistic:.1f} on {self.dof} dof, p = {self.p_value:.2g}"
        if self.worst:
            outcome, observed, expected = self.worst
            text += f"; {name(outcome)} drawn {observed} times, {expected:.1f} expected"
        return text


def chi_square_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square with ``dof`` degrees of freedom: Q(dof/2, statistic/2),
    the regularised upper incomplete gamma function."""
    if dof <= 0 or statistic <= 0:
        return 1.0
    a = torch.tensor(dof / 2.0, dtype=torch.float64)
    return torch.special.gammaincc(a, torch.tensor(statistic / 2.0, dtype=torch.float64)).item()


def goodness_of_fit(counts: Mapping[Hashable, int], exact: Mapping[Hashable, float]) -> FitResult:
    """Compare sampled ``counts`` with their ``exact`` probabilities; outcomes expected fewer than
    MIN_EXPECTED times are pooled into one bin."""
    n = sum(counts.values())
    if n == 0:
        raise ValueError("no samples to test")
    impossible = tuple(k for k, c in counts.items() if c > 0 and exact.get(k, 0.0) <= 0.0)
    if impossible:
        return FitResult(math.inf, 0, 0.0, n, impossible=impossible)
    statistic, bins = 0.0, 0
    pooled_obs, pooled_exp = 0, 0.0
    worst, worst_z = (), -1.0
    for outcome, prob in exact.items():
        expected = prob * n
        observed = counts.get(outcome, 0)
        if expected < MIN_EXPECTED:
            pooled_obs += observed
            pooled_exp += expected
            continue
        statistic += (observed - expected) ** 2 / expected
        bins += 1
        z = abs(observed - expected) / math.sqrt(expected)
        if z > worst_z:
            worst, worst_z = (outcome, observed, expected), z
    if pooled_exp > 0:
        statistic += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        bins += 1
    dof = bins - 1
    return FitResult(statistic, dof, chi_square_sf(statistic, dof), n, worst=worst)
