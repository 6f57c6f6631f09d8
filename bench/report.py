"""The printed report: rich tables for the terminal and the same as Markdown."""

from __future__ import annotations

from bench.aggregate import ALL, SummaryRow
from bench.expect import Verdict
from bench.variants import parse_variant_name

DASH = "—"

OVERALL_COLUMNS = ("Strategy", "γ", "mean γ", "tok/s", "speedup", "vs peer", "TTFT ms", "decode tok/s",
                   "decode speedup", "accept", "acc len", "tok/call", "call cost", "target calls", "identical",
                   "1st div")


def _num(value: float | None, spec: str, suffix: str = "") -> str:
    return DASH if value is None else f"{value:{spec}}{suffix}"


def ratio_cell(value: float | None, margin: float | None) -> str:
    """``1.87×`` and, when the repeats gave one, its 95% margin: ``1.87× ±3.1%``
    (the interval is value · exp(±margin); ``bench.margin``)."""
    if value is None:
        return DASH
    if margin is None:
        return f"{value:.2f}×"
    percent = 100 * margin
    return f"{value:.2f}× ±{percent:.1f}%" if percent < 9.95 else f"{value:.2f}× ±{percent:.0f}%"


def _identical(row: SummaryRow) -> str:
    """``4/6``, and ``4/6, ties 2`` when some of the differences are near-ties (``bench.aggregate``)."""
    if row.identical is None:
        return DASH
    cell = f"{row.identical_count}/{row.identical_count + len(row.divergences)}"
    return cell + (f", ties {row.ties}" if row.ties else "")


def overall_cells(row: SummaryRow) -> list[str]:
    """One row of the main table."""
    v = parse_variant_name(row.variant)
    return [
        v.label.split(" γ=")[0], v.gamma_text, _num(row.mean_gamma, ".1f"),
        _num(row.tokens_per_s, ".1f"), ratio_cell(row.speedup, row.speedup_margin),
        ratio_cell(row.vs_peer, row.vs_peer_margin),
        _num(row.ttft_ms, ".1f"), _num(row.decode_tokens_per_s, ".1f"), _num(row.decode_speedup, ".2f", "×"),
        _num(row.acceptance_rate, ".0%"), _num(row.mean_acceptance_length, ".2f"),
        _num(row.tokens_per_target_call, ".2f"), _num(row.call_cost, ".2f", "×"),
        _num(row.target_calls, ".1f"), _identical(row), _num(row.first_divergence, ".0f"),
    ]


def category_cell(row: SummaryRow | None) -> str:
    if row is None:
        return DASH
    return f"{row.tokens_per_s:.1f} ({_num(row.speedup, '.2f', '×')})"


def category_table(rows: list[SummaryRow]) -> tuple[list[str], list[list[str]]]:
    """Variants down, categories across: tokens/s (speedup) in each cell."""
    rows = [r for r in rows if r.position is None]
    categories = list(dict.fromkeys(r.category for r in rows))
    variants = list(dict.fromkeys(r.variant for r in rows))
    index = {(r.variant, r.category): r for r in rows}
    header = ["Strategy"] + categories
    body = [[parse_variant_name(v).label] + [category_cell(index.get((v, c))) for c in categories]
            for v in variants]
    return header, body


def position_cell(row: SummaryRow | None) -> str:
    """``tok/s (speedup, accept)``; the acceptance left out where the decoder reports none."""
    if row is None:
        return DASH
    inside = _num(row.speedup, ".2f", "×")
    if row.acceptance_rate is not None:
        inside += f", {row.acceptance_rate:.0%}"
    return f"{row.tokens_per_s:.1f} ({inside})"


def position_table(rows: list[SummaryRow], word: str) -> tuple[list[str], list[list[str]]] | None:
    """Variants down, session positions across (``turn 1``, ``turn 2``, or ``prompt 1``...):
    tokens/s (speedup over target AR at that position, acceptance) in each cell; None without sessions."""
    positioned = [r for r in rows if r.position is not None]
    if not positioned:
        return None
    positions = sorted({r.position for r in positioned})
    index = {(r.variant, r.position): r for r in positioned}
    header = ["Strategy"] + [f"{word} {p}" for p in positions]
    body = [[parse_variant_name(v).label] + [position_cell(index.get((v, p))) for p in positions]
            for v in dict.fromkeys(r.variant for r in positioned)]
    return header, body


def position_title(word: str) -> str:
    return f"Tokens/s (speedup over target AR, acceptance) per {word} of the session"


EXPECT_COLUMNS = ("Expectation", "measured", "status")


def verdict_cells(verdict: Verdict) -> list[str]:
    return [verdict.description, ratio_cell(verdict.value, verdict.margin), verdict.status]


def markdown_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines)


def markdown_report(header_lines: list[str], rows: list[SummaryRow], verdicts: list[Verdict],
                    word: str = "position") -> str:
    """The tables in Markdown; ``word`` names a session's positions (``turn`` in a conversation)."""
    overall = [overall_cells(r) for r in rows if r.category == ALL and r.position is None]
    cat_header, cat_body = category_table(rows)
    parts = [
        "\n".join(f"{line}  " for line in header_lines),
        "All prompts:\n\n" + markdown_table(list(OVERALL_COLUMNS), overall),
        "Tokens/s (speedup over target AR) per category:\n\n" + markdown_table(cat_header, cat_body),
    ]
    if (per_position := position_table(rows, word)) is not None:
        parts.append(position_title(word) + ":\n\n" + markdown_table(*per_position))
    if verdicts:
        parts.append("Expectations:\n\n" + markdown_table(
            list(EXPECT_COLUMNS), [verdict_cells(v) for v in verdicts]))
    return "\n\n".join(parts) + "\n"


def print_report(console, header_lines: list[str], rows: list[SummaryRow],
                 verdicts: list[Verdict], word: str = "position") -> None:
    """The same tables, drawn with rich. Every piece of text goes in as ``Text``, never as markup:
    variant names carry brackets (``ngram[suffix]@16``) that markup would take for tags."""
    from rich.table import Table
    from rich.text import Text

    def texts(cells):
        return [Text(cell) for cell in cells]

    def grid(title: str, header: list[str], body: list[list[str]]) -> Table:
        """The first column left-justified and whole, the rest right-justified."""
        table = Table(title=title, title_justify="left")
        for i, name in enumerate(header):
            table.add_column(name, justify="left" if i == 0 else "right", no_wrap=i == 0)
        for cells in body:
            table.add_row(*texts(cells))
        return table

    for line in header_lines:
        console.print(Text(line, style="dim"), highlight=False)
    main = Table(title="All prompts", title_justify="left")
    for i, name in enumerate(OVERALL_COLUMNS):
        main.add_column(name, justify="left" if i == 0 else "right", no_wrap=True)
    for row in rows:
        if row.category == ALL and row.position is None:
            main.add_row(*texts(overall_cells(row)), style="cyan" if row.family == "peer" else None)
    console.print(main)
    console.print(grid("Tokens/s (speedup over target AR) per category", *category_table(rows)))
    if (per_position := position_table(rows, word)) is not None:
        console.print(grid(position_title(word), *per_position))
    if verdicts:
        table = Table(title="Expectations", title_justify="left")
        for name in EXPECT_COLUMNS:
            table.add_column(name)
        colour = {"met": "green", "missed": "red", "within the margin": "yellow", "not checked": "dim"}
        for verdict in verdicts:
            *cells, status = verdict_cells(verdict)
            table.add_row(*texts(cells), Text(status, style=colour[verdict.status]))
        console.print(table)
