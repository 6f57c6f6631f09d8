"""``infer.py --replay FILE``: show a trace file the way the session showed it.

Every prompt gets its panels (with the debug view, from the token pieces the
trace stores), the comparison table and the /stats view. Imports neither
torch nor a tokenizer: a trace carries everything it needs.
"""

from __future__ import annotations

from rich.console import Console
from rich.rule import Rule
from rich.text import Text

from repl import render
from repl.trace import Trace


def show_trace(trace: Trace, console: Console) -> None:
    header = f"replay of a trace recorded {trace.created}" if trace.created else "replay of a trace"
    console.print(Text(header, style="bold"))
    for line in render.environment_lines(trace.environment):
        console.print(Text(line, style="bold"))
    for index, prompt_run in enumerate(trace.prompts, start=1):
        console.print(Rule(Text(f"prompt {index} of {len(trace.prompts)}")))
        console.print(Text(prompt_run.prompt))
        console.print(Text(render.prompt_line(prompt_run), style="dim"))
        console.print(render.legend())
        for run in prompt_run.runs:
            console.print(render.strategy_panel(run, prompt_run.prompt_ids, None, debug=True,
                                                prompt_run=prompt_run))
        if prompt_run.runs:
            console.print(render.comparison_table(prompt_run))
            console.print(render.stats_view(prompt_run))
        if prompt_run.interrupted:
            console.print(Text("this prompt was interrupted: later strategies did not run", style="yellow"))
