"""Why a run was as fast as it was: acceptance statistics and the speedup model.

Torch-free on purpose: ``infer.py --replay`` reads a saved trace and shows the
same numbers without loading torch or a model.
"""

from analysis.acceptance import (
    acceptance_by_position,
    accepted_length_histogram,
    draft_share,
    mean_accepted_length,
    position_counts,
    yield_by_position,
)
from analysis.speedup import (
    CostModel,
    best_gamma,
    ar_step_from_result,
    costs_from_result,
    expected_tokens,
    first_round,
    predicted_run_speedup,
    predicted_speedup,
    throughput_by_gamma,
    tokens_per_s_at_rtt,
)

__all__ = [
    "CostModel",
    "acceptance_by_position",
    "accepted_length_histogram",
    "ar_step_from_result",
    "best_gamma",
    "costs_from_result",
    "draft_share",
    "expected_tokens",
    "first_round",
    "mean_accepted_length",
    "position_counts",
    "predicted_run_speedup",
    "predicted_speedup",
    "throughput_by_gamma",
    "tokens_per_s_at_rtt",
    "yield_by_position",
]
