"""Spec-Bench's published leaderboard against the machine model: each method's speedup on an RTX 3090
and an A100 predicted from its published tau and the cards' profiles, and the A100's carried from the 3090's.

Two variants, each labelled: the profiles as ``analysis.roofline.PROFILES`` holds them (an eager
forward's overhead, 125 µs a layer: 4 ms for the 32-layer target) and the same cards with the
captured path's (about 9 µs a layer: 0.3 ms for the target). The figures, the
rounds and where each fact comes from: ``scripts/specbench_data.py``. Nothing here is fitted to the leaderboard.

    .venv/bin/python scripts/specbench_check.py [--context 500] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts import specbench_data as pub  # noqa: E402
from analysis.roofline import EAGER_PER_LAYER_S, PROFILES, MachineProfile, captured  # noqa: E402

VARIANTS: dict[str, Callable[[MachineProfile], MachineProfile]] = {
    "eager": lambda p: p,           # the profile as it stands
    "captured": captured,           # its overhead a layer replaced by the captured path's
}
FROM, TO = "RTX3090", "A100"
# The forms the cards' profiles were chosen among (docs/results.md): the overhead flat a forward or
# by layer, memory and arithmetic overlapped (the larger) or not (their sum). The last is the profiles'.
FORMS: dict[str, dict] = {
    "4 ms a forward, the larger (the older form)": dict(overhead_s=4e-3, overhead_per_layer_s=0.0, overlap=True),
    "125 µs a layer, the larger": dict(overhead_s=0.0, overhead_per_layer_s=EAGER_PER_LAYER_S, overlap=True),
    "4 ms a forward, the sum": dict(overhead_s=4e-3, overhead_per_layer_s=0.0, overlap=False),
    "no overhead, the sum": dict(overhead_s=0.0, overhead_per_layer_s=0.0, overlap=False),
    "125 µs a layer, the sum (the profiles')": dict(overhead_s=0.0, overhead_per_layer_s=EAGER_PER_LAYER_S,
                                                   overlap=False),
}


def tables(context: int) -> dict[str, dict[str, list[pub.Row]]]:
    """{table: {variant: rows}} for each card and for the A100 carried from the 3090."""
    out: dict[str, dict[str, list[pub.Row]]] = {}
    for card in pub.CARDS:
        out[card] = {v: pub.card_rows(card, make(PROFILES[card]), context) for v, make in VARIANTS.items()}
    out[f"{TO} from {FROM}"] = {v: pub.carried_rows(FROM, TO, make(PROFILES[FROM]), make(PROFILES[TO]), context)
                                for v, make in VARIANTS.items()}
    return out


def forms(context: int) -> dict[str, dict[str, float]]:
    """{form: {table: mean absolute error}} for each of :data:`FORMS` on the cards' bandwidths and peaks."""
    out = {}
    for form, fields in FORMS.items():
        cards = {card: replace(PROFILES[card], **fields) for card in pub.CARDS}
        errors = {card: pub.mean_abs_error(pub.card_rows(card, cards[card], context)) for card in pub.CARDS}
        errors[f"{TO} from {FROM}"] = pub.mean_abs_error(pub.carried_rows(FROM, TO, cards[FROM], cards[TO], context))
        out[form] = errors
    return out


def render(name: str, by_variant: dict[str, list[pub.Row]]) -> list[str]:
    head = f"{'method':<10} {'tau':>5} {'published':>9}"
    for v in by_variant:
        head += f" {v + ' pred':>14} {'error':>7}"
    lines = [name, head]
    variants = list(by_variant.values())
    for i, row in enumerate(variants[0]):
        line = f"{row.method:<10} {row.tau:>5.2f} {row.published:>8.2f}x"
        for rows in variants:
            r = rows[i]
            line += f" {r.predicted:>13.2f}x {100 * r.error:>+6.1f}%"
        lines.append(line)
    mae = "  ".join(f"{v}: {100 * pub.mean_abs_error(rows):.1f}%" for v, rows in by_variant.items())
    lines.append(f"mean absolute error  {mae}")
    return lines


def rounds_dict() -> dict:
    return {m: {"verify_width": r.verify_width, "lookup_s": r.lookup_s, "source": r.source,
                "forwards": [{"what": f.what, "parameters": f.shape.parameters, "layers": f.shape.layers,
                              "width": "tokens kept (tau rounded)" if f.width == pub.ACCEPTED else f.width,
                              "count": f.count, "own_forward": f.own} for f in r.forwards]}
            for m, r in pub.ROUNDS.items()}


def as_json(result: dict[str, dict[str, list[pub.Row]]], context: int) -> dict:
    return {
        "forms": {form: {t: round(100 * e, 2) for t, e in errors.items()} for form, errors in forms(context).items()},
        "source": {"repository": pub.REPOSITORY, "file": pub.LEADERBOARD_FILE, "commit": pub.LEADERBOARD_COMMIT,
                   "model": "Vicuna-7B-v1.3, fp16, greedy, batch 1"},
        "context_tokens": context,
        "variants": {v: {card: make(PROFILES[card]).to_dict() for card in pub.CARDS} for v, make in VARIANTS.items()},
        "rounds": rounds_dict(),
        "tables": {name: {v: {"rows": [r.to_dict() for r in rows],
                              "mean_abs_error_pct": round(100 * pub.mean_abs_error(rows), 2)}
                          for v, rows in by_variant.items()}
                   for name, by_variant in result.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=pub.CONTEXT,
                        help=f"tokens in the cache a forward reads (default {pub.CONTEXT}: prompt + half the answer)")
    parser.add_argument("--json", metavar="FILE", help="also write the tables as JSON to FILE")
    args = parser.parse_args(argv)
    if args.context < 0:
        parser.error("--context must be 0 or more")
    result = tables(args.context)
    print(f"Spec-Bench leaderboard ({pub.source()}), Vicuna-7B-v1.3 fp16 greedy batch 1; "
          f"context {args.context} tokens")
    print("eager: the profiles as they stand (125 µs a layer: 4 ms a target forward); "
          "captured: 9.4 µs a layer (0.3 ms a target forward); memory and arithmetic not overlapped")
    for name, by_variant in result.items():
        print()
        print("\n".join(render(name, by_variant)))
    print()
    print("eager, by the form of the profiles (mean absolute error):")
    for form, errors in forms(args.context).items():
        print(f"  {form:<44} " + "  ".join(f"{t}: {100 * e:.1f}%" for t, e in errors.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(as_json(result, args.context), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
