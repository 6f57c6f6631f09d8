"""``bench.py --advise``: the advisor over the benchmark's prompt set, one advice per category.

Each category gets ``advisor.advise.advise``, all priced by one cost table (measured on the first
category, or ``--costs FILE``). Written to ``--out``: ``advice.json``, ``advice.md``, ``advice.html``
(``bench.advice_page``) and ``costs.json``; with ``--whatif batch`` (``context``, ``machine:NAME``) each
category's methods projected over batch size (context length, a card's batch sizes) too, and charted.
"""

from __future__ import annotations

import json
import time

from advisor.advise import SAMPLING_NOTE, advise, context_of
from advisor.costs import CostsError, CostTable, where_measured
from advisor.whatif import project_for
from bench.advice_page import advice_html
from bench.runner import encode_prompts
from kvcache.static import default_compile

SHOWN = 5       # rows per category in the summary


def advice_conflict(args) -> str | None:
    """One line when the flags do not go with ``--advise``, else None (checked before loading)."""
    if args.whatif and not args.advise:
        return "--whatif projects the advice: give it with --advise"
    if args.multi_turn or args.session_size:
        return "--advise advises on single prompts: leave out --multi-turn and --session-size"
    if args.costs:
        try:
            CostTable.load(args.costs)
        except CostsError as exc:
            return str(exc)
    return None


def _by_category(encoded, length: int, context: int | None, err) -> dict[str, list[list[int]]]:
    """Prompt ids per category in the set's order; a prompt that does not fit is left out with a line."""
    out: dict[str, list[list[int]]] = {}
    for e in encoded:
        if context is not None and len(e.ids) + length > context:
            err.print(f"skipping {e.prompt.id}: {len(e.ids)} prompt tokens + {length} new do not fit "
                      f"the context of {context}", style="yellow", highlight=False)
            continue
        out.setdefault(e.prompt.category, []).append(list(e.ids))
    return out


def summary_lines(reports: dict, costs: CostTable) -> list[str]:
    """The summary as Markdown: per category its best rows, predicted beside measured, and why."""
    lines = ["# Advice", "", f"Costs {costs.label()}." + "".join(f" {n}." for n in costs.notes), ""]
    for category, report in reports.items():
        lines += [f"## {category} ({report.prompts} prompts, {report.length} new tokens, "
                  f"target AR {report.ar_tokens_per_s:.1f} tok/s; {report.ranked_on}; "
                  f"advised in {report.seconds:.1f} s)", "",
                  "| # | method | predicted | measured | decode pred. / meas. | tok/call pred. / meas. | replay | why |",
                  "|---|---|---|---|---|---|---|---|"]
        for i, a in enumerate(report.advice[:SHOWN], 1):
            lines.append(f"| {i} | {a.method} | {a.predicted_text()} | {a.measured_text()} | {a.decode_text()} | "
                         f"{a.tokens_text()} | {a.exactness} | {a.why.line()} |")
        estimated = [a.sampling_line() for a in report.advice if a.sampling is not None]
        if estimated:
            lines.append("\nUnder the sampling processor, estimated from the target's and the drafter's distributions "
                         "along target AR's path (steady state): " + "; ".join(estimated) + ".")
        if report.whatif is not None:
            lines += ["", whatif_markdown(report.whatif)]
        rounding = report.rounding_line()
        if rounding:
            lines.append(f"\n{rounding}.")
        for note in report.notes:
            lines.append(f"\n{note}.")
        for method, reason in report.unreplayable:
            lines.append(f"\nNot replayed: {method}: {reason}.")
        lines.append("")
    return lines


def run_advice(args, prompts, models, out, err) -> int:
    """The advice per category (module docstring): 0, 1 (nothing advised, files unwritable) or 130."""
    costs = CostTable.load(args.costs) if args.costs else None
    if not args.processor.is_greedy:
        err.print(SAMPLING_NOTE, style="yellow", highlight=False)
    groups = _by_category(encode_prompts(prompts, models.tokenizer, chat=args.chat), args.length,
                          models.context_length, err)
    started, reports = time.perf_counter(), {}
    try:
        for category, ids in groups.items():
            err.print(f"advising on {category} ({len(ids)} prompts)", highlight=False)
            report = advise(models, ids, length=args.length, costs=costs, confirm=args.confirm, seed=args.seed,
                            processor=args.processor, session_compile=args.compile or default_compile(models.device),
                            say=lambda line: err.print(f"  {line}", highlight=False))
            costs = report.costs
            if args.whatif and not models.is_encoder_decoder:
                report.whatif = project_for(models, report, context_of(ids, args.length),
                                            where_measured(models.device), args.whatif,
                                            say=lambda line: err.print(f"  {line}", highlight=False))
            reports[category] = report
    except KeyboardInterrupt:
        err.print("interrupted: the categories advised so far are written", style="yellow")
    if not reports:
        err.print("nothing was advised", style="red")
        return 1
    lines = summary_lines(reports, costs)
    for line in lines:
        out.print(line, highlight=False, soft_wrap=True)
    data = {"advice": {c: r.to_dict() for c, r in reports.items()}, "costs": costs.to_dict(),
            "seconds": round(time.perf_counter() - started, 3),
            "settings": {"prompts": args.prompts, "categories": args.categories, "limit": args.limit,
                         "turn": args.turn, "chat": args.chat, "length": args.length, "confirm": args.confirm,
                         "seed": args.seed, "costs_file": args.costs}}
    try:
        (args.out / "advice.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        (args.out / "advice.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (args.out / "advice.html").write_text(advice_html(reports, costs.label()), encoding="utf-8")
        costs.save(args.out / "costs.json")
    except (OSError, CostsError) as exc:
        err.print(f"could not write the advice to {args.out}: {exc}", style="red")
        return 1
    err.print(f"wrote {args.out / 'advice.json'}, advice.md, advice.html and costs.json", highlight=False)
    return 130 if len(reports) < len(groups) else 0


def whatif_markdown(whatif) -> str:
    """The projection (over batch size, or context length) as a Markdown table, its source in the line above."""
    axis = whatif.axis
    head = ["method", *(f"{axis}={b}" for b in whatif.batches), "stops paying at", "drafter cost"]
    rows = [f"Projected, not run: {whatif.title()}; {whatif.caption().removeprefix('projected, not run: ')}.", "",
            "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for method, p in whatif.rows:
        stops = f"{axis}={p.stops_paying}" if p.stops_paying else f"beyond {whatif.batches[-1]}"
        rows.append(f"| {method} | " + " | ".join(f"{s:.2f}x" for s in p.speedups) + f" | {stops} | {p.drafter_source} |")
    best = whatif.best_line()
    rows += ["", best[0].upper() + best[1:] + "."] if best else []
    gammas = whatif.best_gammas()
    if gammas:
        rows += ["", f"Best γ at each {axis}, per drafter shown (projected, not run):", "",
                 "| drafter | " + " | ".join(f"{axis}={b}" for b in whatif.batches) + " |",
                 "|" + "---|" * (len(whatif.batches) + 1)]
        rows += [f"| {family} | " + " | ".join(f"γ {g}: {s:.2f}x" + (" (none pays)" if s < 1.0 else "")
                                              for _, g, s in points) + " |" for family, points in gammas]
    return "\n".join(rows)
