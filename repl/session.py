"""The session: slash commands and prompts in, panels and tables out.

:class:`Session` holds the logic both modes share (run a command line, run a
prompt and show it); :func:`interactive` wraps it in a prompt_toolkit loop
with completion, history, a settings toolbar and multi-line input.
"""

from __future__ import annotations

import os
from pathlib import Path

from rich.console import Console
from rich.text import Text

import checks.selftest
from repl import help_view, render
from repl.commands import completions, execute
from repl.inspect_view import InspectError, has_numbers, pick, round_view
from repl.report import write_report
from repl.runner import PromptRefused, Runner
from repl.runs import PromptRun, StrategyRun
from repl.settings import Settings
from repl.stats_view import stats_view
from repl.trace import TraceError, prompt_record, trace_document, write_trace
from repl.trace import environment as trace_environment

QUIT_HINT = "(Ctrl-C stops a generation; to leave press Ctrl-D or type /quit)"


def unescape(text: str) -> str:
    r"""``\n`` and ``\t`` typed in a prompt become a newline and a tab."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


class Session:
    """Commands and prompts against one settings object and one runner."""

    def __init__(self, runner: Runner, settings: Settings, console: Console, *, trace_out: str | None = None,
                 advisor_costs=None):
        self.runner = runner
        self.advisor_costs = advisor_costs  # the advisor's cost table (advisor.costs): --costs FILE or the first /advise
        self.settings = settings
        self.console = console
        self.failures = 0  # bad commands, refused prompts, failed strategies
        self.last_error: str | None = None
        self.last_run: PromptRun | None = None  # what /stats and /save read
        self.trace_out = trace_out  # --trace-out: every prompt is added to this file
        self._traced: list[dict] = []
        self._environment: dict | None = None

    # ----------------------------------------------------------------- output

    def say(self, message: str, style: str = "") -> None:
        self.console.print(Text(message, style=style))

    def error(self, message: str) -> None:
        self.failures += 1
        self.last_error = message
        self.say(message, "bold red")

    def guarded(self, work, *, interrupted: str, failed: str):
        """``work()``, or None where it did not finish: Ctrl-C says ``interrupted``, an error is one
        line after ``failed``; the models and the session go on either way."""
        try:
            return work()
        except KeyboardInterrupt:
            self.say(f"{interrupted}; the models are intact", "yellow")
        except Exception as e:      # the session outlives a failed command
            self.error(f"{failed}: {type(e).__name__}: {e}")
        return None

    # --------------------------------------------------------------- commands

    def command(self, line: str) -> bool:
        """Run one slash command; False when the session should end."""
        reply = execute(line, self.settings)
        if not reply.ok:
            self.error(reply.message)
            return True
        for notice in reply.notices:
            self.say(notice, "yellow")
        if reply.message:
            self.say(reply.message, "cyan")
        if reply.action == "quit":
            return False
        if reply.action == "help":
            self.console.print(help_view.help_table(reply.topic))
            if reply.topic is None:
                self.say(help_view.HELP_FOOTER, "dim")
        elif reply.action == "config":
            self.console.print(help_view.settings_table(self.settings, self.runner.pair))
        elif reply.action == "stats":
            self.show_stats()
        elif reply.action == "inspect":
            self.inspect(reply.topic, reply.argument)
        elif reply.action == "save":
            if reply.argument.lower().endswith((".html", ".htm")):
                self.save_html(reply.argument)
            else:
                self.save(reply.argument)
        elif reply.action == "selftest":
            self.selftest()
        elif reply.action == "advise":
            from repl.advice import advise_command

            advise_command(self, None if reply.argument is None else unescape(reply.argument))
        elif reply.action == "whatif":
            from repl.whatif_view import whatif_command

            whatif_command(self, reply.topic, reply.argument)
        elif reply.action == "clear":
            self.console.clear()
        return True

    # ------------------------------------------------------ stats and traces

    def show_stats(self) -> None:
        if self.last_run is None and self.advisor_costs is None:
            self.error("no prompt has run yet: /stats shows the last prompt's numbers")
            return
        if self.last_run is not None:
            self.console.print(stats_view(self.last_run, rtt_ms=self.settings.rtt))
        if self.advisor_costs is not None:       # the advisor's cost table, kept for the next /advise
            from repl.advice import costs_table

            self.console.print(costs_table(self.advisor_costs))

    def inspect(self, strategy: str | None, round_word: str | None) -> None:
        """/inspect [STRATEGY] [ROUND]: one round of the last prompt, position by position."""
        if self.last_run is None:
            self.error("no prompt has run yet: /inspect shows a round of the last prompt")
            return
        try:
            run, index = pick(self.last_run.runs, strategy, round_word)
        except InspectError as e:
            self.error(str(e))
            return
        if not has_numbers(run):
            self.error(f"{run.label} recorded no per-token numbers on the last prompt")
            return
        tokenizer = self.runner.pair.tokenizer
        self.console.print(round_view(run, index, lambda i: tokenizer.decode([i], skip_special_tokens=False)))

    def save_html(self, path: str) -> bool:
        """/save NAME.html: the last prompt as a self-contained HTML report."""
        if self.last_run is None:
            self.error("no prompt has run yet: /save writes the last prompt's report")
            return False
        self._record(self.last_run)  # decodes each token's text into the run, as a trace would
        try:
            write_report(path, [self.last_run], self.environment())
        except TraceError as e:
            self.error(str(e))
            return False
        self.say(f"report saved to {path} (one self-contained page: open it in a browser)", "cyan")
        return True

    def environment(self) -> dict:
        if self._environment is None:
            self._environment = trace_environment(self.runner.pair)
        return self._environment

    def _record(self, prompt_run: PromptRun) -> dict:
        return prompt_record(prompt_run, self.runner.pair.tokenizer)

    def save(self, path: str) -> bool:
        """/save FILE: the last prompt's trace; a bad path is one error line."""
        if self.last_run is None:
            self.error("no prompt has run yet: /save writes the last prompt's trace")
            return False
        try:
            write_trace(path, trace_document([self._record(self.last_run)], self.environment()))
        except TraceError as e:
            self.error(str(e))
            return False
        self.say(f"trace saved to {path} (replay: python infer.py --replay {path})", "cyan")
        return True

    def add_to_trace_out(self, prompt_run: PromptRun) -> None:
        """--trace-out: rewrite the file with every prompt so far."""
        self._traced.append(self._record(prompt_run))
        try:
            write_trace(self.trace_out, trace_document(self._traced, self.environment()))
        except TraceError as e:
            self.error(str(e))

    def handle(self, line: str) -> bool:
        """A line as typed: nothing, a command or a prompt. False to end."""
        if not line.strip():
            return True
        if line.lstrip().startswith("/"):
            return self.command(line.strip())
        self.prompt(unescape(line))
        return True

    # ---------------------------------------------------------------- prompts

    def prompt(self, text: str) -> PromptRun | None:
        """Run every enabled strategy on ``text`` and show the results."""
        if not self.settings.enabled_strategies():
            self.error("every strategy is off: turn one on with /speculative, /ngram, /lookahead, /target or /drafter")
            return None
        if self.settings.debug:
            self.console.print(render.legend())
        try:
            prompt_run = self.runner.prepare(text, self.settings)
            self.say(render.prompt_line(prompt_run), "dim")
            watch = (lambda key: self.watch(key, prompt_run.prompt_ids)) if self.live() else None
            self.runner.run(prompt_run, self.settings, on_run=self.show_run, watch=watch)
        except PromptRefused as e:
            self.error(str(e))
            return None
        except KeyboardInterrupt:
            self.say("interrupted before any strategy finished; the models are intact", "yellow")
            return None
        self.show_summary(prompt_run)
        if prompt_run.runs:
            self.last_run = prompt_run
            if self.trace_out:
                self.add_to_trace_out(prompt_run)
        return prompt_run

    def live(self) -> bool:
        """Draw the rounds as they run: /live on, and a terminal to draw on."""
        return self.settings.live and self.console.is_terminal

    def watch(self, key: str, prompt_ids: list[int]):
        """The live panel around one strategy (see ``repl.live``)."""
        from repl.live import live_panel

        tokenizer = self.runner.output_tokenizer(key)
        context = prompt_ids if tokenizer is self.runner.pair.tokenizer else []  # drafter AR: its own ids
        return live_panel(self.console, key, tokenizer, context)

    def show_run(self, prompt_run: PromptRun, run: StrategyRun) -> None:
        if run.error is not None:
            self.failures += 1
        tokenizer = self.runner.pair.tokenizer
        self.console.print(render.strategy_panel(run, prompt_run.prompt_ids, tokenizer,
                                                 debug=self.settings.debug, prompt_run=prompt_run))

    def selftest(self) -> None:
        """/selftest: run checks.selftest on the loaded pair, one line per check."""
        self.say("self-test: greedy and sampling checks on the built-in prompts, one line per check", "dim")
        done, last = checks.selftest.timed_selftest(
            self.runner.pair, tree=self.settings.tree, tree_branch=self.settings.tree_branch,
            report=lambda c: self.say(c.line(), "green" if c.passed else "bold red"))
        if all(c.passed for c in done):
            self.say(last, "bold green")
        else:
            self.error(last)

    def show_summary(self, prompt_run: PromptRun) -> None:
        if prompt_run.runs:
            self.console.print(render.comparison_table(prompt_run, self.console.width))
            busy = render.busy_line(prompt_run)
            if busy is not None:
                self.say(busy, "yellow")
        if prompt_run.interrupted:
            self.say("generation interrupted: the remaining strategies were skipped; the models are intact",
                     "yellow")


# -------------------------------------------------------------- interactive

def history_path() -> Path | None:
    """Where the input history lives (SPECDEC_HISTORY, else ~/.specdec_history),
    or None when that file cannot be written."""
    path = Path(os.environ.get("SPECDEC_HISTORY") or Path.home() / ".specdec_history").expanduser()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError:
        return None
    return path


def _prompt_session(settings: Settings):
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import Completer, Completion
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings

    class SlashCompleter(Completer):
        def get_completions(self, document, complete_event):
            before = document.text_before_cursor
            if not before.startswith("/"):
                return
            word = document.get_word_before_cursor(WORD=True)
            for candidate in completions(before):
                yield Completion(candidate, start_position=-len(word))

    bindings = KeyBindings()

    @bindings.add("escape", "enter")
    def _newline(event):
        event.current_buffer.insert_text("\n")

    path = history_path()
    return PromptSession(
        history=FileHistory(str(path)) if path else InMemoryHistory(),
        completer=SlashCompleter(),
        complete_while_typing=False,
        bottom_toolbar=lambda: help_view.toolbar_text(settings),
        key_bindings=bindings,
    )


def read_entry(prompt_session) -> str:
    r"""One entry: a line, plus continuation lines while it ends with a backslash."""
    line = prompt_session.prompt("> ")
    while line.endswith("\\") and not line.endswith("\\\\"):
        line = line[:-1] + "\n" + prompt_session.prompt("... ")
    return line


def ctrl_c_interrupts() -> None:
    """Make Ctrl-C stop a generation even when the REPL was started with SIGINT ignored (a shell starts
    a background job so, and Python then installs no KeyboardInterrupt handler): at a terminal the
    user's Ctrl-C is meant for the REPL."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def interactive(session: Session) -> int:
    """The prompt loop; returns the exit status (0 on /quit or Ctrl-D)."""
    ctrl_c_interrupts()
    prompt_session = _prompt_session(session.settings)
    session.say("Type a prompt, or /help for the commands. Ctrl-D or /quit leaves.", "dim")
    while True:
        try:
            line = read_entry(prompt_session)
        except KeyboardInterrupt:
            session.say(QUIT_HINT, "dim")
            continue
        except EOFError:
            break
        try:
            if not session.handle(line):
                break
        except KeyboardInterrupt:
            session.say("interrupted; the models are intact", "yellow")
        except Exception as e:  # the session outlives any one bad entry
            session.error(f"internal error, the session goes on: {type(e).__name__}: {e}")
    session.say("bye", "dim")
    return 0
