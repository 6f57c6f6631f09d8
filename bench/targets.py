"""The speed goals, checked on a benchmark's numbers.

The goals of issue #5 compare our strategies with transformers' and with target
autoregressive. The policy goal compares the ``model`` gamma policy with the best
constant gamma of {2, 4, 8} in hindsight (the one that was fastest in this very
run), per strategy, and shows transformers' dynamic assisted generation beside it
as the same ratio. Each goal compares numbers measured in the same run. A goal
whose numbers are missing from the run (no peers, no NASD, sampling instead of
greedy) is reported as not checked rather than passed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.aggregate import ALL, GROUNDED, SummaryRow, category_groups, median, paired_ratio
from bench.aggregate import per_repeat_throughput
from bench.records import RunRecord
from bench.variants import GOAL_GAMMAS, LABELS, Variant, parse_variant_name, policy_kind

POLICY_GOAL = 0.95


@dataclass
class Goal:
    description: str
    variant: str
    category: str
    measure: str          # "vs_peer" or "speedup"
    threshold: float
    value: float | None = None
    reference: str | None = None        # the variant it was measured against, when chosen in hindsight
    beside: str | None = None           # a peer shown beside it: its label...
    beside_value: float | None = None   # ...and the same ratio for the peer

    @property
    def status(self) -> str:
        if self.value is None:
            return "not checked"
        return "met" if self.value >= self.threshold else "missed"


def goals_for(gammas: list[int]) -> list[Goal]:
    """Every goal, once per gamma for the drafting strategies."""
    goals = [Goal("target AR ≥ 1.0× HF generate", "target", ALL, "vs_peer", 1.0)]
    for g in gammas:
        goals += [
            Goal(f"NASD γ={g} ≥ 1.0× HF prompt lookup (grounded)", f"ngram@{g}", GROUNDED,
                 "vs_peer", 1.0),
            Goal(f"NASD γ={g} ≥ 1.8× target AR (grounded)", f"ngram@{g}", GROUNDED,
                 "speedup", 1.8),
            Goal(f"speculative γ={g} ≥ 1.0× HF assisted", f"speculative@{g}", ALL,
                 "vs_peer", 1.0),
        ]
    return goals


def check_goals(rows: list[SummaryRow], gammas: list[int], *, greedy: bool) -> list[Goal]:
    """Fill each goal's measured value from ``rows`` (greedy runs only)."""
    index = {(r.variant, r.category): r for r in rows}
    goals = goals_for(gammas)
    if not greedy:
        return goals
    for goal in goals:
        row = index.get((goal.variant, goal.category))
        if row is not None:
            goal.value = getattr(row, goal.measure)
    return goals


def policy_goals(records: Sequence[RunRecord], *, threshold: float = POLICY_GOAL,
                 gammas: Sequence[int] = GOAL_GAMMAS) -> list[Goal]:
    """For each strategy's ``model`` policy: its tokens/s over the best constant gamma.

    The best constant is the one of ``gammas`` with the highest median tokens/s
    on the same prompts; the ratio is paired per repeat (the median of per-repeat
    ratios), like every other ratio of the report. For speculative decoding
    transformers' dynamic assisted generation (its peer) is shown beside it, as
    its own tokens/s over the same best constant. NASD is checked on all prompts
    and on the input-grounded ones.
    """
    present = list(dict.fromkeys(r.variant for r in records))
    groups = category_groups(r.category for r in records)
    goals = []
    for name in present:
        variant = parse_variant_name(name)
        if variant.family != "ours" or policy_kind(variant.policy) != "model":
            continue
        categories = [ALL] + ([GROUNDED] if variant.strategy == "ngram" else [])
        for category in categories:
            if category in groups:
                goals.append(_policy_goal(records, variant, category, groups[category], present,
                                          threshold, gammas))
    return goals


def _policy_goal(records, variant: Variant, category: str, members: set[str],
                 present: list[str], threshold: float, gammas: Sequence[int]) -> Goal:
    def tps(name: str) -> dict[int, float]:
        return per_repeat_throughput(r for r in records if r.variant == name and r.category in members)

    label = LABELS.get(variant.strategy, variant.strategy)
    where = "" if category == ALL else f" ({category})"
    goal = Goal(f"{label} model ≥ {threshold:g}× best constant γ of "
                f"{{{', '.join(str(g) for g in gammas)}}}{where}", variant.name, category,
                "vs_best_constant", threshold)
    constants = [Variant(variant.strategy, g).name for g in gammas]
    constants = [c for c in constants if c in present]
    if not constants:
        return goal
    speeds = {c: tps(c) for c in constants}
    best = max(constants, key=lambda c: median(speeds[c].values()) or 0.0)
    goal.reference = best
    goal.description += f": γ={parse_variant_name(best).gamma}"
    goal.value = paired_ratio(tps(variant.name), speeds[best])
    peer = variant.peer
    if peer is not None and peer.name in present:
        goal.beside = peer.label
        goal.beside_value = paired_ratio(tps(peer.name), speeds[best])
    return goal
