"""The advice projected over batch size (``--whatif batch``): each method's replayed rounds, priced by shape.

A method's acceptance does not change with the load; the target's (and a drafter model's) forwards
are timed here by shape (``engine.shapes``) and ``analysis.whatif.project`` prices the replayed rounds
at each batch size. Forward costs only, so batch 1 reads a little above the advice's own prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analysis.whatif import Projection, RoundFacts, project
from engine.shapes import BATCHES, PairShapes, time_pair_shapes

ROWS = 12           # the advice's best methods projected (every width they verify is timed)


@dataclass
class BatchWhatIf:
    """The projection of the best advice over ``batches``: (method, its projection) per row, the
    shapes timed, and whether the machine was busy meanwhile."""

    rows: list[tuple[str, Projection]]
    shapes: PairShapes
    where: str

    @property
    def batches(self) -> tuple[int, ...]:
        return self.rows[0][1].batches if self.rows else BATCHES

    def title(self) -> str:
        return (f"projected speedup over target AR by batch size: each method's replayed rounds, forwards "
                f"timed by shape on {self.where} (context {self.shapes.context} tokens)")

    def to_dict(self) -> dict:
        return {"projected": True, "from": f"forwards timed by shape on {self.where}",
                "context": self.shapes.context, "other_load": self.shapes.other_load,
                "methods": [{"method": label, **p.to_dict()} for label, p in self.rows]}


def facts_of_advice(advice, step_s: float) -> RoundFacts | None:
    """An advice's rounds after each prompt's first as ``analysis.whatif`` reads them: tokens per
    round, the share of rounds by verify width, drafter steps per round, and its drafting seconds per round at batch 1
    (its steps at ``Why.c`` target steps of ``step_s`` each, and its look-ups); None without a round."""
    replayed = advice.entry.replayed if advice.entry is not None else None
    steady = replayed.steady_widths if replayed is not None else {}
    rounds = sum(steady.values())
    if not rounds:
        return None
    widths = {w: n / rounds for w, n in steady.items()}
    why = advice.why
    draft_s = why.draft_steps * (why.c or 0.0) * step_s + why.lookup_ms / 1e3
    return RoundFacts(advice.tokens_per_round, widths, why.draft_steps, draft_s)


def _pricing(advice, shapes: PairShapes):
    """(drafter_s, scaled_step) for ``project``: a drafter model of its own timed by shape; the
    target's weights (a self-drafter, or the pair's drafter drafting on the target's cache) scaled as
    its step; a storage's look-ups per sequence."""
    drafter = advice.entry.method.drafter
    if drafter == "model" and shapes.drafter is not None:
        return shapes.drafter_s, True
    return None, drafter in ("model", "self")


def project_advice(pair, advice: Sequence, context: int, where: str, *, rows: int = ROWS,
                   batches: Sequence[int] = BATCHES, say=lambda line: None, stored: PairShapes | None = None
                   ) -> BatchWhatIf:
    """The best ``rows`` of ``advice`` (ranked, best first) projected over ``batches``, the pair's
    forwards timed by shape over a cache of ``context`` tokens; or read off ``stored`` (a cost table's,
    ``--costs FILE``: a width or batch size it lacks read between those it has) where it was timed on
    a cache within a quarter of ``context``."""
    chosen = [a for a in advice if a.entry is not None and sum(a.entry.replayed.widths.values())][:rows]
    widths = sorted({1} | {w for a in chosen for w in a.entry.replayed.widths})
    if stored is not None and abs(stored.context - context) <= context / 4:
        shapes, where = stored, stored.where
        say(f"pricing by batch with the forwards timed on {where} over a cache of {stored.context} tokens")
    else:
        say(f"timing the target by batch ({', '.join(map(str, batches))}) and width ({', '.join(map(str, widths))}) "
            f"over a cache of {context} tokens")
        shapes = time_pair_shapes(pair, widths, context, batches)
    step = shapes.target_s(1, 1)
    out = []
    for a in chosen:
        facts = facts_of_advice(a, step)
        drafter_s, scaled = _pricing(a, shapes)
        out.append((a.method, project(facts, shapes.target_s, batches, drafter_s=drafter_s, scaled_step=scaled)))
    return BatchWhatIf(out, shapes, where)


def project_report(pair, report, context: int, where: str, say=lambda line: None) -> BatchWhatIf:
    """``report``'s advice projected over batch size with its cost table: the forwards by shape the
    table holds (``--costs FILE``) where they fit ``context``, else timed here; a table measured here
    keeps what was timed, so its ``costs.json`` projects elsewhere without timing again."""
    stored = report.costs.batch_shapes()
    whatif = project_advice(pair, report.advice, context, where, say=say, stored=stored)
    if whatif.shapes is not stored and not report.costs.source:
        report.costs.shapes = whatif.shapes.to_dict()
    return whatif
