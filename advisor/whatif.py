"""The advice projected over batch size: each method's replayed rounds, priced by shape here
(``--whatif batch``) or on a machine profile's roofline (``--whatif machine:NAME``); or at batch 1
over context lengths, its rounds split by where they ran (``--whatif context``).

A method's acceptance does not change with the load; the target's (and a drafter model's) forwards
are timed here by shape (``engine.shapes``), or read off a profile (``analysis.roofline``: the
models' shapes as loaded here on the card's published bandwidth and peak), and
``analysis.whatif.project`` prices the replayed rounds at each batch size. The decode part, forward
costs only: batch 1 reads near the advice's decode prediction, above its end-to-end one (which adds
each prompt's time to first token).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from advisor.costs import drafter_key
from analysis.whatif import (
    MIN_ROUNDS, Projection, RoundFacts, contexts_within, nearest_context, project, project_contexts,
)
from engine.shapes import BATCHES, PairShapes, time_pair_shapes

GAMMA = re.compile(r"@(\d+)")     # a method name's draft length (utils.method_name's grammar)
GAMMA_TIE = 0.01    # draft lengths projected within this share of the fastest are a tie: the shortest is named
ROWS = 12           # the advice's best methods shown, beside any method best at some batch size or context
CAPTION = ("projected, not run: the decode part (the rounds after each prompt's first, as the advice's decode "
           "prediction), forward costs only (sampling and host work left out); acceptance as the replay had it, in "
           "lockstep at every batch size (docs/why.md)")


def family_of(method: str) -> tuple[str, int | None]:
    """(the method's name without its draft length, that length): ``speculative+hybrid4:heuristic@8``
    -> (``speculative+hybrid4:heuristic``, 8); (the name, None) where it has none."""
    found = GAMMA.search(method)
    if found is None:
        return method, None
    return method[:found.start()] + method[found.end():], int(found.group(1))


@dataclass
class Projected:
    """The advice projected: (method, its projection) per row shown (:func:`shown`: the best few by
    the advice, and every method that is best at some point); ``every``: every method projected,
    best first by the advice (the rows' families' best draft length is read among them)."""

    rows: list[tuple[str, Projection]]
    every: list[tuple[str, Projection]] = field(default_factory=list, kw_only=True)
    axis = "B"          # what a projection's points are: batch sizes (B) or context lengths (L)

    def best_gammas(self) -> list[tuple[str, list[tuple[int, int, float]]]]:
        """For each drafter shown (a row's method without its draft length) that was projected at two
        draft lengths or more: at each point, (the point, the shortest length projected within
        :data:`GAMMA_TIE` of the fastest there, its speedup); in the rows' order. What an engine's
        per-batch-size draft lengths would be set to: a longer draft within a percent of a shorter one
        is a near-tie, and the shorter one wastes less of a loaded batch on rejected drafts."""
        lengths: dict[str, list[tuple[int, Projection]]] = {}
        for label, p in self.every or self.rows:
            family, gamma = family_of(label)
            if gamma is not None:
                lengths.setdefault(family, []).append((gamma, p))
        out = []
        for family in dict.fromkeys(family_of(label)[0] for label, _ in self.rows):
            found = lengths.get(family, [])
            if len({g for g, _ in found}) < 2:
                continue
            points = []
            for i, point in enumerate(self.batches):
                fastest = max(p.speedups[i] for _, p in found)
                gamma, p = min((row for row in found if row[1].speedups[i] >= fastest * (1 - GAMMA_TIE)),
                               key=lambda row: row[0])
                points.append((point, gamma, p.speedups[i]))
            out.append((family, points))
        return out

    def best_gamma_lines(self) -> list[str]:
        """One line per :meth:`best_gammas` drafter:
        ``speculative: B=1 γ 8 2.41x · ... · B=32 γ 2 0.93x (none pays)``."""
        return [f"{family}: " + " · ".join(f"{self.axis}={point} γ {gamma} {s:.2f}x" + (" (none pays)" if s < 1.0 else "")
                                          for point, gamma, s in points)
                for family, points in self.best_gammas()]

    def best_gamma_dict(self) -> list[dict]:
        return [{"drafter": family, "best": [{"at": point, "gamma": gamma, "speedup": s} for point, gamma, s in points]}
                for family, points in self.best_gammas()]

    @property
    def batches(self) -> tuple[int, ...]:
        return self.rows[0][1].batches if self.rows else BATCHES

    @property
    def best(self) -> list[tuple[int, str | None, float]]:
        """At each point: (the point, the method projected fastest there or None where none beats
        target AR, that method's speedup)."""
        out = []
        for i, point in enumerate(self.batches):
            label, p = max(self.rows, key=lambda row: row[1].speedups[i])
            out.append((point, label if p.speedups[i] >= 1.0 else None, p.speedups[i]))
        return out

    def best_line(self) -> str | None:
        """``best at each B: B=1 speculative@8 2.41x · ... · B=32 target AR (none over 1.0x)``, or None."""
        if not self.rows:
            return None
        return f"best at each {self.axis}: " + " · ".join(
            f"{self.axis}={point} " + (f"{label} {s:.2f}x" if label else f"target AR (none over 1.0x; best {s:.2f}x)")
            for point, label, s in self.best)

    def best_dict(self) -> list[dict]:
        return [{"at": point, "method": label, "speedup": s} for point, label, s in self.best]

    @property
    def other_load(self) -> float | None:
        """The cores other processes used while forwards were timed for it (None: none timed, or unknown)."""
        return None


def shown(projected: list[tuple[str, Projection]], rows: int) -> list[tuple[str, Projection]]:
    """Of every method ``projected`` (best first by the advice), the first ``rows`` and each method
    that is fastest at some point (the best draft length changes with the load: that row is shown
    wherever it ranked)."""
    winners = set()
    for i in range(len(projected[0][1].speedups) if projected else 0):
        winners.add(max(projected, key=lambda row: row[1].speedups[i])[0])
    return [row for k, row in enumerate(projected) if k < rows or row[0] in winners]


def _replayed(advice: Sequence) -> list:
    """The advice that has replayed rounds to project, best first."""
    return [a for a in advice if a.entry is not None and sum(a.entry.replayed.widths.values())]


@dataclass
class BatchWhatIf(Projected):
    """The projection of the best advice over ``batches`` by forwards timed here: the rows, the
    shapes timed, and whether the machine was busy meanwhile."""

    shapes: PairShapes
    where: str
    topic = "batch"

    def caption(self) -> str:
        return CAPTION

    @property
    def other_load(self) -> float | None:
        return self.shapes.other_load

    def title(self) -> str:
        return (f"projected speedup over target AR by batch size: each method's replayed rounds, forwards "
                f"timed by shape on {self.where} (context {self.shapes.context} tokens)")

    def to_dict(self) -> dict:
        return {"projected": True, "from": f"forwards timed by shape on {self.where}",
                "context": self.shapes.context, "other_load": self.shapes.other_load,
                "methods": [{"method": label, **p.to_dict()} for label, p in self.rows], "best": self.best_dict(),
                "best_gamma": self.best_gamma_dict()}


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
    """Every replayed method of ``advice`` (ranked, best first) projected over ``batches``, the pair's
    forwards timed by shape over a cache of ``context`` tokens; or read off ``stored`` (a cost table's,
    ``--costs FILE``: a width or batch size it lacks read between those it has) where it was timed on
    a cache within a quarter of ``context``. The rows kept: :func:`shown`."""
    chosen = _replayed(advice)
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
    return BatchWhatIf(shown(out, rows), shapes, where, every=out)


def project_report(pair, report, context: int, where: str, say=lambda line: None) -> BatchWhatIf:
    """``report``'s advice projected over batch size with its cost table: the forwards by shape the
    table holds (``--costs FILE``) where they fit ``context``, else timed here; a table measured here
    keeps what was timed, so its ``costs.json`` projects elsewhere without timing again."""
    stored = report.costs.batch_shapes()
    whatif = project_advice(pair, report.advice, context, where, say=say, stored=stored)
    if whatif.shapes is not stored and not report.costs.source:
        report.costs.shapes = whatif.shapes.to_dict()
    return whatif


@dataclass
class MachineWhatIf(Projected):
    """The best advice projected over ``batches`` on a machine profile's roofline: the rows, the
    profile, the context priced over, and the methods left out with why."""

    profile: object                     # analysis.roofline.MachineProfile
    context: int
    left_out: list[tuple[str, str]]
    topic = "machine"

    def title(self) -> str:
        return (f"projected speedup over target AR by batch size on {self.profile.name}: each method's replayed "
                f"rounds, forwards from the profile's roofline (context {self.context} tokens)")

    def caption(self) -> str:
        out = (f"projected, not run: the decode part; {self.profile.source}; "
               f"{self.profile.describe()}; the models' shapes as loaded here (their dtypes); a storage's look-ups as timed here; acceptance as "
               "the replay had it, in lockstep at every batch size; sampling and host work left out (docs/why.md)")
        if self.left_out:
            names = [m for m, _ in self.left_out]
            out += (f"; left out, {self.left_out[0][1]}: " + ", ".join(names[:3])
                    + (f" and {len(names) - 3} more" if len(names) > 3 else ""))
        return out

    def to_dict(self) -> dict:
        return {"projected": True, "from": f"{self.profile.name}'s roofline: {self.profile.source}",
                "profile": self.profile.to_dict(), "context": self.context,
                "methods": [{"method": label, **p.to_dict()} for label, p in self.rows], "best": self.best_dict(),
                "best_gamma": self.best_gamma_dict(),
                "left_out": [{"method": m, "reason": why} for m, why in self.left_out]}


def _drafter_shape(pair, method, state):
    """The shape (``engine.shapes.model_shape``) of the model ``method`` drafts with: the pair's
    drafter, or a self-drafter spec built from the target; None where it has none to read."""
    from advisor.costs import drafter_module
    from engine.shapes import model_shape

    try:
        module = drafter_module(pair, drafter_key(method), state)
        return model_shape(module) if module is not None else None
    except (AttributeError, TypeError, ValueError):         # a drafter module with no model config
        return None


def project_machine(pair, advice: Sequence, context: int, profile, *, state=None, rows: int = ROWS,
                    batches: Sequence[int] = BATCHES, step_s: float | None = None) -> MachineWhatIf:
    """Every replayed method of ``advice`` projected over ``batches`` on ``profile`` (the rows kept:
    :func:`shown`): the target's forward
    and a drafter model's priced from their shapes on the profile's roofline over a cache of
    ``context`` tokens; a storage's look-ups as the replay timed them, once per sequence. A method
    whose drafter's shape cannot be read is left out, named with why. ``step_s``: target AR's step
    here, which prices nothing on the profile (only a drafter's steps, which are priced apart)."""
    from engine import EngineState
    from engine.shapes import model_shape

    state = state if state is not None else EngineState()
    target = model_shape(pair.target)
    chosen = _replayed(advice)
    out, left_out, shapes = [], [], {}
    for a in chosen:
        facts = facts_of_advice(a, step_s or 0.0)
        method = a.entry.method
        drafter_s = None
        if method.drafter in ("model", "self"):
            key = (method.drafter, repr(getattr(method, "options", None)))
            if key not in shapes:
                shapes[key] = _drafter_shape(pair, method, state)
            own = shapes[key]
            if own is None:
                left_out.append((a.method, "its drafter's shape cannot be read to price it"))
                continue
            drafter_s = lambda b, own=own: profile.forward_s(own, b, 1, context)     # noqa: E731
        out.append((a.method, project(facts, lambda b, w: profile.forward_s(target, b, w, context), batches,
                                      drafter_s=drafter_s, scaled_step=False,
                                      drafter_source="its shape on the profile")))
    return MachineWhatIf(shown(out, rows), profile, context, left_out, every=out)


@dataclass
class ContextWhatIf(Projected):
    """The best advice projected at batch 1 over context lengths (each row's ``Projection.batches``
    are the contexts): the rows, the prompts' own context, where the forwards were timed, the
    acceptance seen near each context, and the cores other processes used meanwhile."""

    own: int
    where: str
    seen: list[str] = field(default_factory=list)
    load: float | None = None
    surface: list = field(default_factory=list)     # engine.shapes.PairShapes per length timed
    read: bool = False                              # the forwards read off a cost table's, not timed now
    topic = "context"
    axis = "L"

    @property
    def other_load(self) -> float | None:
        return self.load

    def title(self) -> str:
        timed = (f"forwards timed on {self.where} at L={', '.join(str(s.context) for s in self.surface)}, read "
                 "between" if self.read else f"forwards timed here on {self.where}")
        return (f"projected speedup over target AR by context length at batch 1: each method's replayed rounds, "
                f"{timed} (the prompts' own context: {self.own} tokens)")

    def caption(self) -> str:
        return ("projected, not run: the decode part, forward costs only (sampling and host work left out); "
                "acceptance at each L "
                f"from the replayed rounds nearest it where there were {MIN_ROUNDS} or more "
                f"({'; '.join(self.seen) or 'none'}), elsewhere the method's own over all its rounds, which a long "
                "context may lower (docs/why.md)")

    def to_dict(self) -> dict:
        return {"projected": True, "from": f"forwards timed at batch 1 by context on {self.where}"
                + (" (read between the lengths timed)" if self.read else ""),
                "timed_at": [s.context for s in self.surface], "context": self.own, "other_load": self.load, "acceptance_near": list(self.seen),
                "methods": [{"method": label, "contexts": list(p.batches), "speedups": list(p.speedups),
                             "stops_paying_at": p.stops_paying, "drafter_cost": p.drafter_source}
                            for label, p in self.rows], "best": self.best_dict(),
                "best_gamma": self.best_gamma_dict()}


def facts_near(advice, contexts: Sequence[int], step_s: float) -> dict[int, RoundFacts | None]:
    """An advice's rounds (:func:`facts_of_advice`, drafter steps at ``step_s``) split by the context of
    ``contexts`` nearest where each ran (``Replayed.steady_rounds``): tokens per round and the shares of
    verify widths of those near each context, the drafter's steps per round as over all its rounds;
    None for a context with fewer than ``analysis.whatif.MIN_ROUNDS`` rounds near it."""
    base = facts_of_advice(advice, step_s)
    near: dict[int, list[tuple[int, int]]] = {c: [] for c in contexts}
    for position, width, made in getattr(advice.entry.replayed, "steady_rounds", ()):
        near[nearest_context(contexts, position)].append((width, made))
    out: dict[int, RoundFacts | None] = {}
    for c, rounds in near.items():
        if base is None or len(rounds) < MIN_ROUNDS:
            out[c] = None
            continue
        widths: dict[int, float] = {}
        for width, _ in rounds:
            widths[width] = widths.get(width, 0.0) + 1 / len(rounds)
        out[c] = replace(base, tokens_per_round=sum(made for _, made in rounds) / len(rounds), widths=widths)
    return out


def project_context(pair, advice: Sequence, own: int, where: str, *, rows: int = ROWS, say=lambda line: None,
                    stored: Sequence | None = None, state=None) -> ContextWhatIf:
    """Every replayed method of ``advice`` (the rows kept: :func:`shown`) at batch 1 over a cache of
    each of ``analysis.whatif.CONTEXTS``
    that fits the target's window, and ``own`` (the prompts' mean context): the target's forwards
    timed here at each (a drafter model of its own too); a drafter on the target's weights (a
    self-drafter, which reads the target's cache) its ``Why.c`` of the target's step at ``own``, scaled
    to each context as its own step timed there scales (:func:`drafter_steps_by_context`; as the
    target's step where it was not timed); a storage's look-ups as the replay timed them.
    Acceptance at each context from the replayed rounds nearest it (:func:`facts_near`), else the
    method's own. ``stored``: a cost table's forwards by context (``CostTable.context_shapes``, timed
    on two lengths or more): then nothing is timed, the lengths priced are those it timed that fit
    the window and ``own``, each read off it (``engine.shapes.read_by_context``)."""
    from engine.shapes import read_by_context, surface_of, time_by_context
    from utils.machine_load import other_load, read_load

    chosen = _replayed(advice)
    widths = sorted({1} | {w for a in chosen for w in a.entry.replayed.widths})
    contexts = contexts_within(pair.context_length, max(widths), own)
    if stored is not None and len(stored) >= 2:
        contexts = sorted({own} | {s.context for s in stored if s.context <= contexts[-1]})
        where, load, surface = stored[0].where, None, list(stored)
        say(f"pricing by context with the forwards timed on {where} over caches of "
            f"{', '.join(str(s.context) for s in stored)} tokens")
        target, drafter = read_by_context(stored, contexts, widths)
    else:
        say(f"timing the target at batch 1 by width ({', '.join(map(str, widths))}) over caches of "
            f"{', '.join(map(str, contexts))} tokens")
        before = read_load()
        target, drafter = time_by_context(pair, widths, contexts)
        load = other_load(before, read_load())
        surface = surface_of(target, drafter, load, where)
    steps = {} if stored is not None and len(stored) >= 2 else \
        drafter_steps_by_context(pair, chosen, contexts, drafter, state, say)
    out, seen = [], []
    for a in chosen:
        near = facts_near(a, contexts, target[own][(1, 1)])        # its drafter's steps at c of own's step
        seen += [f"{a.method} {f.tokens_per_round:.2f} tokens a round near L={c}" for c, f in near.items() if f]
        kind = a.entry.method.drafter
        own_steps = steps.get(drafter_key(a.entry.method))
        out.append((a.method, project_contexts(facts_of_advice(a, target[own][(1, 1)]), near, own, target,
                                               drafter if kind == "model" else None,
                                               on_target_weights=kind in ("model", "self"),
                                               fixed_s=a.why.lookup_ms / 1e3,
                                               scaled_source=("its step timed at each context" if own_steps else
                                                              "c target steps at each context"),
                                               drafter_steps=own_steps)))
    kept = shown(out, rows)
    names = {label for label, _ in kept}
    return ContextWhatIf(kept, own, where, [line for line in seen if line.split(" ", 1)[0] in names], load,
                         surface, stored is not None and len(stored) >= 2, every=out)


def drafter_steps_by_context(pair, chosen: Sequence, contexts: Sequence[int], drafter: dict, state,
                             say=lambda line: None) -> dict[str, dict[int, float]]:
    """For each drafter (``advisor.costs.drafter_key``) of ``chosen`` that drafts on the target's
    weights with no forward of its own timed by context (``drafter``: the pair's drafter model's, by
    context, or None): its step timed over a cache of each of ``contexts`` tokens
    (``advisor.costs.step_seconds_by_context``), once per drafter. A drafter that cannot be timed so
    is left to the target's step, with a line."""
    from advisor.costs import step_seconds_by_context

    methods = {}
    for a in chosen:
        method = a.entry.method
        if method.drafter == "self" or (method.drafter == "model" and not any(drafter.values())):
            methods.setdefault(drafter_key(method), method)
    out = {}
    for key, method in methods.items():
        say(f"timing the drafter {key}'s step over caches of {', '.join(map(str, contexts))} tokens")
        try:
            out[key] = step_seconds_by_context(pair, method, state, contexts)
        except (RuntimeError, ValueError) as e:
            say(f"{key}'s step not timed by context ({type(e).__name__}: {e}): scaled as the target's step")
    return out


def project_for(pair, report, context: int, where: str, whatif: str, *, state=None, say=lambda line: None):
    """``report``'s advice projected as ``whatif`` (a ``analysis.whatif.whatif_choice`` value) asks: over
    batch size here (:func:`project_report`) or on a machine profile (:func:`project_machine`; its
    captured form, ``analysis.roofline.captured``, where the session's compile path is ``graphs``), or
    over context length (:func:`project_context`: with the forwards by context ``report.costs`` holds,
    else timed here and kept in it)."""
    from analysis.roofline import for_path, profile_named

    topic, _, name = whatif.partition(":")
    if topic == "context":
        projected = project_context(pair, report.advice, context, where, say=say,
                                    stored=report.costs.context_shapes(), state=state)
        if not projected.read and not report.costs.source:      # kept, so its costs.json projects elsewhere
            report.costs.by_context = [s.to_dict() for s in projected.surface]
        return projected
    if topic == "machine":
        # the session's compile path, where given, is the one the user would run there: captured
        # forwards (graphs) pay the captured path's launches on the card
        profile = for_path(profile_named(name), report.session_compile)
        say(f"pricing the best methods on {profile.name}'s roofline over a cache of {context} tokens")
        return project_machine(pair, report.advice, context, profile, state=state, step_s=report.ar_step_s)
    return project_report(pair, report, context, where, say=say)
