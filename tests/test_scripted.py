"""Scripted mode: prompt sources, JSON output on a tiny pair, and the fast paths
(--help, bad flags, bad prompt files) that must not load a model."""

from __future__ import annotations

import io
import json
import subprocess
import time

import pytest

from repl.scripted import ScriptError, collect, parse_lines, read_file
from tests.helpers.repl import INFER, PYTHON, REPO, build_pair, child_env


# ----------------------------------------------------------------- sources

def test_plain_lines_commands_and_escapes():
    entries = parse_lines("hello there\n\n/gamma 2\n  a\\nb\\tc\n", "f")
    assert [(e.kind, e.text, e.where) for e in entries] == [
        ("prompt", "hello there", "f:1"), ("command", "/gamma 2", "f:3"), ("prompt", "  a\nb\tc", "f:4"),
    ]


def test_json_lines_prompt_and_spec_bench_turns():
    text = '{"prompt": "one\\ntwo"}\n{"question_id": 81, "category": "writing", "turns": ["first", "second"]}\n'
    entries = parse_lines(text, "q.jsonl")
    assert [(e.kind, e.text) for e in entries] == [("prompt", "one\ntwo"), ("prompt", "first")]


@pytest.mark.parametrize("line, message", [
    ('{"prompt": ', "q.jsonl:1: not valid JSON"),
    ('{"text": "x"}', 'q.jsonl:1: a JSON line needs a "prompt" string or a "turns" list'),
    ('{"turns": []}', "needs a"),
    ('{"prompt": 5}', "needs a"),
])
def test_bad_json_lines_name_the_line(line, message):
    with pytest.raises(ScriptError, match=message.replace("(", r"\(")):
        parse_lines(line, "q.jsonl")


def test_prompt_flags_come_first_then_the_file(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("from file\n")
    entries = collect(["a\\nb", "c"], str(path), io.StringIO("ignored"))
    assert [e.text for e in entries] == ["a\nb", "c", "from file"]


def test_stdin_is_read_only_without_flags():
    assert [e.text for e in collect(None, None, io.StringIO("x\n/seed 3\n"))] == ["x", "/seed 3"]


def test_missing_or_empty_file(tmp_path):
    with pytest.raises(ScriptError, match="cannot read prompts file"):
        read_file(str(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ScriptError, match="holds no prompts"):
        read_file(str(tmp_path / "empty.txt"))


# ------------------------------------------------------ fast command lines

def _run(args, tmp_path, stdin="", timeout=240):
    return subprocess.run([PYTHON, str(INFER), *args], cwd=REPO, env=child_env(tmp_path), input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def test_help_is_fast_and_loads_no_model(tmp_path):
    start = time.monotonic()
    done = _run(["--help"], tmp_path, timeout=30)
    elapsed = time.monotonic() - start
    assert done.returncode == 0
    assert elapsed < 2.0, f"--help took {elapsed:.2f} s"
    for flag in ("--gamma", "--processor", "--no-speculative", "--target-ar", "--ngram-storage",
                 "--prompt", "--prompts-file", "--json", "--target", "--offline", "--cache-dir"):
        assert flag in done.stdout


def test_help_does_not_import_torch(tmp_path):
    code = ("import sys, runpy; sys.argv = ['infer.py', '--help']\n"
            "try:\n    runpy.run_path('infer.py', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'")
    done = subprocess.run([PYTHON, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("args, message", [
    (["--gamma", "0"], "--gamma: N must be between 1 and 128, got 0 (usage: --gamma N)"),
    (["--processor", "foo"], "--processor: unknown processor 'foo'"),
    (["--length", "-5"], "--length: N must be between 1 and 1000000, got -5"),
])
def test_bad_flags_exit_2_before_loading(args, message, tmp_path):
    done = _run(args, tmp_path, timeout=30)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_bad_prompts_file_exits_2_before_loading(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    done = _run(["--prompts-file", str(path)], tmp_path, timeout=30)
    assert done.returncode == 2
    assert "bad.jsonl:2" in done.stderr


# ------------------------------------------------------ on a tiny pair

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("tiny_pair_scripted"))


FIELDS = ("text", "tokens", "seconds", "tokens_per_s", "acceptance_rate", "tokens_per_target_call",
          "target_calls", "speedup")


def test_json_mode_prints_one_object_per_prompt(pair, tmp_path):
    target, drafter = pair
    done = _run(["--target", str(target), "--drafter", str(drafter), "--length", "10", "--drafter-ar",
                 "--json", "--prompt", "the water is hot", "--prompt", "a new line"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2  # nothing but JSON on stdout
    for index, line in enumerate(lines):
        obj = json.loads(line)
        assert obj["index"] == index and obj["settings"]["length"] == 10
        strategies = obj["strategies"]
        assert list(strategies) == ["speculative", "ngram", "target", "drafter"]
        for key, entry in strategies.items():
            for field in FIELDS:
                assert field in entry, (key, field)
            assert entry["tokens"] == len(entry["token_ids"]) == 10
            assert entry["tokens_per_s"] == pytest.approx(entry["tokens"] / entry["seconds"])
        target_entry = strategies["target"]
        assert target_entry["speedup"] == pytest.approx(1.0)
        assert target_entry["acceptance_rate"] is None
        for key in ("speculative", "ngram"):  # greedy: same tokens as target AR
            entry = strategies[key]
            assert entry["token_ids"] == target_entry["token_ids"]
            assert entry["identical_to_target"] is True and entry["first_divergence"] is None
            assert entry["speedup"] == pytest.approx(entry["tokens_per_s"] / target_entry["tokens_per_s"])
            assert 0.0 <= entry["acceptance_rate"] <= 1.0
            assert entry["tokens_per_target_call"] == pytest.approx(10 / entry["target_calls"])
        drafter_entry = strategies["drafter"]        # another model's output: not held to target AR's
        assert drafter_entry["identical_to_target"] is None and drafter_entry["divergence"] is None


def test_the_confidence_policy_stops_drafting_under_greedy(pair, tmp_path):
    """``--gamma-policy confidence T`` under greedy (the default): a drafter as unsure as the tiny one
    stops after one draft a round at T = 0.99 where the constant policy drafts γ; the tokens stay
    target AR's. (The stop read greedy's one-hot rows, whose top is always 1, and never stopped.)"""
    target, drafter = pair
    runs = {}
    for policy in ("constant", "confidence 0.99"):
        done = _run(["--target", str(target), "--drafter", str(drafter), "--length", "12", "--gamma", "6",
                     "--gamma-policy", *policy.split(), "--no-ngram", "--json", "--prompt", "the water is hot"],
                    tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[policy] = json.loads(done.stdout)["strategies"]
    constant, confident = runs["constant"]["speculative"], runs["confidence 0.99"]["speculative"]
    assert confident["gamma_policy"] == "confidence 0.99"
    assert confident["drafted"] <= confident["target_calls"] < constant["drafted"]     # at most one a round
    assert confident["token_ids"] == runs["confidence 0.99"]["target"]["token_ids"]


def test_stdin_script_with_commands_and_a_bad_line(pair, tmp_path):
    target, drafter = pair
    script = "/gamma 2\n/no_such_command\n/ngram off\nthe water is hot\n/length 70000\nthe water\n"
    done = _run(["--target", str(target), "--drafter", str(drafter), "--length", "6", "--json"],
                tmp_path, stdin=script)
    assert done.returncode == 1  # a bad command and a refused prompt
    assert "unknown command /no_such_command" in done.stderr
    assert "prompt refused" in done.stderr
    first, second = (json.loads(line) for line in done.stdout.strip().splitlines())
    assert first["settings"]["gamma"] == 2
    assert list(first["strategies"]) == ["speculative", "target"]
    assert second["prompt"] == "the water"
    assert second["error"].startswith("prompt refused: 4 prompt tokens + 70000 new tokens")
    assert "Traceback" not in done.stderr


# ------------------------------------------------------ a piped stdout

def _with_terminal_stdin(args, tmp_path, columns: str | None = None):
    """infer.py with a terminal (a pty) on stdin and a pipe on stdout, COLUMNS set to ``columns``
    (None: unset); the target cannot load, so it stops right after its start-up lines."""
    import os
    import pty

    env = {k: v for k, v in child_env(tmp_path).items() if k != "COLUMNS"}
    if columns is not None:
        env["COLUMNS"] = columns
    controller, terminal = pty.openpty()
    try:
        return subprocess.run([PYTHON, str(INFER), "--target", str(tmp_path / "missing"), *args], cwd=REPO,
                              env=env, stdin=terminal, capture_output=True, text=True, timeout=120)
    finally:
        os.close(controller)
        os.close(terminal)


def test_a_piped_stdout_says_once_why_it_has_80_columns_and_no_colours(tmp_path):
    """Mutation: without the notice stderr has no such line."""
    done = _with_terminal_stdin([], tmp_path)
    assert done.returncode == 1 and "could not load the models" in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.startswith("stdout is not a terminal")]
    assert lines == ["stdout is not a terminal: 80 columns, no colours; set COLUMNS for another width, or use --json"]
    assert "stdout is not a terminal" not in done.stdout
    done = _with_terminal_stdin([], tmp_path, columns="132")                 # the width it will use
    assert "stdout is not a terminal: 132 columns, no colours" in done.stderr
    done = _with_terminal_stdin(["--json", "--prompt", "x"], tmp_path)       # the pipe is what --json wants
    assert done.returncode == 1 and "stdout is not a terminal" not in done.stderr
    done = _run(["--target", str(tmp_path / "missing")], tmp_path)           # no terminal at all: a script
    assert done.returncode == 1 and "stdout is not a terminal" not in done.stderr
