"""The advisor against the benchmark over the same grid and prompts, on the default pair (docs/results.md).

Runs ``advisor.advise`` over check_advice.py's grid (constant γ, chains; each n-gram storage, the
pair's drafter and the hybrid with L 4: 21 methods at γ 2, 4, 6) and confirms its best two, then
``bench.py`` over the same 21 methods plus target AR on the same prompts (a Spec-Bench-format file
this script writes, so both encode the same ids), and prints one table: the advisor's top three
with predicted and confirmed speedups, the benchmark's measured speedup of each and its best
method, both wall times, and the three checks (each confirmed method within 10% of its prediction,
the first pick within 5% of the benchmark's best, the advice in at most a fifth of the benchmark's
time).

    .venv/bin/python scripts/advise_vs_bench.py --builtin 0,3 [--repeats 2]
    .venv/bin/python scripts/advise_vs_bench.py --spec-bench ../shared/spec_bench/question.jsonl \\
        --categories summarization,rag,math_reasoning,coding [--repeats 1]

The benchmark runs in a child process (its own model load); its seconds are that process's wall
time less this process's load of the same pair, which is said beside it. ``--report-only --out DIR``
prints the table again from a finished run's files (run.json, bench.json) without running anything.
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
    parser.add_argument("--out", default=None, help="folder for the benchmark's files and advice.json")
    parser.add_argument("--report-only", action="store_true",
                        help="print the table from an earlier run's --out folder without running")
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
    before = read_load()
    report = advise(pair, prompts, length=args.length, confirm=args.confirm, grid=grid, state=runner.state,
                    say=lambda line: print(line, file=sys.stderr))
    run = {"target": pair.target_name, "drafter": pair.drafter_name, "grid": [m.key for m in grid],
           "load_s": load_s, "advise_load": other_load(before, read_load()), "advice": report.to_dict(),
           "costs_label": report.costs.label()}
    (out / "advice.json").write_text(json.dumps(report.to_dict(), indent=1) + "\n", encoding="utf-8")
    run["bench_wall"], bench = run_bench(file, out, args)
    run["bench_load"] = (bench.get("load") or {}).get("other_load")   # the benchmark's own reading
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
    print(f"check 3, advice at most a fifth of the benchmark's seconds: {seconds:.0f} s vs {bench_s:.0f} s "
          f"= {seconds / bench_s:.2f} ({'yes' if seconds <= bench_s / 5 else 'no'})")
    print(f"files: {out}")


if __name__ == "__main__":
    sys.exit(main())
