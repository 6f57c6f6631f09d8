"""A projection drawn as an inline SVG: speedup over target AR against batch size or context length.

The REPL's report (``/save NAME.html`` after ``/whatif``), ``infer.py --advise --whatif ... --html`` and
``bench.py --advise --whatif ...``'s ``advice.html`` all draw their projections here. Plain strings:
no torch, no plotting library, nothing from the network.
"""

from __future__ import annotations

import math
from html import escape

LINE_COLOURS = ("#2e7d32", "#00838f", "#f9a825", "#8e24aa", "#c62828", "#5d4037", "#1565c0", "#6d4c41")
CHART_W = 640
PLOT_H, PLOT_LEFT, PLOT_BOTTOM = 200, 48, 28


def _e(text) -> str:
    return escape(str(text), quote=True)


def projection_chart(title: str, rows, caption: str, axis: str = "B") -> str:
    """``rows`` ((label, projection) with ``batches``, ``speedups`` and ``stops_paying``, as
    ``analysis.whatif.Projection`` has) as one SVG and its legend: one line per row, the points
    (``axis``=x) on a log axis, target AR's 1.0x dashed, and where each line first falls below it
    marked with a ring; ``title`` and ``caption`` (where the figures come from) below."""
    rows = [(label, p) for label, p in rows if p.speedups]
    if not rows:
        return '<p class="note">nothing was projected</p>'
    xs = rows[0][1].batches
    top = max(1.0, *(s for _, p in rows for s in p.speedups)) * 1.1
    width = CHART_W - PLOT_LEFT - 10
    span = math.log2(xs[-1] / xs[0]) or 1.0

    def at(x: float, speedup: float) -> tuple[float, float]:
        return (PLOT_LEFT + width * math.log2(x / xs[0]) / span, 6 + PLOT_H * (1 - speedup / top))

    _, one = at(xs[0], 1.0)
    parts = [f'<line x1="{PLOT_LEFT}" y1="{one:.1f}" x2="{PLOT_LEFT + width}" y2="{one:.1f}" stroke="#555" '
             'stroke-dasharray="4 3"><title>target AR: 1.00x</title></line>',
             f'<text x="{PLOT_LEFT - 4}" y="{one + 4:.1f}" font-size="11" text-anchor="end">1.0x</text>',
             f'<text x="{PLOT_LEFT - 4}" y="14" font-size="11" text-anchor="end">{top:.1f}x</text>']
    for x in xs:
        px, _ = at(x, 0.0)
        parts.append(f'<text x="{px:.1f}" y="{PLOT_H + 22}" font-size="11" text-anchor="middle">{axis}={x}</text>')
    legend = []
    for i, (label, p) in enumerate(rows):
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        points = [at(x, s) for x, s in zip(p.batches, p.speedups)]
        parts.append(f'<polyline class="projected" data-label="{_e(label)}" fill="none" stroke="{colour}" '
                     f'stroke-width="2" points="{" ".join(f"{px:.1f},{py:.1f}" for px, py in points)}"/>')
        parts += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{colour}" data-x="{x}" data-speedup="{s!r}">'
                  f'<title>{_e(f"{label}, {axis}={x}: {s:.2f}x (projected)")}</title></circle>'
                  for (px, py), x, s in zip(points, p.batches, p.speedups)]
        stops = p.stops_paying
        if stops is not None:
            px, py = points[p.batches.index(stops)]
            parts.append(f'<circle class="stops-paying" data-label="{_e(label)}" data-x="{stops}" cx="{px:.1f}" '
                         f'cy="{py:.1f}" r="8" fill="none" stroke="{colour}" stroke-width="2">'
                         f'<title>{_e(f"{label} stops paying at {axis}={stops}")}</title></circle>')
        legend.append(f'<span style="color:{colour}">{_e(label)}: '
                      + (f"stops paying at {axis}={stops}" if stops else f"pays up to {axis}={xs[-1]}")
                      + "</span>")
    height = PLOT_H + PLOT_BOTTOM + 6
    return (f'<svg class="whatif" width="{CHART_W}" height="{height}" viewBox="0 0 {CHART_W} {height}" role="img" '
            f'aria-label="{_e(title)}">{"".join(parts)}</svg>'
            f'<p class="legend">{" · ".join(legend)}</p><p class="meta">{_e(title)}; {_e(caption)}</p>')
