"""Acceptance statistics from a run's rounds.

Every function takes rounds as :class:`generation.result.Round` objects or as
the dicts a trace file holds (``{"drafted": [...], "accepted": k, ...}``), so a
replayed trace gives the same numbers as the live run.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping


def _get(rnd: Any, name: str, default=None):
    if isinstance(rnd, Mapping):
        return rnd.get(name, default)
    return getattr(rnd, name, default)


def round_counts(rnd: Any) -> tuple[int, int]:
    """(drafted, accepted) counts of one round, from a Round or its dict."""
    drafted = _get(rnd, "drafted", ()) or ()
    return len(drafted), int(_get(rnd, "accepted", 0) or 0)


def acceptance_by_position(rounds: Iterable[Any]) -> list[float]:
    """P(draft i accepted | the target judged draft i).

    Position i counts the rounds whose draft reached position i and whose
    earlier drafts were all accepted (the target only judges draft i when
    drafts 0..i-1 passed); of those, the share that accepted draft i. The list
    is as long as the longest draft; a position no round reached is left out.
    """
    reached: list[int] = []
    passed: list[int] = []
    for rnd in rounds:
        drafted, accepted = round_counts(rnd)
        # Judged positions: 0..accepted (the first rejected one included), within
        # the draft; a round cut short inside its accepted drafts (an end token or
        # the length budget, token None) never judged the drafts after the cut.
        cut = _get(rnd, "token", 0) is None and accepted < drafted
        judged = accepted if cut else min(drafted, accepted + 1)
        while len(reached) < judged:
            reached.append(0)
            passed.append(0)
        for i in range(judged):
            reached[i] += 1
            passed[i] += i < accepted
    return [p / n for p, n in zip(passed, reached) if n]


def accepted_length_histogram(rounds: Iterable[Any]) -> list[int]:
    """Index i: how many drafting rounds accepted exactly i drafts.

    Only rounds that drafted at least one token count; the list runs to the
    longest accepted length seen (empty when no round drafted).
    """
    counts: list[int] = []
    for rnd in rounds:
        drafted, accepted = round_counts(rnd)
        if drafted == 0:
            continue
        while len(counts) <= accepted:
            counts.append(0)
        counts[accepted] += 1
    return counts


def mean_accepted_length(rounds: Iterable[Any]) -> float:
    """Mean accepted drafts per drafting round (0.0 when no round drafted)."""
    histogram = accepted_length_histogram(rounds)
    total = sum(histogram)
    return sum(i * n for i, n in enumerate(histogram)) / total if total else 0.0
