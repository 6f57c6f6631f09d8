"""Tree statistics and the tree speedup model on hand-built rounds; the storages'
several continuations and the token-recycling table."""

import pytest

from analysis.trees import allot, best_tree, comb_tokens, rank_counts, tree_summary
from generation.result import Round
from ngram_assisted import NGramStorage, RecyclingStorage


def tree_round(path, ranks, parents):
    return Round(drafted=(), accepted=len(path), token=1, bonus=False, gamma=3,
                 tree_tokens=tuple(range(len(parents))), tree_parents=tuple(parents),
                 path=tuple(path), ranks=tuple(ranks))


# Root children 0 (rank 0), 1 (rank 1); node 2 under 0.
PARENTS = (-1, -1, 0)
ROUNDS = [tree_round([0, 2], [0, 0], PARENTS),     # depth 2 through first choices
          tree_round([1], [1], PARENTS),           # second choice saved the round; node 1 has no children
          tree_round([], [], PARENTS)]             # nothing accepted


def test_rank_counts_and_summary():
    # Depth 2 had no candidates in any round, so it is not counted.
    assert rank_counts(ROUNDS) == [([1, 1], 3), ([1], 1)]
    stats = tree_summary(ROUNDS, tokens=6, target_calls=3)
    assert stats["acceptance_by_depth"] == [[2, 3], [1, 1]]
    assert stats["taken_by_rank"] == {"0": 2, "1": 1}
    assert stats["rounds_saved_by_rank_above_0"] == 1
    assert stats["tokens_per_target_call"] == 2.0


def test_comb_model_prefers_width_where_it_pays():
    rates = [[0.5, 0.3], [0.9]]
    assert comb_tokens(rates, [1, 1]) == pytest.approx(1 + 0.5 + 0.45)
    assert comb_tokens(rates, [2, 1]) == pytest.approx(1 + 0.8 + 0.72)
    assert allot(rates, 3, 2) == [2, 1]
    # Flat verify cost: more nodes never hurt; a steep one makes plain steps best.
    assert best_tree(rates, 2, lambda w: 1.0, 0.0)[0] >= 3
    assert best_tree(rates, 2, lambda w: float(w), 0.0)[0] == 0


def test_storage_offers_ranked_continuations():
    s = NGramStorage(2, 10)
    s.initialize([1, 2, 1, 3, 1, 2, 1, 4])
    got, known = s.top_tokens([1], 3)
    assert known and [t for t, _ in got] == [2, 3, 4]
    assert sum(w for _, w in got) == pytest.approx(1.0) and got[0][1] == pytest.approx(0.5)


def test_recycling_rows_are_replaced_by_the_latest_top_k():
    s = RecyclingStorage(2, 10, width=2)
    s.initialize([1, 2])
    assert s.next_token([1]) == (2, True)
    s.fill([5, 1], [7, 8, 9])
    assert [t for t, _ in s.top_tokens([1], 3)[0]] == [7, 8]
    s.update([1], [3])                       # text does not overwrite a row the target filled
    assert s.next_token([1]) == (7, True)
