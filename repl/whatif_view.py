"""``/whatif batch``: the last prompt's drafting runs projected over batch size (``analysis.whatif``).

The target's forwards (and a drafter model's of its own) are timed here by shape
(``engine.shapes``) over a cache as long as the prompt and half its output; the rounds are the
runs' own. Every figure says it is projected, and from what.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from analysis.whatif import facts_of, project
from utils.machine_load import is_busy, other_load, read_load
from engine.shapes import BATCHES, time_shapes
from generation.served import ServedModel


def whatif_refusal(session) -> str | None:
    """Why ``/whatif batch`` cannot run now (one line), or None."""
    pair = session.runner.pair
    if isinstance(pair.target, ServedModel):
        return "/whatif batch needs a local target: a served target's forwards are the server's to batch"
    if pair.is_encoder_decoder:
        return "/whatif batch needs a decoder-only target"
    last = session.last_run
    if last is None or not [r for r in last.runs if r.drafting and r.usable]:
        return "/whatif batch projects the last prompt's drafting runs: run a prompt with speculative, NASD or lookahead on"
    return None


def whatif_command(session, topic: str) -> None:
    reason = whatif_refusal(session)
    if reason is not None:
        session.error(reason)
        return
    try:
        session.console.print(whatif_table(session))
    except KeyboardInterrupt:
        session.say("what-if interrupted; the models are intact", "yellow")
    except Exception as e:      # the session outlives a failed what-if
        session.error(f"/whatif failed: {type(e).__name__}: {e}")


def whatif_table(session) -> Table:
    pair, last = session.runner.pair, session.last_run
    runs = [(r, facts_of(r.result)) for r in last.runs if r.drafting and r.usable]
    runs = [(r, f) for r, f in runs if f is not None]
    outputs = [len(r.result.tokens) for r, _ in runs]
    context = len(last.prompt_ids) + (max(outputs, default=0) // 2)
    widths = sorted({1} | {w for _, f in runs for w in f.widths})
    session.say(f"timing the target by batch ({', '.join(map(str, BATCHES))}) and width "
                f"({', '.join(map(str, widths))}) over a cache of {context} tokens...", "dim")
    before = read_load()
    target = time_shapes(pair.target, BATCHES, widths, context, pair.vocab_size)
    drafter = _drafter_costs(pair, context)
    load = other_load(before, read_load())
    if is_busy(load):
        session.say(f"busy machine: other processes used {load:.1f} cores while the forwards were timed; "
                    "the projection may be off", "yellow")
    table = Table(title=f"projected speedup over target AR by batch size: this prompt's rounds, forwards timed "
                        f"here on {pair.device} (context {context} tokens)", title_justify="left")
    table.add_column("strategy")
    for batch in BATCHES:
        table.add_column(f"B={batch}", justify="right")
    table.add_column("stops paying at", justify="right")
    table.add_column("drafter cost")
    for run, facts in runs:
        own = drafter if run.key == "speculative" else None
        projection = project(facts, lambda b, w: target[(b, w)], BATCHES,
                             drafter_s=None if own is None else (lambda b: own[(b, 1)]),
                             scaled_step=run.key == "speculative")
        stops = projection.stops_paying
        table.add_row(run.label, *(f"{s:.2f}x" for s in projection.speedups),
                      f"B={stops}" if stops else f"beyond {BATCHES[-1]}", projection.drafter_source)
    table.caption = Text("forward costs only (sampling and host work left out); acceptance as this prompt's runs "
                         "had it, in lockstep at every batch size (docs/why.md)", style="dim")
    return table


def _drafter_costs(pair, context: int):
    """The drafter model's forward by batch at width 1, where it is a model of its own that runs alone
    on its own cache (not the target's weights drafting on the target's cache); None otherwise."""
    from engine.run import decodes_alone
    from kvcache.probe import runs_alone

    drafter = pair.drafter
    if (drafter is None or drafter is pair.target or pair.drafts_on_target_cache or not pair.shares_tokenizer
            or not runs_alone(drafter) or not decodes_alone(drafter)):
        return None
    return time_shapes(drafter, BATCHES, (1,), context, pair.vocab_size)
