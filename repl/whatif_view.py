"""``/whatif batch`` and ``/whatif machine NAME``: the last prompt's drafting runs projected over batch
size (``analysis.whatif``), a forward's price timed here by shape or read off a machine's roofline
(``analysis.roofline``). Every figure says it is projected, and from what."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from analysis.whatif import MIN_ROUNDS, contexts_within, facts_by_context, facts_of, project, project_contexts
from utils.machine_load import is_busy
from engine.shapes import BATCHES, coarse_widths, time_pair_shapes
from generation.served import ServedModel


def whatif_refusal(session, topic: str = "batch") -> str | None:
    """Why ``/whatif TOPIC`` cannot run now (one line), or None."""
    pair = session.runner.pair
    if isinstance(pair.target, ServedModel):
        return f"/whatif {topic} needs a local target: a served target's forwards are the server's to batch"
    if pair.is_encoder_decoder:
        return f"/whatif {topic} needs a decoder-only target"
    last = session.last_run
    if last is None or not [r for r in last.runs if r.drafting and r.usable]:
        return (f"/whatif {topic} projects the last prompt's drafting runs: run a prompt with speculative, NASD or "
                "lookahead on")
    return None


@dataclass(frozen=True)
class WhatIf:
    """One projection of the last prompt's runs: what ``/whatif`` printed, and what ``/save NAME.html``
    draws (``repl.report.whatif_chart``). ``rows``: (label, ``analysis.whatif.Projection``); ``axis``:
    "B" (batch sizes) or "L" (context lengths)."""

    title: str
    rows: list
    caption: str
    axis: str = "B"


def whatif_command(session, topic: str, machine: str | None = None) -> None:
    reason = whatif_refusal(session, topic)
    if reason is not None:
        session.error(reason)
        return
    views = {"batch": lambda: whatif_table(session), "context": lambda: context_table(session),
             "machine": lambda: machine_table(session, machine)}
    view = session.guarded(views[topic], interrupted="what-if interrupted", failed="/whatif failed")
    if view is not None:
        session.last_run.whatifs[topic if topic != "machine" else f"machine {machine}"] = view
        session.console.print(projection_table(view))


def drafting_runs(last) -> tuple[list, int]:
    """The last prompt's usable drafting runs with their rounds (``analysis.whatif.RoundFacts``), and the
    context their forwards are priced over: the prompt and half the longest output."""
    runs = [(r, facts_of(r.result)) for r in last.runs if r.drafting and r.usable]
    runs = [(r, f) for r, f in runs if f is not None]
    return runs, len(last.prompt_ids) + (max((len(r.result.tokens) for r, _ in runs), default=0) // 2)


def whatif_table(session) -> WhatIf:
    pair, last = session.runner.pair, session.last_run
    runs, context = drafting_runs(last)
    widths = sorted({1} | {w for _, f in runs for w in f.widths})
    session.say(f"timing the target by batch ({', '.join(map(str, BATCHES))}) and width "
                f"({', '.join(map(str, widths))}) over a cache of {context} tokens...", "dim")
    shapes = time_pair_shapes(pair, widths, context)
    if is_busy(shapes.other_load):
        session.say(f"busy machine: other processes used {shapes.other_load:.1f} cores while the forwards were "
                    "timed; the projection may be off", "yellow")
    rows = []
    for run, facts in runs:
        # above batch 1 only coarse widths are timed (engine.shapes.coarse_widths): read between them
        own = shapes.drafter is not None and run.key == "speculative"
        rows.append((run.label, project(facts, shapes.target_s, BATCHES,
                                        drafter_s=shapes.drafter_s if own else None,
                                        scaled_step=run.key == "speculative")))
    between = sorted(set(widths) - set(coarse_widths(widths)))
    read = (f"; above batch 1 widths {', '.join(map(str, between))} read between those timed" if between else "")
    return WhatIf(f"projected speedup over target AR by batch size: this prompt's rounds, forwards timed "
                  f"here on {pair.device} (context {context} tokens)", rows,
                  f"forward costs only (sampling and host work left out){read}; acceptance as this prompt's runs "
                  "had it, in lockstep at every batch size (docs/why.md)")


def context_table(session) -> WhatIf:
    """The last prompt's drafting runs at batch size 1 over a cache of each of ``analysis.whatif.CONTEXTS`` that
    fits the model's window (and the prompt's own): the target's forwards (and a drafter model's of
    its own) timed here at each; acceptance as the runs had it."""
    from engine.shapes import time_by_context

    pair, last = session.runner.pair, session.last_run
    runs, own = drafting_runs(last)
    widths = sorted({1} | {w for _, f in runs for w in f.widths})
    contexts = contexts_within(pair.context_length, max(widths), own)
    session.say(f"timing the target at batch 1 by width ({', '.join(map(str, widths))}) over caches of "
                f"{', '.join(map(str, contexts))} tokens...", "dim")
    target, drafter = time_by_context(pair, widths, contexts)
    steps = drafter_steps(session, runs, contexts, drafter)
    rows, seen = [], []
    for run, facts in runs:
        by_context = facts_by_context(run.result, len(last.prompt_ids), contexts)
        seen += [f"{run.label} {f.tokens_per_round:.2f} tokens a round near L={c}" for c, f in by_context.items() if f]
        speculative = run.key == "speculative"
        rows.append((run.label, project_contexts(facts, by_context, own, target, drafter if speculative else None,
                                                 on_target_weights=speculative, drafter_steps=steps,
                                                 scaled_source="its step timed at each context" if steps else None)))
    return WhatIf(f"projected speedup over target AR by context length at batch 1: this prompt's rounds, "
                  f"forwards timed here on {pair.device} (this prompt's own context: {own} tokens)", rows,
                  "forward costs only (sampling and host work left out); acceptance at each L from this prompt's "
                  f"rounds nearest it where there were {MIN_ROUNDS} or more ({'; '.join(seen) or 'none'}), elsewhere "
                  "the run's own, which a long context may lower (docs/why.md)", axis="L")


def drafter_steps(session, runs, contexts, drafter) -> dict[int, float] | None:
    """The pair's drafter model's step timed over a cache of each of ``contexts`` tokens, where a
    speculative run drafted with it and it has no forward of its own timed by context (``drafter``):
    a self-drafter on the target's cache, whose attention grows with it unlike the target's step
    (``advisor.costs.step_seconds_by_context``). None where there is none to time, or it failed (a line)."""
    from advisor.costs import step_seconds_by_context
    from advisor.replay import method

    pair = session.runner.pair
    if pair.drafter is None or any(drafter.values()) or not any(run.key == "speculative" for run, _ in runs):
        return None
    session.say(f"timing the drafter's step over caches of {', '.join(map(str, contexts))} tokens...", "dim")
    try:
        return step_seconds_by_context(pair, method("model", None, 4), getattr(session.runner, "state", None),
                                       contexts)
    except (RuntimeError, ValueError) as e:
        session.say(f"the drafter's step not timed by context ({type(e).__name__}: {e}): scaled as the "
                    "target's step", "yellow")
        return None


def machine_table(session, name: str) -> WhatIf:
    """The last prompt's drafting runs priced on the machine profile ``name``: the target's forward and
    a drafter model's from their shapes as loaded here; a storage's look-ups as timed here. Each run
    meets the card as it ran: on compile ``graphs``, its captured form (``analysis.roofline.for_path``)."""
    from analysis.roofline import for_path, profile_named
    from engine.shapes import model_shape

    pair, last = session.runner.pair, session.last_run
    card = profile_named(name)
    runs, context = drafting_runs(last)
    target = model_shape(pair.target)
    try:
        drafter = model_shape(pair.drafter) if pair.drafter is not None else None
    except (AttributeError, TypeError, ValueError):         # a drafter module with no model config
        drafter = None
    rows, used = [], {}
    for run, facts in runs:
        own = drafter if run.key == "speculative" else None
        if run.key == "speculative" and own is None:
            session.say(f"{run.label}: left out, its drafter's shape cannot be read to price it", "yellow")
            continue
        # each run priced as it ran: captured forwards (compile graphs) pay the captured path's launches
        profile = for_path(card, (getattr(run.result, "compile", None) or {}).get("path"))
        used[profile.name] = profile
        rows.append((run.label, project(facts, lambda b, w, p=profile: p.forward_s(target, b, w, context), BATCHES,
                                        drafter_s=None if own is None else (lambda b, p=profile: p.forward_s(own, b, 1, context)),
                                        scaled_step=False, drafter_source="its shape on the profile")))
    forms = "; ".join((f"{name}: " if len(used) > 1 else "") + p.describe(target) for name, p in used.items())
    return WhatIf(f"projected speedup over target AR by batch size on {' and '.join(used) or card.name}: this "
                  f"prompt's rounds, forwards from the profile's roofline (context {context} tokens)", rows,
                  f"projected, not run: {card.source}; {forms or card.describe(target)}; the models as loaded here "
                  "(their dtypes); a storage's look-ups as timed here; sampling and host work left out (docs/why.md)")


def projection_table(view: WhatIf) -> Table:
    """One row per (label, ``analysis.whatif.Projection``): its speedup at each batch size (``axis``
    "L": at each context length), where it stops paying, and where its drafter's cost came from."""
    title, rows, caption, axis = view.title, view.rows, view.caption, view.axis
    batches = rows[0][1].batches if rows else BATCHES
    table = Table(title=title, title_justify="left")
    table.add_column("strategy")
    for batch in batches:
        table.add_column(f"{axis}={batch}", justify="right")
    table.add_column("stops paying at", justify="right")
    table.add_column("drafter cost")
    for label, projection in rows:
        stops = projection.stops_paying
        table.add_row(label, *(f"{s:.2f}x" for s in projection.speedups),
                      f"{axis}={stops}" if stops else f"beyond {batches[-1]}", projection.drafter_source)
    table.caption = Text(caption, style="dim")
    return table
