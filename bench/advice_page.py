"""The advice as one self-contained HTML page: each group's ranking and, where asked for, its projection.

``bench.py --advise`` writes it as ``advice.html`` (one section per category) and ``infer.py --advise
--html OUT.html`` for its prompts. Each section holds the advisor's table (predicted beside measured,
tokens per target call, the replay's exactness and why) and, with ``--whatif``, the projection drawn
(``utils.projection_chart``: speedup against batch size, context length or a card's batch sizes, one
line per method, where each stops paying ringed), its source and the best method at each point. Inline
CSS and SVG, no script, nothing from the network; every piece of text escaped. No torch.
"""

from __future__ import annotations

from html import escape

from utils.projection_chart import projection_chart

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:64em;color:#222;line-height:1.45}
h1{font-size:1.4em} h2{font-size:1.2em;border-bottom:1px solid #ccc} h3{font-size:1.05em;margin-bottom:.3em}
.meta,.note{color:#666;font-size:.9em}
table{border-collapse:collapse;font-size:.9em} th,td{padding:.2em .6em;border-bottom:1px solid #ddd;text-align:right}
td.l,th.l{text-align:left}
.legend span{margin-right:1em}
svg{display:block;margin:.3em 0 1em 0}
"""
COLUMNS = (("#", ""), ("method", "l"), ("predicted", ""), ("measured", ""), ("decode pred. / meas.", ""),
           ("tok/call pred. / meas.", ""), ("replay", "l"), ("why", "l"))


def _e(text) -> str:
    return escape(str(text), quote=True)


def advice_rows(report) -> list[tuple[str, ...]]:
    """The cells of the advice table, best first: the same texts the terminal's and Markdown's tables show."""
    return [(str(i), a.method, a.predicted_text(), a.measured_text(), a.decode_text(), a.tokens_text(),
             a.exactness, a.why.line()) for i, a in enumerate(report.advice, 1)]


def projection_section(whatif) -> str:
    """A report's projection (``advisor.whatif.Projected``): its chart, source and best method at each point."""
    best = whatif.best_line()
    return ('<h3 class="whatif">What if (projected, not run)</h3>'
            + projection_chart(whatif.title(), whatif.rows, whatif.caption(), whatif.axis)
            + (f'<p class="best" data-axis="{_e(whatif.axis)}">{_e(best[0].upper() + best[1:])}.</p>' if best else "")
            + best_gamma_table(whatif))


def best_gamma_table(whatif) -> str:
    """Each drafter shown at its best draft length at each point (``Projected.best_gammas``), or ""."""
    gammas = whatif.best_gammas()
    if not gammas:
        return ""
    axis = whatif.axis
    head = '<th class="l">drafter</th>' + "".join(f"<th>{_e(axis)}={b}</th>" for b in whatif.batches)
    body = "".join(
        f'<tr data-drafter="{_e(family)}"><td class="l">{_e(family)}</td>'
        + "".join(f'<td data-gamma="{g}" data-speedup="{s!r}">γ {g}: {s:.2f}x{" (none pays)" if s < 1.0 else ""}</td>'
                  for _, g, s in points) + "</tr>" for family, points in gammas)
    return (f'<p class="meta">Best γ at each {_e(axis)}, per drafter shown (projected, not run):</p>'
            f'<table class="best-gamma"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def report_section(name: str, report) -> str:
    """One group's advice (``advisor.advise.AdviceReport``) and its projection, where there is one."""
    head = "".join(f'<th class="{cls}">{_e(title)}</th>' for title, cls in COLUMNS)
    body = "".join("<tr>" + "".join(f'<td class="{cls}">{_e(cell)}</td>' for (_, cls), cell in zip(COLUMNS, row))
                   + "</tr>" for row in advice_rows(report))
    parts = [f'<section class="advice" data-group="{_e(name)}"><h2>{_e(name)}</h2>',
             f'<p class="meta">{report.prompts} prompts, {report.length} new tokens, target AR '
             f'{report.ar_tokens_per_s:.1f} tok/s; {_e(report.ranked_on)}; advised in {report.seconds:.1f} s</p>',
             f'<table class="advice"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>',
             '<p class="meta">predicted from the replay; measured: the confirming runs beside target AR</p>']
    if report.whatif is not None:
        parts.append(projection_section(report.whatif))
    parts += [f'<p class="note">{_e(note)}.</p>' for note in report.notes]
    parts += [f'<p class="note">Not replayed: {_e(method)}: {_e(reason)}.</p>' for method, reason in report.unreplayable]
    parts.append("</section>")
    return "".join(parts)


def advice_html(reports: dict, costs_label: str, *, title: str = "specdec advice") -> str:
    """The page: ``reports`` (group name -> ``AdviceReport``), in order, under the cost table's label."""
    body = "".join(report_section(name, report) for name, report in reports.items())
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<style>{CSS}</style></head><body><h1>{_e(title)}</h1><p class="meta">Costs {_e(costs_label)}.</p>'
            f'<main>{body}</main></body></html>\n')
