"""The model policy's prediction: tokens per second by gamma, and the best gamma."""

from __future__ import annotations

from analysis.speedup import throughput_by_gamma
from generation.gamma_policies.acceptance import Acceptance
from generation.gamma_policies.costs import Costs


def predicted(acceptance: Acceptance, costs: Costs, max_gamma: int) -> list[float]:
    """Predicted tokens per second for gamma = 0..max_gamma ([] before any cost is known).

    A round of gamma drafts yields E(gamma) = sum_{i=0..gamma} prod_{j<i} c_j
    tokens (Leviathan et al. 2023, sec. 3, with a rate per position) and costs
    draft_step * D + E[verify(1 + drafted)] + other, D the drafted count
    expected from q: ``analysis.speedup.throughput_by_gamma``.
    """
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
