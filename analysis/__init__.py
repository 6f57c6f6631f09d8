"""Why a run was as fast as it was: acceptance statistics and the speedup model.

Torch-free on purpose: ``infer.py --replay`` reads a saved trace and shows the
same numbers without loading torch or a model.
"""

from analysis.acceptance import (
    AcceptanceCounts,
    acceptance_counts,
    acceptance_histogram,
    acceptance_histogram_by_draft_length,
    acceptance_rate_per_position,
    conditional_acceptance_per_position,
    draft_acceptance_rate,
    draft_share,
    engine_numbers,
    mean_acceptance_length,
    position_counts,
    yield_by_position,
)
from analysis.sources import drafter_chose_lengths, source_numbers
from analysis.speedup import (
    CostModel,
    RoundMix,
    best_cap,
    best_gamma,
    ar_step_from_result,
    costs_from_result,
    estimated_inputs,
    expected_tokens,
    first_round,
    measured_mix,
    mix_run_speedup,
    mix_speedup,
    predicted_run_speedup,
    predicted_speedup,
    throughput_by_gamma,
    tokens_per_s_at_rtt,
)

__all__ = [
    "AcceptanceCounts",
    "CostModel",
    "RoundMix",
    "acceptance_counts",
    "acceptance_histogram",
    "acceptance_histogram_by_draft_length",
    "acceptance_rate_per_position",
    "ar_step_from_result",
    "best_cap",
    "best_gamma",
    "conditional_acceptance_per_position",
    "costs_from_result",
    "draft_acceptance_rate",
    "draft_share",
    "drafter_chose_lengths",
    "engine_numbers",
    "estimated_inputs",
    "expected_tokens",
    "first_round",
    "mean_acceptance_length",
    "measured_mix",
    "mix_run_speedup",
    "mix_speedup",
    "position_counts",
    "predicted_run_speedup",
    "predicted_speedup",
    "source_numbers",
    "throughput_by_gamma",
    "tokens_per_s_at_rtt",
    "yield_by_position",
]
