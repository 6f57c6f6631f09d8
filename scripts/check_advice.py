"""The advisor's predictions against real runs on the default pair (docs/advisor.md, docs/results.md).

Advises on some built-in prompts over a small grid (constant γ, chains; each n-gram storage, the
pair's drafter and the hybrid; ``advisor.replay.default_grid``) and confirms the best few by real
runs; prints each method's predicted speedup beside the measured decode and end-to-end speedups,
the costs' origin and the advisor's seconds. The whole default grid (every policy, trees and the
other self-drafters) is ``infer.py --advise``'s; this one is sized to run in minutes on a CPU.

    .venv/bin/python scripts/check_advice.py [--prompts 0,3] [--length 64] [--gammas 2,4,6] [--confirm 3]
    .venv/bin/python scripts/check_advice.py --full        # the whole default grid, as infer.py --advise
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from advisor.advise import advise  # noqa: E402
from advisor.replay import default_grid  # noqa: E402
from scripts.default_runner import default_runner  # noqa: E402
from utils.builtin_prompts import BUILTIN  # noqa: E402
from utils.machine_load import other_load, read_load  # noqa: E402
from utils.vocab import encode_prompt  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="0,3", help="indices into utils.builtin_prompts.BUILTIN")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--gammas", default="2,4,6")
    parser.add_argument("--confirm", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", metavar="FILE", help="also write the advisor's JSON object here")
    parser.add_argument("--full", action="store_true",
                        help="the whole default grid (advisor.replay.default_grid; --gammas is then ignored)")
    args = parser.parse_args()
    runner = default_runner(args.threads)
    pair = runner.pair
    prompts = [encode_prompt(pair.tokenizer, BUILTIN[int(i)][1]) for i in args.prompts.split(",")]
    grid = default_grid(pair) if args.full else default_grid(
        pair, gammas=tuple(int(g) for g in args.gammas.split(",")), policies=("constant",), trees=(0,), self_specs=())
    before = read_load()
    report = advise(pair, prompts, length=args.length, confirm=args.confirm, grid=grid, state=runner.state,
                    say=lambda line: print(line, file=sys.stderr))
    load = other_load(before, read_load())
    print(f"{pair.target_name} · drafter {pair.drafter_name} · {len(prompts)} prompts ({args.prompts}) · "
          f"{args.length} new tokens · {len(grid)} methods · advised in {report.seconds:.0f} s · "
          f"other processes {load if load is not None else float('nan'):.2f} cores")
    print(f"costs {report.costs.label()}" + "".join(f"; {n}" for n in report.costs.notes))
    print(f"target AR {report.ar_tokens_per_s:.1f} tok/s, decode step {1e3 * (report.ar_step_s or 0):.1f} ms")
    print(f"{'#':>3} {'method':<28}{'predicted':>10}{'decode':>9}{'end to end':>12}{'tok/call':>10}  why")
    for i, a in enumerate(report.advice, 1):
        decode = f"{a.measured_decode_speedup:.2f}x" if a.measured_decode_speedup else ""
        end = f"{a.measured_speedup:.2f}x" if a.measured_speedup else ""
        print(f"{i:>3} {a.method:<28}{a.predicted_speedup:>9.2f}x{decode:>9}{end:>12}{a.tokens_per_call:>10.2f}  "
              f"{a.why.line()}")
    for method, reason in report.unreplayable:
        print(f"not replayed: {method}: {reason}")
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
