"""A hybrid run's rounds by kind: how many the drafter model drafted, how many retrieval, and
each kind's acceptance (accepted drafts over drafted tokens), read from the rounds' notes.

Torch-free, like the rest of ``analysis``: a replayed trace gives the same numbers.
"""

from __future__ import annotations

from analysis.acceptance import drafted_count

KINDS = ("model", "retrieval")


def round_kind(note: dict | None) -> str | None:
    """``model`` for a round the drafter model drafted (its note's source is ``model``),
    ``retrieval`` for one a storage drafted, None for a round that asked for no drafts."""
    if not note:
        return None
    return "model" if note.get("source") == "model" else "retrieval"


def hybrid_summary(trace, min_match: int) -> dict:
    """``{"L": L, "rounds": {kind: n}, "drafted": {kind: n}, "accepted": {kind: n},
    "acceptance": {kind: accepted / drafted or None}}`` over ``trace`` (rounds with ``note``,
    ``drafted`` and ``accepted``), for the kinds ``model`` and ``retrieval``."""
    rounds = dict.fromkeys(KINDS, 0)
    drafted = dict.fromkeys(KINDS, 0)
    accepted = dict.fromkeys(KINDS, 0)
    for rnd in trace:
        kind = round_kind(rnd.note)
        if kind is None:
            continue
        rounds[kind] += 1
        drafted[kind] += drafted_count(rnd)
        accepted[kind] += rnd.accepted
    acceptance = {k: accepted[k] / drafted[k] if drafted[k] else None for k in KINDS}
    return {"L": min_match, "rounds": rounds, "drafted": drafted, "accepted": accepted, "acceptance": acceptance}
