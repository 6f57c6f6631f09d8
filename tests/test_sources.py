"""Where a match drafter's drafts came from and how long they were (``analysis.sources``),
on hand-built rounds with exact counts."""

from __future__ import annotations

from dataclasses import asdict

import pytest

import analysis.sources
from analysis.sources import (
    NO_MATCH,
    by_match_length,
    by_source,
    draft_lengths,
    drafter_chose_lengths,
    length_summary,
    mean_match_length,
    quantile,
    source_numbers,
)
from generation.result import Round


def note(source: str, match: int) -> dict:
    return {"source": source, "match": match}


ROUNDS = [
    Round((1, 2, 3), 2, 9, False, gamma=4, note=note("prompt", 5)),
    Round((1, 2, 3, 4), 4, 9, True, gamma=4, note=note("prompt", 7)),
    Round((1,), 0, 9, False, gamma=4, note=note("global", 1)),
    Round((), 0, 9, False, gamma=4, note=note("", 0)),
    # a tree round: 5 nodes verified, one accepted along the path
    Round((1, 2), 1, 9, False, gamma=4, tree_tokens=(1, 2, 3, 4, 5), tree_parents=(-1, 0, -1, 1, 2),
          path=(0,), ranks=(0,), note=note("global", 3)),
    Round((), 0, 9, False, gamma=4, note=note("", 0)),
    Round((), 0, 9, False, gamma=0),                 # the budget's last token: asked for nothing, no note
]
EXPECTED = {
    "prompt": dict(rounds=2, drafting_rounds=2, drafted=7, accepted=6, acceptance_rate=6 / 7,
                   mean_acceptance_length=4.0, mean_match_length=6.0),
    "global": dict(rounds=2, drafting_rounds=2, drafted=6, accepted=1, acceptance_rate=1 / 6,
                   mean_acceptance_length=1.5, mean_match_length=2.0),
    NO_MATCH: dict(rounds=2, drafting_rounds=0, drafted=0, accepted=0, acceptance_rate=0.0,
                   mean_acceptance_length=1.0, mean_match_length=0.0),
}


def same(got: dict, expected: dict) -> bool:
    """{source: counts} equal, the rates to rounding."""
    return set(got) == set(expected) and all(got[s] == pytest.approx(expected[s]) for s in expected)


def _sources_by_hand_hold() -> bool:
    return same({source: counts.to_dict() for source, counts in by_source(ROUNDS).items()}, EXPECTED)


def test_rounds_by_source_with_exact_counts(monkeypatch):
    assert _sources_by_hand_hold()
    assert list(by_source(ROUNDS)) == ["prompt", "global", NO_MATCH]      # as they first appear, no match last
    # Mutation check: a tree round counted by its recorded chain (2) instead of the 5 nodes it verified.
    monkeypatch.setattr(analysis.sources, "drafted_count", lambda rnd: len(rnd.drafted))
    assert not _sources_by_hand_hold()


def test_match_length_and_the_distribution_of_draft_lengths():
    assert mean_match_length(ROUNDS) == pytest.approx((5 + 7 + 1 + 3) / 4)   # over the rounds that matched
    lengths = draft_lengths(ROUNDS)
    assert lengths == {0: 3, 1: 1, 3: 1, 4: 1, 5: 1}                         # every round, 0 included
    # sorted lengths 0 0 0 1 3 4 5: nearest rank ceil(q * 7)
    assert (quantile(lengths, 0.1), quantile(lengths, 0.5), quantile(lengths, 0.9)) == (0, 1, 5)
    assert quantile({2: 1, 7: 1}, 0.5) == 2 and quantile({2: 1, 7: 1}, 0.51) == 7
    assert length_summary(lengths) == {"rounds_by_length": {"0": 3, "1": 1, "3": 1, "4": 1, "5": 1},
                                       "mean": pytest.approx(13 / 7), "p10": 0, "p50": 1, "p90": 5, "max": 5}
    assert length_summary({}) == {"rounds_by_length": {}, "mean": 0.0, "max": 0}


def test_trace_dicts_give_the_same_numbers_and_other_drafters_none():
    numbers = source_numbers(ROUNDS)
    assert source_numbers([asdict(r) for r in ROUNDS]) == numbers
    assert same(numbers["draft_sources"], EXPECTED)
    assert drafter_chose_lengths(ROUNDS)
    plain = [Round((1, 2), 1, 9, False, gamma=2), Round((), 0, 9, False)]
    assert not drafter_chose_lengths(plain) and source_numbers(plain) is None
    assert mean_match_length([Round((), 0, 9, False, note=note("", 0))]) is None


def test_acceptance_by_match_length_with_exact_counts(monkeypatch):
    rounds = ROUNDS + [
        Round((4, 5), 0, 9, False, gamma=4, note=note("prompt", 1)),       # a second 1-token match, rejected
        Round((6, 7), 1, 9, False, gamma=4, note=note("context", 20)),     # a long match (17+)
        Round((8,), 1, None, False, gamma=4, note=note("prompt", 2)),      # cut by an end token: first draft taken
        Round((1, 2, 3), 1, 9, False, gamma=3, note=note("model", 9)),    # a hybrid's model round: not copied
    ]
    table = by_match_length(rounds)
    # in bucket order; the tree round (match 3) counts its 5 verified nodes; no-match rounds are left out
    assert list(table) == ["1", "2", "3", "5-8", "17+"]
    assert table["1"] == dict(rounds=2, drafted=3, accepted=0, acceptance=0.0, first_taken=0.0)
    assert table["2"] == dict(rounds=1, drafted=1, accepted=1, acceptance=1.0, first_taken=1.0)
    assert table["3"] == dict(rounds=1, drafted=5, accepted=1, acceptance=0.2, first_taken=1.0)
    assert table["5-8"] == pytest.approx(dict(rounds=2, drafted=7, accepted=6, acceptance=6 / 7, first_taken=1.0))
    assert table["17+"] == dict(rounds=1, drafted=2, accepted=1, acceptance=0.5, first_taken=1.0)
    assert by_match_length([asdict(r) for r in rounds]) == table          # a trace replays the same
    assert source_numbers(rounds)["acceptance_by_match"] == table
    # Mutation check: the hybrid's model round counted as a copied one would join the 9-16 bucket.
    monkeypatch.setattr(analysis.sources, "round_kind", lambda note: "retrieval")
    assert "9-16" in by_match_length(rounds)
