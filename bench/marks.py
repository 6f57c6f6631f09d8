"""What a benchmark's figures stand on: the runs that finished when it stopped part-way, and how
busy the machine was. Pure functions over run records; the header, summary.md, the chart's title
and bench.json carry their lines and dicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.records import RunRecord
from utils.machine_load import BUSY_CORES

# A coverage line names at most this many prompts (bench.json has them all).
NAMED = 8


@dataclass(frozen=True)
class Coverage:
    """The timed runs of a stopped benchmark: how many finished of how many planned, and per
    repeat which prompts every variant finished (``complete``) and which some of them did
    (``partial``: prompt -> how many variants)."""

    finished: int
    planned: int
    prompts: tuple[str, ...]          # the planned prompts (every step of every session), in run order
    variants: int
    complete: dict[int, tuple[str, ...]]
    partial: dict[int, dict[str, int]]


def coverage(records: Sequence[RunRecord], prompts: Sequence[str], variants: int, planned: int) -> Coverage:
    """The coverage of ``records`` (the finished timed runs) against the plan: ``prompts`` (ids in
    run order), ``variants`` run on each, ``planned`` timed runs in all."""
    done: dict[int, dict[str, set[str]]] = {}
    for r in records:
        done.setdefault(r.repeat, {}).setdefault(r.prompt_id, set()).add(r.variant)
    complete, partial = {}, {}
    for repeat, by_prompt in sorted(done.items()):
        complete[repeat] = tuple(p for p in prompts if len(by_prompt.get(p, ())) >= variants)
        partial[repeat] = {p: len(by_prompt[p]) for p in prompts if 0 < len(by_prompt.get(p, ())) < variants}
    return Coverage(len(records), planned, tuple(prompts), variants, complete, partial)


def _names(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:NAMED])
    return shown + (f", … ({len(ids) - NAMED} more)" if len(ids) > NAMED else "")


def _repeat_text(c: Coverage, repeats: list[int]) -> str:
    """``repeats 1-2 on all 6 prompts`` or ``repeat 3 on 2 of 6 prompts (a, b), c by 4 of 10 variants``."""
    first, last = repeats[0] + 1, repeats[-1] + 1
    which = f"repeat {first}" if first == last else f"repeats {first}-{last}"
    complete, partial = c.complete[repeats[0]], c.partial[repeats[0]]
    total = len(c.prompts)
    text = f"{which} on all {total} prompts" if len(complete) == total else \
        f"{which} on {len(complete)} of {total} prompts" + (f" ({_names(complete)})" if complete else "")
    for prompt, count in partial.items():
        text += f", {prompt} by {count} of {c.variants} variants"
    return text


def coverage_line(c: Coverage) -> str:
    """``interrupted: 17 of 42 runs; ...`` saying on which prompts each repeat's ratios stand
    (every ratio pairs the runs both its sides finished: ``bench.aggregate.common_runs``)."""
    groups: list[list[int]] = []
    for repeat in c.complete:
        same = groups and c.complete[groups[-1][-1]] == c.complete[repeat] and not c.partial[repeat] \
            and not c.partial[groups[-1][-1]] and repeat == groups[-1][-1] + 1
        if same:
            groups[-1].append(repeat)
        else:
            groups.append([repeat])
    parts = "; ".join(_repeat_text(c, g) for g in groups) or "no run finished"
    return f"interrupted: {c.finished} of {c.planned} runs; each ratio pairs the runs both its sides finished: {parts}"


def coverage_dict(c: Coverage) -> dict:
    """The JSON of a stopped benchmark's coverage (repeats 0-based, as in ``runs``)."""
    return {
        "runs": c.finished, "planned": c.planned, "line": coverage_line(c),
        "by_repeat": [{"repeat": repeat, "prompts": list(c.complete[repeat]), "partial": c.partial[repeat]}
                      for repeat in c.complete],
    }


def busy_runs(records: Sequence[RunRecord]) -> int:
    return sum(r.busy for r in records)


def busy_line(records: Sequence[RunRecord]) -> str | None:
    """One warning line when some run ran while other processes took more than
    ``utils.machine_load.BUSY_CORES`` cores' worth of CPU (its ``busy`` mark), else None."""
    busy = busy_runs(records)
    if not busy:
        return None
    cores = "one core" if BUSY_CORES == 1 else f"{BUSY_CORES:g} cores"
    return (f"busy machine: {busy} of {len(records)} runs ran while other processes used more than {cores}; "
            "their times are slower than this machine's own, and the ratios that pair them may be off "
            "(each run's other_load in bench.json and runs.csv)")
