"""What the live view costs: tokens/s with ``/live on`` against ``/live off``.

Runs built-in prompts through a REPL session on the default pair, each prompt
with the live view on and off in alternating order (on-off, then off-on), and
compares the strategies' own tokens/s (the number the panels show, which
leaves the drawing out) and the wall time of the whole prompt (which includes
the drawing). The live view draws into a terminal console writing to
/dev/null, so every frame is really rendered.

    .venv/bin/python scripts/live_cost.py                    # 6 prompts (one per category) x 2 rounds
    .venv/bin/python scripts/live_cost.py --rounds 3 --length 96 --out live.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.rtt_check import first_of_each_category  # noqa: E402

STRATEGIES = ("speculative", "ngram", "target")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=64, help="new tokens per strategy (default 64)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="on/off pairs per prompt, alternating the order (default 2)")
    parser.add_argument("--per-category", type=int, default=1, help="prompts per category (default 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's own choice); 1 helps on a shared machine")
    parser.add_argument("--out", help="write the figures as JSON to this file")
    parser.add_argument("--report", metavar="JSON", help="print the report of a saved --out file and exit")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(report(saved["samples"], saved["environment"]))
        return 0
    from rich.console import Console

    from bench.meta import environment
    from bench.prompts import builtin_prompts
    from repl.session import Session
    from repl.settings import Settings

    from default_runner import default_runner  # scripts/ is this script's first import path

    runner = default_runner(args.threads)
    pair = runner.pair
    sink = open(os.devnull, "w", encoding="utf-8")
    terminal = Console(file=sink, force_terminal=True, width=100, height=40, markup=False, emoji=False,
                       highlight=False)
    sessions = {mode: Session(runner, Settings(length=args.length, live=mode == "on"), terminal)
                for mode in ("on", "off")}
    assert sessions["on"].live() and not sessions["off"].live()
    prompts = first_of_each_category(builtin_prompts(), args.per_category)
    load_before = os.getloadavg()
    started = time.time()
    samples = []  # one per (prompt, round, mode)
    for i, prompt in enumerate(prompts):
        for r in range(args.rounds):
            order = ("on", "off") if (i + r) % 2 == 0 else ("off", "on")
            for mode in order:
                t0 = time.perf_counter()
                prompt_run = sessions[mode].prompt(prompt.text)
                wall = time.perf_counter() - t0
                sample = {"prompt": prompt.id, "round": r, "mode": mode, "wall_s": wall}
                for run in prompt_run.runs:
                    sample[run.key] = {"tokens": len(run.result.tokens), "seconds": run.result.seconds,
                                       "tokens_per_s": run.result.tokens_per_second}
                samples.append(sample)
                print(json.dumps(sample), flush=True)
    ids = pair.tokenizer(prompts[0].text).input_ids
    overhead = counted_overhead_s(pair.tokenizer, ids)
    env = environment(pair)
    env.update(counted_overhead_s=overhead, threads=args.threads, load_before=load_before, load_after=os.getloadavg(),
               minutes=(time.time() - started) / 60, length=args.length, rounds=args.rounds, prompts=len(prompts))
    print(report(samples, env))
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": env, "samples": samples}, indent=1))
    return 0


def counted_overhead_s(tokenizer, prompt_ids: list[int], iterations: int = 2000) -> float:
    """Seconds per round that watching adds to a strategy's own time.

    What stays inside the timed run with the live view on: the drafts copied
    to the host and the calls into the watch outside its own clock (the live
    view's recording and drawing are measured and subtracted). Timed here on
    a 4-token round with a drawing view, the drawing time subtracted as the
    loop subtracts it; load-independent enough to set beside the A/B figure.
    """
    import io

    import torch
    from rich.console import Console

    from generation.observer import Watch
    from generation.result import Round
    from repl.live import LiveView

    console = Console(file=io.StringIO(), force_terminal=True, width=100, height=40)
    view = LiveView("speculative", tokenizer, prompt_ids, draw=console.print, interval=0.1)
    watch = Watch(view)
    draft = torch.tensor([504, 3003, 14797, 359])
    rnd = Round(drafted=(504, 3003, 14797, 359), accepted=3, token=28, bonus=False, gamma=4)
    t0 = time.perf_counter()
    for _ in range(iterations):
        watch.drafted(draft.tolist())
        watch.round(rnd, [504, 3003, 14797, 28])
    return (time.perf_counter() - t0 - watch.paused_s) / iterations


def totals(samples: list[dict], mode: str, key: str) -> tuple[int, float]:
    chosen = [s[key] for s in samples if s["mode"] == mode and key in s]
    return sum(c["tokens"] for c in chosen), sum(c["seconds"] for c in chosen)


def paired_ratios(samples: list[dict], key: str) -> list[float]:
    """Per (prompt, round): tokens/s with live on over tokens/s with it off."""
    by = {(s["prompt"], s["round"], s["mode"]): s for s in samples}
    out = []
    for (prompt, r, mode), s in by.items():
        if mode == "on" and (prompt, r, "off") in by and key in s:
            out.append(s[key]["tokens_per_s"] / by[(prompt, r, "off")][key]["tokens_per_s"])
    return out


def report(samples: list[dict], env: dict) -> str:
    lines = [f"{env['date']} · {env['cpu']} · torch {env['torch']} · transformers {env['transformers']} · "
             f"load {env['load_before'][0]:.2f} before, {env['load_after'][0]:.2f} after · "
             f"{env['minutes']:.1f} min",
             f"{env['prompts']} prompts x {env['rounds']} on/off pairs · length {env['length']}", "",
             "| strategy | tokens/s live off | tokens/s live on | on/off (all tokens) | median paired on/off |",
             "|---|---|---|---|---|"]
    for key in STRATEGIES:
        off_tokens, off_s = totals(samples, "off", key)
        on_tokens, on_s = totals(samples, "on", key)
        if not off_s or not on_s:
            continue
        ratios = sorted(paired_ratios(samples, key))
        median = ratios[len(ratios) // 2] if len(ratios) % 2 else sum(ratios[len(ratios) // 2 - 1:][:2]) / 2
        lines.append(f"| {key} | {off_tokens / off_s:.2f} | {on_tokens / on_s:.2f} | "
                     f"{(on_tokens / on_s) / (off_tokens / off_s):.3f} | {median:.3f} |")
    if "counted_overhead_s" in env:
        on_rounds_s = [s["speculative"]["seconds"] / max(1, s["speculative"]["tokens"] / 4.0)
                       for s in samples if s["mode"] == "on" and "speculative" in s]
        lines.append("")
        lines.append(f"counted overhead of watching: {env['counted_overhead_s'] * 1e6:.1f} µs per round "
                     f"(drafts copied to the host, calls into the watch); a speculative round took "
                     f"{min(on_rounds_s) * 1e3:.0f} ms or more here")
    walls = {m: sum(s["wall_s"] for s in samples if s["mode"] == m) for m in ("on", "off")}
    lines.append("")
    lines.append(f"whole prompts, wall clock (drawing and panels included): live on {walls['on']:.1f} s, "
                 f"live off {walls['off']:.1f} s ({walls['on'] / walls['off']:.3f})")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
