"""The benchmark's figures in every condition: a stopped run compares like with like, every run
carries the machine's load, the REPL and the benchmark share one set of defaults, decode speed
stands apart from prefill, and a run without a terminal still says how far it got."""

from __future__ import annotations

import csv
import io
import json
import statistics
import subprocess
import sys
import time

import pytest
import torch

from bench.aggregate import ALL, summarize
from bench.records import RunRecord
from generation.result import decode_rate
from tests.test_bench import _rec, tiny_pair  # noqa: F401  (tiny_pair: the module's fixture)
from utils.defaults import DEFAULTS, Defaults
from utils.machine_load import LoadReading

PROMPTS = [
    {"question_id": 1, "category": "summarization", "turns": ["the cat sat on the mat. the cat sat."]},
    {"question_id": 2, "category": "chat", "turns": ["hello there, how are you? hello there."]},
    {"question_id": 3, "category": "translation", "turns": ["one two three four one two three"]},
]


def _bench(pair, tmp_path, *flags, prompts=PROMPTS) -> tuple[int, dict | None, str, str]:
    """Run bench.py on ``prompts`` with one thread: (exit code, bench.json, summary.md, printed header)."""
    from bench.cli import main

    path = tmp_path / "q.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in prompts), encoding="utf-8")
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:
        code = main(["--prompts", str(path), "--policies", "none", "--threads", "1", "--out", str(out), *flags],
                    loader=lambda args: pair)
    finally:
        torch.set_num_threads(threads)
    if not (out / "bench.json").exists():
        return code, None, "", ""
    return code, json.loads((out / "bench.json").read_text()), (out / "summary.md").read_text(), str(out)


# ---------------------------------------------------------------- a stopped run compares like with like

def _by_hand(runs: list[dict], mine: str, other: str, rate, category: str = ALL) -> float | None:
    """The slow obvious way: per repeat, ``rate`` of ``mine``'s and of ``other``'s runs on the
    (prompt, repeat) pairs both have, then the median of the per-repeat ratios."""
    def table(name):
        return {(r["prompt_id"], r["repeat"]): r for r in runs
                if r["variant"] == name and category in (ALL, r["category"])}

    a, b = table(mine), table(other)
    common = a.keys() & b.keys()
    ratios = []
    for repeat in sorted({k[1] for k in common}):
        keys = [k for k in common if k[1] == repeat]
        ratios.append(rate([a[k] for k in keys]) / rate([b[k] for k in keys]))
    return statistics.median(ratios) if ratios else None


def _tokens_per_s(runs):
    return sum(r["n_tokens"] for r in runs) / sum(r["seconds"] for r in runs)


def _decode_per_s(runs):
    return (sum(r["n_tokens"] - r["first_tokens"] for r in runs)
            / sum(r["engine_seconds"] - r["first_token_s"] for r in runs))


def _seconds_per_call(runs):
    return sum(r["seconds"] for r in runs) / sum(r["target_calls"] for r in runs)


def _stop_after(monkeypatch, runs: int) -> None:
    """Ctrl-C during run ``runs + 1``: the executor's first ``runs`` runs finish."""
    from bench.executor import Executor

    real, count = Executor.run, [0]

    def run(self, *args, **kwargs):
        count[0] += 1
        if count[0] > runs:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Executor, "run", run)


def test_a_stopped_run_pairs_every_ratio_on_the_runs_both_sides_finished(tiny_pair, tmp_path, monkeypatch, capsys):
    """3 prompts, 6 variants (the peers eager and on a static cache), 2 repeats (36 runs), stopped
    after 27: repeat 2 (variants reversed) finished prompt 1 whole and prompt 2 by the two prompt
    lookups and NASD only. Every ratio, recomputed
    from bench.json's runs on the runs both its sides finished, is what the report says; the
    interrupted line is in the header, summary.md and bench.json. Power: left unpaired, NASD's
    speedup would be another number."""
    _stop_after(monkeypatch, 27)
    code, data, md, _ = _bench(tiny_pair, tmp_path, "--strategies", "target,ngram", "--gamma", "2", "--peers",
                               "--length", "8", "--repeats", "2", "--warmup", "0", "--no-chart", "--seed", "0",
                               "--expect", "ngram@2/target=0.001")
    assert code == 130
    runs = data["runs"]
    assert len(runs) == 27 and data["variants"] == ["target", "hf_generate", "hf_generate+static", "ngram@2",
                                                    "hf_prompt_lookup@2", "hf_prompt_lookup+static@2"]
    summary = {(r["variant"], r["category"]): r for r in data["summary"] if r["position"] is None}
    categories = {r["category"] for r in runs} | {ALL}
    for category in categories:
        row = summary[("ngram@2", category)]
        assert row["speedup"] == pytest.approx(_by_hand(runs, "ngram@2", "target", _tokens_per_s, category))
        assert row["vs_peer"] == pytest.approx(_by_hand(runs, "ngram@2", "hf_prompt_lookup@2", _tokens_per_s,
                                                        category))
        assert row["decode_speedup"] == pytest.approx(_by_hand(runs, "ngram@2", "target", _decode_per_s, category))
    common = [r for r in runs if r["variant"] == "ngram@2" and (r["prompt_id"], r["repeat"]) != ("2", 1)]
    target = [r for r in runs if r["variant"] == "target"]
    assert summary[("ngram@2", ALL)]["call_cost"] == pytest.approx(_seconds_per_call(common)
                                                                   / _seconds_per_call(target))
    assert data["expectations"][0]["value"] == pytest.approx(summary[("ngram@2", ALL)]["speedup"])
    # Power: NASD has a run (prompt 2, repeat 2) target AR never finished; pooled anyway, the ratio moves.
    unpaired = statistics.median(
        _tokens_per_s([r for r in runs if r["variant"] == "ngram@2" and r["repeat"] == repeat])
        / _tokens_per_s([r for r in runs if r["variant"] == "target" and r["repeat"] == repeat]) for repeat in (0, 1))
    assert unpaired != pytest.approx(summary[("ngram@2", ALL)]["speedup"])

    line = ("interrupted: 27 of 36 runs; each ratio pairs the runs both its sides finished: repeat 1 on all 3 "
            "prompts; repeat 2 on 1 of 3 prompts (1), 2 by 3 of 6 variants")
    printed = capsys.readouterr().out
    assert line in printed and line in md
    assert data["interrupted"] == {"runs": 27, "planned": 36, "line": line, "by_repeat": [
        {"repeat": 0, "prompts": ["1", "2", "3"], "partial": {}},
        {"repeat": 1, "prompts": ["1"], "partial": {"2": 3}}]}
    assert data["settings"]["interrupted"] is True
    assert "differs from the REPL's defaults: length 8, seed 0" in md


def test_a_complete_run_has_no_interrupted_line_and_says_only_what_differs(tiny_pair, tmp_path, capsys):
    code, data, md, _ = _bench(tiny_pair, tmp_path, "--strategies", "target", "--length", "6", "--repeats", "1",
                               "--warmup", "0", "--no-chart", prompts=PROMPTS[:1])
    assert code == 0 and data["interrupted"] is None and "interrupted" not in md
    differs = [line for line in md.splitlines() if line.startswith("differs from the REPL's defaults")]
    assert differs == ["differs from the REPL's defaults: length 6  "]      # the seed is the REPL's own


def test_a_run_that_fails_keeps_what_finished_in_one_line(tiny_pair, tmp_path, monkeypatch, capsys):
    from bench.executor import Executor

    real, count = Executor.run, [0]

    def run(self, *args, **kwargs):
        count[0] += 1
        if count[0] > 3:
            raise RuntimeError("out of memory")
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Executor, "run", run)
    code, data, md, _ = _bench(tiny_pair, tmp_path, "--strategies", "target,ngram", "--gamma", "2", "--length", "6",
                               "--repeats", "2", "--warmup", "0", "--no-chart", prompts=PROMPTS[:2])
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and len(data["runs"]) == 3 and "Traceback" not in err
    assert "failed (RuntimeError: out of memory); reporting the 3 runs that finished" in err
    assert "interrupted: 3 of 8 runs" in md


# ---------------------------------------------------------------- the machine's load

def _reading(clock: float, system: float, own: float) -> LoadReading:
    return LoadReading(clock=clock, system_busy_s=system, own_busy_s=own, loadavg=(0.5, 0.5, 0.5), cores=2)


def test_each_run_is_marked_with_the_load_other_processes_put_on_it(tiny_pair, monkeypatch):
    """Fake readings around two runs: 2.5 busy seconds of which 0.5 ours in 1 s (2.0 cores
    others': busy), then 0.8 of which 0.5 ours in 1 s (0.3: not busy); the warning counts 1 of 2."""
    import bench.executor
    from bench.executor import Executor, RunSettings
    from bench.marks import busy_line
    from bench.processors import parse_processor
    from bench.variants import Variant

    readings = iter([_reading(0, 10, 1), _reading(1, 12.5, 1.5), _reading(5, 20, 2), _reading(6, 20.8, 2.5)])
    monkeypatch.setattr(bench.executor, "read_load", lambda: next(readings))
    executor = Executor(tiny_pair, RunSettings(parse_processor("greedy"), length=4))
    try:
        records = [executor.run(Variant("target"), [3, 4, 5], prompt_id="p", category="chat", repeat=r)
                   for r in range(2)]
    finally:
        executor.close()
    assert [r.other_load for r in records] == [pytest.approx(2.0), pytest.approx(0.3)]
    assert [r.busy for r in records] == [True, False]
    assert "other_load" in records[0].row() and records[0].row()["busy"] is True
    assert busy_line(records).startswith("busy machine: 1 of 2 runs ran while other processes used more than one core")
    assert busy_line(records[1:]) is None


def test_a_benchmark_under_load_marks_its_runs_and_warns_once(tiny_pair, tmp_path, capsys):
    """Two busy loops beside a one-thread benchmark on this machine: every run measures them
    (more than half a core), and the header and the terminal say so once."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)   # both loops running before the first run
        code, data, md, _ = _bench(tiny_pair, tmp_path, "--strategies", "target,ngram", "--gamma", "2",
                                   "--length", "24", "--repeats", "1", "--warmup", "0", "--no-chart",
                                   prompts=PROMPTS[:1])
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    assert code == 0
    assert all(r["other_load"] > 0.5 for r in data["runs"]), [r["other_load"] for r in data["runs"]]
    load = data["load"]
    assert load["other_load"] > 0.5 and load["cores"] >= 1 and load["runs"] == 2 and "loadavg_start" in load
    captured = capsys.readouterr()
    warning = "ran while other processes used more than one core"
    assert warning in md and warning in captured.out
    assert captured.err.count("busy machine:") == 1
    assert load["busy_runs"] == sum(r["busy"] for r in data["runs"]) >= 1


# ---------------------------------------------------------------- one set of defaults

def repl_defaults() -> dict:
    """The shared defaults as the REPL's Settings has them."""
    from repl.settings import Settings

    s = Settings()
    return {name: getattr(s, name) for name in Defaults.__dataclass_fields__ if name != "processor"} | \
        {"processor": s.processor.command_text()}


def bench_defaults(parser=None) -> dict:
    """The shared defaults as the benchmark's flags and RunSettings have them (γ: the sweep must hold
    the REPL's; a list flag: its one item); a flag and RunSettings that disagree read as None."""
    from bench.cli import build_parser
    from bench.executor import RunSettings
    from bench.processors import parse_processor

    args = (parser or build_parser()).parse_args([])
    runs = RunSettings(parse_processor("greedy"))
    flags = dict(gamma=DEFAULTS.gamma if DEFAULTS.gamma in args.gamma else args.gamma, length=args.length,
                 seed=args.seed, verify=args.verify, top_k_filler=args.top_k_filler, tree_branch=args.tree_branch,
                 tree_sample=args.tree_sample, ngram_storage=args.ngram_storage, ngram_n=args.ngram_n,
                 suffix_pattern=args.suffix_pattern, uag=args.uag, chat=args.chat,
                 processor=args.processor.command_text())
    flags = {k: v[0] if isinstance(v, list) and len(v) == 1 else v for k, v in flags.items()}
    executor = dict(length=runs.length, seed=runs.seed, top_k_filler=runs.filler_top_k, tree_branch=runs.tree_branch,
                    tree_sample=runs.tree_sample, ngram_storage=runs.ngram_storage, ngram_n=runs.ngram_n,
                    suffix_pattern=runs.suffix_pattern, uag=runs.uag)
    return {k: v if executor.get(k, v) == v else None for k, v in flags.items()}


def disagreements(a: dict, b: dict) -> list[str]:
    return [k for k in a if a[k] != b.get(k)]


def test_the_repl_and_the_benchmark_start_from_the_same_defaults():
    """Every shared default is the same in the REPL's Settings, the benchmark's flags and its
    RunSettings, and is the REPL's documented one. Mutation: a flag's default changed is caught."""
    from bench.cli import build_parser

    repl = repl_defaults()
    assert repl == {f: getattr(DEFAULTS, f) for f in Defaults.__dataclass_fields__}
    assert (repl["verify"], repl["seed"], repl["top_k_filler"], repl["tree_branch"]) == ("block", 42, 3, 2)
    assert disagreements(repl, bench_defaults()) == []
    for flag, value in (("seed", 0), ("top_k_filler", 1), ("tree_branch", 3), ("verify", ["residual"])):
        mutated = build_parser()
        mutated.set_defaults(**{flag: value})
        assert disagreements(repl, bench_defaults(mutated)) == [flag]


def test_the_default_rule_keeps_the_plain_name_and_the_peer():
    from bench.variants import parse_variant_name, plan_variants

    names = [v.name for v in plan_variants(["speculative"], [4], peers=True, verifies=["block", "residual", "strict"])]
    assert names == ["target", "hf_generate", "speculative@4", "hf_assisted@4", "speculative@4~residual",
                     "speculative@4~strict"]
    assert parse_variant_name("speculative@4").verify == DEFAULTS.verify
    assert parse_variant_name("speculative@4~residual").peer.name == "hf_assisted@4"
    assert parse_variant_name("speculative@4~strict").peer is None
    assert [v.name for v in plan_variants(["speculative"], [4], peers=True)] == \
        ["target", "hf_generate", "speculative@4", "hf_assisted@4"]


# ---------------------------------------------------------------- decode apart from prefill; progress

def test_decode_columns_and_progress_lines_without_a_terminal(tiny_pair, tmp_path, capsys):
    """Time to first token, decode tok/s and decode speedup equal what the runs give, in bench.json,
    summary.csv and the tables; peers have none. stderr is no terminal here: one plain line per
    finished run, warm-up included."""
    code, data, md, out = _bench(tiny_pair, tmp_path, "--strategies", "target,ngram", "--gamma", "2", "--peers",
                                 "--length", "10", "--repeats", "2", "--warmup", "1", "--no-chart",
                                 prompts=PROMPTS[:2])
    assert code == 0
    runs = data["runs"]
    for r in runs:
        ours = r["variant"] in ("target", "ngram@2")
        assert (r["first_token_s"] is not None) == ours and (r["first_tokens"] is not None) == ours, r["variant"]
        if ours:
            assert 0 < r["first_token_s"] < r["engine_seconds"] and r["first_tokens"] >= 1
            assert r["decode_tokens_per_s"] == pytest.approx(
                decode_rate(r["n_tokens"], r["engine_seconds"], r["first_token_s"], r["first_tokens"]))
    summary = {(r["variant"], r["category"]): r for r in data["summary"]}
    for name in ("target", "ngram@2"):
        mine = [r for r in runs if r["variant"] == name]
        row = summary[(name, ALL)]
        assert row["ttft_ms"] == pytest.approx(statistics.median(1000 * r["first_token_s"] for r in mine))
        assert row["decode_tokens_per_s"] == pytest.approx(statistics.median(
            _decode_per_s([r for r in mine if r["repeat"] == repeat]) for repeat in (0, 1)))
        assert row["decode_speedup"] == pytest.approx(_by_hand(runs, name, "target", _decode_per_s))
    for peer in ("hf_generate", "hf_prompt_lookup@2"):
        row = summary[(peer, ALL)]
        assert row["ttft_ms"] is None and row["decode_tokens_per_s"] is None and row["decode_speedup"] is None
    with open(f"{out}/summary.csv", newline="") as f:
        table = {(r["variant"], r["category"]): r for r in csv.DictReader(f)}
    assert float(table[("ngram@2", ALL)]["decode_speedup"]) == pytest.approx(summary[("ngram@2", ALL)]["decode_speedup"])
    row = summary[("ngram@2", ALL)]
    cells = f"| {row['ttft_ms']:.1f} | {row['decode_tokens_per_s']:.1f} | {row['decode_speedup']:.2f}× |"
    assert "| TTFT ms | decode tok/s | decode speedup |" in md and cells in md
    captured = capsys.readouterr()
    assert "TTFT ms" in captured.out

    lines = [line for line in captured.err.splitlines() if line.startswith("[")]
    assert len(lines) == 6 * (1 + 2 * 2)       # 6 variants (peers eager and static): a warm-up, 2 prompts twice
    assert lines[0].startswith("[1/30] target · 1 · warm-up · ") and lines[0].endswith(" ms")
    assert lines[-1].startswith("[30/30] target · 2 · repeat 2 · ")


def test_progress_is_a_line_per_run_on_a_console_that_is_no_terminal():
    from rich.console import Console

    from bench.progress import RunBar, RunLines, run_progress

    sink = io.StringIO()
    console = Console(file=sink, width=80)
    record = RunRecord("speculative@4", "speculative", 4, "ours", "writing/1", "writing", 0, 5, seconds=3.21)
    with run_progress(console, 98) as progress:
        assert isinstance(progress, RunLines)
        progress.grow(99)
        progress.finished(record)
    progress.finished(RunRecord("target", "target", None, "ours", "chat/2", "chat", -1, 5, seconds=0.0421))
    assert sink.getvalue() == ("[1/99] speculative@4 · writing/1 · repeat 1 · 3.2 s\n"
                               "[2/99] target · chat/2 · warm-up · 42 ms\n")
    assert isinstance(run_progress(Console(file=sink, force_terminal=True), 1), RunBar)


# ---------------------------------------------------------------- pairing on hand-built records

def test_every_aggregate_pairs_on_the_runs_both_sides_finished():
    """Target AR ran prompt a only; NASD ran a and b (b twice as fast as a): its speedup, call cost
    and expectation stand on a alone. Mutation: pooling b in too would read 1.5x, not 1.0x."""
    from bench.expect import Expectation, check_expectations

    records = [_rec("target", "a", "chat", 0, 10, 1.0), _rec("ngram@4", "a", "chat", 0, 10, 1.0),
               _rec("ngram@4", "b", "chat", 0, 10, 0.5)]
    row = next(r for r in summarize(records, greedy=True) if r.variant == "ngram@4" and r.category == ALL)
    assert row.speedup == pytest.approx(1.0) and row.call_cost == pytest.approx(1.0)
    assert (row.identical_count, row.identical) == (1, 1.0)    # b has no reference to compare with
    verdict, = check_expectations(records, [Expectation("ngram@4", "target", 1.2)])
    assert verdict.value == pytest.approx(1.0) and verdict.status == "missed"
