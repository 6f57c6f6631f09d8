"""The REPL's ``/advise`` and scripted ``--advise``: the advisor's ranking as a table or as JSON.

``/advise`` advises on the last prompt (or on ``/advise TEXT``) for the loaded pair;
``infer.py --advise`` on every scripted prompt together, ``--json`` printing the advisor's JSON
object (``advisor.advise.AdviceReport.to_dict``). The cost table is measured on the first
advice and kept by the session (``/stats`` shows it), or read from ``--costs FILE``.
"""

from __future__ import annotations

import json

from rich.console import Group
from rich.table import Table
from rich.text import Text

from advisor import CONFIRM
from advisor.rank import ROUNDING


def advice_table(report) -> Table:
    """The methods best first: predicted beside measured, tokens per call, the replay's exactness and
    why (a rounding reason goes once below the table)."""
    table = Table(title=f"advice: best first, {report.ranked_on} (predicted from the replay; the confirmed "
                        "first, by their measured speedup)", title_justify="left", show_lines=False)
    for name, justify in (("#", "right"), ("method", "left"), ("predicted", "right"), ("measured", "right"),
                          ("decode pred. / meas.", "right"), ("tok/call pred. / meas.", "right"), ("replay", "left"),
                          ("why", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for i, advice in enumerate(report.advice, 1):
        measured = advice.measured_text()
        if advice.identical is False and not advice.confirm_error:
            measured += " differs!"
        why = advice.why.line() + (f" · {advice.note}" if advice.note and advice.exactness != ROUNDING else "")
        if advice.confirm_error:
            why += f" · run failed: {advice.confirm_error}"
        table.add_row(str(i), advice.method, advice.predicted_text(), measured, advice.decode_text(),
                      advice.tokens_text(), advice.exactness, why)
    return table


def costs_table(costs) -> Table:
    """The cost table in milliseconds: the target by width, each drafter's step by width."""
    table = Table(title=f"forward costs, {costs.label()}", title_justify="left")
    table.add_column("forward", justify="left")
    table.add_column("ms by width", justify="left", overflow="fold")
    table.add_row("target", "  ".join(f"{w}: {s * 1e3:.2f}" for w, s in sorted(costs.target_s.items())))
    for key, widths in sorted(costs.draft_s.items()):
        table.add_row(f"drafter {key}", "  ".join(f"{w}: {s * 1e3:.2f}" for w, s in sorted(widths.items())))
    table.add_row("host per round", f"{costs.host_s * 1e3:.2f}")
    return table


def advice_view(report) -> Group:
    """The table, the costs' origin, what could not be replayed, and the advisor's own seconds."""
    lines = [advice_table(report),
             Text(f"costs {report.costs.label()}" + "".join(f"; {n}" for n in report.costs.notes), style="dim")]
    step = f"; its decode step in the record the replay read, {report.ar_step_s * 1e3:.1f} ms, prices the predictions" \
        if report.ar_step_s else ""
    beside = " beside the confirmed runs" if len(report.ar_passes) > 1 else ""
    lines.append(Text(f"baseline: target AR {report.ar_tokens_per_s:.1f} tok/s{beside}, the measured speedups' "
                      f"denominator{step} (predicted and measured: end to end, each prompt's time to first token in; "
                      "decode: after the first round)", style="dim"))
    estimated = [a.sampling_line() for a in report.advice if a.sampling is not None]
    if estimated:
        lines.append(Text("under the session's sampling, estimated from the target's and the drafter's "
                          "distributions along target AR's path (steady state): " + "; ".join(estimated),
                          style="yellow"))
    rounding = report.rounding_line()
    if rounding:
        lines.append(Text(rounding, style="dim"))
    for method, reason in report.unreplayable:
        lines.append(Text(f"not replayed: {method}: {reason}", style="yellow"))
    for note in report.notes:
        lines.append(Text(note, style="yellow"))
    lines.append(Text(f"advised in {report.seconds:.1f} s on {report.prompts} prompt(s) of {report.length} "
                      "new tokens, greedy", style="dim"))
    return Group(*lines)


def refusal(pair) -> str | None:
    """Why the advisor cannot run on ``pair`` (one line), or None."""
    from engine.widths import fill_refusal

    if pair.target is None:
        return "/advise needs a loaded target"
    reason = fill_refusal(pair.target)
    return None if reason is None else "/advise " + reason.replace("filling verify widths ", "")


def advise_prompts(session, prompt_ids: list[list[int]]):
    """The advisor's report for ``prompt_ids`` under the session's settings, its cost table kept;
    None (with one error line) when it cannot run."""
    from advisor.advise import SAMPLING_NOTE, advise

    reason = refusal(session.runner.pair)
    if reason is not None:
        session.error(reason)
        return None
    settings = session.settings
    if not settings.processor.is_greedy:
        session.say(SAMPLING_NOTE, "yellow")
    report = session.guarded(
        lambda: advise(session.runner.pair, prompt_ids, length=settings.length, costs=session.advisor_costs,
                       confirm=CONFIRM, state=session.runner.state, seed=settings.seed, processor=settings.processor,
                       session_compile=settings.compile, say=lambda line: session.say(line, "dim")),
        interrupted="advice interrupted", failed="/advise failed")
    if report is None:
        return None
    session.advisor_costs = report.costs
    return report


def advise_command(session, text: str | None) -> None:
    """``/advise [TEXT]``: advice for the last prompt, or for ``TEXT`` (its escapes already read)."""
    from repl.runner import PromptRefused

    if text is None:
        if session.last_run is None:
            session.error("no prompt has run yet: /advise advises on the last prompt, or give one: /advise TEXT")
            return
        ids = session.last_run.prompt_ids
    else:
        try:
            ids = session.runner.prepare(text, session.settings).prompt_ids
        except PromptRefused as e:
            session.error(str(e))
            return
    report = advise_prompts(session, [ids])
    if report is not None:
        session.console.print(advice_view(report))


def advise_script(session, entries, *, as_json: bool, stdout, whatif: str | None = None,
                  html: str | None = None) -> int:
    """``infer.py --advise``: the commands applied in order, then one advice over every prompt (JSON with
    ``as_json``; projected with ``whatif``, ``batch``, ``context`` or ``machine:NAME``:
    ``analysis.whatif.whatif_choice``; written as one HTML page, the projection charted, to ``html``).
    0, or 1 when it could not run."""
    from repl.runner import PromptRefused

    prompts = []
    for entry in entries:
        if entry.kind == "command":
            if not session.command(entry.text):
                break
            continue
        try:
            prompts.append(session.runner.prepare(entry.text, session.settings).prompt_ids)
        except PromptRefused as e:
            session.error(f"[{entry.where}] {e}")
    if not prompts:
        session.error("--advise needs a prompt (--prompt TEXT, --prompts-file FILE or stdin)")
        return 1
    report = advise_prompts(session, prompts)
    if report is None:
        return 1
    if whatif and not project_report(session, report, prompts, whatif):
        return 1
    if as_json:
        stdout.write(json.dumps(report.to_dict(), ensure_ascii=False) + "\n")
        stdout.flush()
    else:
        session.console.print(advice_view(report))
        if report.whatif is not None:
            session.console.print(whatif_view(report.whatif))
            best = report.whatif.best_line()
            if best:
                session.console.print(best, highlight=False)
            lines = report.whatif.best_gamma_lines()
            if lines:
                session.console.print(f"best γ at each {report.whatif.axis}, per drafter shown (projected, not run):", highlight=False)
                for line in lines:
                    session.console.print(f"  {line}", highlight=False, soft_wrap=True)
    if html:
        from bench.advice_page import advice_html
        from repl.trace import TraceError, write_whole

        try:
            write_whole(html, advice_html({f"{report.prompts} prompts": report}, report.costs.label()), "report",
                        ".html")
        except TraceError as e:
            session.error(str(e))
            return 1
        # whole on one line, however long the path: a path folded inside a word cannot be copied
        session.console.print(Text(f"advice written to {html} (one self-contained page)", style="dim"), soft_wrap=True)
    return 1 if session.failures else 0


def project_report(session, report, prompts: list[list[int]], whatif: str = "batch") -> bool:
    """The report's best methods projected (``whatif``: ``batch``, timed here by shape; ``context``, at
    batch 1 by context, timed here; ``machine:NAME``, on that profile), kept in ``report.whatif``;
    False (with one error line) where that cannot run."""
    from advisor.advise import context_of
    from advisor.costs import where_measured
    from advisor.whatif import project_for
    from utils.machine_load import is_busy

    pair = session.runner.pair
    if pair.is_encoder_decoder:
        session.error(f"--whatif {whatif} needs a decoder-only target")
        return False
    report.whatif = session.guarded(
        lambda: project_for(pair, report, context_of(prompts, report.length), where_measured(pair.device), whatif,
                            state=session.runner.state, say=lambda line: session.say(line, "dim")),
        interrupted="what-if interrupted", failed="--whatif failed")
    if report.whatif is None:
        return False
    load = report.whatif.other_load             # where forwards were timed here: the machine's load meanwhile
    if is_busy(load):
        session.say(f"busy machine: other processes used {load:.1f} cores while the forwards were timed; "
                    "the projection may be off", "yellow")
    return True


def whatif_view(whatif):
    """The projection's table (``repl.whatif_view.projection_table``)."""
    from repl.whatif_view import WhatIf, projection_table

    return projection_table(WhatIf(whatif.title(), whatif.rows, whatif.caption(), axis=whatif.axis))
