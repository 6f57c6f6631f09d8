"""The self-test (checks/selftest.py) passes on a correct engine and fails loudly
on a broken accept rule, in process and through ``infer.py --selftest``."""

from __future__ import annotations

import ast
import re
import subprocess

import pytest
import torch

import checks.selftest
import generation.accept
import generation.verify
import generation.verify_rules
from checks.selftest import Check, run_selftest, selftest_exit_code
from tests.helpers.repl import INFER, PYTHON, REPO, build_model, build_pair, build_tokenizer, child_env
from utils.models import ModelPair

CONTEXT = 4096
RUNS = 200  # sampling runs per strategy: enough power for the mistakes below, a few seconds
PASSED = re.compile(r"self-test passed: 7 checks in \d+\.\d s")


@pytest.fixture(scope="module")
def pair():
    """The REPL tests' tiny word-level pair, with a drafter far enough from the
    target that rejections (and so the resample path) are frequent."""
    tokenizer = build_tokenizer()
    target = build_model(1, len(tokenizer), context=CONTEXT)
    drafter = build_model(1, len(tokenizer), context=CONTEXT, noise=0.05)
    return ModelPair(
        target=target, drafter=drafter, tokenizer=tokenizer, target_name="tiny target",
        drafter_name="tiny drafter", end_tokens=[tokenizer.eos_token_id], device=torch.device("cpu"),
        vocab_size=len(tokenizer), context_length=CONTEXT, self_draft_demo=False,
    )


def accept_everything(p, q, draft, sample, generator=None):
    """A broken accept rule: every draft is kept, then a token from p after them."""
    k = draft.shape[0]
    return torch.tensor(k, device=p.device), sample(p[k:], generator)[0]


def test_passes_on_a_correct_engine(pair):
    reported: list[Check] = []
    checks = run_selftest(pair, length=24, sampling_runs=RUNS, report=reported.append)
    assert checks == reported  # each check is reported as soon as it is done
    assert [c.name.split(" (")[0] for c in checks] == [
        "cache probe", "speculative greedy", "NASD greedy", "speculative greedy", "NASD greedy",
        "speculative sampling", "NASD sampling"]
    for check in checks:
        assert check.passed, check.line()
        assert "\n" not in check.detail
        assert check.seconds > 0 and check.line().endswith(f" [{check.seconds:.1f} s]")
    assert checks[0].detail.startswith("cache probe (") and "target cached" in checks[0].detail
    greedy = [c for c in checks if "greedy" in c.name]
    assert any("cache off" in c.name for c in greedy) and any("cache on" in c.name for c in greedy)
    # The drafts were exercised: both strategies accepted some drafts in the greedy checks.
    assert all(" 0 of " not in c.detail for c in greedy)


def test_accepting_every_draft_fails_with_the_first_wrong_token(pair, monkeypatch):
    for name in generation.verify_rules.VERIFY_RULES:  # every chain rule, whichever one runs
        monkeypatch.setitem(generation.verify_rules.VERIFY_RULES, name, accept_everything)
    checks = run_selftest(pair, length=24, sampling_runs=50)  # a drawn zero-probability token fails at once
    failed = {c.name for c in checks if not c.passed}
    assert {"speculative greedy (cache on)", "NASD greedy (cache on)"} <= failed
    assert any("greedy (cache off)" in name for name in failed)
    assert any(name.startswith("NASD sampling") for name in failed)
    nasd = next(c for c in checks if c.name == "NASD greedy (cache on)")
    assert "target AR gave" in nasd.detail and "token " in nasd.detail
    assert nasd.line().startswith("FAIL  NASD greedy (cache on): prompt ")
    assert "(unexplained): token " in nasd.detail     # drafts its own verify rows did not rank first
    # Tokens are shown as their text, their ids beside it (mutation: the ids alone).
    got, want = re.search(r"token \d+ is (.+), target AR gave (.+)$", nasd.detail).groups()
    assert_decoded(pair, got) and assert_decoded(pair, want)
    sampled = next(c for c in checks if c.name.startswith("NASD sampling") and not c.passed)
    assert_decoded(pair, re.search(r"sampled (.+), which has probability 0", sampled.detail).group(1))


def assert_decoded(pair, shown: str) -> bool:
    """``shown`` is ``'text' (ids...)``: the ids' decoded text, then the ids."""
    match = re.fullmatch(r"('.*'|\".*\") \(([\d, ]+)\)", shown)
    assert match, shown
    ids = [int(t) for t in match.group(2).split(",") if t.strip()]
    assert ast.literal_eval(match.group(1)) == pair.tokenizer.decode(ids, skip_special_tokens=False), shown
    return True


def test_resampling_from_p_is_caught_by_the_sampling_check(pair, monkeypatch):
    """The classic mistake keeps greedy output right (so the greedy checks pass)
    but biases sampling, which the chi-square check catches."""
    monkeypatch.setattr(generation.accept, "residual_distributions", lambda p, q, draft: p)
    checks = run_selftest(pair, length=8, sampling_runs=RUNS)
    sampling = {c.name.split(" (")[0]: c for c in checks if "sampling" in c.name}
    assert not sampling["speculative sampling"].passed
    assert "chi-square" in sampling["speculative sampling"].detail or "probability 0" in \
        sampling["speculative sampling"].detail
    assert all(c.passed for c in checks if "greedy" in c.name)


@pytest.fixture(scope="module")
def twin_pair(pair):
    """A drafter identical to its target: q equals p, so no draft is ever rejected."""
    twin = build_model(1, len(pair.tokenizer), context=CONTEXT)
    return ModelPair(
        target=pair.target, drafter=twin, tokenizer=pair.tokenizer, target_name="tiny target",
        drafter_name="its twin", end_tokens=pair.end_tokens, device=torch.device("cpu"),
        vocab_size=pair.vocab_size, context_length=CONTEXT, self_draft_demo=False,
    )


def _speculative_sampling(pair) -> Check:
    return next(c for c in run_selftest(pair, length=4, sampling_runs=RUNS) if c.name.startswith("speculative samp"))


def test_the_sampling_check_tries_the_resample_even_when_the_drafter_always_agrees(twin_pair, monkeypatch):
    """With its own q a twin drafter is never rejected, so a wrong resample goes
    unseen; the check's one-hot q is rejected often, and catches it."""
    assert _speculative_sampling(twin_pair).passed
    monkeypatch.setattr(generation.accept, "residual_distributions", lambda p, q, draft: p)
    caught = _speculative_sampling(twin_pair)
    assert not caught.passed and "drafts: the drafter's most likely token" in caught.detail
    monkeypatch.setattr(checks.selftest, "ONE_HOT_DRAFTER", "model")           # the pair's own q
    unseen = _speculative_sampling(twin_pair)
    assert unseen.passed and re.search(r" (\d+) of \1 drafts accepted\)", unseen.detail)


def test_exit_code_and_lines(pair, monkeypatch):
    lines: list[str] = []
    assert selftest_exit_code(pair, out=lines.append, length=8, sampling_runs=50) == 0
    assert PASSED.fullmatch(lines[-1]), lines[-1]
    assert all(line.startswith("PASS  ") for line in lines[:-1])
    for name in generation.verify_rules.VERIFY_RULES:  # every chain rule, whichever one runs
        monkeypatch.setitem(generation.verify_rules.VERIFY_RULES, name, accept_everything)
    lines.clear()
    assert selftest_exit_code(pair, out=lines.append, length=24, sampling_runs=50) == 1
    assert lines[-1].startswith("self-test failed: ") and re.search(r"\) in \d+\.\d s$", lines[-1])
    assert any(line.startswith("FAIL  NASD greedy") for line in lines)


def test_bad_length_is_refused(pair):
    with pytest.raises(ValueError, match="length must be an integer >= 1, got 0"):
        run_selftest(pair, length=0)


def test_repl_selftest_command_prints_one_line_per_check(pair, monkeypatch):
    import io

    from rich.console import Console

    import checks.selftest
    from repl.runner import Runner
    from repl.session import Session
    from repl.settings import Settings

    full = checks.selftest.run_selftest
    monkeypatch.setattr(checks.selftest, "run_selftest",
                        lambda p, **kw: full(p, length=24, sampling_runs=50, **kw))
    out = io.StringIO()
    session = Session(Runner(pair), Settings(), Console(file=out, width=200, color_system=None))
    assert session.handle("/selftest") is True
    lines = out.getvalue().splitlines()
    assert sum(line.startswith("PASS  ") for line in lines) == 7
    assert any(PASSED.fullmatch(line) for line in lines)
    assert session.failures == 0

    for name in generation.verify_rules.VERIFY_RULES:  # every chain rule, whichever one runs
        monkeypatch.setitem(generation.verify_rules.VERIFY_RULES, name, accept_everything)
    out.seek(0)
    out.truncate(0)
    session.handle("/selftest")
    assert session.failures == 1 and session.last_error.startswith("self-test failed: ")
    assert any(line.startswith("FAIL  NASD greedy") for line in out.getvalue().splitlines())


# ------------------------------------------------------------ through infer.py

BROKEN_LAUNCHER = """\
import runpy, sys
sys.path.insert(0, {repo!r})
import torch
import generation.verify_rules

def accept_everything(p, q, draft, sample, generator=None):
    k = draft.shape[0]
    return torch.tensor(k, device=p.device), sample(p[k:], generator)[0]

for name in generation.verify_rules.VERIFY_RULES:  # every chain rule, whichever one runs
    generation.verify_rules.VERIFY_RULES[name] = accept_everything
sys.argv = ["infer.py", *sys.argv[1:]]
runpy.run_path({infer!r}, run_name="__main__")
"""


@pytest.fixture(scope="module")
def saved_pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("tiny_pair_selftest"), context=CONTEXT)


def _selftest(args, tmp_path, script=None):
    command = [PYTHON, str(script)] if script else [PYTHON, str(INFER)]
    return subprocess.run([*command, *args, "--selftest"], cwd=REPO, env=child_env(tmp_path),
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def test_infer_selftest_passes_and_fails_loudly(saved_pair, tmp_path):
    target, drafter = saved_pair
    args = ["--target", str(target), "--drafter", str(drafter), "--device", "cpu"]
    done = _selftest(args, tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert len(lines) == 7 and all(line.startswith("PASS  ") for line in lines), done.stdout
    assert PASSED.fullmatch(done.stdout.splitlines()[-1]), done.stdout  # the last line gives the time

    launcher = tmp_path / "broken_infer.py"
    launcher.write_text(BROKEN_LAUNCHER.format(repo=str(REPO), infer=str(INFER)))
    broken = _selftest(args, tmp_path, script=launcher)
    assert broken.returncode == 1, broken.stdout[-2000:] + broken.stderr[-2000:]
    assert "FAIL  NASD greedy (cache on): prompt " in broken.stdout
    assert "self-test failed: " in broken.stdout
    assert "Traceback" not in broken.stderr


# ------------------------------------------------------ self-drafters, trees

@pytest.fixture(scope="module")
def self_pair(pair):
    """The tiny pair with a self-drafter (the target in int8) in place of its drafter."""
    from dataclasses import replace

    from model_drafters.selfdraft.build import build_self_drafter
    from model_drafters.selfdraft.spec import parse_self_draft

    drafter = build_self_drafter(pair.target, parse_self_draft("self:int8"))
    return replace(pair, drafter=drafter, drafter_name="tiny target self:int8", drafts_on_target_cache=True)


def _keep_the_tree_root(monkeypatch):
    """Mutation: a self-drafter drops its tree's nodes but leaves the root in the target's cache."""
    import model_drafters.selfdraft.drafter
    from model_drafters import selfdraft

    real = selfdraft.drafter.draft_tree
    monkeypatch.setattr(selfdraft.drafter, "draft_tree", lambda *a, **kw: real(*a, **(kw | {"drop_root": False})))


def test_a_self_drafter_with_trees_passes_and_says_so(self_pair):
    checks = run_selftest(self_pair, length=16, sampling_runs=100, tree=8, tree_branch=2)
    for check in checks:
        assert check.passed, check.line()
    on = next(c for c in checks if c.name == "speculative greedy (cache on)")
    assert "; trees in " in on.detail and "; trees in 0 of" not in on.detail   # trees were verified
    off = next(c for c in checks if c.name == "speculative greedy (cache off)")
    assert "chain instead of a tree: the cache is off" in off.detail


def test_a_self_drafter_that_leaves_its_tree_root_in_the_target_cache_fails(self_pair, monkeypatch):
    _keep_the_tree_root(monkeypatch)
    checks = run_selftest(self_pair, length=16, sampling_runs=100, tree=8, tree_branch=2)
    failed = {c.name for c in checks if not c.passed}
    assert "speculative greedy (cache on)" in failed and "speculative sampling" in " ".join(failed)
    assert "NASD greedy (cache on)" not in failed                  # the n-gram drafter never shares the cache


def test_infer_selftest_checks_the_self_drafter_it_is_given_with_trees(saved_pair, capsys, monkeypatch):
    """``infer.py --selftest --drafter self:int8 --tree 8`` (in process): the self-drafter is
    built from the target, and the speculative checks verify trees with it; broken, it fails."""
    import infer

    target, _ = saved_pair
    argv = ["--target", str(target), "--drafter", "self:int8", "--device", "cpu", "--tree", "8", "--selftest"]
    assert infer.main(argv) == 0
    out = capsys.readouterr().out
    assert "self:int8" in out and "self-test passed: 7 checks" in out
    greedy = next(line for line in out.splitlines() if line.startswith("PASS  speculative greedy (cache on)"))
    assert "; trees in " in greedy and "; trees in 0 of" not in greedy

    _keep_the_tree_root(monkeypatch)
    assert infer.main(argv) == 1
    assert "FAIL  speculative greedy (cache on): " in capsys.readouterr().out
