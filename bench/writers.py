"""JSON and CSV files of a benchmark run."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path

from bench.aggregate import SummaryRow
from bench.records import RunRecord
from bench.expect import Verdict


def outputs_by_variant(records: list[RunRecord]) -> dict[str, dict[str, list[int]]]:
    """Generated ids of each variant for each prompt, first repeat only."""
    out: dict[str, dict[str, list[int]]] = {}
    for r in records:
        if r.repeat == 0:
            out.setdefault(r.variant, {})[r.prompt_id] = list(r.tokens)
    return out


def report_dict(environment: dict, settings: dict, rows: list[SummaryRow], verdicts: list[Verdict],
                records: list[RunRecord], skipped: list, ceilings: dict[int, dict] | None = None,
                marks: dict | None = None) -> dict:
    """The run's JSON. ``ceilings``: the copy ceiling per γ (``bench.ceiling.copy_ceilings``);
    ``marks``: what the figures stand on (``interrupted``: a stopped run's coverage, else None;
    ``load``: the machine's load over the benchmark; ``bench.marks``)."""
    return {
        "environment": environment,
        "settings": settings,
        "variants": list(dict.fromkeys(r.variant for r in records)),
        "summary": [asdict(r) for r in rows],
        "expectations": [dict(expect=v.expectation.text, description=v.description, value=v.value,
                              reference=v.reference, margin=v.margin, status=v.status)
                         for v in verdicts],
        "skipped": [asdict(s) for s in skipped],
        "runs": [r.row() for r in records],
        "outputs": outputs_by_variant(records),
        "copy_ceiling": {str(gamma): entry for gamma, entry in (ceilings or {}).items()},
        **(marks or {}),
    }


def write_json(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def _csv_value(value):
    if isinstance(value, list):
        return " ".join(str(v) for v in value)
    return "" if value is None else value


def flat_row(row: dict) -> dict:
    """Nested dicts become columns ``outer.inner`` (``phases.draft``,
    ``acceptance.acceptance_histogram_by_draft_length.4``...), at any depth."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in flat_row(value).items()})
        else:
            out[key] = value
    return out


def write_csv(path: Path, rows: list[dict]) -> Path:
    """``rows`` as CSV, every key a column in first-seen order; lists joined by spaces, nested dicts
    spread over columns."""
    flat = [flat_row(r) for r in rows]
    with path.open("w", newline="", encoding="utf-8") as f:
        if not flat:
            return path
        fields = list(dict.fromkeys(k for row in flat for k in row))
        writer = csv.DictWriter(f, fieldnames=fields, restval="")
        writer.writeheader()
        for row in flat:
            writer.writerow({k: _csv_value(v) for k, v in row.items()})
    return path
