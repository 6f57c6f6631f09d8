"""Where a model-free drafter's drafts came from, and how long they were.

The match drafters (docs/model_free.md) say per round which text they drafted from
(``Round.note = {"source": ..., "match": m}``). Read here: per source (``prompt``, ``global``,
``context``, ``corpus``, ``none``) the rounds, drafts, acceptance and mean match length; the
distribution of draft lengths the speedup model prices (``analysis.speedup.measured_mix``); and
acceptance by match length (:func:`by_match_length`), which decides whether copying pays. A round
that asked for no drafts counts under no source, at length 0; a tree round drafted every node.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from analysis.acceptance import _get, drafted_count, round_counts
from analysis.hybrid import round_kind

NO_MATCH = "none"  # the name a round whose note says source "" (nothing matched) is counted under
QUANTILES = (0.1, 0.5, 0.9)


def match_note(rnd: Any) -> Mapping | None:
    """The round's match note (``{"source", "match"}``), or None."""
    note = _get(rnd, "note", None)
    return note if isinstance(note, Mapping) and "source" in note else None


def drafter_chose_lengths(rounds: Iterable[Any]) -> bool:
    """True when a match drafter chose the draft lengths (some round carries its note):
    the speedup model then takes the measured distribution of draft lengths, not one γ."""
    return any(match_note(rnd) is not None for rnd in rounds)


@dataclass
class SourceCounts:
    """One source's rounds: ``rounds`` with its note, ``drafting_rounds`` of them drafted
    at least one token, ``drafted`` / ``accepted`` draft tokens, ``match`` the sum of
    their match lengths."""

    rounds: int = 0
    drafting_rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    match: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + (self.accepted / self.drafting_rounds if self.drafting_rounds else 0.0)

    @property
    def mean_match_length(self) -> float:
        return self.match / self.rounds if self.rounds else 0.0

    def to_dict(self) -> dict:
        return dict(rounds=self.rounds, drafting_rounds=self.drafting_rounds, drafted=self.drafted,
                    accepted=self.accepted, acceptance_rate=self.acceptance_rate,
                    mean_acceptance_length=self.mean_acceptance_length, mean_match_length=self.mean_match_length)


def by_source(rounds: Iterable[Any]) -> dict[str, SourceCounts]:
    """{source: its counts}, in the order the sources first appear; ``none`` last."""
    out: dict[str, SourceCounts] = {}
    for rnd in rounds:
        note = match_note(rnd)
        if note is None:
            continue
        counts = out.setdefault(str(note["source"]) or NO_MATCH, SourceCounts())
        drafted = drafted_count(rnd)
        counts.rounds += 1
        counts.drafting_rounds += drafted > 0
        counts.drafted += drafted
        counts.accepted += round_counts(rnd)[1] if drafted else 0
        counts.match += int(note.get("match", 0) or 0)
    if NO_MATCH in out:
        out[NO_MATCH] = out.pop(NO_MATCH)
    return out


# Match lengths grouped for the acceptance table: (label, shortest, longest); None: no bound.
MATCH_BUCKETS = (("1", 1, 1), ("2", 2, 2), ("3", 3, 3), ("4", 4, 4), ("5-8", 5, 8), ("9-16", 9, 16),
                 ("17+", 17, None))


def _match_bucket(match: int) -> str:
    for label, low, high in MATCH_BUCKETS:
        if match >= low and (high is None or match <= high):
            return label
    raise ValueError(f"a match length must be >= 1, got {match}")


def by_match_length(rounds: Iterable[Any]) -> dict[str, dict]:
    """{match-length bucket (:data:`MATCH_BUCKETS`): ``rounds``, ``drafted`` / ``accepted``, ``acceptance``
    and ``first_taken``} over the rounds that drafted copied tokens after a match, buckets in order."""
    raw: dict[str, list[int]] = {}
    for rnd in rounds:
        note = match_note(rnd)
        drafted = drafted_count(rnd)
        if note is None or round_kind(note) != "retrieval" or not drafted:
            continue
        match = int(note.get("match", 0) or 0)
        if match < 1:
            continue
        accepted = round_counts(rnd)[1]
        counts = raw.setdefault(_match_bucket(match), [0, 0, 0, 0])
        counts[0] += 1
        counts[1] += drafted
        counts[2] += accepted
        counts[3] += accepted > 0
    return {label: dict(rounds=c[0], drafted=c[1], accepted=c[2], acceptance=c[2] / c[1],
                        first_taken=c[3] / c[0])
            for label, _, _ in MATCH_BUCKETS if (c := raw.get(label))}


def mean_match_length(rounds: Iterable[Any]) -> float | None:
    """Mean match length over the rounds that matched (source not ""); None when none did."""
    matches = [int(note.get("match", 0) or 0) for note in map(match_note, rounds) if note and note["source"]]
    return sum(matches) / len(matches) if matches else None


def draft_lengths(rounds: Iterable[Any]) -> dict[int, int]:
    """{draft length k: rounds that drafted k tokens}, over every round (k = 0 included)."""
    counts: dict[int, int] = {}
    for rnd in rounds:
        k = drafted_count(rnd)
        counts[k] = counts.get(k, 0) + 1
    return dict(sorted(counts.items()))


def quantile(histogram: Mapping[int, int], q: float) -> int:
    """The q-quantile of a histogram of lengths, nearest rank: the smallest k with at
    least ceil(q * n) rounds at or below it."""
    n = sum(histogram.values())
    if not n:
        raise ValueError("no rounds")
    rank, seen = max(1, math.ceil(q * n)), 0
    for k, count in sorted(histogram.items()):
        seen += count
        if seen >= rank:
            return k
    raise AssertionError("unreachable: the ranks add up to n")


def length_summary(histogram: Mapping[int, int]) -> dict:
    """The draft-length distribution, JSON-ready: ``rounds_by_length`` (string keys),
    ``mean``, ``p10`` / ``p50`` / ``p90`` (nearest rank) and ``max``."""
    n = sum(histogram.values())
    if not n:
        return {"rounds_by_length": {}, "mean": 0.0, "max": 0}
    summary = {"rounds_by_length": {str(k): c for k, c in sorted(histogram.items())},
               "mean": sum(k * c for k, c in histogram.items()) / n}
    summary.update({f"p{round(q * 100)}": quantile(histogram, q) for q in QUANTILES})
    summary["max"] = max(histogram)
    return summary


def source_numbers(rounds: Iterable[Any]) -> dict | None:
    """Everything above, JSON-ready (what ``--json`` and trace files carry); None when
    no round carries a match note (any drafter but the match drafters)."""
    rounds = list(rounds)
    if not drafter_chose_lengths(rounds):
        return None
    return dict(draft_sources={source: counts.to_dict() for source, counts in by_source(rounds).items()},
                mean_match_length=mean_match_length(rounds),
                draft_lengths=length_summary(draft_lengths(rounds)),
                acceptance_by_match=by_match_length(rounds))


def fill_summary(rounds: Iterable[Any], verify_s: Mapping[int, float] | None = None) -> dict:
    """What filling verify widths did in a run (``generation.widths``): ``rounds`` filled,
    ``drafts`` added to them, ``accepted`` of those (kept beyond the draft's own length), and the
    measured forward ``verify_ms`` by width the choice rested on."""
    filled = drafts = accepted = 0
    for rnd in rounds:
        note = match_note(rnd)
        extra = int(note.get("filled", 0) or 0) if note is not None else 0
        if extra <= 0:
            continue
        own = max(0, drafted_count(rnd) - extra)          # what the match alone drafted
        filled, drafts = filled + 1, drafts + extra
        accepted += min(extra, max(0, int(_get(rnd, "accepted", 0)) - own))
    out = {"rounds": filled, "drafts": drafts, "accepted": accepted}
    if verify_s:
        out["verify_ms"] = {str(w): round(s * 1000, 3) for w, s in sorted(verify_s.items())}
    return out
