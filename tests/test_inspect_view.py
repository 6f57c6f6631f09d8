"""/inspect: its arguments, what it shows, and the inspector in --replay (and a format-1 trace refused)."""

from __future__ import annotations

import json

import pytest

import torch

from repl.commands import execute
from repl.inspect_view import BLOCK_LEGEND, NO_NUMBERS, STRICT_NOTE, default_round, round_view
from repl.runner import Runner
from repl.runs import PromptRun, StrategyRun
from repl.session import Session
from repl.settings import Settings
from repl.trace import TraceError, prompt_record, read_trace, trace_document, write_trace
from sampling import GreedyProcessor, MultinomialProcessor
from tests.helpers.decode import speculative
from tests.helpers.models import tiny_llama
from tests.helpers.repl import ENV, console, fake_pair, infer, why_prompt_run
from tests.helpers.report import NASTY, PROMPT, V, HtmlTokenizer, inspected_prompt_run


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


# ------------------------------------------------------------------ the chain verify rules

def rule_prompt_run(rule: str) -> PromptRun:
    """A sampled speculative run under ``rule`` on the tiny pair, its pieces and token text filled."""
    target = tiny_llama(1, vocab_size=V, logit_scale=6.0)
    drafter = tiny_llama(2, vocab_size=V, logit_scale=6.0)
    result = speculative(PROMPT, drafter, target, processor=MultinomialProcessor(1.0), gamma=4, max_gen_len=20,
                         generator=torch.Generator().manual_seed(3), verify=rule)
    pr = PromptRun(NASTY, PROMPT, greedy=False, settings=Settings(gamma=4, chat=False, verify=rule).to_dict())
    tokenizer = HtmlTokenizer()
    pr.runs = [StrategyRun("speculative", result, text=tokenizer.decode(result.tokens))]
    prompt_record(pr, tokenizer)
    return pr


def shown_round(pr: PromptRun, index: int | None = None) -> tuple[str, object, int]:
    """/inspect's view of a round of the prompt's run (default: the round /inspect picks)."""
    run = pr.runs[0]
    index = default_round(run.result.trace) if index is None else index
    c, out = console()
    c.print(round_view(run, index, lambda i: pr.token_text[i]))
    return out.getvalue(), run.result.trace[index], index


def _block_round(pr: PromptRun) -> int:
    """A round where block kept a draft and then stopped before the last (its residual is scaled)."""
    return next(i for i, r in enumerate(pr.runs[0].result.trace)
                if r.token is not None and 0 < r.accepted < len(r.drafted) - 1)


def test_block_view_shows_ratio_threshold_and_the_scaled_residual():
    pr = rule_prompt_run("block")
    shown, rnd, _ = shown_round(pr, _block_round(pr))
    assert BLOCK_LEGEND in shown
    tok = HtmlTokenizer()
    for i, (x, pos) in enumerate(zip(rnd.drafted, rnd.inspection.positions)):
        line = next(l for l in shown.splitlines() if l.startswith(f"{i:>2} {tok.decode([x])!r}"))
        assert f"min(1, p/q) {pos.accept:.3f} · b {pos.ratio:.3f} · h {pos.threshold:.3f} · H(p)" in line
        # block tests every position: each draft after what it kept failed its test
        assert ("accepted" if i < rnd.accepted else "rejected") in line and "not judged" not in line
    residual = rnd.inspection.residual
    assert f"scaled residual norm(max(0, b·p - q)) top: {tok.decode([residual[0][0]])!r}" in shown
    assert shown.count("residual norm") == 1 and "after the last draft whose test passed" in shown


@pytest.mark.parametrize("rule", ["residual", "strict"])
def test_the_block_columns_show_only_under_block(prompt_run, rule):
    pr = prompt_run if rule == "residual" else rule_prompt_run("strict")
    shown, rnd, _ = shown_round(pr)
    assert rnd.rejected and BLOCK_LEGEND not in shown and " · b " not in shown and " · h " not in shown
    assert all(pos.ratio is None and pos.threshold is None for pos in rnd.inspection.positions)


def test_strict_view_shows_p_as_the_keep_probability_and_no_residual():
    pr = rule_prompt_run("strict")
    shown, rnd, _ = shown_round(pr)
    assert rnd.rejected and rnd.inspection.residual is None
    assert STRICT_NOTE in shown and "residual norm" not in shown and "min(1, p/q)" not in shown
    for pos in rnd.inspection.positions:
        assert f"P(keep) = p(x) {pos.accept:.3f}" in shown and pos.accept == pos.p
    assert "target's draw" in shown


def test_the_report_carries_block_numbers_only_under_block(prompt_run):
    from repl.report import report_html
    from tests.helpers.report import parse

    block = rule_prompt_run("block")
    page = parse(report_html([block], ENV))
    drafts = [t for t in page.tokens if "data-accept" in t]
    positions = [p for r in block.runs[0].result.trace for p in r.inspection.positions]
    assert [float(t["data-ratio"]) for t in drafts] == [p.ratio for p in positions]
    assert [float(t["data-threshold"]) for t in drafts] == [p.threshold for p in positions]
    assert all(f"ratio {float(t['data-ratio']):.3f}" in t["title"] for t in drafts)
    assert BLOCK_LEGEND in "".join(page.text)
    plain = parse(report_html([prompt_run], ENV))
    assert not any("data-ratio" in t or "data-threshold" in t for t in plain.tokens)
    assert BLOCK_LEGEND not in "".join(plain.text)


def test_a_trace_from_before_the_rules_still_replays(prompt_run, tmp_path):
    """A trace written before ``rule``, ``ratio`` and ``threshold`` existed reads back as it was."""
    document = trace_document([prompt_record(prompt_run, HtmlTokenizer())], ENV)
    for strategy in document["prompts"][0]["strategies"].values():
        for rnd in strategy["result"]["trace"]:
            ins = rnd.get("inspection")
            if ins is not None:
                assert ins.pop("rule") == "residual"
                for pos in ins["positions"]:
                    assert pos.pop("ratio") is None and pos.pop("threshold") is None
    path = tmp_path / "old.json"
    path.write_text(json.dumps(document))
    back = read_trace(str(path))
    for old, new in zip(prompt_run.runs, back.prompts[0].runs):
        assert new.result.trace == old.result.trace
    done = infer(["--replay", str(path)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "residual norm(max(0, p - q)) top:" in done.stdout and BLOCK_LEGEND not in done.stdout
