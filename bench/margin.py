"""How far a measured speed ratio could move on a rerun of the same prompts: a margin from the repeats.

A variant's run and its partner's of the same prompt and repeat form one pair. With the ratio
R = (N_A / S_A) / (N_B / S_B) over all paired runs, the delta method gives

    log R - log R_true ≈ Σ_runs z,   z = n_A / N_A - s_A / S_A - n_B / N_B + s_B / S_B,

with variance Σ_prompts K_p · var_p(z) over each prompt's K_p repeats. The margin is a Student-t
quantile (Σ (K_p - 1) degrees of freedom) times its square root: the interval is
ratio · exp(±margin); None with one repeat. It says nothing about other machines or prompts.
"""

from __future__ import annotations

import functools
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence

from bench.records import RunRecord

LEVEL = 0.95


# Past this many degrees of freedom the Cornish-Fisher expansion is exact to 1e-6.
_EXPANSION_DF = 300


def t_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with an integer ``df``: the finite series of Abramowitz and
    Stegun 26.7.3-4 in θ = atan(t / √df) (exact; about df / 2 terms)."""
    theta = math.atan(t / math.sqrt(df))
    sin, cos2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:   # 2/π (θ + sin θ (cos θ + 2/3 cos³θ + ... + 2·4···(df-3) / 1·3···(df-2) cos^(df-2) θ))
        term = total = math.cos(theta) if df > 1 else 0.0
        for k in range(3, df - 1, 2):
            term *= cos2 * (k - 1) / k
            total += term
        return 2 / math.pi * (theta + sin * total)
    term = total = 1.0   # sin θ (1 + 1/2 cos²θ + ... + 1·3···(df-3) / 2·4···(df-2) cos^(df-2) θ)
    for k in range(2, df - 1, 2):
        term *= cos2 * (k - 1) / k
        total += term
    return sin * total


@functools.lru_cache(maxsize=1024)
def t_quantile(p: float, df: int) -> float:
    """The p-quantile of Student's t with ``df`` degrees of freedom (0.5 < p < 1): :func:`t_within`
    inverted by bisection up to 300 (exact to 1e-9), beyond it the Cornish-Fisher expansion in 1/df."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    if df <= _EXPANSION_DF:
        target, low, high = 2 * p - 1, 0.0, 1.0
        while t_within(high, df) < target and high < 1e15:   # the bound: p a rounding step from 1
            low, high = high, 2 * high
        while high - low > 1e-9 * high:
            middle = (low + high) / 2
            low, high = (middle, high) if t_within(middle, df) < target else (low, middle)
        return (low + high) / 2
    z = statistics.NormalDist().inv_cdf(p)
    terms = ((z ** 3 + z) / 4,
             (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
             (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
             (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
    return z + sum(term / df ** (i + 1) for i, term in enumerate(terms))


def paired_runs(mine: Iterable[RunRecord], base: Iterable[RunRecord]) -> list[tuple[RunRecord, RunRecord]]:
    """(mine, base) run pairs of the same prompt and repeat; a run without a partner is left out."""
    partner = {r.key: r for r in base}
    return [(r, partner[r.key]) for r in mine if r.key in partner]


def log_ratio_margin(pairs: Sequence[tuple[RunRecord, RunRecord]], level: float = LEVEL) -> float | None:
    """The half-width, on the log scale, of the ``level`` interval of the pooled tokens/s ratio of
    ``pairs`` (module docstring); None without a prompt run at least twice, or without time."""
    tokens_a = sum(a.n_tokens for a, _ in pairs)
    tokens_b = sum(b.n_tokens for _, b in pairs)
    seconds_a = sum(a.seconds for a, _ in pairs)
    seconds_b = sum(b.seconds for _, b in pairs)
    if not (tokens_a and tokens_b and seconds_a > 0 and seconds_b > 0):
        return None
    by_prompt: dict[tuple, list[float]] = defaultdict(list)
    for a, b in pairs:
        z = a.n_tokens / tokens_a - a.seconds / seconds_a - b.n_tokens / tokens_b + b.seconds / seconds_b
        by_prompt[a.key[:3]].append(z)
    repeated = [zs for zs in by_prompt.values() if len(zs) >= 2]
    if not repeated:
        return None
    variance = sum(len(zs) * _sample_variance(zs) for zs in repeated)
    df = sum(len(zs) - 1 for zs in repeated)
    return t_quantile((1 + level) / 2, df) * math.sqrt(variance)


def _sample_variance(values: Sequence[float]) -> float:
    """The unbiased sample variance, in floats (``statistics.variance`` works in exact fractions:
    a hundred times slower, and a run looks at its margins after every repeat)."""
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def ratio_margin(mine: Iterable[RunRecord], base: Iterable[RunRecord], level: float = LEVEL) -> float | None:
    """:func:`log_ratio_margin` of ``mine``'s runs against ``base``'s, paired by prompt and repeat."""
    return log_ratio_margin(paired_runs(mine, base), level)


def sequential_level(looks: int, level: float = LEVEL) -> float:
    """The level each of ``looks`` checks of one run must use so that the run as a whole errs
    with at most 1 - ``level`` (Bonferroni): a run that stops at its first settled check
    looks many times, and at ``level`` each it would settle a tie about one time in five."""
    return 1 - (1 - level) / max(looks, 1)


def expectation_level(planned: int, most: int | None) -> float:
    """The level of an expectation's margin in a run of ``planned`` repeats: 95%, or with
    ``--until-decided most`` the level of each of its looks (after ``planned`` repeats, then after
    each one up to ``most``: most - planned + 1 looks)."""
    return LEVEL if most is None else sequential_level(most - planned + 1)


def interval(value: float | None, margin: float | None) -> tuple[float, float] | None:
    """(low, high) = value · exp(∓margin); None when either is unknown."""
    if value is None or margin is None:
        return None
    return value * math.exp(-margin), value * math.exp(margin)
