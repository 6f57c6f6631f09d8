"""/inspect: its arguments, what it shows, and the inspector in --replay (and a format-1 trace refused)."""

from __future__ import annotations

import json

import pytest

from repl.commands import execute
from repl.inspect_view import NO_NUMBERS, default_round, round_view
from repl.runner import Runner
from repl.session import Session
from repl.settings import Settings
from repl.trace import TraceError, prompt_record, read_trace, trace_document, write_trace
from sampling import GreedyProcessor
from tests.helpers.repl import ENV, console, fake_pair, infer, why_prompt_run
from tests.helpers.report import HtmlTokenizer, inspected_prompt_run


@pytest.fixture(scope="module")
def prompt_run():
    return inspected_prompt_run()


def session_with(prompt_run, monkeypatch) -> tuple:
    c, out = console()
    pair = fake_pair()
    pair.tokenizer = HtmlTokenizer()
    session = Session(Runner(pair), Settings(chat=False), c)
    monkeypatch.setattr(session.runner, "prepare", lambda text, settings: prompt_run)
    monkeypatch.setattr(session.runner, "run", lambda pr, settings, on_run, watch=None: pr)
    return session, out


# ------------------------------------------------------------------ arguments

@pytest.mark.parametrize("line", ["/inspect", "/inspect ngram", "/inspect NASD 2", "/inspect 3 speculative",
                                  "/inspect 1"])
def test_good_arguments_parse(line):
    assert execute(line, Settings()).ok


@pytest.mark.parametrize("line, message", [
    ("/inspect foo", "unknown strategy 'foo'"),
    ("/inspect specualtive", "did you mean speculative"),
    ("/inspect 0", "ROUND must be between 1"),
    ("/inspect -2", "ROUND must be between 1"),
    ("/inspect 1 2", "expected one round number"),
    ("/inspect ngram 1 2", "at most a strategy and a round"),
])
def test_bad_arguments_are_one_line(line, message):
    reply = execute(line, Settings())
    assert not reply.ok and message in reply.message and "\n" not in reply.message
    assert "usage: /inspect [STRATEGY] [ROUND]" in reply.message


def test_inspect_before_and_against_the_last_prompt(prompt_run, monkeypatch):
    session, out = session_with(prompt_run, monkeypatch)
    assert session.handle("/inspect")
    assert "no prompt has run yet: /inspect" in out.getvalue()
    session.handle("w3")
    rounds = len(prompt_run.runs[0].result.trace)
    for line, message in [
        (f"/inspect speculative {rounds + 1}", f"Speculative has {rounds} rounds: ROUND must be between 1 and {rounds}"),
        ("/inspect target", "Target AR drafts nothing"),
        ("/inspect drafter", "drafter did not run on the last prompt"),
    ]:
        before, failures = out.getvalue(), session.failures
        assert session.handle(line)
        added = out.getvalue()[len(before):]
        assert message in added and len(added.strip().splitlines()) == 1 and session.failures == failures + 1


def test_inspect_shows_each_drafted_position(prompt_run, monkeypatch):
    session, out = session_with(prompt_run, monkeypatch)
    session.handle("w3")
    run = prompt_run.runs[0]
    index = default_round(run.result.trace)
    rnd = run.result.trace[index]
    assert rnd.rejected                                   # the default is the first round with a rejection
    start = len(out.getvalue())
    assert session.handle("/inspect") and session.failures == 0
    shown = out.getvalue()[start:]
    assert f"Speculative · round {index + 1} of {len(run.result.trace)}" in shown
    tok = HtmlTokenizer()
    for i, (x, pos) in enumerate(zip(rnd.drafted, rnd.inspection.positions)):
        line = next(l for l in shown.splitlines() if l.startswith(f"{i:>2} {tok.decode([x])!r}"))
        assert f"q(x) {pos.q:.3f} · p(x) {pos.p:.3f} · min(1, p/q) {pos.accept:.3f}" in line
        assert f"H(p) {pos.entropy_p:.2f} · H(q) {pos.entropy_q:.2f}" in line
    top = rnd.inspection.positions[0].p_top
    assert f"p top: {tok.decode([top[0][0]])!r} {top[0][1]:.3f}" in shown
    residual = rnd.inspection.residual
    assert f"residual norm(max(0, p - q)) top: {tok.decode([residual[0][0]])!r}" in shown
    assert f"drawn: {tok.decode([rnd.token])!r}" in shown
    nasd = next(i for i, r in enumerate(prompt_run.runs[1].result.trace) if r.drafted) + 1
    start = len(out.getvalue())
    assert session.handle(f"/inspect nasd {nasd}")
    assert f"NASD · round {nasd}" in out.getvalue()[start:] and "q is one-hot" in out.getvalue()[start:]


def test_greedy_view_says_what_it_shows():
    pr = inspected_prompt_run(GreedyProcessor(), greedy=True)
    run = pr.runs[0]
    index = default_round(run.result.trace)
    rnd = run.result.trace[index]
    assert rnd.inspection.token_top[0][0] == rnd.token    # the target's top-1 is what it emitted
    c, out = console()
    c.print(round_view(run, index, lambda i: pr.token_text[i]))
    assert "greedy: p and q shown are the models' softmax at temperature 1" in out.getvalue()
    pos = rnd.inspection.positions[rnd.accepted]
    assert f"accept (greedy rule) {pos.accept:.3f}" in out.getvalue() and pos.accept == 0.0


# ------------------------------------------------------------------ replay

def test_replay_shows_the_inspector_for_a_new_trace(prompt_run, tmp_path):
    path = tmp_path / "t.json"
    write_trace(str(path), trace_document([prompt_record(prompt_run, HtmlTokenizer())], ENV))
    back = read_trace(str(path))
    assert back.format == 2
    for old, new in zip(prompt_run.runs, back.prompts[0].runs):
        assert new.result.trace == old.result.trace       # inspections included, exactly
    done = infer(["--replay", str(path)], tmp_path)
    assert done.returncode == 0, done.stderr
    index = default_round(prompt_run.runs[0].result.trace)
    assert f"inspector (in a session: /inspect speculative {index + 1})" in done.stdout
    assert "residual norm(max(0, p - q)) top:" in done.stdout and "q is one-hot" in done.stdout


def test_replay_of_a_trace_without_numbers_says_so(tmp_path):
    path = tmp_path / "plain.json"
    document = trace_document([prompt_record(why_prompt_run(), HtmlTokenizer())], ENV)  # rounds without inspection
    path.write_text(json.dumps(document))
    assert read_trace(str(path)).format == 2
    done = infer(["--replay", str(path)], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [l for l in done.stdout.splitlines() if "per-token numbers" in l]
    assert lines == [NO_NUMBERS.format(label="Speculative")]


def test_a_format_1_trace_is_no_longer_read(tmp_path):
    path = tmp_path / "old.json"
    document = trace_document([prompt_record(why_prompt_run(), HtmlTokenizer())], ENV)
    document["format"] = 1
    for record in document["prompts"]:
        record.pop("token_text", None)
    path.write_text(json.dumps(document))
    with pytest.raises(TraceError, match="trace format 1 is no longer read: the trace was written by an older"):
        read_trace(str(path))
    done = infer(["--replay", str(path)], tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "no longer read" in done.stderr


def test_save_html_in_a_session(prompt_run, tmp_path, monkeypatch):
    from tests.helpers.report import parse

    session, out = session_with(prompt_run, monkeypatch)
    monkeypatch.setattr(session, "environment", lambda: ENV)
    path = tmp_path / "r.html"
    assert session.handle(f"/save {path}") and "no prompt has run yet: /save" in out.getvalue()
    session.handle("w3")
    assert session.handle(f"/save {tmp_path / 'no' / 'r.html'}") and "cannot write report to" in out.getvalue()
    assert session.failures == 2
    assert session.handle(f"/save {path}") and "report saved to" in out.getvalue() and session.failures == 2
    page = parse(path.read_text())
    assert len([t for t in page.tokens if "rej" not in t["class"]]) == sum(len(r.result.tokens)
                                                                           for r in prompt_run.runs)
