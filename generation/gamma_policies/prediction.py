"""The model policy's prediction: tokens per second by gamma, and the best gamma."""

from __future__ import annotations

from analysis.speedup import throughput_by_gamma
from generation.gamma_policies.acceptance import Acceptance
from generation.gamma_policies.costs import Costs


def predicted(acceptance: Acceptance, costs: Costs, max_gamma: int) -> list[float]:
    """Predicted tokens per second for gamma = 0..max_gamma ([] before any cost is known): E(gamma) per
    round (Leviathan et al. 2023, sec. 3, a rate per position) over its expected cost
    (``analysis.speedup.throughput_by_gamma``)."""
    if not costs.verify_s:
        return []
    return throughput_by_gamma(acceptance.rates(), acceptance.propose_rates(),
                               costs.verify_table(max_gamma),
                               draft_step_s=costs.draft_step_s.value, other_s=costs.other_s.value)


def best(speeds: list[float], max_gamma: int) -> tuple[int, float]:
    """(gamma, predicted tokens/s) with the largest speed, ties to the smaller gamma;
    (min(max_gamma, 4), 0.0) while nothing is predicted yet."""
    if not speeds:
        return min(max_gamma, 4), 0.0
    gamma = max(range(len(speeds)), key=lambda g: (speeds[g], -g))
    return gamma, speeds[gamma]
