"""A report to share: one prompt's (or a trace's) runs as one self-contained HTML page.

``infer.py --replay FILE --html OUT.html`` and ``/save NAME.html`` write it: inline CSS and SVG, no
script, nothing from the network. Every token is coloured by how it was produced, with the
inspector's numbers in its tooltip; each ``/whatif`` run on the prompt is charted (speedup against
batch size or context, where each run stops paying); every piece of text is escaped. No torch.
"""

from __future__ import annotations

from html import escape

from analysis.report import Why
from analysis.sources import NO_MATCH, match_note
from generation.result import Round
from repl.inspect_view import BLOCK_LEGEND, STRICT_NOTE
from repl.render import (COMPARISON_COLUMNS, busy_line, ceiling_text, comparison_cells, divergence_text,
                         environment_lines, network_text, prompt_line, what_if_text)
from repl.runs import PromptRun, StrategyRun
from repl.trace import write_whole
from utils.projection_chart import projection_chart

COLOURS = {"speculative": "#2e7d32", "ngram": "#00838f", "lookahead": "#f9a825", "target": "#1565c0",
           "drafter": "#8e24aa"}
DRAFT_FILL, VERIFY_FILL = "#f9a825", "#1e88e5"
CHART_W, CHART_H = 640, 120

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222;line-height:1.45}
h1{font-size:1.4em} h2{font-size:1.2em;border-bottom:1px solid #ccc} h3{font-size:1.05em;margin-bottom:.3em}
pre.prompt{background:#f5f5f5;padding:.6em;white-space:pre-wrap}
.env,.note,.meta{color:#666;font-size:.9em}
.text{white-space:pre-wrap;font-family:ui-monospace,monospace;background:#fafafa;padding:.6em;border:1px solid #eee}
.tok{border-radius:2px;cursor:help}
.tok:hover{outline:1px solid #555}
.acc{background:#c8e6c9}
.rej{color:#b71c1c;text-decoration:line-through;opacity:.55}
.tgt{background:#bbdefb;font-weight:bold}
.bonus{background:#e1bee7;font-weight:bold}
.ar{background:#eceff1}
.legend span{margin-right:1em;padding:0 .3em}
#hide-rejected:checked ~ main .rej{display:none}
table{border-collapse:collapse;font-size:.92em} th,td{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:right}
th:first-child,td:first-child{text-align:left}
svg{display:block;margin:.3em 0 1em 0}
"""


def _e(text) -> str:
    return escape(str(text), quote=True)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# ------------------------------------------------------------------ tokens

def _attrs(values: dict) -> str:
    """``data-*`` attributes (exact values) for the numbers that exist."""
    return "".join(f' data-{k}="{_e(repr(v) if isinstance(v, float) else v)}"'
                   for k, v in values.items() if v is not None)


def _span(piece: str, kind: str, label: str, numbers: dict) -> str:
    parts = [label] + [f"{k} {_num(v) if isinstance(v, float) else v}" for k, v in numbers.items()
                       if v is not None and k not in ("round", "position", "id")]
    title = f"round {numbers['round']} · position {numbers['position']} · " + " · ".join(parts)
    return f'<span class="tok {kind}" title="{_e(title)}"{_attrs(numbers)}>{_e(piece)}</span>'


def round_spans(rnd: Round, index: int, piece: dict, ar_kind: str | None) -> list[str]:
    """One span per token of round ``index`` (0-based): drafts, then the target's token. A draft
    of a match drafter also carries where it was copied from and the match length (the round's note)."""
    ins = rnd.inspection
    note = match_note(rnd)
    origin = {} if note is None else {"source": note["source"] or NO_MATCH, "match": note.get("match")}
    spans = []
    for i, (x, text) in enumerate(zip(rnd.drafted, piece["drafted"])):
        pos = ins.positions[i] if ins is not None and i < len(ins.positions) else None
        numbers = {"round": index + 1, "position": i, "id": x, **origin}
        if pos is not None:
            numbers.update({"p": pos.p, "q": pos.q, "accept": pos.accept,
                            "entropy-p": pos.entropy_p, "entropy-q": pos.entropy_q,
                            "ratio": pos.ratio, "threshold": pos.threshold})    # the last two: block only
        accepted = i < rnd.accepted
        spans.append(_span(text, "acc" if accepted else "rej",
                           "accepted draft" if accepted else "rejected draft", numbers))
    if rnd.token is not None and piece.get("token") is not None:
        numbers = {"round": index + 1, "position": rnd.accepted, "id": rnd.token}
        if ins is not None:
            numbers.update({"p": ins.token_p, "entropy-p": ins.token_entropy})
        if ar_kind is not None:
            kind, label = "ar", f"{ar_kind} step"
        elif rnd.bonus:
            kind, label = "bonus", "bonus token"
        else:
            kind, label = "tgt", "target token" if rnd.drafted else "target step (nothing drafted)"
        spans.append(_span(piece["token"], kind, label, numbers))
    return spans


def strategy_text(run: StrategyRun) -> str:
    """The run's text, token by token, or its plain text when the trace has no pieces."""
    result = run.result
    if run.pieces is None or len(run.pieces) != len(result.trace):
        return (f'<p class="note">this trace has no per-token text for {_e(run.label)} (written by an '
                f'older version): the plain text follows</p><div class="text">{_e(run.text)}</div>')
    ar_kind = None if run.drafting else ("target AR" if run.key == "target" else "drafter AR")
    spans = []
    for index, (rnd, piece) in enumerate(zip(result.trace, run.pieces)):
        spans += round_spans(rnd, index, piece, ar_kind)
    return f'<div class="text">{"".join(spans)}</div>'


# ------------------------------------------------------------------ charts

def phase_bars(run: StrategyRun) -> str:
    """Per round, a bar of draft time under verify time (inline SVG)."""
    trace = run.result.trace
    totals = [r.draft_s + r.verify_s for r in trace]
    top = max(totals, default=0.0)
    if not trace or top <= 0:
        return '<p class="note">no round timings recorded</p>'
    width = CHART_W / len(trace)
    bars = []
    for i, rnd in enumerate(trace):
        x = i * width
        d_h, v_h = rnd.draft_s / top * CHART_H, rnd.verify_s / top * CHART_H
        tip = (f"round {i + 1}: draft {rnd.draft_s * 1000:.1f} ms, verify {rnd.verify_s * 1000:.1f} ms, "
               f"{len(rnd.drafted)} drafted, {rnd.accepted} accepted")
        bars.append(f'<g><title>{_e(tip)}</title>'
                    f'<rect x="{x:.2f}" y="{CHART_H - d_h:.2f}" width="{max(width - 1, 0.5):.2f}" '
                    f'height="{d_h:.2f}" fill="{DRAFT_FILL}"/>'
                    f'<rect x="{x:.2f}" y="{CHART_H - d_h - v_h:.2f}" width="{max(width - 1, 0.5):.2f}" '
                    f'height="{v_h:.2f}" fill="{VERIFY_FILL}"/></g>')
    label = f"draft (amber) and verify (blue) seconds per round; tallest {top * 1000:.1f} ms"
    return (f'<svg class="phases" width="{CHART_W}" height="{CHART_H}" viewBox="0 0 {CHART_W} {CHART_H}" '
            f'role="img" aria-label="{_e(label)}">{"".join(bars)}</svg><p class="meta">{_e(label)}</p>')


def acceptance_bars(prompt_run: PromptRun, run: StrategyRun) -> str:
    """Acceptance at each draft position (inline SVG), from the same numbers as /stats."""
    why = prompt_run.why(run)
    if why is None or not why.counts:
        return '<p class="note">no round drafted anything</p>'
    row, label_w, bar_w = 18, 170, CHART_W - 170 - 10
    rows = []
    for i, (passed, judged) in enumerate(why.counts):
        rate = passed / judged if judged else 0.0
        y = i * row
        rows.append(f'<g><title>{_e(f"position {i}: {passed}/{judged} accepted")}</title>'
                    f'<text x="0" y="{y + 13}" font-size="12">{_e(f"{i}: {passed}/{judged} ({rate:.0%})")}</text>'
                    f'<rect x="{label_w}" y="{y + 3}" width="{rate * bar_w:.2f}" height="{row - 6}" '
                    f'fill="{COLOURS[run.key]}"/></g>')
    height = row * len(why.counts)
    return (f'<svg class="acceptance" width="{CHART_W}" height="{height}" viewBox="0 0 {CHART_W} {height}" '
            f'role="img" aria-label="acceptance by draft position">{"".join(rows)}</svg>')


def whatif_chart(view) -> str:
    """One ``/whatif`` projection (``repl.whatif_view.WhatIf``) as an inline SVG
    (``utils.projection_chart``): speedup against batch size (or context length), one line per run,
    where each first falls below target AR ringed."""
    return projection_chart(view.title, view.rows, view.caption, view.axis)


def comparison(prompt_run: PromptRun) -> str:
    head = "".join(f"<th>{_e(header)}</th>" for header, _ in COMPARISON_COLUMNS)
    body = "".join(
        f'<tr style="color:{COLOURS[run.key]}">'
        + "".join(f"<td>{_e(cell)}</td>" for cell in comparison_cells(prompt_run, run)) + "</tr>"
        for run in prompt_run.runs)
    return (f'<table class="comparison"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
            '<p class="meta">speedup = tokens/s over target AR; predicted, best γ: the speedup model; '
            'd/v/o = share of time drafting / verifying / other</p>')


def sources_table(why: Why | None) -> str:
    """For a match drafter (docs/model_free.md), from its run's ``why``: its rounds by the text they
    copied from, with acceptance and mean match length, and how many rounds drafted each length;
    the same numbers as the panel and ``/stats``. Empty for any other drafter."""
    if why is None or why.sources is None:
        return ""
    rows = []
    for source, c in why.sources["draft_sources"].items():
        rate = "-" if source == NO_MATCH else f"{c['acceptance_rate']:.0%}"
        match = "-" if source == NO_MATCH else f"{c['mean_match_length']:.1f}"
        rows.append(f'<tr data-source="{_e(source)}"><td>{_e("no match" if source == NO_MATCH else source)}</td>'
                    f"<td>{c['rounds']}</td><td>{c['accepted']}/{c['drafted']}</td><td>{rate}</td>"
                    f"<td>{match}</td></tr>")
    lengths = why.sources["draft_lengths"]
    histogram = " · ".join(f"{k}: {n}" for k, n in lengths["rounds_by_length"].items())
    by_match = " · ".join(f"{label}: {c['accepted']}/{c['drafted']} ({c['acceptance']:.0%})"
                          for label, c in (why.sources.get("acceptance_by_match") or {}).items())
    by_match_line = (f'<p class="meta" data-by-match>acceptance by match length (match: accepted/drafted) '
                     f"{_e(by_match)}</p>") if by_match else ""
    return ("<h4>where the drafts came from</h4><table class=\"sources\"><tr><th>source</th><th>rounds</th>"
            "<th>accepted/drafted</th><th>acceptance</th><th>mean match</th></tr>" + "".join(rows) + "</table>"
            f'<p class="meta">rounds by draft length ({_e(histogram)}) · mean {lengths["mean"]:.2f}</p>'
            + by_match_line)


# ------------------------------------------------------------------ page

def _strategy_section(prompt_run: PromptRun, run: StrategyRun) -> str:
    out = [f'<section class="strategy" data-key="{_e(run.key)}">'
           f'<h3 style="color:{COLOURS[run.key]}">{_e(run.label)}</h3>']
    if run.result is None:
        out.append(f'<p class="note">{_e(run.error or "no result")}</p></section>')
        return "".join(out)
    r = run.result
    out.append(f'<p class="meta">{len(r.tokens)} tokens · {r.seconds:.2f} s · {r.tokens_per_second:.1f} tokens/s'
               + (f" · acceptance {r.acceptance_rate:.1%} ({r.accepted}/{r.drafted} drafts)" if run.drafting else "")
               + f" · stop: {_e(r.stop_reason)}</p>")
    network = network_text(r)
    if network is not None:
        out.append(f'<p class="meta network">{_e(network)}</p>')
    parted = divergence_text(prompt_run, run)
    if parted is not None:
        verdict = prompt_run.report(run).divergence.verdict or "none"
        out.append(f'<p class="note divergence" data-verdict="{_e(verdict)}">{_e(parted)}</p>')
    why = prompt_run.why(run) if run.drafting else None
    if why is not None and why.what_if is not None:
        out.append(f'<p class="meta what-if">{_e(what_if_text(why.what_if))}</p>')
    shown = {rnd.inspection.shown for rnd in r.trace if rnd.inspection is not None}
    if "softmax" in shown:
        out.append('<p class="note">greedy: the p and q on each token are the models\' softmax at temperature 1; '
                   'accept is the greedy rule\'s (1 when the draft is p\'s top-1, else 0)</p>')
    if any(rnd.inspection is not None and rnd.inspection.one_hot_q and rnd.drafted for rnd in r.trace):
        out.append('<p class="note">n-gram drafts are deterministic: q is one-hot (q(x) = 1)</p>')
    rules = {rnd.inspection.rule for rnd in r.trace if rnd.inspection is not None and rnd.drafted}
    if "strict" in rules:
        out.append(f'<p class="note">{_e(STRICT_NOTE)}; accept is that p(x)</p>')
    if any(pos.ratio is not None for rnd in r.trace if rnd.inspection is not None
           for pos in rnd.inspection.positions):
        out.append(f'<p class="note">{_e(BLOCK_LEGEND)} (ratio = b, threshold = h on each token)</p>')
    out.append(strategy_text(run))
    if run.drafting:
        out.append("<h4>draft and verify time per round</h4>" + phase_bars(run))
        out.append("<h4>acceptance by draft position</h4>" + acceptance_bars(prompt_run, run))
        why = prompt_run.why(run)
        out.append(sources_table(why))
        ceiling = ceiling_text(why, r, prompt_run.settings.get("ngram_storage", "")) if why is not None else None
        if ceiling is not None:
            out.append(f'<p class="meta" data-ceiling>{_e(ceiling.plain)}</p>')
    out.append("</section>")
    return "".join(out)


def _prompt_section(index: int, total: int, prompt_run: PromptRun) -> str:
    parts = [f'<section class="prompt-run"><h2>prompt {index} of {total}</h2>',
             f'<pre class="prompt">{_e(prompt_run.prompt)}</pre>',
             f'<p class="meta">{_e(prompt_line(prompt_run))}</p>']
    parts += [_strategy_section(prompt_run, run) for run in prompt_run.runs]
    if prompt_run.runs:
        parts.append("<h3>Comparison</h3>" + comparison(prompt_run))
        busy = busy_line(prompt_run)
        if busy is not None:
            parts.append(f'<p class="meta" data-busy>{_e(busy)}</p>')
    for topic, view in prompt_run.whatifs.items():
        parts.append(f'<h3>What if: {_e(topic)} (projected, not run)</h3>' + whatif_chart(view))
    parts.append("</section>")
    return "".join(parts)


def report_html(prompt_runs: list[PromptRun], environment: dict, *, created: str = "") -> str:
    """The whole page as one string."""
    env = "<br>".join(_e(line) for line in environment_lines(environment))
    legend = ('<p class="legend"><span class="acc">accepted draft</span><span class="rej">rejected draft</span>'
              '<span class="tgt">target token</span><span class="bonus">bonus token</span>'
              '<span class="ar">autoregressive step</span> · hover a token for its numbers</p>')
    body = "".join(_prompt_section(i, len(prompt_runs), pr) for i, pr in enumerate(prompt_runs, start=1))
    title = "specdec report" + (f" · {created}" if created else "")
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<style>{CSS}</style></head><body><h1>{_e(title)}</h1><p class="env">{env}</p>{legend}'
            '<input type="checkbox" id="hide-rejected"><label for="hide-rejected"> hide rejected drafts</label>'
            f'<main>{body}</main></body></html>\n')


def write_report(path: str, prompt_runs: list[PromptRun], environment: dict, *, created: str = "") -> None:
    """Write the page to ``path`` whole (a temporary file, then a rename); TraceError (one line) on failure."""
    write_whole(path, report_html(prompt_runs, environment, created=created), "report", ".html")
