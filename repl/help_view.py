"""The REPL's settings table, ``/help`` and the toolbar under the prompt, read off the command
table (``repl.commands.COMMANDS``).
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from repl.commands import COMMANDS
from repl.settings import Settings


def settings_table(settings: Settings, pair=None) -> Table:
    table = Table(title=Text("Settings"), title_justify="left", show_edge=False, pad_edge=False)
    table.add_column(Text("command"))
    table.add_column(Text("value"))
    table.add_column(Text("what it does"))
    for command in COMMANDS.values():
        if command.show is not None:
            table.add_row(Text(f"/{command.name}"), Text(command.show(settings), style="bold"),
                          Text(command.help, style="dim"))
    if pair is not None:
        table.add_section()
        for name, value in (("target model", pair.target_name), ("drafter model", pair.drafter_name),
                            ("device", str(pair.device)), ("context length", str(pair.context_length or "unknown")),
                            ("vocabulary", str(pair.vocab_size))):
            table.add_row(Text(name), Text(str(value), style="bold"), Text(""))
        probe = pair.probe
        if probe is not None:
            for name, result in (("target cache path", probe.target), ("drafter cache path", probe.drafter)):
                table.add_row(Text(name), Text(result.path, style="bold"), Text(result.line(), style="dim"))
    return table


# The usage column of /help; a longer grammar gets a line of its own above its help.
USAGE_WIDTH = 30


def help_table(topic: str | None = None) -> Group:
    """Every command (or ``topic``'s) with its grammar and help line. A grammar never wraps inside
    itself: one longer than ``USAGE_WIDTH`` gets a line of its own above its help, and one wider than
    the terminal breaks only between its ``|`` alternatives (:func:`usage_lines`)."""
    commands = [COMMANDS[topic]] if topic else list(COMMANDS.values())
    parts: list = []
    rows: list[tuple[Text, Text]] = []

    def flush() -> None:
        if rows:
            parts.append(_help_grid(rows[:]))
            rows.clear()

    for command in commands:
        usage = Text(command.usage, style="bold")
        if len(command.usage) > USAGE_WIDTH:
            flush()
            parts.append(UsageLine(command.usage))
            usage = Text("")
        rows.append((usage, Text(command.help)))
        if topic and command.flag:
            flush()
            parts += [Text("also a command-line flag:", style="dim"), UsageLine(command.flag_usage)]
    flush()
    return Group(*parts)


def _help_grid(rows: list[tuple[Text, Text]]) -> Table:
    table = Table(show_header=False, show_edge=False, pad_edge=False, box=None)
    table.add_column(Text("usage"), width=USAGE_WIDTH, no_wrap=True)
    table.add_column(Text("help"), ratio=1)
    for usage, help_text in rows:
        table.add_row(usage, help_text)
    return table


def usage_lines(usage: str, width: int) -> list[str]:
    """``usage`` on one line when it fits in ``width``, else broken between its `` | ``
    alternatives (never inside one), later lines indented two spaces."""
    if len(usage) <= width:
        return [usage]
    lines: list[str] = []
    for piece in usage.split(" | "):
        if lines and len(lines[-1]) + 3 + len(piece) <= width:
            lines[-1] += " | " + piece
        else:
            lines.append(("  | " if lines else "") + piece)
    return lines


class UsageLine:
    """A command's grammar in bold, whole on one line where the terminal allows (rich renderable)."""

    def __init__(self, usage: str):
        self.usage = usage

    def __rich_console__(self, console, options):
        for line in usage_lines(self.usage, options.max_width):
            yield Text(line, style="bold", no_wrap=True, overflow="fold")


HELP_FOOTER = (
    "Anything not starting with / is a prompt. End a line with \\ (or press Esc then Enter) "
    "to continue on the next line; \\n in a prompt is a newline. Ctrl-C stops a generation; "
    "Ctrl-D or /quit leaves."
)


def toolbar_text(settings: Settings) -> str:
    """The one-line summary shown at the bottom of the prompt."""
    def mark(flag: bool) -> str:
        return "+" if flag else "-"

    strategies = " ".join(f"{mark(getattr(settings, k))}{name}" for k, name in
                          (("speculative", "spec"), ("ngram", "nasd"), ("lookahead", "lookahead"),
                           ("target", "target"), ("drafter", "drafter")))
    toggles = " ".join(f"{mark(getattr(settings, k))}{k}" for k in ("cache", "chat", "debug", "live"))
    if settings.verify != Settings().verify:
        toggles += f" | verify {settings.verify}"
    if settings.compile != Settings().compile:
        toggles += f" | compile {settings.compile}"
    if settings.rtt:
        toggles += f" | rtt {settings.rtt:g} ms"
    if settings.rtt_inject:
        toggles += f" | rtt-inject {settings.rtt_inject:g} ms"
    reset = " reset" if settings.reset_in_between else " keep"
    policy = "" if settings.gamma_policy == "constant" else f" ({settings.gamma_policy_text()})"
    return (f" gamma {settings.gamma}{policy} | length {settings.length} | {settings.processor.describe()} | "
            f"{strategies} | ngram {COMMANDS['set_ngramstorage'].show(settings)} filler "
            f"{settings.top_k_filler}{reset} | {toggles} | seed {settings.seed}")
