"""Choose a self-drafter by its predicted speedup, and say why in numbers (pure, torch-free).

For each measured self-drafter the speedup model of Leviathan et al. 2023
(``analysis.speedup``) gives the expected speedup over target AR at every γ,
from its acceptance by position, its draft-step seconds, its host seconds per
round and the target's verify seconds by width. The pick is the highest at
its best γ. When none is predicted to beat target AR, the reason line names
the best one's numbers: what a draft step costs against a target step, how
often drafts are accepted, and what a verify of γ + 1 tokens costs.
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.speedup import SEARCH_GAMMA, CostModel, best_drafting_gamma, best_gamma, predicted_speedup



@dataclass(frozen=True)
class Scored:
    """One candidate's prediction: at its best γ, and at the session's γ."""

    label: str
    gamma: int
    speedup: float
    at_gamma: float
    draft_step_s: float
    acceptance: float
    skipped: str = ""


@dataclass(frozen=True)
class Choice:
    """The pick (a label; the best candidate even when none beats target AR) and every score."""

    pick: str
    scores: tuple[Scored, ...]
    beats_ar: bool
    reason: str
    gamma: int  # the session's γ the ``at_gamma`` predictions are for

    @property
    def best(self) -> Scored:
        return next(s for s in self.scores if s.label == self.pick)


def _mean(rates) -> float:
    return sum(rates) / len(rates) if rates else 0.0


def score(label: str, rates, draft_step_s: float, other_s: float, verify_s: dict[int, float],
          gamma: int, skipped: str = "") -> Scored:
    """The predicted speedup of one candidate (0 when it was not measured: ``skipped`` says why)."""
    if skipped:
        return Scored(label, 0, 0.0, 0.0, draft_step_s, 0.0, skipped)
    costs = CostModel(draft_step_s=draft_step_s, verify_s=dict(verify_s), other_per_round_s=other_s)
    g, best = best_gamma(rates, costs, max(SEARCH_GAMMA, gamma))
    if g == 0:  # drafting never pays: report its best drafting γ all the same
        g, best = best_drafting_gamma(rates, costs, SEARCH_GAMMA)
    return Scored(label, g, best, predicted_speedup(rates, gamma, costs), draft_step_s, _mean(rates))


def reason_line(best: Scored, verify_s: dict[int, float]) -> str:
    """Why the best candidate does not beat target AR, in numbers."""
    step = verify_s[1]
    costs = CostModel(draft_step_s=best.draft_step_s, verify_s=dict(verify_s))
    width = best.gamma + 1
    return (f"no self-drafter is predicted to beat target AR here: the best, {best.label}, "
            f"{best.speedup:.2f}x at γ {best.gamma}: a draft step costs {best.draft_step_s * 1e3:.1f} ms "
            f"({best.draft_step_s / step:.2f} of a {step * 1e3:.1f} ms target step), drafts are accepted "
            f"{best.acceptance:.0%} of the time, and a verify of {width} tokens costs "
            f"{costs.verify(width) / step:.2f} target steps")


def choose(candidates: list[dict], verify_s: dict[int, float], *, gamma: int = 4) -> Choice:
    """Score ``candidates`` (dicts with label, rates, draft_step_s, other_s and optionally skipped)
    and pick the highest predicted speedup."""
    if not candidates:
        raise ValueError("no self-drafter to choose from")
    scores = tuple(score(c["label"], c.get("rates") or [], float(c.get("draft_step_s") or 0.0),
                         float(c.get("other_s") or 0.0), verify_s, gamma, c.get("skipped") or "")
                   for c in candidates)
    best = max(scores, key=lambda s: s.speedup)
    beats = best.speedup > 1.0
    return Choice(best.label, scores, beats, "" if beats else reason_line(best, verify_s), gamma)


def choice_lines(choice: Choice) -> list[str]:
    """The banner's lines: the pick and its prediction, the others, and the reason when none pays."""
    best = choice.best
    lines = [f"drafter chosen by measuring this machine: {best.label}, predicted {best.speedup:.2f}x "
             f"target AR at γ {best.gamma} ({best.at_gamma:.2f}x at γ {choice.gamma}); "
             f"acceptance {best.acceptance:.0%}, draft step {best.draft_step_s * 1e3:.1f} ms"]
    others = [f"{s.label} {s.speedup:.2f}x" if not s.skipped else f"{s.label} not run ({s.skipped})"
              for s in choice.scores if s.label != best.label]
    if others:
        lines.append("other self-drafters: " + "; ".join(others))
    if choice.reason:
        lines.append(choice.reason)
    return lines
