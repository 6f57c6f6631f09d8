"""Everything the REPL shows, as rich renderables.

Model text only ever enters rich as :class:`rich.text.Text` (never as a
markup string), so brackets or colons in a model's output print as they are.
"""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from generation import GenerationResult, Round
from repl.commands import COMMANDS
from repl.runner import PromptRun, StrategyRun
from repl.settings import Settings

STRATEGY_COLOURS = {"speculative": "green", "ngram": "cyan", "target": "blue", "drafter": "magenta"}
ACCEPTED = "green"
REJECTED = "red strike"
TARGET = "bold blue"
BONUS = "bold magenta"
DRAFTING = ("speculative", "ngram")
PIECE_WINDOW = 8  # tokens of left context used to decode one token's text


def make_console(*, stderr: bool = False) -> Console:
    """A console that never reads markup, emoji codes or highlights in strings."""
    return Console(stderr=stderr, markup=False, emoji=False, highlight=False)


# ------------------------------------------------------------------- metrics

def _metrics(run: StrategyRun) -> Text:
    r = run.result
    parts = [
        f"{len(r.tokens)} tokens",
        f"{r.seconds:.2f} s",
        f"{r.tokens_per_second:.1f} tokens/s",
    ]
    if run.key in DRAFTING:
        parts += [
            f"acceptance {r.acceptance_rate:.1%} ({r.accepted}/{r.drafted} drafts)",
            f"{r.tokens_per_target_call:.2f} tokens/target call",
        ]
    calls = "drafter forward passes" if run.key == "drafter" else "target forward passes"
    parts.append(f"{r.target_calls} {calls}")
    if run.key == "speculative":
        parts.append(f"{r.drafter_calls} drafter forward passes")
    parts.append(f"stop: {r.stop_reason}")
    return Text(" · ".join(parts), style="dim")


def strategy_panel(run: StrategyRun, prompt_ids: list[int], tokenizer, *, debug: bool) -> Panel:
    """One strategy's output, its numbers and (in debug mode) its rounds."""
    colour = STRATEGY_COLOURS[run.key]
    title = Text(run.label, style=f"bold {colour}")
    if run.error is not None:
        return Panel(Text(run.error, style="red"), title=title, title_align="left", border_style="red")
    body: list = [Text(run.text or "(no text)", style="" if run.text else "dim")]
    if run.result.interrupted:
        title.append("  interrupted", style="bold yellow")
        body.append(Text(f"interrupted after {len(run.result.tokens)} tokens", style="yellow"))
    body.append(_metrics(run))
    if debug and run.key in DRAFTING and run.result.trace is not None:
        body += [Text(""), rounds_view(run.result, prompt_ids, tokenizer)]
    border = "yellow" if run.result.interrupted else colour
    return Panel(Group(*body), title=title, title_align="left", border_style=border)


# ---------------------------------------------------------------- debug view

def token_pieces(tokenizer, context: list[int], tokens: list[int]) -> list[str]:
    """The text each of ``tokens`` adds after ``context`` (special tokens shown).

    Decoding a token alone breaks multi-byte characters and leading spaces, so
    each piece is the difference between decoding a short window with and
    without the token.
    """
    pieces, seq = [], list(context[-PIECE_WINDOW:])
    for token in tokens:
        before = tokenizer.decode(seq, skip_special_tokens=False)
        after = tokenizer.decode(seq + [token], skip_special_tokens=False)
        pieces.append(after[len(before):] if after.startswith(before) else tokenizer.decode([token]))
        seq = (seq + [token])[-PIECE_WINDOW:]
    return pieces


def _round_text(rnd: Round, context: list[int], tokenizer) -> Text:
    accepted = list(rnd.drafted[: rnd.accepted])
    text = Text()
    for piece in token_pieces(tokenizer, context, accepted):
        text.append(piece, style=ACCEPTED)
    after = context + accepted
    for piece in token_pieces(tokenizer, after, list(rnd.rejected)):
        text.append(piece, style=REJECTED)
    if rnd.token is not None:
        text.append(token_pieces(tokenizer, after, [rnd.token])[0], style=BONUS if rnd.bonus else TARGET)
    return text


def rounds_view(result: GenerationResult, prompt_ids: list[int], tokenizer) -> Text:
    """The output rebuilt round by round in the debug colours."""
    text, context = Text(), list(prompt_ids)
    for rnd in result.trace:
        text.append_text(_round_text(rnd, context, tokenizer))
        context += list(rnd.drafted[: rnd.accepted]) + ([rnd.token] if rnd.token is not None else [])
    return text


def legend() -> Text:
    text = Text("debug colours: ")
    for label, style in (("accepted draft", ACCEPTED), ("rejected draft", REJECTED),
                         ("target token", TARGET), ("bonus token (all drafts accepted)", BONUS)):
        text.append(label, style=style)
        text.append("  ")
    return text


# ----------------------------------------------------------- comparison table

def comparison_table(prompt_run: PromptRun) -> Table:
    """Speedup over target AR for each strategy and, under greedy, identity."""
    table = Table(title=Text("Comparison"), title_justify="left", show_edge=False, pad_edge=False)
    for header, justify in (("strategy", "left"), ("tokens", "right"), ("seconds", "right"),
                            ("tokens/s", "right"), ("speedup", "right"),
                            ("identical", "center"), ("first divergence", "right")):
        table.add_column(Text(header), justify=justify)
    for run in prompt_run.runs:
        table.add_row(*(Text(cell) for cell in _comparison_cells(prompt_run, run)),
                      style=STRATEGY_COLOURS[run.key])
    notes = ["speedup = tokens/s over target AR's tokens/s"]
    if prompt_run.baseline() is None:
        notes = ["speedup and identity need a complete target AR run (/target)"]
    elif not prompt_run.greedy:
        notes.append("identity is checked under greedy only: sampled outputs differ by design")
    else:
        notes.append("identical / first divergence: token ids compared with target AR")
    table.caption = Text("; ".join(notes))
    table.caption_justify = "left"
    return table


def _comparison_cells(prompt_run: PromptRun, run: StrategyRun) -> list[str]:
    if run.result is None:
        return [run.label, "-", "-", "-", "n/a", "n/a", "-"]
    r = run.result
    speedup = prompt_run.speedup(run)
    return [
        run.label + (" (interrupted)" if r.interrupted else ""),
        str(len(r.tokens)),
        f"{r.seconds:.2f}",
        f"{r.tokens_per_second:.1f}",
        f"{speedup:.2f}x" if speedup is not None else "n/a",
        *_identity_cells(prompt_run, run),
    ]


def _identity_cells(prompt_run: PromptRun, run: StrategyRun) -> tuple[str, str]:
    """(identical, first divergence) cells; the target AR row is the baseline."""
    if run.key == "target" and run.usable:
        return "baseline", "-"
    identical, index = prompt_run.divergence(run)
    if identical is None:
        return "n/a", "-"
    return ("yes" if identical else "no"), ("-" if index is None else f"token {index}")


# ---------------------------------------------------------- settings and help

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
                            ("device", str(pair.device)), ("context length", str(pair.context_length)),
                            ("vocabulary", str(pair.vocab_size))):
            table.add_row(Text(name), Text(str(value), style="bold"), Text(""))
    return table


def help_table(topic: str | None = None) -> Table:
    table = Table(show_header=False, show_edge=False, pad_edge=False, box=None)
    table.add_column(Text("usage"), style="bold")
    table.add_column(Text("help"))
    commands = [COMMANDS[topic]] if topic else list(COMMANDS.values())
    for command in commands:
        table.add_row(Text(command.usage), Text(command.help))
        if topic and command.flag:
            table.add_row(Text(""), Text(f"also a command-line flag: {command.flag_usage}", style="dim"))
    return table


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
                          (("speculative", "spec"), ("ngram", "nasd"), ("target", "target"),
                           ("drafter", "drafter")))
    toggles = " ".join(f"{mark(getattr(settings, k))}{k}" for k in ("cache", "chat", "debug"))
    reset = " reset" if settings.reset_in_between else " keep"
    return (f" gamma {settings.gamma} | length {settings.length} | {settings.processor.describe()} | "
            f"{strategies} | ngram {settings.ngram_storage} {settings.ngram_n} filler "
            f"{settings.top_k_filler}{reset} | {toggles} | seed {settings.seed}")
