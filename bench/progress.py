"""The benchmark's progress: a bar on a terminal, one plain line per finished run elsewhere.

rich draws its bar only on a terminal; on a log file or a pipe it prints nothing, so a long
run would be silent there. :func:`run_progress` picks by the console.
"""

from __future__ import annotations

from rich.progress import (
    BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn,
)

from bench.records import RunRecord


def run_line(done: int, total: int, record: RunRecord) -> str:
    """``[12/98] speculative@4 · writing/1 · repeat 1 · 3.2 s`` (a run under a second in ms)."""
    where = "warm-up" if record.repeat < 0 else f"repeat {record.repeat + 1}"
    took = f"{record.seconds:.1f} s" if record.seconds >= 1 else f"{1000 * record.seconds:.0f} ms"
    return f"[{done}/{total}] {record.variant} · {record.prompt_id} · {where} · {took}"


class RunBar:
    """rich's progress bar: what runs now, and how many of the planned runs finished."""

    def __init__(self, console, total: int):
        self.progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TimeRemainingColumn(), console=console)
        self.task = self.progress.add_task("starting", total=total)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def describe(self, text: str) -> None:
        self.progress.update(self.task, description=text)

    def grow(self, total: int) -> None:
        self.progress.update(self.task, total=total)

    def finished(self, record: RunRecord) -> None:
        self.progress.advance(self.task)


class RunLines:
    """One line per finished run (:func:`run_line`), for a console that is not a terminal."""

    def __init__(self, console, total: int):
        self.console, self.total, self.done = console, total, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def describe(self, text: str) -> None:
        pass

    def grow(self, total: int) -> None:
        self.total = total

    def finished(self, record: RunRecord) -> None:
        self.done += 1
        self.console.print(run_line(self.done, self.total, record), highlight=False, soft_wrap=True)


def run_progress(console, total: int) -> RunBar | RunLines:
    """A bar when ``console`` is a terminal, else a line per run."""
    return RunBar(console, total) if console.is_terminal else RunLines(console, total)
