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


# ---------------------------------------------------------------- the best tree in /stats and the JSON

def tree_prompt_run():
    """A tree run (budget 3, depth 3) beside target AR, its prediction known by hand.

    Rank rates: depth 0 [3/5, 1/5], depth 1 [2/3] (node 1 has no children). Target AR
    pays 0.06 s a token (width 1); each tree round after the first drafts for 0.02 s
    and verifies 3 nodes + 1 = width 4 in 0.1 s. A budget of 3 goes [2, 1, 0]:
    E = 1 + 0.8 + 0.8 * 2/3 = 7/3 tokens for 0.12 s, 7/6 of plain decoding. The
    rounds' ``drafted`` is empty: priced at drafted + 1 the tree would look free.
    """
    from generation.result import GenerationResult
    from repl.runner import PromptRun, StrategyRun
    from repl.settings import Settings

    paths = [([0, 2], [0, 0]), ([1], [1]), ([], []), ([0, 2], [0, 0]), ([0], [0])]
    rounds = [Round(drafted=(), accepted=len(p), token=1, bonus=False, gamma=3, draft_s=0.02,
                    verify_s=0.5 if i == 0 else 0.1, tree_tokens=(0, 1, 2), tree_parents=PARENTS,
                    path=tuple(p), ranks=tuple(r)) for i, (p, r) in enumerate(paths)]
    tree = GenerationResult(tokens=list(range(2, 12)), seconds=1.0, target_calls=5, drafted=15, accepted=6,
                            trace=rounds, tree=3, phases={"draft": 0.1, "verify": 0.9, "other": 0.0})
    ar = GenerationResult(tokens=list(range(2, 12)), seconds=0.84, target_calls=10,
                          trace=[Round((), 0, t, False, verify_s=0.3 if t == 2 else 0.06) for t in range(2, 12)],
                          phases={"draft": 0.0, "verify": 0.84, "other": 0.0})
    pr = PromptRun("p", [2, 3], greedy=True, settings=Settings(gamma=3).to_dict())
    pr.runs = [StrategyRun("speculative", tree, text="x"), StrategyRun("target", ar, text="x")]
    return pr


def _verify(width: int) -> float:
    """The measured line: 0.06 s at width 1, 0.1 s at width 4, extrapolated along it."""
    return 0.06 + (width - 1) * 0.04 / 3


def test_the_tree_model_in_stats_prices_the_measured_widths():
    from analysis.trees import rank_rates

    pr = tree_prompt_run()
    run = pr.runs[0]
    assert rank_rates(run.result.trace) == [pytest.approx([3 / 5, 1 / 5]), pytest.approx([2 / 3])]
    tree = pr.why(run).tree
    assert tree["model_depth"] == 3
    assert tree["predicted_speedup_at_budget"] == pytest.approx(7 / 6)
    budgets = (0, 1, 2, 3, 4, 8, 16, 32, 64)
    best, speedup = best_tree(rank_rates(run.result.trace), 3, _verify, 0.02, budgets)
    assert (tree["best_nodes"], tree["best_nodes_speedup"]) == (best, pytest.approx(speedup))
    # By hand: a 4th node goes to depth 2 ([2, 1, 1]): E = 7/3 + 0.8 * 2/3 * 2/3, for
    # 0.02 s + verify(5); a 5th adds nothing (no third rank measured, depth 3 is the cap).
    e4 = 7 / 3 + 0.8 * (2 / 3) ** 2
    assert best == 4 and speedup == pytest.approx(e4 * 0.06 / (0.02 + _verify(5)))


def test_stats_json_and_panel_show_the_best_tree_beside_the_best_gamma():
    from repl import render
    from repl.stats_view import stats_view
    from tests.helpers.repl import WordTokenizer, console

    pr = tree_prompt_run()
    entry = pr.to_dict()["strategies"]["speculative"]
    stats = entry["tree_stats"]
    assert stats["best_nodes"] == 4 and stats["predicted_speedup_at_budget"] == pytest.approx(7 / 6)
    assert stats["acceptance_by_depth"] == [[4, 5], [2, 3]] and "best_gamma" in entry
    assert "tree_stats" not in pr.to_dict()["strategies"]["target"]
    c, out = console()
    c.print(stats_view(pr))
    c.print(render.strategy_panel(pr.runs[0], pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    text = out.getvalue()
    assert any("best tree nodes (predicted)" in line and "4 (1.21x)" in line for line in text.splitlines())
    assert any("best γ (predicted)" in line for line in text.splitlines())
    joined = " ".join(line.strip("│ ") for line in text.splitlines())   # the panel wraps
    assert "best tree 4 nodes (1.21x; this run's budget 1.17x)" in joined
