"""What every figure of a prompt carries besides its speed: the machine's load while it ran
(``utils.machine_load``) and the decode part apart from the prefill (time to first token,
decode-only tokens/s), in the comparison, /stats, the JSON and trace files, old traces included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from generation import GenerationResult
from repl import render
from repl.replay import show_trace
from repl.runner import Runner
from repl.runs import PromptRun, StrategyRun
from repl.session import Session
from repl.settings import Settings
from repl.stats_view import stats_view
from repl.trace import prompt_record, read_trace, trace_document, write_trace
from tests.helpers.repl import ENV, WordTokenizer, build_model, build_tokenizer, console, fake_pair, result
from utils.machine_load import BUSY_CORES, LoadReading, busy_warning
from utils.models import ModelPair

CONTEXT = 1024


def _rows(text: str) -> dict[str, list[str]]:
    return {line.split("│")[0].strip(): [cell.strip() for cell in line.split("│")]
            for line in text.splitlines() if "│" in line}


# ------------------------------------------------------------ the load, from fake readings

def reading(clock, system, own, loadavg=(0.5, 0.4, 0.3), cores=4) -> LoadReading:
    return LoadReading(clock=clock, system_busy_s=system, own_busy_s=own, loadavg=loadavg, cores=cores)


# Two strategies: the readings Runner.run takes, in order (start, then before and after each
# strategy, then the end). Other processes: 0.5 core during Speculative ((1.0 - 0.5) / 1 s), 2.0
# during Target AR ((2.5 - 0.5) / 1 s), and over the whole prompt (4.0 - 1.5) / 2.5 s = 1.0, not
# above BUSY_CORES.
READINGS = [reading(0.0, 100.0, 10.0), reading(0.0, 100.0, 10.0), reading(1.0, 101.0, 10.5),
            reading(1.0, 101.0, 10.5), reading(2.0, 103.5, 11.0), reading(2.5, 104.0, 11.5, (1.5, 0.6, 0.35))]


def _run_with_readings(monkeypatch, readings) -> PromptRun:
    import repl.runner

    feed = iter(readings)
    monkeypatch.setattr(repl.runner, "read_load", lambda: next(feed))
    runner = Runner(fake_pair())
    monkeypatch.setattr(runner, "run_strategy",
                        lambda key, ids, settings, observer=None: StrategyRun(key, result([5, 6, 7]), text="x"))
    prompt_run = PromptRun("p", [2, 3], greedy=True)
    runner.run(prompt_run, Settings(ngram=False))
    assert next(feed, None) is None          # every reading was taken
    return prompt_run


def test_the_prompt_record_carries_the_load_of_each_strategy_and_of_the_prompt(monkeypatch):
    """Mutations: without the readings around each strategy its other_load is None; with the
    prompt's record taken from the last strategy's readings the load averages and load differ."""
    pr = _run_with_readings(monkeypatch, READINGS)
    assert pr.machine_load == {"cores": 4, "loadavg_start": [0.5, 0.4, 0.3], "loadavg_end": [1.5, 0.6, 0.35],
                               "other_load": 1.0, "busy": False}
    assert [run.other_load for run in pr.runs] == pytest.approx([0.5, 2.0])
    obj = json.loads(json.dumps(pr.to_dict()))
    assert obj["machine_load"] == pr.machine_load
    assert obj["strategies"]["speculative"]["other_load"] == pytest.approx(0.5)
    assert obj["strategies"]["target"]["other_load"] == pytest.approx(2.0)
    # The prompt as a whole was not busy, Target AR's run was: one line names it.
    assert render.busy_line(pr) == busy_warning(2.0, 4, "Target AR's run")
    assert render.busy_line(pr).startswith("busy machine: other processes used 2.0 of 4 cores during Target AR's run")


def test_a_busy_prompt_warns_for_the_prompt_and_a_quiet_one_not_at_all(monkeypatch):
    busy = [reading(0.0, 100.0, 10.0), *READINGS[1:5], reading(2.5, 106.0, 11.5)]   # (6 - 1.5) / 2.5 = 1.8
    pr = _run_with_readings(monkeypatch, busy)
    assert pr.machine_load["busy"] and pr.machine_load["other_load"] == pytest.approx(1.8)
    assert render.busy_line(pr) == busy_warning(1.8, 4, "this prompt's runs")
    quiet = [reading(0.0, 100.0, 10.0), reading(0.0, 100.0, 10.0), reading(1.0, 101.0, 10.5),
             reading(1.0, 101.0, 10.5), reading(2.0, 102.0, 11.0), reading(2.5, 102.5, 11.5)]
    pr = _run_with_readings(monkeypatch, quiet)
    assert pr.machine_load["other_load"] == pytest.approx(0.4) and not pr.machine_load["busy"]
    assert render.busy_line(pr) is None
    assert render.busy_line(PromptRun("p", [1], greedy=True)) is None           # nothing measured (old traces)


def test_the_load_travels_through_a_trace_and_its_replay(monkeypatch, tmp_path):
    """Mutation: a trace reader that drops machine_load loses the record and the replay's warning."""
    pr = _run_with_readings(monkeypatch, READINGS)
    path = tmp_path / "t.json"
    write_trace(str(path), trace_document([prompt_record(pr, WordTokenizer())], ENV))
    back = read_trace(str(path)).prompts[0]
    assert back.machine_load == pr.machine_load and back.to_dict() == pr.to_dict()
    assert [run.other_load for run in back.runs] == [run.other_load for run in pr.runs]
    c, out = console()
    show_trace(read_trace(str(path)), c)
    text = out.getvalue()
    assert text.index(render.busy_line(pr)) > text.index("Comparison")


# ------------------------------------------------------------ under a real load

@pytest.fixture(scope="module")
def pair():
    tokenizer = build_tokenizer()
    return ModelPair(
        target=build_model(1, len(tokenizer), context=CONTEXT),
        drafter=build_model(1, len(tokenizer), context=CONTEXT, noise=0.05), tokenizer=tokenizer,
        target_name="tiny target", drafter_name="tiny drafter", end_tokens=[tokenizer.eos_token_id],
        device=torch.device("cpu"), vocab_size=len(tokenizer), context_length=CONTEXT, self_draft_demo=False,
    )


def test_a_prompt_under_a_synthetic_load_records_it_and_warns_after_the_table(pair, tmp_path):
    """Two busy loops beside the session; each target call waits 30 ms (/rtt_inject), so this
    process is idle most of the time and the loops take about two cores. The record carries the
    load, the output has the warning after the comparison, and the JSON and the trace carry both.
    Mutation: without the warning in Session.show_summary the line is missing."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)                          # the loops are running before the prompt starts
        c, out = console()
        session = Session(Runner(pair), Settings(length=8, chat=False, ngram=False, rtt_inject=30.0), c)
        pr = session.prompt("the water is hot and the water is")
    finally:
        for process in busy:
            process.kill()
            process.wait()
    assert pr is not None and [run.key for run in pr.runs] == ["speculative", "target"]
    load = pr.machine_load
    assert load["cores"] == os.cpu_count() and load["busy"] is True
    assert load["other_load"] > BUSY_CORES, load
    assert len(load["loadavg_start"]) == len(load["loadavg_end"]) == 3
    assert all(run.other_load is not None and run.other_load > BUSY_CORES / 2 for run in pr.runs)
    text = out.getvalue()
    line = busy_warning(load["other_load"], load["cores"], "this prompt's runs")
    assert line in text and text.index(line) > text.index("Comparison")
    obj = json.loads(json.dumps(pr.to_dict()))
    assert obj["machine_load"] == load
    assert all(obj["strategies"][run.key]["other_load"] == run.other_load for run in pr.runs)
    path = tmp_path / "busy.json"
    assert session.save(str(path))
    assert json.loads(path.read_text())["prompts"][0]["machine_load"] == load
    # The decode figures shown are the result's own (a real run: every field measured).
    rows = _rows(text)
    for run in pr.runs:
        r = run.result
        assert r.first_token_s is not None and r.decode_tokens_per_second is not None
        assert rows[run.label][3:5] == [f"{r.first_token_s * 1000:.0f}", f"{r.decode_tokens_per_second:.1f}"]
        entry = obj["strategies"][run.key]
        assert entry["first_token_s"] == r.first_token_s
        assert entry["decode_tokens_per_s"] == r.decode_tokens_per_second


# ------------------------------------------------------------ decode apart from prefill

def decode_prompt_run() -> PromptRun:
    """12 tokens in 1.25 s, the first 2 after 0.25 s: 250 ms to the first token, then 10 tokens in
    1.0 s = 10.0 decode tokens/s (9.6 end to end). Target AR: 12 tokens in 2.0 s, the first after
    0.5 s: 11 / 1.5 = 7.3 decode tokens/s."""
    spec = result([5] * 12, seconds=1.25, drafted=10, accepted=8, target_calls=4, first_token_s=0.25, first_tokens=2)
    target = result([5] * 12, seconds=2.0, first_token_s=0.5, first_tokens=1)
    pr = PromptRun("p", [1], greedy=True)
    pr.runs = [StrategyRun("speculative", spec, text="x"), StrategyRun("target", target, text="x")]
    return pr


def test_the_comparison_shows_each_results_time_to_first_token_and_decode_rate():
    """Mutations: TTFT and decode tok/s swapped, or decode tok/s from tokens_per_second, fail."""
    pr = decode_prompt_run()
    c, out = console()
    c.print(render.comparison_table(pr))
    rows = _rows(out.getvalue())
    assert rows["Speculative"][2:5] == ["9.6", "250", "10.0"]
    assert rows["Target AR"][2:5] == ["6.0", "500", "7.3"]
    for run in pr.runs:
        cells = render.comparison_cells(pr, run)
        assert cells[3] == f"{run.result.first_token_s * 1000:.0f}"
        assert cells[4] == f"{run.result.decode_tokens_per_second:.1f}"
    entry = pr.to_dict()["strategies"]["speculative"]
    assert entry["first_token_s"] == 0.25 and entry["decode_tokens_per_s"] == pytest.approx(10.0)


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_comparison_fits_the_terminal_and_keeps_the_decode_figures(width):
    """At 100 columns and more the decode figures are columns; at 80 they move into the caption,
    with every run's numbers, and no line is wider than the terminal."""
    from rich.console import Console
    import io

    pr = decode_prompt_run()
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(render.comparison_table(pr, width))
    text = out.getvalue()
    assert all(len(line.rstrip()) <= width for line in text.splitlines())
    rows = _rows(text)
    if width >= 100:
        assert "250" in rows["Speculative"] and "10.0" in rows["Speculative"]
        assert "TTFT" in text and "decode" in text
    else:
        assert "250" not in rows["Speculative"]
        assert "Speculative 250 ms / 10.0, Target AR 500 ms / 7.3" in " ".join(text.split())


def test_stats_shows_the_decode_figures_beside_the_end_to_end_ones():
    pr = decode_prompt_run()
    c, out = console()
    c.print(stats_view(pr))
    rows = {line.split("│")[0].strip(): line.split("│")[1].strip() for line in out.getvalue().splitlines()
            if "│" in line}
    assert rows["tokens/s (end to end)"] == "9.6"
    assert rows["time to first token (ms)"] == "250"
    assert rows["decode tokens/s (after the first round)"] == "10.0"
    assert "Target AR: 6.0 tokens/s end to end · first token 500 ms · decode 7.3 tokens/s" in out.getvalue()


def test_a_trace_without_the_new_fields_replays(tmp_path):
    """A trace written before time to first token and the machine load were recorded: the figures
    read "-", no warning, no error."""
    pr = decode_prompt_run()
    document = trace_document([prompt_record(pr, WordTokenizer())], ENV)
    record = document["prompts"][0]
    record.pop("machine_load")
    for entry in record["strategies"].values():
        for name in ("first_token_s", "decode_tokens_per_s", "other_load"):
            entry.pop(name)
        for name in ("first_token_s", "first_tokens", "decode_tokens_per_s"):
            entry["result"].pop(name)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    trace = read_trace(str(path))
    back = trace.prompts[0]
    assert back.machine_load is None and back.runs[0].result.first_token_s is None
    c, out = console()
    show_trace(trace, c)
    rows = _rows(out.getvalue())
    assert rows["Speculative"][3:5] == ["-", "-"]
    assert "busy machine" not in out.getvalue()
    assert back.to_dict()["strategies"]["speculative"]["decode_tokens_per_s"] is None


def test_a_result_without_a_first_round_shows_dashes():
    r = GenerationResult(tokens=[], seconds=0.1)
    assert render.first_token_ms(r) == "-" and render.decode_rate_cell(r) == "-"

