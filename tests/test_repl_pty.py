"""The interactive session, driven for real through a pseudo-terminal.

One session on a tiny local model pair walks through the bad commands, a
prompt, toggles, debug mode, a refused prompt, Ctrl-C during a long
generation and at an empty prompt, and Ctrl-D; a second one checks flags and
/quit. Output is read with the ANSI escapes stripped.
"""

from __future__ import annotations

import re
import time

import pytest

pexpect = pytest.importorskip("pexpect")

from tests.helpers.repl import INFER, PYTHON, REPO, build_pair, child_env  # noqa: E402

ANSI = re.compile(r"\x1b\[[0-9;?<>=]*[A-Za-z~]|\x1b\][^\x07\x1b]*(\x07|\x1b\\)|\x1b[()][A-Za-z0-9]|\x1b[=>78]|\r")
S = r"[\s│┃]+"  # between table cells
START_TIMEOUT = 120
STEP_TIMEOUT = 60


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_pair")
    return build_pair(root)


class Pty:
    """A child on a pty, read as plain text with a moving cursor."""

    def __init__(self, args, env):
        self.child = pexpect.spawn(PYTHON, [str(INFER), *args], cwd=str(REPO), env=env,
                                   dimensions=(50, 220), encoding="utf-8", codec_errors="replace",
                                   timeout=STEP_TIMEOUT)
        self.raw = ""
        self.cursor = 0

    @property
    def text(self) -> str:
        return ANSI.sub("", self.raw)

    def _pump(self, wait: float) -> bool:
        """Read what is there; answer prompt_toolkit's cursor position
        requests as a terminal would (without them it hides the toolbar)."""
        try:
            chunk = self.child.read_nonblocking(65536, timeout=wait)
            self.raw += chunk
            for _ in range(chunk.count("\x1b[6n")):
                self.child.send("\x1b[10;1R")
            return True
        except pexpect.TIMEOUT:
            return True
        except pexpect.EOF:
            return False

    def wait(self, pattern: str, timeout: float = STEP_TIMEOUT, regex: bool = False) -> str:
        """Wait until ``pattern`` appears after the cursor; move the cursor past it."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.text
            if regex:
                match = re.search(pattern, text[self.cursor:])
                found = (match.start(), match.end()) if match else None
            else:
                at = text.find(pattern, self.cursor)
                found = (at - self.cursor, at - self.cursor + len(pattern)) if at >= 0 else None
            if found:
                seen = text[self.cursor:self.cursor + found[1]]
                self.cursor += found[1]
                return seen
            alive = self._pump(0.2)
            if not alive or time.monotonic() > deadline:
                start, tail = text[self.cursor:self.cursor + 1500], text[-3000:]
                raise AssertionError(f"did not see {pattern!r}; output after the last match:\n{start}\n"
                                     f"... output ends with:\n{tail}")

    def type(self, line: str) -> None:
        self.child.sendline(line)

    def command(self, line: str, expected: str) -> None:
        self.type(line)
        self.wait(expected)

    def finish(self, timeout: float = 30) -> int:
        deadline = time.monotonic() + timeout
        while self._pump(0.2) and time.monotonic() < deadline:
            pass
        self.child.close()
        return self.child.exitstatus


BAD_COMMANDS = [
    ("/gamma abc", "/gamma: N must be a whole number, got 'abc' (usage: /gamma N)"),
    ("/gamma 0", "/gamma: N must be between 1 and 128, got 0 (usage: /gamma N)"),
    ("/length -5", "/length: N must be between 1 and 1000000, got -5 (usage: /length N)"),
    ("/processor nucleus 0.7 1.5", "/processor: top_p must be in (0, 1], got 1.5 (usage: /processor"),
    ("/processor foo", "/processor: unknown processor 'foo'; choose one of greedy"),
    ("/set_ngramstorage tree 3", "/set_ngramstorage: unknown storage 'tree'; choose basic or onelevel or recycling"),
    ("/set_ngramstorage basic 1", "/set_ngramstorage: N must be between 2 and 16, got 1"),
    ("/gama 5", "unknown command /gama (did you mean /gamma?)"),
    ("/frobnicate", "unknown command /frobnicate; type /help for the list"),
    ("/gamma_policy confidence 2", "/gamma_policy: T must be in (0, 1), got 2.0"),
    ("/stats", "no prompt has run yet: /stats"),
]


def test_interactive_session(pair, tmp_path):
    target, drafter = pair
    pty = Pty(["--target", str(target), "--drafter", str(drafter), "--length", "12"], child_env(tmp_path))
    try:
        pty.wait("Type a prompt", timeout=START_TIMEOUT)
        pty.wait("gamma 4 | length 12")  # the bottom toolbar

        for line, message in BAD_COMMANDS:
            pty.command(line, message)
        pty.command("/processor multinomial 0", "temperature 0 means")
        pty.wait("processor: greedy")
        pty.type("")  # an empty line does nothing
        pty.command("/config", "Settings")
        pty.wait(rf"/gamma{S}4{S}drafts per", regex=True)  # old values kept
        pty.wait(rf"/length{S}12{S}", regex=True)
        pty.wait(rf"/set_ngramstorage{S}basic 3{S}", regex=True)
        pty.command("/help", "/set_ngramstorage basic|onelevel|recycling N")
        pty.wait("Ctrl-D or /quit leaves")
        pty.child.send("/proc\t")  # Tab completes the command name
        pty.type(" foo")
        pty.wait("/processor: unknown processor 'foo'")
        pty.command("/clear", "| seed 42")

        # A prompt (typed over two lines) through the default strategies, then the comparison.
        pty.type("the water \\")
        pty.type("is hot")
        pty.wait("prompt: 6 tokens (chat template)")
        for label in ("Speculative", "NASD", "Target AR"):
            pty.wait(label)
            pty.wait(r"12 tokens · [0-9.]+ s · [0-9.]+ tokens/s", regex=True)
        pty.wait("Comparison")
        rate = rf"[0-9.]+{S}[0-9]+{S}[0-9.]+"                         # tokens/s, TTFT ms, decode tok/s
        split = rf"[0-9.]+{S}[0-9.]+x"                                # tok/call, call cost
        model = rf"(?:[0-9.]+x|n/a){S}(?:[0-9]+|n/a){S}[0-9/]+%"  # predicted, best gamma, phase split
        pty.wait(rf"Speculative{S}12{S}{rate}{S}[0-9.]+x{S}{split}{S}{model}{S}yes", regex=True)
        pty.wait(rf"NASD{S}12{S}{rate}{S}[0-9.]+x{S}{split}{S}{model}{S}yes", regex=True)
        pty.wait(rf"Target AR{S}12{S}{rate}{S}1\.00x{S}1\.00{S}1\.00x{S}-{S}-{S}[0-9/]+%{S}baseline", regex=True)

        # The why views: /stats, a trace saved with /save, and a gamma policy.
        pty.command("/stats", "Why (last prompt)")
        pty.wait("acceptance at position")
        pty.wait("cache rollback")
        trace = tmp_path / "last trace.json"
        pty.command(f"/save {trace}", "trace saved to")
        assert trace.exists()
        pty.command(f"/save {tmp_path / 'missing' / 'x.json'}", "cannot write trace to")
        pty.command("/gamma_policy heuristic", "gamma_policy: heuristic")
        pty.wait("gamma 4 (heuristic) |")  # the toolbar

        # Toggles: drafter on, speculative off; debug colours and the legend.
        pty.command("/drafter", "drafter: on")
        pty.command("/speculative", "speculative: off")
        pty.command("/debug", "debug: on")
        pty.type("a new\\nline of the water")
        pty.wait("debug colours: accepted draft")
        pty.wait("NASD")
        pty.wait("Drafter AR")
        pty.wait("Comparison")
        assert "Speculative" not in pty.text[pty.text.rfind("debug colours"):]
        assert "\x1b[9" in pty.raw or ";9m" in pty.raw or ";9;" in pty.raw  # struck-through rejected drafts
        pty.command("/debug off", "debug: off")

        # A prompt too long for the context is refused with the token counts.
        pty.command("/length 70000", "length: 70000")
        pty.type("the water is hot")
        pty.wait("prompt refused: 6 prompt tokens + 70000 new tokens = 70006, more than the context of 65536")

        # Ctrl-C during a long generation: partial output, then the prompt again.
        pty.command("/length 60000", "length: 60000")
        pty.command("/ngram off", "ngram: off")
        pty.command("/drafter off", "drafter: off")
        pty.type("the water is hot")
        pty.wait("prompt: 6 tokens")
        pty.wait(r"live · round \d+ · \d+ tokens", regex=True)   # decoding, not still setting up
        time.sleep(0.5)
        pty.child.sendintr()
        pty.wait("interrupted after")
        pty.wait("generation interrupted")
        pty.command("/length 8", "length: 8")
        pty.type("the water")
        pty.wait(rf"Target AR{S}8{S}", regex=True)  # the models still work

        # Ctrl-C at an empty prompt hints how to leave; Ctrl-D leaves with 0.
        pty.wait("| seed 42")
        time.sleep(0.5)
        pty.child.sendintr()
        pty.wait("to leave press Ctrl-D or type /quit")
        pty.wait("| seed 42")  # the prompt is back (raw mode) before Ctrl-D is typed
        time.sleep(0.5)
        pty.child.sendcontrol("d")
        pty.wait("bye")
        status = pty.finish()
    finally:
        if pty.child.isalive():
            pty.child.terminate(force=True)
    assert status == 0
    assert "Traceback" not in pty.text


def test_flags_configure_the_session_and_quit_exits_zero(pair, tmp_path):
    target, drafter = pair
    args = ["--target", str(target), "--drafter", str(drafter), "--gamma", "6", "--no-speculative",
            "--processor", "topk", "0.7", "20", "--ngram-storage", "onelevel", "4", "--seed", "7"]
    pty = Pty(args, child_env(tmp_path))
    try:
        pty.wait("Type a prompt", timeout=START_TIMEOUT)
        pty.command("/config", "Settings")
        for row in (rf"/gamma{S}6{S}", rf"/processor{S}topk\(temperature=0\.7, top_k=20\)",
                    rf"/speculative{S}off{S}", rf"/set_ngramstorage{S}onelevel 4{S}", rf"/seed{S}7{S}"):
            pty.wait(row, regex=True)
        pty.type("/quit")
        status = pty.finish()
    finally:
        if pty.child.isalive():
            pty.child.terminate(force=True)
    assert status == 0
    assert "Traceback" not in pty.text


FINAL_PANEL = r"╭─ {label} ─[^\n]*\n(?:│[^\n]*\n)+?╰"


def _final_text(text: str, label: str) -> list[str]:
    """The body lines of the last finished ``label`` panel, metrics left out."""
    panel = re.findall(FINAL_PANEL.format(label=label), text)[-1]
    lines = [line.strip("│ ") for line in panel.splitlines()[1:-1]]
    return [line for line in lines if not re.search(r"tokens/s|phases:|mean accepted|target forward|stop:", line)]


def test_live_rounds_update_the_panel_and_leave_the_output_unchanged(pair, tmp_path):
    """With a terminal the live view is on: the running panel is redrawn round by
    round (its status line counts the rounds), then the ordinary panel is
    printed; /live off gives the same output."""
    target, drafter = pair
    pty = Pty(["--target", str(target), "--drafter", str(drafter), "--length", "300", "--no-ngram",
               "--no-target-ar"], child_env(tmp_path))
    try:
        pty.wait("Type a prompt", timeout=START_TIMEOUT)
        pty.wait("+live")  # the toolbar
        pty.type("the water is hot")
        pty.wait("prompt: 6 tokens")
        start = pty.cursor
        pty.wait("Speculative  running")
        pty.wait(r"╭─ Speculative ─", regex=True)  # the finished panel
        live_part = pty.text[start:pty.cursor]
        rounds = [int(n) for n in re.findall(r"live · round (\d+) · \d+ tokens", live_part)]
        assert len(set(rounds)) >= 2 and rounds == sorted(rounds), rounds  # updated at least twice
        pty.wait(r"300 tokens · [0-9.]+ s", regex=True)
        pty.wait("Comparison")
        live_on = _final_text(pty.text, "Speculative")

        pty.command("/live off", "live: off")
        pty.type("the water is hot")
        pty.wait("prompt: 6 tokens")
        start = pty.cursor
        pty.wait("Comparison")
        assert "live · round" not in pty.text[start:]
        live_off = _final_text(pty.text, "Speculative")
        assert live_on == live_off and len(" ".join(live_on).split()) >= 250
        pty.type("/quit")
        status = pty.finish()
    finally:
        if pty.child.isalive():
            pty.child.terminate(force=True)
    assert status == 0
    assert "Traceback" not in pty.text
