"""The advisor against the benchmark over the same grid and prompts, on the default pair (docs/results.md).

Runs ``advisor.advise`` over check_advice.py's grid (constant γ, chains; each n-gram storage, the
pair's drafter and the hybrid with L 4: 21 methods at γ 2, 4, 6) and confirms its best two, then
``bench.py`` over the same 21 methods plus target AR on the same prompts (a Spec-Bench-format file
this script writes, so both encode the same ids), and prints one table: the advisor's top three
with predicted and confirmed speedups, the benchmark's measured speedup of each and its best
method, both wall times, and the three checks (each confirmed method within 10% of its prediction,
the first pick within 5% of the benchmark's best, the advice in at most a fifth of the benchmark's
time).

The benchmark's best is the largest of 21 measured speedups, each with the machine's noise, so it
reads high (the winner's curse: the method that won is as likely to have been lucky as good). The
first-pick check is therefore made a second time on fresh runs (``--recheck N``, default 2 passes):
the benchmark's three best and the advisor's first pick run again here, each warmed first, beside
target AR prompt by prompt (the order of the methods turned by one each prompt), and their speedups
over those target AR runs compared.

    .venv/bin/python scripts/advise_vs_bench.py --builtin 0,3 [--repeats 2]
    .venv/bin/python scripts/advise_vs_bench.py --spec-bench ../shared/spec_bench/question.jsonl \\
        --categories summarization,rag,math_reasoning,coding [--repeats 1]

The benchmark runs in a child process (its own model load); its seconds are that process's wall
time less this process's load of the same pair, which is said beside it. ``--report-only --out DIR``
prints the table again from a finished run's files (run.json, bench.json) without running anything;
``--recheck-only --out DIR`` runs the fresh runs alone on a finished run's files and prints the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from advisor import CONFIRM  # noqa: E402
from advisor.advise import advise  # noqa: E402
from advisor.replay import default_grid  # noqa: E402
from utils.options import NGRAM_STORAGES as STORAGES  # noqa: E402
from bench.prompts import chat_ids, load_prompts  # noqa: E402
from scripts.default_runner import default_runner  # noqa: E402
from utils.builtin_prompts import BUILTIN  # noqa: E402
from utils.machine_load import other_load, read_load  # noqa: E402

HYBRID_L = 4
RECHECK_TOP = 3     # the benchmark's best methods run again beside the advisor's first pick


def prompt_items(args) -> list[dict]:
    """The prompts as Spec-Bench lines: the chosen built-in ones, or the first of each category."""
    if args.builtin:
        return [{"question_id": f"builtin-{i}", "category": BUILTIN[int(i)][0], "turns": [BUILTIN[int(i)][1]]}
                for i in args.builtin.split(",")]
    prompts = load_prompts(args.spec_bench, categories=args.categories.split(","), limit=args.limit)
    return [{"question_id": p.id, "category": p.category, "turns": [p.text]} for p in prompts]


def run_bench(file: Path, out: Path, args) -> tuple[float, dict]:
    """bench.py over the grid on ``file``: (wall seconds, bench.json)."""
    command = [sys.executable, str(ROOT / "bench.py"), "--prompts", str(file), "--strategies", "speculative,ngram,target",
               "--ngram-storage", ",".join(STORAGES), "--gamma", args.gammas, "--policies", "none",
               "--hybrid", str(HYBRID_L), "--length", str(args.length), "--repeats", str(args.repeats),
               "--no-chart", "--out", str(out)]
    if args.threads:
        command += ["--threads", str(args.threads)]
    print("$ " + " ".join(command), file=sys.stderr)
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, json.loads((out / "bench.json").read_text(encoding="utf-8"))


def recheck(pair, prompts: list[list[int]], methods: list, length: int, state, passes: int) -> dict[str, dict]:
    """``methods`` (grid points) run again for real: each warmed once, then ``passes`` passes over the
    prompts, on each prompt target AR's run and then every method's, the methods' order turned by one
    each prompt. Each method's tokens/s over all its runs and its speedup over target AR's runs beside
    them, by key (``target``: target AR's own)."""
    from advisor.advise import SEED, WARM_TOKENS, Timing, greedy_fields, target_ar
    from engine import run_strategy

    def greedy(length: int) -> dict:
        return greedy_fields(dict(max_gen_len=length, seed=SEED))

    timings = {m.key: Timing() for m in methods}
    ar = Timing()
    for m in methods:
        run_strategy(m.strategy(**greedy(min(length, WARM_TOKENS))), pair, prompts[0], state=state)
    target = target_ar(length, SEED)
    turn = 0
    for _ in range(max(1, passes)):
        for prompt in prompts:
            ar.add(run_strategy(target, pair, prompt, state=state))
            for m in methods[turn:] + methods[:turn]:
                timings[m.key].add(run_strategy(m.strategy(**greedy(length)), pair, prompt, state=state))
            turn = (turn + 1) % len(methods)
    out = {"target": {"tokens_per_s": ar.tokens_per_s, "speedup": 1.0}}
    for key, t in timings.items():
        out[key] = {"tokens_per_s": t.tokens_per_s, "speedup": t.tokens_per_s / ar.tokens_per_s}
    return out


def recheck_methods(grid: list, rows: dict[str, dict], first: str) -> list:
    """The grid points the recheck runs: the benchmark's :data:`RECHECK_TOP` best and the advisor's first pick."""
    ours = sorted((k for k in rows if k != "target"), key=lambda k: -(rows[k]["speedup"] or 0.0))
    keys = list(dict.fromkeys(ours[:RECHECK_TOP] + [first]))
    by_key = {m.key: m for m in grid}
    return [by_key[k] for k in keys if k in by_key]


def run_recheck(pair, prompts, grid, bench: dict, first: str, args, state) -> dict:
    """:func:`recheck` of the benchmark's best and the advisor's ``first`` pick, as run.json keeps it."""
    chosen = recheck_methods(grid, pooled_rows(bench), first)
    print("rechecking " + ", ".join(m.key for m in chosen) + " beside target AR, prompt by prompt", file=sys.stderr)
    before = read_load()
    speedups = recheck(pair, prompts, chosen, args.length, state, max(1, args.recheck))
    return {"passes": max(1, args.recheck), "speedups": speedups, "other_load": other_load(before, read_load())}


def pooled_rows(report: dict) -> dict[str, dict]:
    """The benchmark's summary rows over every prompt, by variant."""
    rows = [r for r in report["summary"] if r.get("position") is None]
    categories = {r["category"] for r in rows}
    pooled = "all" if "all" in categories else next(iter(categories))   # one category: its own rows
    return {r["variant"]: r for r in rows if r["category"] == pooled}


def _decode_predicted(advice: dict) -> float:
    """The steady-state (decode) prediction of one advice (files from before it was kept apart: the only one)."""
    return advice.get("predicted_decode_speedup") or advice["predicted_speedup"]


def fmt(x: float | None, suffix: str = "x") -> str:
    return "" if x is None else f"{x:.2f}{suffix}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--builtin", help="indices into utils.builtin_prompts.BUILTIN, e.g. 0,3")
    which.add_argument("--spec-bench", metavar="FILE", help="a Spec-Bench question.jsonl")
    parser.add_argument("--categories", default="summarization,rag,math_reasoning,coding")
    parser.add_argument("--limit", type=int, default=1, help="prompts per category (--spec-bench)")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--gammas", default="2,4,6")
    parser.add_argument("--confirm", type=int, default=CONFIRM)
    parser.add_argument("--repeats", type=int, default=2, help="the benchmark's timed runs per prompt")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--recheck", type=int, default=2, metavar="N",
                        help="passes of the fresh runs of the benchmark's best and the first pick (0: none)")
    parser.add_argument("--out", default=None, help="folder for the benchmark's files and advice.json")
    parser.add_argument("--report-only", action="store_true",
                        help="print the table from an earlier run's --out folder without running")
    parser.add_argument("--recheck-only", action="store_true",
                        help="run only the fresh runs of an earlier run's --out folder (the same prompt options), "
                             "then print its table")
    args = parser.parse_args()
    items = prompt_items(args)
    out = Path(args.out or tempfile.mkdtemp(prefix="advise_vs_bench_"))
    out.mkdir(parents=True, exist_ok=True)
    file = out / "prompts.jsonl"
    file.write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items), encoding="utf-8")

    if args.report_only:
        print_table(items, args, out, json.loads((out / "run.json").read_text(encoding="utf-8")))
        return 0
    started = time.perf_counter()
    runner = default_runner(args.threads)
    load_s = time.perf_counter() - started
    pair = runner.pair
    prompts = [chat_ids(pair.tokenizer, i["turns"][0]) for i in items]
    grid = default_grid(pair, gammas=tuple(int(g) for g in args.gammas.split(",")), policies=("constant",),
                        trees=(0,), self_specs=())
    if args.recheck_only:
        run = json.loads((out / "run.json").read_text(encoding="utf-8"))
        bench = json.loads((out / "bench.json").read_text(encoding="utf-8"))
        run["recheck"] = run_recheck(pair, prompts, grid, bench, run["advice"]["advice"][0]["method"], args,
                                     runner.state)
        (out / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
        print_table(items, args, out, run)
        return 0
    before = read_load()
    report = advise(pair, prompts, length=args.length, confirm=args.confirm, grid=grid, state=runner.state,
                    say=lambda line: print(line, file=sys.stderr))
    run = {"target": pair.target_name, "drafter": pair.drafter_name, "grid": [m.key for m in grid],
           "load_s": load_s, "advise_load": other_load(before, read_load()), "advice": report.to_dict(),
           "costs_label": report.costs.label()}
    (out / "advice.json").write_text(json.dumps(report.to_dict(), indent=1) + "\n", encoding="utf-8")
    run["bench_wall"], bench = run_bench(file, out, args)
    run["bench_load"] = (bench.get("load") or {}).get("other_load")   # the benchmark's own reading
    if args.recheck > 0 and report.advice:
        run["recheck"] = run_recheck(pair, prompts, grid, bench, report.advice[0].method, args, runner.state)
    (out / "run.json").write_text(json.dumps(run, indent=1) + "\n", encoding="utf-8")
    print_table(items, args, out, run)
    return 0


def print_table(items: list[dict], args, out: Path, run: dict) -> None:
    """The comparison from the files a run left in ``out`` (run.json, bench.json)."""
    bench = json.loads((out / "bench.json").read_text(encoding="utf-8"))
    report = run["advice"]
    if "load" in bench:
        run["bench_load"] = bench["load"].get("other_load")
    advice = report["advice"]
    seconds = report["seconds"]
    bench_s = run["bench_wall"] - run["load_s"]
    rows = pooled_rows(bench)
    ours = {k: r for k, r in rows.items() if k != "target"}
    best_name, best = max(ours.items(), key=lambda kv: kv[1]["speedup"] or 0.0)
    missing = sorted(set(run["grid"]) - set(ours))
    extra = sorted(set(ours) - set(run["grid"]))
    nan = float("nan")
    print(f"{run['target']} · drafter {run['drafter']} · {len(items)} prompts "
          f"({', '.join(i['question_id'] + ' ' + i['category'] for i in items)}) · {args.length} new tokens · "
          f"{len(run['grid'])} methods · bench {bench['settings']['repeats']} repeat(s)")
    print(f"advisor {seconds:.0f} s (other processes {run['advise_load'] if run['advise_load'] is not None else nan:.2f} "
          f"cores); benchmark {bench_s:.0f} s ({run['bench_wall']:.0f} s wall less a {run['load_s']:.0f} s load; other "
          f"processes {run['bench_load'] if run['bench_load'] is not None else nan:.2f} cores)")
    print(f"costs {run['costs_label']}; target AR {report['baseline']['tokens_per_s']:.1f} tok/s in the advice, "
          f"{rows['target']['tokens_per_s']:.1f} in the benchmark")
    if missing or extra:
        print(f"grid differs: advisor only {missing}, benchmark only {extra}")
    print(f"{'#':>3} {'method':<26}{'predicted':>10}{'confirmed':>10}{'off':>7}{'decode':>8}{'confirmed':>10}"
          f"{'off':>7}{'bench':>8}{'b.decode':>9}{'tok/call':>9}")
    for i, a in enumerate(advice[:max(args.confirm, 1)], 1):
        r = ours.get(a["method"], {})
        pred, got = a["predicted_speedup"], a["measured_speedup"]
        dpred, dec = _decode_predicted(a), a["measured_decode_speedup"]
        off = got / pred - 1 if got else None
        doff = dec / dpred - 1 if dec else None
        print(f"{i:>3} {a['method']:<26}{fmt(pred):>10}{fmt(got):>10}{'' if off is None else f'{off:+.0%}':>7}"
              f"{fmt(dpred):>8}{fmt(dec):>10}{'' if doff is None else f'{doff:+.0%}':>7}"
              f"{fmt(r.get('speedup')):>8}{fmt(r.get('decode_speedup')):>9}{a['tokens_per_call']:>9.2f}")
    rank = next((i for i, a in enumerate(advice, 1) if a["method"] == best_name), "-")
    print(f"benchmark's best: {best_name} {fmt(best['speedup'])} (decode {fmt(best.get('decode_speedup'))}); "
          f"advisor's rank of it: {rank}, predicted "
          f"{fmt(next((a['predicted_speedup'] for a in advice if a['method'] == best_name), None))}")
    print("benchmark, every method by speedup: " + ", ".join(
        f"{k} {fmt(r['speedup'])}" for k, r in sorted(ours.items(), key=lambda kv: -(kv[1]['speedup'] or 0))))
    errors = sorted(((a["predicted_speedup"] / ours[a["method"]]["speedup"] - 1, a["method"]) for a in advice
                     if ours.get(a["method"], {}).get("speedup")), key=lambda e: abs(e[0]))
    if errors:
        worst = errors[-1]
        print(f"every method, predicted against the benchmark's median: {sum(abs(e) <= 0.10 for e, _ in errors)}/"
              f"{len(errors)} within 10%, mean |error| {sum(abs(e) for e, _ in errors) / len(errors):.1%}, "
              f"largest {worst[0]:+.1%} ({worst[1]})")
    confirmed = [a for a in advice if a["measured_decode_speedup"]]
    within = [abs(a["measured_decode_speedup"] / _decode_predicted(a) - 1) <= 0.10 for a in confirmed]
    within_e2e = [abs(a["measured_speedup"] / a["predicted_speedup"] - 1) <= 0.10 for a in confirmed]
    first = advice[0]
    first_bench = ours.get(first["method"], {}).get("speedup")
    print(f"check 1, confirmed within 10% of predicted: end to end {sum(within_e2e)}/{len(within_e2e)}, "
          f"decode part {sum(within)}/{len(within)}")
    if first_bench:
        print(f"check 2, first pick within 5% of the benchmark's best: {first['method']} {first_bench:.2f}x in the "
              f"benchmark vs {best['speedup']:.2f}x: {first_bench / best['speedup'] - 1:+.1%} "
              f"({'yes' if first_bench >= 0.95 * best['speedup'] else 'no'}); its confirmed run "
              f"{fmt(first['measured_speedup'])}: {(first['measured_speedup'] or 0) / best['speedup'] - 1:+.1%}")
    again = run.get("recheck")
    if again:
        fresh = {k: r for k, r in again["speedups"].items() if k != "target"}
        top_name, top = max(fresh.items(), key=lambda kv: kv[1]["speedup"])
        mine = fresh.get(first["method"])
        print(f"check 2 again, on fresh runs ({again['passes']} pass(es) beside target AR; other processes "
              f"{again['other_load'] if again.get('other_load') is not None else nan:.2f} cores): "
              + ", ".join(f"{k} {r['speedup']:.2f}x" for k, r in sorted(fresh.items(), key=lambda kv: -kv[1]['speedup'])))
        if mine:
            print(f"  first pick {first['method']} {mine['speedup']:.2f}x vs the best of them, {top_name} "
                  f"{top['speedup']:.2f}x: {mine['speedup'] / top['speedup'] - 1:+.1%} "
                  f"({'yes' if mine['speedup'] >= 0.95 * top['speedup'] else 'no'})")
    print(f"check 3, advice at most a fifth of the benchmark's seconds: {seconds:.0f} s vs {bench_s:.0f} s "
          f"= {seconds / bench_s:.2f} ({'yes' if seconds <= bench_s / 5 else 'no'})")
    print(f"files: {out}")


if __name__ == "__main__":
    sys.exit(main())
