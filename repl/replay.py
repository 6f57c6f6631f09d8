"""``infer.py --replay FILE``: show a trace file the way the session showed it (panels, comparison,
/stats, the inspector). Imports neither torch nor a tokenizer: a trace carries everything it needs."""

from __future__ import annotations

from rich.console import Console
from rich.rule import Rule
from rich.text import Text

from repl import render
from repl.inspect_view import NO_NUMBERS, default_round, has_numbers, round_view
from repl.runs import PromptRun
from repl.stats_view import stats_view
from repl.trace import Trace


def show_inspector(prompt_run: PromptRun, console: Console) -> None:
    """Per drafting run, the round /inspect shows by default, with the trace's token text."""
    def text_of(token: int) -> str:
        return prompt_run.token_text.get(token, f"<id {token}>")

    for run in prompt_run.runs:
        if not run.drafting or run.result is None:
            continue
        if not has_numbers(run):
            console.print(Text(NO_NUMBERS.format(label=run.label), style="yellow"))
            continue
        index = default_round(run.result.trace)
        if index is None:
            console.print(Text(f"inspector: {run.label} drafted nothing on this prompt", style="dim"))
        else:
            console.print(Text(f"inspector (in a session: /inspect {run.key} {index + 1})", style="dim"))
            console.print(round_view(run, index, text_of))


def show_trace(trace: Trace, console: Console) -> None:
    header = f"replay of a trace recorded {trace.created}" if trace.created else "replay of a trace"
    console.print(Text(header, style="bold"))
    for line in render.environment_lines(trace.environment):
        console.print(Text(line, style="bold"))
    for note in trace.notes:
        console.print(Text(note, style="yellow"), soft_wrap=True)  # one line, however narrow
    for index, prompt_run in enumerate(trace.prompts, start=1):
        console.print(Rule(Text(f"prompt {index} of {len(trace.prompts)}")))
        console.print(Text(prompt_run.prompt))
        console.print(Text(render.prompt_line(prompt_run), style="dim"))
        console.print(render.legend())
        for run in prompt_run.runs:
            console.print(render.strategy_panel(run, prompt_run.prompt_ids, None, debug=True,
                                                prompt_run=prompt_run))
        if prompt_run.runs:
            console.print(render.comparison_table(prompt_run, console.width))
            busy = render.busy_line(prompt_run)
            if busy is not None:
                console.print(Text(busy, style="yellow"))
            console.print(stats_view(prompt_run))
            show_inspector(prompt_run, console)
        if prompt_run.interrupted:
            console.print(Text("this prompt was interrupted: later strategies did not run", style="yellow"))
