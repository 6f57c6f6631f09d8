"""Check the network what-if: does ``/rtt MS`` predict what ``--rtt-inject MS`` measures?

For each built-in prompt the REPL's strategies (speculative, NASD, target AR)
run twice on the same pair and settings: once as they are, and once with a
real wait of MS milliseconds before every target forward. From the first run
the speedup model predicts each drafting strategy's speedup over target AR at
that round trip (``/rtt MS``, the number the panel and /stats show); the
second run measures it (both strategies and target AR pay the wait). The two
runs of a prompt are taken in alternating order, so a drift in the machine's
load does not favour one side.

    .venv/bin/python scripts/rtt_check.py                 # default pair, 20 ms, all 18 prompts
    .venv/bin/python scripts/rtt_check.py --per-category 1 --length 48 --out rtt.json

With ``--target-server URL`` the target is a real server and the wait a real one: each prompt
runs once against the server directly and once through scripts/delay_proxy.py, which holds
every request MS milliseconds. The prediction is ``/rtt`` at the round trip the direct runs
measured plus MS (a served run's ``/rtt`` is the whole round trip per request; the model swaps
its measured one for it); the measurement is the proxied run.

Prints a markdown table (prompt, strategy, predicted, measured, error) and a
summary; ``--out`` also writes every number as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DRAFTING = ("speculative", "ngram")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtt", type=float, default=20.0, help="round trip in ms (default 20)")
    parser.add_argument("--length", type=int, default=64, help="new tokens per strategy (default 64)")
    parser.add_argument("--gamma", type=int, default=4, help="drafts per round (default 4)")
    parser.add_argument("--per-category", type=int, default=None,
                        help="only the first N prompts of each category (default: all)")
    parser.add_argument("--only", metavar="IDS", help="comma-separated prompt ids (e.g. chat-1,math-2)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's own choice); 1 helps on a shared machine")
    parser.add_argument("--repeats", type=int, default=1,
                        help="runs of each prompt in each condition, in alternating order; the medians are "
                             "compared (default 1)")
    parser.add_argument("--target-server", metavar="URL",
                        help="a real served target (llama.cpp or vLLM); the wait is a delaying proxy's")
    parser.add_argument("--server-kind", metavar="KIND", help="the engine behind --target-server (default: detected)")
    parser.add_argument("--out", help="write the figures as JSON to this file")
    parser.add_argument("--report", metavar="JSON", help="print the report of a saved --out file and exit")
    return parser.parse_args(argv)


def first_of_each_category(prompts, n: int):
    """The first ``n`` prompts of each category, in their order."""
    seen: dict[str, int] = {}
    kept = []
    for prompt in prompts:
        seen[prompt.category] = seen.get(prompt.category, 0) + 1
        if seen[prompt.category] <= n:
            kept.append(prompt)
    return kept


def raw(prompt_run) -> dict:
    """Per strategy: tokens, seconds, target calls and verify seconds (to see what a wait really cost)."""
    return {run.key: {"tokens": len(run.result.tokens), "seconds": run.result.seconds,
                      "target_calls": run.result.target_calls, "verify_s": run.result.phases["verify"]}
            for run in prompt_run.runs if run.result is not None}


def run_prompt(runner, text: str, settings):
    prompt_run = runner.prepare(text, settings)
    return runner.run(prompt_run, settings)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        print(report(saved["rows"], saved["environment"]))
        return 0
    from bench.meta import environment
    from bench.prompts import builtin_prompts
    from repl.settings import Settings

    from default_runner import default_runner  # scripts/ is this script's first import path

    proxy = None
    if args.target_server:
        runner, proxied, proxy = served_runners(args)
    else:
        runner = proxied = default_runner(args.threads)
    pair = runner.pair
    prompts = builtin_prompts()
    if args.per_category:
        prompts = first_of_each_category(prompts, args.per_category)
    if args.only:
        prompts = [p for p in prompts if p.id in args.only.split(",")]
    plain = Settings(length=args.length, gamma=args.gamma, live=False)
    injected = plain if proxy else Settings(length=args.length, gamma=args.gamma, live=False, rtt_inject=args.rtt)
    runners = {"plain": runner, "injected": proxied}
    load_before = os.getloadavg()
    started = time.time()
    rows = []
    for i, prompt in enumerate(prompts):
        order = [("plain", plain), ("injected", injected)]
        pairs = []                      # (plain, injected) prompt runs, one per repeat
        for repeat in range(args.repeats):
            runs = {}
            for name, settings in (order if (i + repeat) % 2 == 0 else order[::-1]):
                runs[name] = run_prompt(runners[name], prompt.text, settings)
            pairs.append((runs["plain"], runs["injected"]))
            print(json.dumps({"prompt": prompt.id, "repeat": repeat,
                              "runs": {name: raw(pr) for name, pr in runs.items()}}), flush=True)
        for key in DRAFTING:
            row = compare(prompt.id, key, pairs, args.rtt, proxy is not None)
            rows.append(row)
            print(json.dumps(row), flush=True)
    load_after = os.getloadavg()
    env = environment(pair)
    env.update(threads=args.threads, load_before=load_before, load_after=load_after,
               minutes=(time.time() - started) / 60,
               rtt_ms=args.rtt, length=args.length, gamma=args.gamma, prompts=len(prompts), repeats=args.repeats)
    if proxy:
        proxy.__exit__(None, None, None)
        env.update(target_server=args.target_server, server_kind=pair.target.client.kind)
    print(report(rows, env))
    if args.out:
        Path(args.out).write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    return 0


def compare(prompt_id: str, key: str, pairs, rtt: float, served: bool) -> dict:
    """One strategy on one prompt: the median over repeats of the prediction (each plain run's
    /rtt what-if) and of the measurement (each waited run's speedup)."""
    from statistics import median

    predicted, measured, rtts, proxied = [], [], [], []
    first = None
    for base, real in pairs:
        run_a = next(r for r in base.runs if r.key == key)
        run_b = next(r for r in real.runs if r.key == key)
        if run_a.result is None or run_b.result is None:
            return {"prompt": prompt_id, "strategy": key, "failed": run_a.error or run_b.error, "predicted": None,
                    "measured": None, "error": None, "local_predicted": None, "local_measured": None,
                    "best_gamma": None}
        rtt_ms = rtt + (measured_ms(base) if served else 0.0)
        why = base.why(run_a, rtt_ms=rtt_ms)
        if why is not None and why.what_if is not None and why.what_if.predicted is not None:
            predicted.append(why.what_if.predicted)
        if real.speedup(run_b) is not None:
            measured.append(real.speedup(run_b))
        rtts.append(rtt_ms)
        proxied.append(measured_ms(real) if served else None)
        first = first or (base, run_a, real, run_b, why)
    base, run_a, real, run_b, why = first
    p = median(predicted) if predicted else None
    m = median(measured) if measured else None
    return {
        "prompt": prompt_id, "strategy": key, "predicted": p, "measured": m,
        "error": None if p is None or m is None else m / p - 1,
        "predicted_each": predicted, "measured_each": measured,
        "local_predicted": why.predicted if why else None, "local_measured": base.speedup(run_a),
        "best_gamma": why.what_if.best_gamma if why and why.what_if else None,
        "tokens": len(run_b.result.tokens), "identical": all(r.divergence(next(x for x in r.runs if x.key == key))[0]
                                                              for _, r in pairs),
        "what_if_rtt_ms": median(rtts), "measured_rtt_ms": median(proxied) if served else None,
    }


def served_runners(args):
    """Runners on the served target, directly and through a proxy holding each request ``args.rtt``
    ms; the offline model drafts in both (one copy)."""
    import torch

    from delay_proxy import DelayProxy
    from engine import load_served_pair, served_pair_of
    from remote.connect import connect
    from repl.runner import Runner

    if args.threads:
        torch.set_num_threads(args.threads)
    direct = load_served_pair(args.target_server, args.server_kind)
    proxy = DelayProxy(args.target_server, args.rtt).__enter__()
    client = connect(proxy.url, direct.target.client.kind)
    proxied = served_pair_of(client, client.info(), direct.drafter, direct.tokenizer,
                             drafter_name=direct.drafter_name, n_probs=direct.target.n_probs)
    runners = Runner(direct), Runner(proxied)
    for runner in runners:
        runner.warm_up()
    return runners[0], runners[1], proxy


def measured_ms(prompt_run) -> float:
    """The round trip per request the prompt's served runs measured (all strategies' requests)."""
    requests = trip = 0.0
    for run in prompt_run.runs:
        network = (run.result.network or {}) if run.result is not None else {}
        requests += network.get("requests", 0)
        trip += network.get("round_trip_s", 0.0)
    return 1000.0 * trip / requests if requests else 0.0


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _change(at_rtt, without) -> str:
    """How much the round trip moves a speedup (``+2.0%``); ``n/a`` when either is missing."""
    return "n/a" if at_rtt is None or not without else f"{at_rtt / without - 1:+.1%}"


def report(rows: list[dict], env: dict) -> str:
    lines = [f"{env['date']} · {env['cpu']} · torch {env['torch']} · transformers {env['transformers']} · "
             f"load {env['load_before'][0]:.2f} before, {env['load_after'][0]:.2f} after · "
             f"{env['minutes']:.1f} min",
             (f"served target {env['target_server']} ({env['server_kind']}), a proxy holding each request "
              f"{env['rtt_ms']:g} ms; the what-if is the direct runs' measured round trip + {env['rtt_ms']:g} ms"
              if env.get("target_server") else f"rtt {env['rtt_ms']:g} ms")
             + f" · {env['prompts']} prompts · length {env['length']} · gamma {env['gamma']}"
             + f" · {env.get('repeats', 1)} repeats (medians)",
             "", "| prompt | strategy | predicted (/rtt) | measured (with the wait) | error | best γ "
             "| no round trip: predicted / measured | change the round trip makes: predicted / measured |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        error = "n/a" if r["error"] is None else f"{r['error']:+.1%}"
        lines.append(f"| {r['prompt']} | {r['strategy']} | {_x(r['predicted'])} | {_x(r['measured'])} | "
                     f"{error} | {r['best_gamma']} | {_x(r['local_predicted'])} / {_x(r['local_measured'])} | "
                     f"{_change(r['predicted'], r['local_predicted'])} / {_change(r['measured'], r['local_measured'])} |")
    lines.append("")
    for key in DRAFTING:
        errors = [r["error"] for r in rows if r["strategy"] == key and r["error"] is not None]
        if errors:
            inside = sum(abs(e) <= 0.10 for e in errors)
            within15 = sum(abs(e) <= 0.15 for e in errors)
            lines.append(f"{key}: mean error {sum(errors) / len(errors):+.1%}, mean |error| "
                         f"{sum(abs(e) for e in errors) / len(errors):.1%}, max |error| "
                         f"{max(abs(e) for e in errors):.1%}; within 10% on {inside}/{len(errors)} prompts, "
                         f"within 15% on {within15}/{len(errors)}")
            noise = [r["local_measured"] / r["local_predicted"] - 1 for r in rows
                     if r["strategy"] == key and r["local_measured"] and r["local_predicted"]]
            lines.append(f"{key}, for scale: the same model without a round trip against the same run's "
                         f"measurement: mean |error| {sum(abs(e) for e in noise) / len(noise):.1%}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
