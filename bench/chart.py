"""Speedup over target autoregressive against gamma, one line per strategy, as a PNG.

Constant-gamma variants are the lines, each point with its 95% interval when the
run had repeats (``bench.margin``); variants without a gamma (autoregressive)
and the adaptive gamma policies (which choose their own) are horizontal lines.
"""

from __future__ import annotations

from pathlib import Path

from bench.aggregate import ALL, GROUNDED, SummaryRow
from bench.margin import interval
from bench.variants import LABELS, parse_variant_name
from utils.method_name import policy_kind

_STYLE = {
    "speculative": dict(color="tab:blue", marker="o"),
    "ngram": dict(color="tab:green", marker="s"),
    "lookahead": dict(color="tab:purple", marker="D"),
    "arctic_suffix": dict(color="tab:red", marker="^", linestyle="--", alpha=0.7),
    "hf_assisted": dict(color="tab:blue", marker="o", linestyle="--", alpha=0.7),
    "hf_prompt_lookup": dict(color="tab:green", marker="s", linestyle="--", alpha=0.7),
    "drafter": dict(color="tab:orange", linestyle=":"),
    "hf_generate": dict(color="tab:gray", linestyle=":"),
}
_POLICY_STYLE = {"heuristic": dict(linestyle=(0, (1, 1))), "confidence": dict(linestyle="-."),
                 "model": dict(linestyle=(0, (5, 1)), linewidth=2)}


def series_key(variant) -> str:
    """The line a constant-gamma variant belongs to: its strategy, or with a tree, a
    self-drafter or one of several n-gram storages the variant's name without its gamma
    (``speculative[self:int8]+tree8``, ``ngram[suffix]``)."""
    if not variant.tree and not variant.drafter and not variant.storage and not variant.shape:
        return variant.strategy
    return variant.name.partition("@")[0]


def series_rows(rows: list[SummaryRow], category: str) -> dict[str, list[SummaryRow]]:
    """line (see :func:`series_key`) -> its rows sorted by gamma, for the drafting strategies."""
    series: dict[str, list[SummaryRow]] = {}
    for r in rows:
        v = parse_variant_name(r.variant)
        if r.category == category and r.position is None and r.gamma is not None and r.speedup is not None \
                and v.constant:
            series.setdefault(series_key(v), []).append(r)
    return {k: sorted(v, key=lambda r: r.gamma) for k, v in series.items()}


def error_bars(line: list[SummaryRow]) -> list[list[float]] | None:
    """[below, above] distances of each point's 95% interval (``bench.margin``), for
    matplotlib's ``yerr``; None when a point has no margin (one repeat)."""
    bounds = [interval(r.speedup, r.speedup_margin) for r in line]
    if any(b is None for b in bounds):
        return None
    return [[r.speedup - low for r, (low, _) in zip(line, bounds)],
            [high - r.speedup for r, (_, high) in zip(line, bounds)]]


def flat_lines(rows: list[SummaryRow], category: str) -> dict[str, float]:
    """Speedups of the variants without a constant gamma, by variant name (horizontal lines)."""
    return {r.variant: r.speedup for r in rows
            if r.category == category and r.position is None and r.speedup is not None
            and not (r.gamma is not None and parse_variant_name(r.variant).constant)}


def _flat_style(name: str) -> dict:
    v = parse_variant_name(name)
    style = dict(_STYLE.get(v.strategy, {}))
    style.pop("marker", None)
    style.update(_POLICY_STYLE.get(policy_kind(v.policy), {}) if not v.constant else {})
    return style


def _line_style(variant) -> dict:
    """The strategy's style; a tree or a self-drafter line is dashed, in its own colour."""
    style = dict(_STYLE.get(variant.strategy, {}))
    if variant.tree or variant.drafter or variant.storage:
        style.pop("color", None)
        style["linestyle"] = "--" if variant.drafter or variant.storage else "-."
    return style


def _panel(ax, rows: list[SummaryRow], category: str, title: str) -> None:
    ax.axhline(1.0, color="black", linewidth=0.8)
    for name, value in flat_lines(rows, category).items():
        if name != "target":
            ax.axhline(value, label=parse_variant_name(name).label, **_flat_style(name))
    lines = series_rows(rows, category)
    for key, line_rows in lines.items():
        gammas, speedups = [r.gamma for r in line_rows], [r.speedup for r in line_rows]
        line = parse_variant_name(key)
        ax.errorbar(gammas, speedups, yerr=error_bars(line_rows), capsize=3,
                    label=LABELS.get(key, line.label), **_line_style(line))
    gammas = sorted({r.gamma for line_rows in lines.values() for r in line_rows})
    if gammas:
        ax.set_xscale("log", base=2)
        ax.set_xticks(gammas, [str(g) for g in gammas])
    ax.set_xlabel("γ (draft tokens per round)")
    ax.set_ylabel("speedup over target autoregressive")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)


def speedup_chart(rows: list[SummaryRow], path: Path, *, title: str = "") -> Path:
    """Save the chart: all prompts, and the input-grounded ones when there are some."""
    # Imported here: matplotlib takes seconds to import, and only a run that draws the chart needs it.
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(ALL, "all prompts")]
    if any(r.category == GROUNDED for r in rows):
        panels.append((GROUNDED, "input-grounded prompts"))
    legend_rows = -(-len({r.variant for r in rows}) // 4)      # an upper bound: 4 entries a row
    height = 4.5 + 0.25 * legend_rows
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), height), squeeze=False)
    for ax, (category, name) in zip(axes[0], panels):
        _panel(ax, rows, category, name)
    handles, labels = axes[0][0].get_legend_handles_labels()
    ncol = min(len(labels), 4)
    fig.legend(handles, labels, loc="lower center", ncol=max(ncol, 1), fontsize="small")
    if title:
        fig.suptitle(title, fontsize="medium")
    bottom = (0.3 + 0.22 * -(-len(labels) // max(ncol, 1))) / height
    fig.tight_layout(rect=(0, bottom, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
