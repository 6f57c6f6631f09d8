"""The front ends on a served target, as a user drives them: ``infer.py --target-server URL`` in a
child process, scripted with ``--json`` (every strategy on) and the REPL through a pseudo-terminal
(every slash command of the command table once), against llama.cpp's real server on the offline
model and against the fake vLLM and SGLang servers (tests/helpers/served.py) on a tiny saved pair.
A served pair must never end in a traceback: every failure is one line in a strategy's panel."""

from __future__ import annotations

import json

import pytest

pexpect = pytest.importorskip("pexpect")

from repl.commands import COMMANDS  # noqa: E402
from tests.helpers.repl import build_pair, child_env, infer  # noqa: E402
from tests.helpers.served import FakeServer, FakeSglang, FakeVllm  # noqa: E402
from tests.test_repl_pty import START_TIMEOUT, Pty  # noqa: E402

pytestmark = pytest.mark.slow
STRATEGY_FLAGS = ["--speculative", "--ngram", "--lookahead", "--target-ar", "--drafter-ar"]
ALL_STRATEGIES = {"speculative", "ngram", "lookahead", "target", "drafter"}
WORDS = "the water is hot and the sun is"          # the tiny pair's word vocabulary


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The saved tiny pair's directories and the target loaded to serve (model, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target, drafter = build_pair(tmp_path_factory.mktemp("served_pair"), context=128)
    return target, drafter, AutoModelForCausalLM.from_pretrained(target).eval(), AutoTokenizer.from_pretrained(target)


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def fake(request, tiny):
    """(url, drafter dir, kind) of a fake engine of each kind serving the tiny target."""
    _, drafter, model, tokenizer = tiny
    handler = FakeVllm(model, tokenizer) if request.param == "vllm" else FakeSglang(model, tokenizer)
    with FakeServer(handler) as server:
        yield server.url, drafter, request.param


@pytest.fixture(scope="module")
def llama():
    pytest.importorskip("xllamacpp", reason="the llama.cpp server comes from xllamacpp (requirements-dev.txt)")
    from tests.helpers.served import llama_server
    from utils.default_model import default_gguf_path

    with llama_server(default_gguf_path()) as url:
        yield url


def scripted(url: str, drafter: str | None, prompt: str, tmp_path, *extra: str, status: int = 0) -> dict:
    """One scripted prompt with every strategy on; the JSON object it printed (``status``: the exit
    code expected, 1 where a strategy is refused)."""
    args = ["--target-server", url, *(["--drafter", drafter] if drafter else []), "--length", "5", "--gamma", "3",
            *STRATEGY_FLAGS, *extra, "--json", "--prompt", prompt]
    done = infer(args, tmp_path, timeout=600)
    assert "Traceback" not in done.stderr + done.stdout, done.stderr[-3000:]
    assert done.returncode == status, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_every_strategy_ran(obj: dict, refused: set[str] = frozenset()) -> None:
    runs = obj["strategies"]
    assert set(runs) == ALL_STRATEGIES
    for key, run in runs.items():
        error = run.get("error")
        if key in refused:
            assert error and error.startswith("refused: ") and "\n" not in error, error
        else:
            assert error is None and run["tokens"] == 5, (key, error)


def test_scripted_json_runs_every_strategy_on_a_fake_engine(fake, tmp_path):
    url, drafter, _ = fake
    obj = scripted(url, str(drafter), WORDS, tmp_path)
    check_every_strategy_ran(obj)
    assert obj["strategies"]["speculative"]["identical_to_target"] is True    # the server's greedy, exactly


def test_scripted_json_runs_every_strategy_on_llamacpp(llama, tmp_path):
    obj = scripted(llama, None, "Name three colours.", tmp_path)
    check_every_strategy_ran(obj)
    filled = scripted(llama, None, "Name three colours.", tmp_path, "--ngram-storage", "suffix", "--fill-width",
                      status=1)
    check_every_strategy_ran(filled, refused={"ngram"})            # widths cannot be timed on a server
    assert "local target" in filled["strategies"]["ngram"]["error"]


# Every command of the table with words to try it with; a command added to the table must be added
# here (the test says so), so that none is left untried on a served target.
def every_command(trace: str) -> list[str]:
    return [
        "/gamma 3", "/length 5", "/processor greedy", "/speculative on", "/ngram on", "/lookahead on",
        "/target on", "/drafter on", "/cache on", "/chat on", "/debug on", "/live off", "/seed 7",
        "/verify block", "/uag slem", "/rtt 5", "/rtt_inject 0", "/reset_in_between on", "/corpus off",
        WORDS, "/stats", "/inspect", "/inspect speculative 1",
        "/tree 4", "/tree_branch 2", "/tree_sample off", WORDS, "/tree 0",
        "/set_ngramstorage suffix", "/suffix_pattern 8", "/suffix_outputs 4", "/match_factor 1",
        "/fill_width on", "/hybrid 2", "/top_k_filler 2", "/lookahead_window 3", "/lookahead_ngram 3",
        "/lookahead_guesses 3", "/gamma_policy heuristic", WORDS, "/fill_width off", "/hybrid 0",
        "/processor topk 0.8 5", WORDS, "/processor greedy", "/gamma_policy confidence 0.5", "/compile static",
        WORDS, "/config", f"/save {trace}", "/help gamma", "/advise", "/whatif batch", "/whatif context", "/whatif machine H100", "/selftest", "/clear",
    ]


def test_the_command_list_covers_the_table(tmp_path):
    named = {line.split()[0][1:] for line in every_command(str(tmp_path / "t.json")) if line.startswith("/")}
    assert named | {"quit"} == set(COMMANDS), "try each new command on a served target in every_command"


def drive_every_command(url: str, drafter: str | None, tmp_path, skip: tuple[str, ...] = ()) -> str:
    """A REPL session on the served pair that runs every command once, then /quit; its text."""
    marker = COMMANDS["quit"].help
    args = ["--target-server", url, *(["--drafter", drafter] if drafter else [])]
    pty = Pty(args, child_env(tmp_path))
    try:
        pty.wait("Type a prompt", timeout=START_TIMEOUT)
        for line in every_command(str(tmp_path / "trace.json")):
            if line.split()[0] in skip:
                continue
            pty.type(line)
            pty.type("/help quit")                  # its line marks where this command's output ends
            pty.wait(marker, timeout=600)
            assert "Traceback" not in pty.text, f"{line}: {pty.text[-3000:]}"
        pty.type("/quit")
        status = pty.finish()
    finally:
        if pty.child.isalive():
            pty.child.terminate(force=True)
    assert status == 0, pty.text[-3000:]
    return pty.text


def test_the_repl_runs_every_command_on_a_fake_engine(fake, tmp_path):
    """The self-test runs on the vLLM fake (a minute of requests); the SGLang one leaves it out."""
    url, drafter, kind = fake
    text = drive_every_command(url, str(drafter), tmp_path, skip=("/selftest",) if kind == "sglang" else ())
    assert "Comparison" in text and "failed:" not in text and "/advise needs a local target" in text
    assert all(f"/whatif {t} needs a local target" in text for t in ("batch", "context", "machine"))
    if kind == "vllm":
        assert "self-test passed" in text
    assert (tmp_path / "trace.json").exists()


def test_the_repl_runs_every_command_on_llamacpp(llama, tmp_path):
    """/selftest is left out here (test_served.py runs it on this server: minutes of requests)."""
    text = drive_every_command(llama, None, tmp_path, skip=("/selftest",))
    assert "Comparison" in text and "failed:" not in text
    assert "refused: filling verify widths needs a local target" in text
