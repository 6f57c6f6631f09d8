"""The compile path in the front ends: /compile and --compile through the one command table,
the default per device, the setting reaching every strategy, and the path each run took in its
panel, /stats and the JSON; bench.py's --compile in its settings, bench.json and header."""

from __future__ import annotations

import argparse
import dataclasses

import pytest
import torch

from generation import autoregressive, verify
from kvcache import static
from kvcache.static import default_compile
from repl import render
from repl.commands import COMMANDS, CommandError, add_flags, apply_flags, execute, parse_compile
from repl.runner import Runner, strategy_for
from repl.runs import StrategyRun
from repl.settings import STRATEGIES, Settings
from repl.stats_view import stats_view
from repl.trace import environment, prompt_record, read_trace, trace_document, write_trace
from tests.helpers.models import tiny_llama
from tests.helpers.pairs import model_pair
from tests.helpers.static import fresh_captures
from tests.helpers.tokenizers import word_tokenizer
from utils.options import COMPILE_PATHS

PROMPT = "w1 w2 w3 w4 w1 w2 w3 w4 w1 w2"


# ---------------------------------------------------------------- the setting

def _compile_command_faults() -> list[str]:
    """What /compile gets wrong (empty: nothing): each path is set, told in one line, and changes no
    other setting and asks for nothing (no reload, no run: the setting is read at the next prompt);
    a refused line is told in one line with the usage and leaves every setting as it was."""
    faults = []
    settings = Settings()
    for path in COMPILE_PATHS:
        before = dataclasses.asdict(settings)
        reply = execute(f"/compile {path.upper()}", settings)
        if not (reply.ok and settings.compile == path and reply.message == f"compile: {path}"):
            faults.append(f"/compile {path}: {reply}")
        if {**before, "compile": path} != dataclasses.asdict(settings):
            faults.append(f"/compile {path} changed another setting")
        if (reply.action, reply.topic, reply.argument) != (None, None, None):
            faults.append(f"/compile {path} asked for {reply.action!r}")
    for line, words in (("/compile fast", "unknown compile path 'fast'"), ("/compile", "missing compile path"),
                        ("/compile off static", "expected one compile path")):
        before = dataclasses.asdict(settings)
        reply = execute(line, settings)
        if reply.ok or words not in reply.message or "\n" in reply.message or \
                not reply.message.endswith("(usage: /compile off|static|graphs)"):
            faults.append(f"{line}: {reply.message!r}")
        if dataclasses.asdict(settings) != before:
            faults.append(f"{line} changed the settings")
    if "did you mean graphs?" not in execute("/compile graph", settings).message:
        faults.append("/compile graph: no hint")
    return faults


def test_compile_parses_each_path_and_refuses_in_one_line(monkeypatch):
    """Mutations: /compile asking for a reload, and a parser that writes the setting before it
    refuses the line, each fail the same check."""
    assert _compile_command_faults() == []
    command = COMMANDS["compile"]

    def reloads(words, settings=None):
        return dataclasses.replace(parse_compile(words, settings), action="reload")

    def writes_then_checks(words, settings=None):
        settings.compile = (words or ["off"])[0].lower()
        return parse_compile(words, settings)
    monkeypatch.setitem(COMMANDS, "compile", dataclasses.replace(command, parse=reloads))
    assert any("asked for 'reload'" in f for f in _compile_command_faults())
    monkeypatch.setitem(COMMANDS, "compile", dataclasses.replace(command, parse=writes_then_checks))
    assert any("changed the settings" in f for f in _compile_command_faults())


def test_the_flag_goes_through_the_same_parser():
    parser = argparse.ArgumentParser()
    add_flags(parser)
    settings = Settings()
    apply_flags(parser.parse_args(["--compile", "static"]), settings)
    assert settings.compile == "static"
    with pytest.raises(CommandError) as refused:
        apply_flags(parser.parse_args(["--compile", "cuda"]), Settings())
    assert str(refused.value).startswith("--compile: unknown compile path 'cuda'") and "\n" not in str(refused.value)
    assert COMMANDS["compile"].values == COMPILE_PATHS


def test_the_default_is_off_on_a_cpu_and_graphs_on_cuda():
    assert Settings().compile == "off"
    assert default_compile(torch.device("cpu")) == default_compile("cpu") == "off"
    assert default_compile("cuda:0") == "graphs"


def test_every_strategy_takes_the_setting():
    """Mutation (by hand): strategy_for leaving compile out of its common fields fails here."""
    for path in COMPILE_PATHS:
        settings = Settings(compile=path)
        assert {strategy_for(key, settings).compile for key in STRATEGIES} == {path}


# ---------------------------------------------------------------- runs on a tiny pair

@pytest.fixture(scope="module")
def runner():
    tokenizer = word_tokenizer()
    target = tiny_llama(0, vocab_size=len(tokenizer), logit_scale=8.0)
    drafter = tiny_llama(1, vocab_size=len(tokenizer), logit_scale=8.0)      # independent: rejections run
    pair = model_pair(target, drafter, tokenizer=tokenizer, end_tokens=[tokenizer.eos_token_id],
                      context_length=256)
    told: list[str] = []
    runner = Runner(pair, notify=told.append)
    runner.told = told
    return runner


def _run(runner, **fields):
    settings = Settings(**{"length": 12, "chat": False, "live": False, "drafter": True, **fields})
    prompt_run = runner.prepare(PROMPT, settings)
    return runner.run(prompt_run, settings)


def test_the_json_and_the_panels_say_which_path_each_strategy_ran(runner, monkeypatch, tmp_path):
    monkeypatch.setattr(static, "BACKEND", "eager")
    prompt_run = _run(runner, compile="static")
    entries = prompt_run.to_dict()["strategies"]
    assert list(entries) == ["speculative", "ngram", "target", "drafter"]
    for key, entry in entries.items():
        compiled = entry["compile"]
        assert (compiled["requested"], compiled["path"], compiled["reason"]) == ("static", "static", ""), key
    assert entries["speculative"]["compile"]["drafter_path"] == "static"
    assert entries["ngram"]["compile"]["drafter_path"] is None        # no drafter model ran
    assert entries["speculative"]["token_ids"] == entries["target"]["token_ids"]   # greedy: lossless
    run = prompt_run.runs[0]
    panel = render.make_console()
    with panel.capture() as captured:
        panel.print(render.strategy_panel(run, prompt_run.prompt_ids, runner.pair.tokenizer, debug=False,
                                          prompt_run=prompt_run))
        panel.print(stats_view(prompt_run))
    text = captured.get()
    assert "compile: static (drafter static)" in text and "compile path" in text
    path = tmp_path / "trace.json"                            # the saved trace keeps it, and reads it back
    write_trace(str(path), trace_document([prompt_record(prompt_run, runner.pair.tokenizer)], environment(runner.pair)))
    replayed = read_trace(str(path)).prompts[0]
    assert [r.result.compile for r in replayed.runs] == [r.result.compile for r in prompt_run.runs]
    off = _run(runner, compile="off").to_dict()["strategies"]
    assert {e["compile"]["path"] for e in off.values()} == {"off"}


@pytest.fixture(scope="module")
def self_runner():
    """A pair whose drafter is made from its target, as the default pair's is: a layer-skipping
    self-drafter (most of its drafts rejected), drafting on the target's cache."""
    from model_drafters.selfdraft import build_self_drafter, parse_self_draft

    tokenizer = word_tokenizer()
    target = tiny_llama(0, vocab_size=len(tokenizer), logit_scale=8.0)
    pair = model_pair(target, build_self_drafter(target, parse_self_draft("self:skip=1")), tokenizer=tokenizer,
                      end_tokens=[tokenizer.eos_token_id], context_length=256)
    return Runner(pair, notify=lambda line: None)


@pytest.mark.parametrize("path", ["static", "graphs"])
def test_a_self_drafter_runs_on_the_path_asked_and_its_panel_and_json_say_so(self_runner, monkeypatch, path):
    """``/compile static`` (or graphs), then a prompt: the speculative run's target takes the path, its
    self-drafter drafts on the target's static cache (eager: on graphs its record says why in one line),
    the panel and the JSON say so, and the tokens are target AR's."""
    monkeypatch.setattr(static, "BACKEND", "eager")
    settings = Settings(length=12, chat=False, live=False, ngram=False)
    assert execute(f"/compile {path}", settings).ok
    prompt_run = self_runner.run(self_runner.prepare(PROMPT, settings), settings)
    entries = prompt_run.to_dict()["strategies"]
    compiled = entries["speculative"]["compile"]
    assert (compiled["path"], compiled["reason"], compiled["drafter_path"]) == (path, "", "static"), compiled
    assert (compiled["drafter_reason"] == "") == (path == "static") and "\n" not in compiled["drafter_reason"]
    assert entries["speculative"]["token_ids"] == entries["target"]["token_ids"]
    assert entries["speculative"]["drafted"] > entries["speculative"]["accepted"]
    run = prompt_run.runs[0]
    panel = render.make_console()
    with panel.capture() as captured:
        panel.print(render.strategy_panel(run, prompt_run.prompt_ids, self_runner.pair.tokenizer, debug=False,
                                          prompt_run=prompt_run))
    assert f"compile: {path} (drafter static)" in captured.get()
    assert ("drafter: a self-drafter's forwards" in render.compile_text(run.result, detail=True)) == (path == "graphs")


def _graphs_run_faults(runner) -> list[str]:
    """What a graphs run reports wrongly (empty: nothing): with no capture kept, the first run
    captures its widths, outside its time, and /stats says so; the next run reuses them: no capture,
    and /stats says none."""
    faults = []
    for first in (True, False):
        target = _run(runner, compile="graphs", speculative=False, ngram=False, drafter=False).runs[0]
        compiled = target.result.compile
        line = render.compile_text(target.result, detail=True)
        if compiled["path"] != "graphs" or compiled["recompiles"] != 0 or not line.startswith("compile: graphs"):
            faults.append(f"not a graphs run: {line}")
        if first and not (compiled["captures"] >= 1 and compiled["widths"] and
                          f"{compiled['captures']} captures in" in line and "not in the run's time" in line):
            faults.append(f"the first run's captures are not reported: {compiled}, {line!r}")
        if not first and (compiled["captures"] != 0 or "captures in" in line):
            faults.append(f"the second run captured again: {compiled}")
    return faults


def test_graphs_runs_report_their_captures(runner, monkeypatch):
    """dynamo's cheap "eager" backend, and no capture kept from an earlier test: the first run must
    capture. Mutation: compile_report dropping the captures' count fails the same check."""
    monkeypatch.setattr(static, "BACKEND", "eager")
    fresh_captures(monkeypatch)
    assert _graphs_run_faults(runner) == []
    real = static.compile_report

    def uncounted(*args, **kwargs):
        return {**real(*args, **kwargs), "captures": 0}
    fresh_captures(monkeypatch)
    for module in (autoregressive, verify):
        monkeypatch.setattr(module, "compile_report", uncounted)
    assert any("captures are not reported" in f for f in _graphs_run_faults(runner))


def test_a_fallback_is_shown_on_the_panel_and_its_reason_told_once(runner):
    """With the cache off the static path cannot run: every panel says it fell back, the runner
    tells the reason once for the whole session. Mutation (by hand): tell_fallback without its
    memory tells it once per strategy and fails the count."""
    runner.told.clear()
    for _ in range(2):
        prompt_run = _run(runner, compile="static", cache=False)
    assert all(r.result.compile["path"] == "off" for r in prompt_run.runs)
    assert [m for m in runner.told if m.startswith("compile static fell back")] == \
        ["compile static fell back to off: the cache is off"]
    runs = {r.key: r for r in prompt_run.runs}
    assert render.compile_text(runs["target"].result) == "compile: off (asked static; fell back)"
    assert render.compile_text(runs["speculative"].result) == "compile: off (asked static; fell back; drafter off)"
    assert render.compile_text(StrategyRun("target").result or _result_without_compile()) is None


def _result_without_compile():
    from generation import GenerationResult

    return GenerationResult(tokens=[1], seconds=0.1)        # a served target, or a trace from before


# ---------------------------------------------------------------- bench.py

def test_bench_settings_carry_the_path_into_bench_json_and_the_header(capsys):
    from bench.cli import parse_settings, settings_dict
    from bench.meta import header_lines

    assert parse_settings([]).compile is None                 # resolved after loading: the device's
    settings = parse_settings(["--compile", "Static"])
    assert settings.compile == "static"
    recorded = settings_dict(settings, 3)
    assert recorded["compile"] == "static"
    env = {"date": "d", "device": "cpu", "cpu": "c", "torch_threads": 1, "torch": "t", "transformers": "x",
           "target": "t", "target_dtype": "float32", "drafter": "d", "drafter_dtype": "float32"}
    assert any(line.endswith("· compile static") for line in header_lines(env, {**recorded, "repeats": 1}))
    with pytest.raises(SystemExit):
        parse_settings(["--compile", "fast"])
    err = capsys.readouterr().err
    assert "unknown compile path 'fast'; choose off, static or graphs" in err


def test_bench_runs_ours_on_the_path_asked_and_pairs_the_static_peer(runner, tmp_path, monkeypatch):
    """bench.py --compile static: every run of ours took the static path (its record in bench.json's
    runs), the header says so, and target AR is compared with transformers' static generate.
    Mutation (by hand): the executor not passing RunSettings.compile to our_strategy fails here."""
    import json

    from bench.cli import main

    monkeypatch.setattr(static, "BACKEND", "eager")
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "chat", "turns": [PROMPT]}), encoding="utf-8")
    out = tmp_path / "out"
    code = main(["--prompts", str(prompts), "--no-chat", "--strategies", "target,speculative", "--gamma", "2",
                 "--policies", "none", "--peers", "--compile", "static", "--length", "8", "--repeats", "1",
                 "--warmup", "0", "--threads", "1", "--no-chart", "--out", str(out)], loader=lambda args: runner.pair)
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    assert data["settings"]["compile"] == "static"
    for run in data["runs"]:
        if run["family"] == "ours":
            assert (run["compile"]["requested"], run["compile"]["path"]) == ("static", "static"), run["variant"]
        else:
            assert run["compile"] is None
    target = next(r for r in data["summary"] if r["variant"] == "target" and r["category"] == "all")
    assert target["peer"] == "hf_generate+static"
    assert "compile static" in (out / "summary.md").read_text()


def test_whatif_machine_prices_each_run_on_the_path_it_ran(runner, monkeypatch):
    """``/compile graphs``, a prompt, then ``/whatif machine H100`` as a user types them: the runs took
    the captured path, so the card is priced with the captured path's launches ("H100 (captured)",
    9.4 µs a layer); the same prompt on ``off`` gets the eager profile (125 µs a layer). Mutation:
    a captured run priced with the eager launches gives the eager table (NASD's rows differ below)."""
    from repl.session import Session
    from tests.helpers.repl import console

    monkeypatch.setattr(static, "BACKEND", "eager")
    tables = {}
    for path in ("graphs", "off"):
        c, out = console()
        session = Session(runner, Settings(length=12, chat=False, live=False, drafter=True), c)
        for line in (f"/compile {path}", PROMPT, "/whatif machine H100"):
            session.handle(line)
        text = " ".join(out.getvalue().split())
        assert "Traceback" not in text and "/whatif failed" not in text
        tables[path] = session.last_run.whatifs["machine H100"]
        assert {r.result.compile["path"] for r in session.last_run.runs} == {path}
    captured, eager = tables["graphs"], tables["off"]
    assert "on H100 (captured)" in captured.title and "overhead 9 µs a layer" in captured.caption
    assert "on H100:" in eager.title and "overhead 125 µs a layer" in eager.caption
    rows = dict(captured.rows)
    assert rows and set(rows) == set(dict(eager.rows))
    # NASD's look-ups, timed here, are the same in both; next to the captured path's cheaper forwards
    # they are a larger share of a round, so its projection is lower at every batch size
    assert all(c < 0.8 * e for c, e in zip(rows["NASD"].speedups, dict(eager.rows)["NASD"].speedups))
