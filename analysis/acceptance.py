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


def verify_width(rnd: Any) -> int:
    """Tokens the target's verify forward took in this round: a chain round feeds
    its drafts plus the last committed token (``len(drafted) + 1``); a tree round
    feeds every node of its tree plus that token (``tree_size + 1``), although its
    ``drafted`` records only the accepted path and the first-choice line below it."""
    tree = _get(rnd, "tree_tokens", ()) or ()
    if tree:
        return len(tree) + 1
    return len(_get(rnd, "drafted", ()) or ()) + 1


def position_counts(rounds: Iterable[Any], *, missing_is_rejection: bool = False) -> list[tuple[int, int]]:
    """(passed, reached) per draft position.

    Position i is reached when the target judged draft i: the round drafted it
    and accepted drafts 0..i-1 (a round cut short inside its accepted drafts,
    by an end token or the length budget, token None, never judged the drafts
    after the cut). It passed when draft i was accepted.

    ``missing_is_rejection``: a position the round asked for (its ``gamma``)
    but the drafter did not fill (an n-gram drafter with no match, a drafter
    that stopped early) counts as reached and not passed. That is what the
    speedup model needs: the chance that a round yields its (i+1)-th draft.
    """
    reached: list[int] = []
    passed: list[int] = []
    for rnd in rounds:
        drafted, accepted = round_counts(rnd)
        cut = _get(rnd, "token", 0) is None and accepted < drafted
        length = drafted
        if missing_is_rejection and not cut:
            length = max(drafted, int(_get(rnd, "gamma", 0) or 0))
        judged = accepted if cut else min(length, accepted + 1)
        while len(reached) < judged:
            reached.append(0)
            passed.append(0)
        for i in range(judged):
            reached[i] += 1
            passed[i] += i < accepted
    return list(zip(passed, reached))


def acceptance_by_position(rounds: Iterable[Any]) -> list[float]:
    """P(draft i accepted | the target judged draft i), for i = 0 .. longest draft - 1."""
    return [p / n for p, n in position_counts(rounds) if n]


def yield_by_position(rounds: Iterable[Any]) -> list[float]:
    """Like :func:`acceptance_by_position` over the rounds that drafted, but a
    draft the round asked for (its ``gamma``) and did not get counts as
    rejected: the chance that a drafting round yields its (i+1)-th draft, the
    rates the speedup model uses."""
    drafting = [rnd for rnd in rounds if round_counts(rnd)[0] > 0]
    return [p / n for p, n in position_counts(drafting, missing_is_rejection=True) if n]


def draft_share(rounds: Iterable[Any]) -> float:
    """The share of rounds that drafted at least one token (1.0 when there are no rounds).

    A model drafter drafts every round; an n-gram drafter only when its
    storage knows the context, and a gamma policy may choose not to draft.
    """
    counts = [round_counts(rnd)[0] > 0 for rnd in rounds]
    return sum(counts) / len(counts) if counts else 1.0


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
