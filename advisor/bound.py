"""A drafter model's source left out by its ceiling: no method of it could rank first.

A source (one drafter and its options, ``advisor.advise.replay_sources``) of a drafter model makes
at most k + 1 tokens a round of k drafts, and pays for that round at least k drafter steps and one
verify of at least k + 1 positions, plus the loop's host work. Priced by the same cost table and
anchor as the ranking (``advisor.rank.price``), no mix of such rounds predicts more than

    ceiling = max over k of (k + 1) / (k c + v(k + 1) + h)

target steps' worth of tokens per step, where c is the drafter's step over the target's, v(w) the
cheapest verify the table prices at any width from w up to the widest the source verifies (a tree
of k levels verifies more than k + 1 positions), and h the host seconds per round over target AR's
step. A method's end-to-end prediction adds the first round, which pays target AR's time to first
token and more: it lies between 1 and the ceiling, so a source is left out only under a best
prediction above both.

Before a large source of a drafter model is replayed (more than :data:`MIN_METHODS` methods,
its drafter run for real), the sources already replayed are ranked; where the source's ceiling is
under the best prediction there that rests on no estimate (``advisor.rank.Advice.estimate``), none
of its methods could rank first, and its replay (the
longest part of an advice: a forward per draft, per position) is left out: named in one line with
its ceiling, the drafter's step and the method it is under (:class:`Bounded`). Its drafter's step
is timed for it (``advisor.costs.measure_costs``: a short run where the step is not its module's
forward), and kept apart from the table the ranking prices with, which a replay's own timed steps
fill.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_METHODS = 8     # a source of more methods than this is bounded before its replay


@dataclass(frozen=True)
class Bounded:
    """A source left out: its methods, its ceiling (the most any of them could predict), its
    drafter's step over the target's, and the best replayed method it is under."""

    source: str
    methods: tuple[str, ...]
    ceiling: float
    step_ratio: float
    best: str
    best_speedup: float

    def to_dict(self) -> dict:
        return {"source": self.source, "methods": list(self.methods), "ceiling_speedup": round(self.ceiling, 4),
                "drafter_step_ratio": round(self.step_ratio, 4), "under": self.best,
                "under_speedup": round(self.best_speedup, 4)}


def boundable(pair, group) -> bool:
    """Whether ``group`` (one source's methods) is bounded before its replay: more than
    :data:`MIN_METHODS` methods, each drafting with a drafter model alone (no n-gram storage
    beside it), at least one of them replayed by running the drafter (``advisor.replay.replay_mode``)."""
    from advisor.replay import replay_mode
    from engine.strategy import HybridOptions

    return (len(group) > MIN_METHODS
            and all(m.drafter in ("model", "self") and not isinstance(m.options, HybridOptions) for m in group)
            and any(replay_mode(pair, m) == "drafter" for m in group))


def _constant(m) -> bool:
    return m.gamma_policy in ("", "constant")


def widest(group, max_gen_len: int) -> int:
    """The most drafts a round of ``group``'s methods can verify: γ under a constant policy, any
    length up to ``max_gen_len`` under another, a tree's nodes."""
    most = max([1] + [max(m.gamma if _constant(m) else max_gen_len, m.tree) for m in group])
    return max(1, min(most, max(max_gen_len, 1)))


def verify_widths(group) -> set[int]:
    """The verify widths to time for ``group``'s ceiling: a constant chain's γ + 1 and a tree's nodes + 1;
    a width past them (a policy's longer chains) is read off the widest, as the ranking reads it."""
    return {m.tree + 1 if m.tree else m.gamma + 1 for m in group if m.tree or _constant(m)}


def ceiling(costs, key: str, drafts: int, host_s: float, ar_step_s: float | None) -> tuple[float, float]:
    """(the ceiling, the drafter's step over the target's) of a source of drafter ``key`` whose
    rounds verify at most ``drafts`` drafts, priced by ``costs`` (it holds ``key``'s step)."""
    own = costs.target(1)[0]
    step = ar_step_s if ar_step_s and ar_step_s > 0 else own
    c = costs.draft(key, 1)[0] / own
    verify = [costs.target(w)[0] / own for w in range(1, drafts + 2)]      # verify[w - 1]: width w
    best = 0.0
    for k in range(1, drafts + 1):
        cheapest = min(verify[k:])                                          # widths k + 1 .. drafts + 1
        best = max(best, (k + 1) / (k * c + cheapest + host_s / step))
    return best, c


def bound(pair, group, ranked, costs, *, state, max_gen_len: int, ar_step_s: float | None, name: str
          ) -> Bounded | None:
    """``group`` as :class:`Bounded` where its ceiling is under the prediction of the best of
    ``ranked`` (the sources replayed so far, priced by ``costs``) that rests on no estimate, else
    None. ``costs`` is not changed: the drafter's step is timed into a copy where ``costs`` lacks it."""
    from advisor.costs import drafter_key, measure_costs

    top = next((a for a in ranked if not a.estimate), None)     # a source is left out under no estimate
    if top is None or not group:
        return None
    key = drafter_key(group[0])
    if costs.source and key not in costs.draft_s:
        return None                 # a table read from a file without this drafter: nothing to bound with
    if key in costs.draft_s:
        priced = costs
    else:
        priced = measure_costs(pair, set(costs.target_s), {key: {1}}, state=state, base=costs,
                               methods={key: group[0]}, context=costs.context)
    most, c = ceiling(priced, key, widest(group, max_gen_len), costs.host_s, ar_step_s)
    if max(1.0, most) >= top.predicted_speedup:      # an end-to-end prediction lies between 1 and the ceiling
        return None
    return Bounded(name, tuple(m.key for m in group), most, c, top.method, top.predicted_speedup)


def bounded_line(bounded: list[Bounded]) -> str | None:
    """One line naming the sources left out by their ceiling, or None."""
    if not bounded:
        return None
    return ("not replayed, under the best by their ceiling (every draft accepted): " + "; ".join(
        f"{b.source}: at most {b.ceiling:.2f}x (its drafter's step {b.step_ratio:.2f} of the target's), "
        f"under {b.best}'s {b.best_speedup:.2f}x" for b in bounded))
