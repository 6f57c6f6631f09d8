"""What ``/stats`` shows about the last prompt: the summary of why each drafting strategy ran as
fast as it did, then per strategy its acceptance and draft-length charts, the cost model and the
cache rollbacks (docs/why.md). No torch: ``infer.py --replay`` shows it for a trace.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from analysis.report import Why, plain_step_words
from analysis.sources import NO_MATCH
from analysis.speedup import measured_mix
from generation.result import GenerationResult
from repl.render import (
    PHASES, STRATEGY_COLOURS, ceiling_text, compile_text, cross_tokenizer_text, decode_rate_cell, dim, divergence_text,
    est_note, fill_text, first_token_ms, hybrid_text, interval_note, lookahead_text, ms_text, present, ratio_text,
    rollback_text, tree_text,
)
from repl.runs import PromptRun

BLOCKS = " ▏▎▍▌▋▊▉█"  # eighths of a character cell, for the bar charts
BAR_WIDTH = 16


def bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of ``fraction`` (0..1) of ``width`` cells, in eighths."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    return ("█" * full + (BLOCKS[part] if part else "")).ljust(width)


def chart(*columns: tuple[str, str], bars: tuple[str, ...] = (), overflow: str = "ellipsis") -> Table:
    """A borderless table of ``columns`` (header, justification); those named in ``bars`` hold a :func:`bar`."""
    table = Table(show_edge=False, pad_edge=False, box=None)
    for header, justify in columns:
        table.add_column(Text(header), justify=justify, overflow=overflow,
                         min_width=BAR_WIDTH if header in bars else None)
    return table


def _cost_text(why: Why) -> str:
    costs = why.costs
    widths = ", ".join(f"{w}: {ms_text(c)}" for w, c in sorted(costs.verify_s.items()))
    return (f"cost model: drafter step {ms_text(costs.draft_step_s)} · verify by width {{{widths}}} · "
            f"other {ms_text(costs.other_per_round_s)}/round · {plain_step_words(why)}"
            + (f" · estimated: {', '.join(why.estimated)}" if why.estimated else ""))


def summary_table(prompt_run: PromptRun, rtt_ms: float | None = None) -> Table:
    """One column per drafting strategy, one row per number behind its speed;
    with a round trip (``rtt_ms``, default the prompt's /rtt) the what-if rows."""
    whys = [(run, prompt_run.why(run, rtt_ms)) for run in prompt_run.runs]
    whys = [(run, why) for run, why in whys if why is not None]
    table = Table(title=Text("Why (last prompt)"), title_justify="left", show_edge=False, pad_edge=False)
    table.add_column(Text(""))
    for run, _ in whys:
        table.add_column(Text(run.label, style=f"bold {STRATEGY_COLOURS[run.key]}"), justify="right",
                         overflow="fold")

    def row(name: str, cell) -> None:
        table.add_row(Text(name), *(Text(cell(run, why)) for run, why in whys))

    row("rounds", lambda run, why: str(len(run.result.trace)))
    row("accepted / drafted", lambda run, why: "n/a (nothing drafted)" if not why.acceptance.drafted
        else f"{why.acceptance.accepted}/{why.acceptance.drafted} ({why.acceptance.draft_acceptance_rate:.0%})")
    row("mean acceptance length", lambda run, why: f"{why.acceptance.mean_acceptance_length:.2f}")
    row("rounds that drafted", lambda run, why: f"{why.draft_share:.0%}")
    for phase in PHASES:
        row(f"{phase} seconds", lambda run, why, p=phase: f"{(run.result.phases or {}).get(p, 0.0):.3f}")
    row("tokens/s (end to end)", lambda run, why: f"{run.result.tokens_per_second:.1f}")
    row("time to first token (ms)", lambda run, why: first_token_ms(run.result))
    row("decode tokens/s (after the first round)", lambda run, why: decode_rate_cell(run.result))
    row("measured speedup", lambda run, why: ratio_text(prompt_run.speedup(run)))
    row("predicted speedup (this run)", lambda run, why: f"{ratio_text(why.predicted)}{est_note(why)}"
        + f"{interval_note(why)} " + ("at measured draft lengths" if why.measured else f"at γ {why.gamma}"))
    row("first round (prefill) seconds", lambda run, why: "-" if why.first_round_s is None
        else f"{why.first_round_s:.3f}")
    row("predicted, decode part", lambda run, why: f"{ratio_text(why.predicted_steady)}{est_note(why)}")
    row("measured, decode part", lambda run, why: ratio_text(prompt_run.decode_speedup(run)))
    row("best γ (predicted)", lambda run, why: "-" if why.no_gamma else "n/a" if why.best_gamma is None
        else f"{why.best_gamma} ({ratio_text(why.best_speedup)})")
    row("plain step", lambda run, why: plain_step_words(why).removeprefix("plain step: "))
    if any(why.estimated for _, why in whys):
        row("estimated inputs", lambda run, why: ", ".join(why.estimated) or "-")
    if any(why.sources is not None for _, why in whys):
        row("draft length: mean, p50/p90, max", lambda run, why: "-" if why.sources is None
            else _lengths_cell(why.sources["draft_lengths"]))
        row("mean match length", lambda run, why: "-" if why.sources is None
            or why.sources["mean_match_length"] is None else f"{why.sources['mean_match_length']:.1f}")
    if any(why.tree is not None for _, why in whys):
        row("best tree nodes (predicted)", lambda run, why: "-" if why.tree is None
            else f"{why.tree['best_nodes']} ({ratio_text(why.tree['best_nodes_speedup'])})")
    row("gamma policy", lambda run, why: run.result.gamma_policy or "-")
    row("compile path", lambda run, why: (compile_text(run.result) or "-").removeprefix("compile: "))
    row("verify rule", lambda run, why: run.result.verify_rule or (f"tree ({run.result.tree_rule})"
                                                                   if run.result.tree_rule else "-"))
    if any(why.what_if is not None for _, why in whys):
        rtt = next(why.what_if.rtt_ms for _, why in whys if why.what_if is not None)
        row(f"at a {rtt:g} ms round trip (/rtt): predicted",
            lambda run, why: "-" if why.what_if is None else ratio_text(why.what_if.predicted))
        row(f"at a {rtt:g} ms round trip: long outputs",
            lambda run, why: "-" if why.what_if is None else ratio_text(why.what_if.predicted_steady))
        row(f"at a {rtt:g} ms round trip: best γ",
            lambda run, why: "-" if why.what_if is None or why.what_if.best_gamma is None
            else f"{why.what_if.best_gamma} ({ratio_text(why.what_if.best_speedup)})")
    return table


def _lengths_cell(lengths: dict) -> str:
    """``3.25, 4/8, 8``: a draft-length distribution's mean, median and 90th percentile, and maximum."""
    if "p50" not in lengths:
        return "-"
    return f"{lengths['mean']:.2f}, {lengths['p50']}/{lengths['p90']}, {lengths['max']}"


def sources_table(why: Why) -> Table:
    """Per source a match drafter drafted from: rounds, acceptance, mean match length."""
    table = chart(("source", "left"), *((header, "right") for header in (
        "rounds", "drafting", "accepted/drafted", "acceptance", "mean acc. length", "mean match")))
    for source, c in why.sources["draft_sources"].items():
        table.add_row(Text("no match" if source == NO_MATCH else source), Text(str(c["rounds"])),
                      Text(str(c["drafting_rounds"])), Text(f"{c['accepted']}/{c['drafted']}"),
                      Text(f"{c['acceptance_rate']:.0%}"), Text(f"{c['mean_acceptance_length']:.2f}"),
                      Text(f"{c['mean_match_length']:.1f}"))
    return table


def draft_length_chart(why: Why, trace: list) -> Table:
    """Row k: the rounds that drafted k tokens, with a bar, and the tokens such a round yielded
    on average: what the speedup model prices for a drafter that chose its lengths."""
    table = chart(("k", "right"), ("rounds", "right"), ("rounds drafting k tokens", "left"), ("tokens/round", "right"),
                  bars=("rounds drafting k tokens",))
    histogram = {int(k): c for k, c in why.sources["draft_lengths"]["rounds_by_length"].items()}
    tokens = measured_mix(trace).tokens if trace else {}
    top = max(histogram.values(), default=0)
    for k, count in histogram.items():
        table.add_row(Text(str(k)), Text(str(count)), Text(bar(count / top if top else 0.0), style="cyan"),
                      Text(f"{tokens.get(k, 0.0):.2f}"))
    return table


def match_chart(why: Why) -> Table | None:
    """Row per match length (grouped): the rounds that copied drafts after such a match, their
    acceptance as a bar, and how often the first draft was taken; None without such rounds."""
    by_match = why.sources.get("acceptance_by_match") or {}
    if not by_match:
        return None
    table = chart(("match", "right"), ("rounds", "right"), ("accepted/drafted", "right"), ("acceptance", "left"),
                  ("", "right"), ("first draft taken", "right"), bars=("acceptance",))
    for label, c in by_match.items():
        table.add_row(Text(label), Text(str(c["rounds"])), Text(f"{c['accepted']}/{c['drafted']}"),
                      Text(bar(c["acceptance"]), style="cyan"), Text(f"{c['acceptance']:.0%}"),
                      Text(f"{c['first_taken']:.0%}"))
    return table


def _tree_depth_text(result: GenerationResult) -> str:
    """``acceptance by tree depth: 0 12/20 60% · 1 ...`` and tokens per target call."""
    from analysis.trees import tree_summary

    stats = tree_summary(result.trace, tokens=len(result.tokens), target_calls=result.target_calls)
    if stats is None:
        return ""
    depth = " · ".join(f"{i} {a}/{r} {a / r:.0%}" for i, (a, r) in enumerate(stats["acceptance_by_depth"]) if r)
    return f"acceptance by tree depth: {depth}; {stats['tokens_per_target_call']:.2f} tokens/target call"


def acceptance_chart(why: Why) -> Table:
    """Row i: acceptance at draft position i, conditional (with a bar) and unconditional, and the
    drafting rounds that accepted exactly i drafts (with a bar)."""
    table = chart(("i", "right"), ("accepted/reached", "right"), ("conditional", "right"),
                  ("acceptance at position i", "left"), ("per drafting round", "right"), ("rounds", "right"),
                  ("rounds accepting i drafts", "left"), bars=("acceptance at position i", "rounds accepting i drafts"),
                  overflow="fold")
    a = why.acceptance
    unconditional = a.acceptance_rate_per_position
    top = max(a.histogram, default=0)
    for i in range(len(a.histogram)):
        cells = [Text(""), Text(""), Text(""), Text("")]
        if i < len(a.reached_by_position) and a.reached_by_position[i]:
            passed, reached = a.accepted_by_position[i], a.reached_by_position[i]
            cells[:3] = [Text(f"{passed}/{reached}"), Text(f"{passed / reached:.0%}"),
                         Text(bar(passed / reached), style="green")]
        if i < len(unconditional):
            cells[3] = Text(f"{unconditional[i]:.0%}")
        count = a.histogram[i]
        table.add_row(Text(str(i)), *cells, Text(str(count)),
                      Text(bar(count / top if top else 0.0), style="cyan"))
    return table


def by_draft_length_text(why: Why) -> Text | None:
    """``drafting rounds by draft length (accepted 0, 1, ...): 2: 1 0 0 · 3: 0 1 0 1``,
    when the rounds drafted different lengths (γ adapted); None otherwise."""
    rows = why.acceptance.by_draft_length
    if len(rows) < 2:
        return None
    text = " · ".join(f"{n}: " + " ".join(map(str, h)) for n, h in rows.items())
    return Text(f"drafting rounds by draft length (accepting 0, 1, ... drafts): {text}", style="dim")


def decode_line(prompt_run: PromptRun) -> Text | None:
    """``Target AR: 9.7 tokens/s end to end · first token 123 ms · decode 8.4 tokens/s``, for the
    runs without a column in the summary (no drafts); None when there is none."""
    parts = [f"{run.label}: {run.result.tokens_per_second:.1f} tokens/s end to end · first token "
             f"{first_token_ms(run.result)} ms · decode {decode_rate_cell(run.result)} tokens/s"
             + (f" · {compile_text(run.result)}" if compile_text(run.result) else "")
             for run in prompt_run.runs if not run.drafting and run.result is not None]
    return Text("; ".join(parts), style="dim") if parts else None


def stats_view(prompt_run: PromptRun, rtt_ms: float | None = None) -> Group:
    """What /stats shows: the summary, then per drafting strategy its acceptance charts, the cost model
    and the cache rollbacks; ``rtt_ms``: the /rtt what-if (default: the prompt's own)."""
    parts: list = [summary_table(prompt_run, rtt_ms)]
    for run in prompt_run.runs:
        why = prompt_run.why(run)
        if why is None:
            continue
        colour = STRATEGY_COLOURS[run.key]
        parts.append(Text(""))
        rule = f" (verify {run.result.verify_rule})" if run.result.verify_rule else ""
        parts.append(Text(f"{run.label}{rule}: acceptance by draft position, accepted drafts per round",
                          style=f"bold {colour}"))
        if not why.acceptance.histogram:
            parts.append(Text("no round drafted anything", style="dim"))
        else:
            a = why.acceptance
            parts += [acceptance_chart(why), Text(f"mean acceptance length {a.mean_acceptance_length:.2f} over "
                                                  f"{a.drafting_rounds} drafting rounds", style="dim")]
            parts += present(by_draft_length_text(why))
        if why.sources is not None:
            parts.append(Text("where the drafts came from, and their lengths (the speedup model prices "
                              "these lengths, not one γ)", style=f"bold {colour}"))
            parts += [sources_table(why), draft_length_chart(why, run.result.trace)]
            by_match = match_chart(why)
            if by_match is not None:
                parts += [Text("acceptance by match length (tokens of the tail found where the drafts were "
                               "copied from)", style=f"bold {colour}"), by_match]
        r = run.result
        parts += present(ceiling_text(why, r, prompt_run.settings.get("ngram_storage", "")))
        parts += dim(None if why.costs is None else _cost_text(why))
        tree = lookahead_text(r) if run.key == "lookahead" else tree_text(r)
        if tree is not None:
            parts += [tree, Text(_tree_depth_text(r), style="dim")]
        parts += present(hybrid_text(r), fill_text(r, widths=True))
        parts.append(Text(f"cache rollback: {rollback_text(r.rollback)}", style="dim"))
        parted = divergence_text(prompt_run, run)
        if parted is not None:
            parts.append(Text(parted, style="yellow" if prompt_run.report(run).divergence.tie else "bold red"))
        parts += dim(compile_text(r, detail=True), cross_tokenizer_text(r))
    if len(parts) == 1:
        return Group(Text("no drafting strategy finished on the last prompt: /stats needs speculative, NASD or lookahead",
                          style="yellow"))
    plain = decode_line(prompt_run)
    if plain is not None:
        parts.insert(1, plain)
    parts.append(Text(""))
    parts.append(Text("conditional = drafts accepted at a position over the rounds that reached it; per drafting "
                      "round = the same over every drafting round (vLLM's per-position rate); mean acceptance "
                      "length = 1 + accepted / drafting rounds; predicted = the speedup model at the run's γ "
                      "(at its measured draft lengths for a drafter that chose them); "
                      "docs/why.md explains each number", style="dim"))
    return Group(*parts)
