"""Predicted against measured speedup with target AR off, on the default pair (docs/why.md).

With target AR off the speedup model takes the plain step the runner timed at load; lookahead's
rounds are priced at the width they fed, window included. This script checks both against a
measurement: per built-in prompt it runs target AR alone, speculative decoding and lookahead with
target AR off (their predictions), and target AR again, and prints each prediction beside the
measured speedup against the two target AR runs' mean rate, decode part (the time to first token
left out of both) and end to end, with target AR's decode step and the most CPU other processes
used during any of the runs (``utils.machine_load``): a row above ``BUSY`` cores is marked and
left out of the worst case (on a shared machine a slowed target AR run alone moves a speedup
twofold). Beside them, the old pricing
for contrast: speculative with no load-time step (its one verify width taken for the plain step),
lookahead with its window rows unrecorded (a round with no candidate taken for a plain step).

    .venv/bin/python scripts/check_predictions.py [--prompts 0,3,6] [--repeats 2] [--threads N]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from repl.runs import PromptRun, StrategyRun  # noqa: E402
from repl.settings import Settings  # noqa: E402
from scripts.default_runner import default_runner  # noqa: E402
from utils.builtin_prompts import BUILTIN  # noqa: E402

TOLERANCE = 0.15
BUSY = 0.3      # cores' worth of other processes' CPU above which a row's measurement is not trusted


def without_window(run: StrategyRun) -> StrategyRun:
    """``run`` with its rounds' window rows removed from their notes: the old pricing."""
    trace = [dataclasses.replace(r, note={k: v for k, v in r.note.items() if k != "rows"})
             if isinstance(r.note, dict) else r for r in run.result.trace]
    return StrategyRun(run.key, dataclasses.replace(run.result, trace=trace), text=run.text)


def mean_ar(first: StrategyRun, second: StrategyRun) -> StrategyRun:
    """Target AR with the mean seconds, time to first token and phases of two runs of one prompt
    (greedy: the same tokens)."""
    a, b = first.result, second.result
    mean = dataclasses.replace(a, seconds=(a.seconds + b.seconds) / 2,
                               first_token_s=(a.first_token_s + b.first_token_s) / 2,
                               phases={k: (a.phases[k] + b.phases[k]) / 2 for k in a.phases})
    run = StrategyRun("target", mean, text=first.text)
    run.other_load = max(first.other_load or 0.0, second.other_load or 0.0)
    return run


def one(runner, text: str) -> list[dict]:
    """The predictions (target AR off) and the measured speedups of one prompt."""
    off = Settings(speculative=True, ngram=False, target=False, drafter=False, lookahead=True)
    ar = Settings(speculative=False, ngram=False, target=True, drafter=False, lookahead=False)
    before = runner.run(runner.prepare(text, ar), ar)
    predicted = runner.run(runner.prepare(text, off), off)
    after = runner.run(runner.prepare(text, ar), ar)
    measured = dataclasses.replace(after, runs=[mean_ar(before.runs[0], after.runs[0])])
    both = PromptRun(text, predicted.prompt_ids, greedy=True, settings=off.to_dict(),
                     runs=predicted.runs + measured.runs)
    rows = []
    for run in predicted.runs:
        why = predicted.why(run)
        if run.key == "speculative":
            old_pr = dataclasses.replace(predicted, load_step_s=None, _ceilings={})
            old = old_pr.why(run).predicted_steady
        else:
            old_pr = dataclasses.replace(both, runs=[without_window(run)] + measured.runs, _ceilings={})
            old = old_pr.why(old_pr.runs[0]).predicted_steady
        rows.append(dict(strategy=run.key, predicted=why.predicted_steady, estimated=why.estimated,
                         source=why.cost_source, plain_ms=1e3 * why.plain_step_s, old=old,
                         decode=both.decode_speedup(run), end_to_end=both.speedup(run),
                         ar_ms=1e3 * both.ar_step_s(),
                         load=max(run.other_load or 0.0, measured.runs[0].other_load or 0.0)))
    return rows


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="0,3,6", help="indices into utils.builtin_prompts.BUILTIN")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    started = time.time()
    runner = default_runner(args.threads)
    print(f"{cpu_name()}, {os.cpu_count()} cores · {runner.pair.target_name} · drafter {runner.pair.drafter_name}")
    for line in runner.pair.notes:            # the self-drafter calibration's banner lines
        print(f"banner: {line}")
    print(f"plain step timed at load: {runner.load_step_s * 1e3:.1f} ms")
    header = (f"{'prompt':<16}{'strategy':<12}{'predicted':>10}{'measured decode':>17}{'end to end':>12}"
              f"{'off by':>8}{'old':>7}{'AR step':>9}{'load':>6}  plain step")
    print(header)
    worst = 0.0
    for index in (int(i) for i in args.prompts.split(",")):
        category, text = BUILTIN[index]
        for _ in range(args.repeats):
            for row in one(runner, text):
                off = row["predicted"] / row["decode"] - 1 if row["decode"] else float("nan")
                busy = row["load"] > BUSY
                if not busy:
                    worst = max(worst, abs(off))
                est = " (est.)" if row["estimated"] else ""
                print(f"{f'{index} {category}':<16}{row['strategy']:<12}{row['predicted']:>9.2f}x"
                      f"{row['decode']:>16.2f}x{row['end_to_end']:>11.2f}x{off:>+8.0%}{row['old']:>6.2f}x"
                      f"{row['ar_ms']:>6.1f} ms{row['load']:>6.1f}  {row['source']} {row['plain_ms']:.0f} ms{est}"
                      + ("  busy: left out" if busy else ""))
    print(f"worst quiet row: {worst:.0%} off the measured decode speedup (target {TOLERANCE:.0%}); "
          f"{time.time() - started:.0f} s in all")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
