"""Trace files: writing, reading back, rejecting bad files, and --replay without torch."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from pathlib import Path

from repl.runs import StrategyRun
from repl.trace import (
    FORMAT,
    OLD_ACCEPTANCE_NAMES,
    TraceError,
    check_writable,
    prompt_record,
    read_trace,
    trace_document,
    write_trace,
)
from tests.helpers.repl import (ENV, PYTHON, REPO, WordTokenizer, build_pair, child_env, infer, match_prompt_run,
                                why_prompt_run)

def saved(tmp_path, prompt_runs=None) -> str:
    path = tmp_path / "trace.json"
    runs = prompt_runs or [why_prompt_run()]
    write_trace(str(path), trace_document([prompt_record(pr, WordTokenizer()) for pr in runs], ENV))
    return str(path)


# ------------------------------------------------------------------ round trip

def test_a_trace_reads_back_to_the_same_numbers(tmp_path):
    original = why_prompt_run()
    original.target_dtype = "bfloat16"             # a replay explains a half-precision target's partings
    trace = read_trace(saved(tmp_path, [original]))
    assert trace.environment == ENV and trace.created
    back = trace.prompts[0]
    assert back.to_dict() == original.to_dict() and back.target_dtype == "bfloat16"
    assert back.settings == original.settings and back.prompt_ids == original.prompt_ids
    spec = back.runs[0]
    assert spec.result.trace == original.runs[0].result.trace
    assert spec.result.phases == original.runs[0].result.phases
    assert spec.pieces == [{"drafted": [" w5", " w6"], "token": " w7"},
                           {"drafted": [" w8", " w9"], "token": " w10"},
                           {"drafted": [" w11", " w12"], "token": " w13"}]


def test_a_match_drafters_sources_and_measured_lengths_read_back(tmp_path):
    original = match_prompt_run()
    back = read_trace(saved(tmp_path, [original])).prompts[0]
    assert back.runs[0].result.trace == original.runs[0].result.trace          # the notes travel
    entry = back.to_dict()["strategies"]["ngram"]
    assert entry == original.to_dict()["strategies"]["ngram"]
    assert entry["prediction_draft_lengths"] == "measured" and entry["draft_sources"]["prompt"]["rounds"] == 2


def test_the_file_holds_everything_a_bug_report_needs(tmp_path):
    data = json.loads(open(saved(tmp_path)).read())
    assert data["format"] == FORMAT and data["environment"]["versions"]["torch"] == "2.x"
    record = data["prompts"][0]
    assert record["settings"]["gamma"] == 2 and record["prompt_ids"] == [2, 3]
    spec = record["strategies"]["speculative"]
    assert spec["token_ids"] == [5, 6, 7, 8, 9, 10, 13] and spec["text"] == "x"
    assert spec["predicted_speedup"] == pytest.approx(0.9692307)
    assert spec["predicted_speedup_steady"] == pytest.approx(0.14 / 0.13)
    first = spec["result"]["trace"][0]
    assert (first["gamma"], first["drafted"], first["accepted"], first["token"], first["bonus"]) == \
        (2, [5, 6], 2, 7, True)
    assert (first["draft_s"], first["verify_s"]) == (0.02, 0.5)
    assert first["pieces"] == {"drafted": [" w5", " w6"], "token": " w7"}


def test_failed_strategies_survive_the_round_trip(tmp_path):
    pr = why_prompt_run()
    pr.runs.append(StrategyRun("drafter", error="failed: boom"))
    back = read_trace(saved(tmp_path, [pr])).prompts[0]
    assert back.runs[-1].error == "failed: boom" and back.runs[-1].result is None


# ------------------------------------------------------------------ bad files

@pytest.mark.parametrize("content, message", [
    ("{not json", "not a trace file (not valid JSON"),
    ("[1, 2]", 'not a trace file (no "kind"'),
    ('{"kind": "something else", "format": 1}', 'not a trace file (no "kind"'),
    ('{"kind": "specdec-trace", "format": 99, "prompts": []}', "trace format 99 is not one this version reads"),
    ('{"kind": "specdec-trace", "prompts": []}', "trace format None is not one"),
    ('{"kind": "specdec-trace", "format": 2}', "a damaged trace file (missing 'prompts')"),
    ('{"kind": "specdec-trace", "format": 2, "prompts": []}', "the trace holds no prompts"),
    ('{"kind": "specdec-trace", "format": 2, "prompts": [{"prompt": "p"}]}', "missing 'strategies'"),
    ('{"kind": "specdec-trace", "format": 2, "prompts": [{"prompt": "p", "strategies": {"nope": {}}}]}',
     "unknown strategy 'nope'"),
    ('{"kind": "specdec-trace", "format": 2, "prompts": [{"prompt": "p", "strategies": '
     '{"target": {"result": {"trace": [{"drafted": [1], "colour": 3}]}}}}]}', "a damaged trace file"),
    ('{"kind": "specdec-trace", "format": 2, "prompts": [{"prompt": "p", "settings": {"processor": '
     '{"name": "magic"}}, "strategies": {}}]}', "unknown processor"),
    ('{"kind": "specdec-trace", "format": 1, "prompts": []}',
     "trace format 1 is no longer read: the trace was written by an older version"),
])
def test_bad_trace_files_are_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        read_trace(str(path))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_trace_with_the_old_acceptance_names_replays_with_one_line_naming_them(tmp_path):
    path = saved(tmp_path)
    data = json.loads(open(path).read())
    entry = data["prompts"][0]["strategies"]["speculative"]
    for new in ("mean_acceptance_length", "conditional_acceptance_per_position", "acceptance_histogram",
                "acceptance_rate_per_position", "acceptance_histogram_by_draft_length", "drafting_rounds"):
        entry.pop(new)
    entry.update(acceptance_by_position=[2 / 3, 1.0], accepted_length_histogram=[1, 0, 2], mean_accepted_length=4 / 3)
    old = tmp_path / "old_names.json"
    old.write_text(json.dumps(data))
    assert read_trace(path).notes == []
    trace = read_trace(str(old))
    assert len(trace.notes) == 1 and all(name in trace.notes[0] for name in OLD_ACCEPTANCE_NAMES)
    # the numbers come from the rounds either way
    assert trace.prompts[0].to_dict() == read_trace(path).prompts[0].to_dict()
    done = infer(["--replay", str(old)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if "old acceptance names" in line] == [trace.notes[0]]
    assert "mean acceptance length 2.33" in done.stdout


def test_unreadable_paths(tmp_path):
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(str(tmp_path / "missing.json"))
    with pytest.raises(TraceError, match="cannot read trace"):
        read_trace(str(tmp_path))
    with pytest.raises(TraceError, match="cannot write trace to .*: it is a directory"):
        write_trace(str(tmp_path), {})
    with pytest.raises(TraceError, match="cannot write trace to"):
        write_trace(str(tmp_path / "no" / "dir" / "t.json"), {})
    with pytest.raises(TraceError, match="no directory"):
        check_writable(str(tmp_path / "no" / "t.json"))
    check_writable(str(tmp_path / "fine.json"))
    assert not (tmp_path / "fine.json").exists()
    # where the permissions let even root through but nothing can be created (a pseudo file system)
    if Path("/proc/self").is_dir():
        with pytest.raises(TraceError, match="cannot write report to '/proc/x.html'"):
            check_writable("/proc/x.html", "report")
    # names the system cannot take: a NUL byte (a scripted session can type one), one past NAME_MAX
    for name, says in (("a\x00b.json", "embedded null byte"), ("a" * 300 + ".json", "File name too long")):
        for write in (lambda p: write_trace(p, {}), check_writable):
            with pytest.raises(TraceError, match=f"cannot write trace to .*: {says}"):
                write(str(tmp_path / name))
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind


# ------------------------------------------------------------------ --replay

def test_replay_renders_without_torch_and_fast(tmp_path):
    path = saved(tmp_path)
    code = ("import sys, runpy; sys.argv = ['infer.py', '--replay', sys.argv[1]]\n"
            "try:\n    runpy.run_path('infer.py', run_name='__main__')\nexcept SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'heavy import'\n")
    start = time.monotonic()
    done = subprocess.run([PYTHON, "-c", code, path], cwd=REPO, env=child_env(tmp_path),
                          capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - start
    assert done.returncode == 0, done.stderr
    assert elapsed < 3.0, f"--replay took {elapsed:.2f} s"
    out = done.stdout
    for part in ("target:  t-model (float32)", "torch 2.x", "Speculative", "Target AR", "Comparison",
                 "Why (last prompt)", "predicted 0.97x vs measured 0.90x", "² w5 w6 w7",
                 "acceptance at position", "gamma 2 constant"):
        assert part in out, part


@pytest.mark.parametrize("content, message", [
    ("{}", 'not a trace file (no "kind"'),
    ('{"kind": "specdec-trace", "format": 7}', "trace format 7"),
])
def test_replay_of_a_bad_file_is_one_line(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    done = infer(["--replay", str(path)], tmp_path)
    assert done.returncode == 2 and message in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_trace_out_to_a_bad_path_exits_before_loading(tmp_path):
    done = infer(["--trace-out", str(tmp_path / "no" / "t.json"), "--prompt", "x"], tmp_path, timeout=30)
    assert done.returncode == 2 and "cannot write trace to" in done.stderr and "no directory" in done.stderr
    assert "Traceback" not in done.stderr
    done = infer(["--trace-out", str(tmp_path / ("t" * 300)), "--prompt", "x"], tmp_path, timeout=30)
    assert done.returncode == 2 and "File name too long" in done.stderr and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("infer.py: error: cannot write trace to")


# ------------------------------------------------------------------ end to end on a tiny pair

@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("tiny_pair_trace"))


def test_save_then_replay_on_a_tiny_pair(pair, tmp_path):
    target, drafter = pair
    saved_path, all_path = tmp_path / "last.json", tmp_path / "all.json"
    script = f"/gamma 3\nthe water is hot and the water is\n/save {saved_path}\n/stats\na new line\n"
    done = infer(["--target", str(target), "--drafter", str(drafter), "--length", "12", "--json",
                   "--trace-out", str(all_path)], tmp_path, stdin=script, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "trace saved to" in done.stderr and "Why (last prompt)" in done.stderr
    printed = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert len(printed) == 2

    last = read_trace(str(saved_path))
    everything = read_trace(str(all_path))
    assert len(last.prompts) == 1 and len(everything.prompts) == 2
    env = last.environment
    assert env["target"].startswith(str(target)) and env["device"] == "cpu"
    assert env["target_dtype"] == "float32" and set(env["versions"]) >= {"python", "torch", "transformers"}
    for trace_run, json_obj in zip(everything.prompts, printed):
        assert trace_run.to_dict()["strategies"] == json_obj["strategies"]  # same numbers both ways
    assert last.prompts[0].to_dict() == everything.prompts[0].to_dict()

    spec = last.prompts[0].runs[0]
    assert spec.key == "speculative" and spec.result.trace and spec.pieces
    assert all(r.gamma <= 3 for r in spec.result.trace)
    assert len(spec.pieces) == len(spec.result.trace)
    entry = printed[0]["strategies"]["speculative"]
    for field in ("phases", "mean_acceptance_length", "acceptance_rate_per_position",
                  "conditional_acceptance_per_position", "acceptance_histogram",
                  "acceptance_histogram_by_draft_length", "predicted_speedup", "best_gamma", "rollback",
                  "gamma_policy"):
        assert field in entry, field
    for old in OLD_ACCEPTANCE_NAMES:
        assert old not in entry, old
    drafting = sum(1 for r in spec.result.trace if r.drafted)
    assert sum(entry["acceptance_histogram"]) == entry["drafting_rounds"] == drafting
    assert entry["verify_rule"] == printed[0]["settings"]["verify"] == "block"  # the REPL's default rule
    assert entry["mean_acceptance_length"] == pytest.approx(1 + spec.result.accepted / drafting)

    replay = infer(["--replay", str(all_path)], tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert "prompt 2 of 2" in replay.stdout and "Comparison" in replay.stdout
    assert spec.text.split()[0] in replay.stdout
    assert "Traceback" not in replay.stderr


# ------------------------------------------------------------------ file modes

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_traces_and_reports_get_the_users_umask_not_0600(tmp_path, umask, mode):
    """A colleague must be able to read an attached trace: the file gets 0666 less the umask (as a
    plain open gives), not the temporary file's 0600; a file written over keeps its mode.
    Mutation: without the chmod both files are 0600 under umask 022."""
    import os
    import stat

    from repl.report import write_report

    old = os.umask(umask)
    try:
        trace, report = tmp_path / "t.json", tmp_path / "r.html"
        write_trace(str(trace), trace_document([prompt_record(why_prompt_run(), WordTokenizer())], ENV))
        write_report(str(report), [why_prompt_run()], ENV)
        assert stat.S_IMODE(trace.stat().st_mode) == mode
        assert stat.S_IMODE(report.stat().st_mode) == mode
        trace.chmod(0o640)
        write_trace(str(trace), trace_document([prompt_record(why_prompt_run(), WordTokenizer())], ENV))
        assert stat.S_IMODE(trace.stat().st_mode) == 0o640
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "t.json"]   # no temporary file left
