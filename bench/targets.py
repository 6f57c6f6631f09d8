"""The speed goals of issue #5, checked on a benchmark's summary rows.

Each goal compares two numbers measured in the same run. A goal whose numbers
are missing from the run (no peers, no NASD, sampling instead of greedy) is
reported as not checked rather than passed.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.aggregate import ALL, GROUNDED, SummaryRow


@dataclass
class Goal:
    description: str
    variant: str
    category: str
    measure: str          # "vs_peer" or "speedup"
    threshold: float
    value: float | None = None

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
