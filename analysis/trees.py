"""What a token tree bought: per-depth acceptance, which ranked child was taken, and the best budget.

From a run's tree rounds: acceptance by depth, and the share of rounds r[i][k] that took the rank-k
child at depth i (a rank > 0 child *saved* a round a chain would have stopped). The model (a comb,
after SpecInfer's and Sequoia's analysis): k_i children at depth i continue with probability
c_i(k_i) = r[i][0] + ... + r[i][k_i - 1], so a round yields E = 1 + sum_i prod_{j<=i} c_j(k_j) for
sum_i k_i nodes; nodes go where they add most to E, and the best budget maximises E per second.
"""

from __future__ import annotations

from typing import Any, Sequence

from analysis.acceptance import _get


def tree_rounds(rounds) -> list:
    return [r for r in rounds or [] if _get(r, "tree_tokens")]


def _has_children(rnd, node: int) -> bool:
    return node in tuple(_get(rnd, "tree_parents", ()))


def rank_counts(rounds) -> list[tuple[list[int], int]]:
    """Per depth i: (rounds that took the rank-k child, for each k), rounds that reached depth i."""
    table: list[tuple[list[int], int]] = []
    for rnd in tree_rounds(rounds):
        path, ranks = list(_get(rnd, "path", ())), list(_get(rnd, "ranks", ()))
        for depth in range(len(path) + 1):
            above = path[depth - 1] if depth else -1
            if not _has_children(rnd, above):
                break
            while len(table) <= depth:
                table.append(([], 0))
            taken, reached = table[depth]
            if depth < len(ranks):
                rank = ranks[depth]
                taken = taken + [0] * (rank + 1 - len(taken))
                taken[rank] += 1
            table[depth] = (taken, reached + 1)
    return table


def rank_rates(rounds) -> list[list[float]]:
    """r[i][k]: the share of rounds reaching depth i that went on through the rank-k child."""
    return [[t / reached for t in taken] for taken, reached in rank_counts(rounds)]


def tree_summary(rounds, *, tokens: int = 0, target_calls: int = 0) -> dict | None:
    """The numbers /stats and the JSON show for a run with trees (None without tree rounds)."""
    rounds = tree_rounds(rounds)
    if not rounds:
        return None
    counts = rank_counts(rounds)
    by_rank: dict[int, int] = {}
    for rnd in rounds:
        for rank in _get(rnd, "ranks", ()):
            by_rank[rank] = by_rank.get(rank, 0) + 1
    saved = sum(1 for rnd in rounds if any(rank > 0 for rank in _get(rnd, "ranks", ())))
    return dict(
        rounds=len(rounds),
        mean_nodes=sum(len(_get(r, "tree_tokens")) for r in rounds) / len(rounds),
        mean_accepted_depth=sum(len(_get(r, "path", ())) for r in rounds) / len(rounds),
        acceptance_by_depth=[[sum(taken), reached] for taken, reached in counts],
        taken_by_rank={str(k): v for k, v in sorted(by_rank.items())},
        rounds_saved_by_rank_above_0=saved,
        tokens_per_target_call=tokens / target_calls if target_calls else 0.0,
    )


# ------------------------------------------------------------- speedup model

def _continue(rates: Sequence[Sequence[float]], depth: int, k: int) -> float:
    """c_i(k): the chance the path goes on at ``depth`` when k ranked children are offered."""
    if k <= 0 or not rates:
        return 0.0
    row = rates[depth] if depth < len(rates) else rates[-1]
    return min(1.0, sum(row[:k]))


def comb_tokens(rates: Sequence[Sequence[float]], widths: Sequence[int]) -> float:
    """E = 1 + sum_i prod_{j<=i} c_j(k_j) for the children offered per depth."""
    total, reach = 1.0, 1.0
    for depth, k in enumerate(widths):
        reach *= _continue(rates, depth, k)
        total += reach
    return total


def allot(rates: Sequence[Sequence[float]], nodes: int, depth: int) -> list[int]:
    """Children per depth for a budget of ``nodes``: each node goes where it adds most to E."""
    widths = [0] * depth
    for _ in range(nodes):
        best, gain = None, -1.0
        base = comb_tokens(rates, widths)
        for i in range(depth):
            if i > 0 and widths[i - 1] == 0:
                break
            trial = widths.copy()
            trial[i] += 1
            g = comb_tokens(rates, trial) - base
            if g > gain + 1e-12:
                best, gain = i, g
        if best is None:
            break
        widths[best] += 1
    return widths


def predicted_tree(rates, nodes: int, depth: int, verify_s, draft_s: float) -> tuple[float, float]:
    """(expected tokens per round, predicted speedup over one-token target steps); ``draft_s``:
    drafting seconds per round (one drafter forward per level)."""
    tokens = comb_tokens(rates, allot(rates, nodes, depth)) if nodes else 1.0
    round_s = verify_s(nodes + 1) + (draft_s if nodes else 0.0)
    return tokens, tokens * verify_s(1) / round_s


def best_tree(rates, depth: int, verify_s, draft_s: float,
              budgets: Sequence[int] = (0, 1, 2, 4, 8, 16, 32, 64)) -> tuple[int, float]:
    """The budget (0: plain steps) with the highest predicted speedup, and that speedup."""
    scored = [(predicted_tree(rates, n, depth, verify_s, draft_s)[1], -n, n) for n in budgets]
    speedup, _, n = max(scored)
    return n, speedup


def tree_model(result: Any, ar_step_s: float | None = None) -> dict | None:
    """The tree speedup model on a run's own rank rates, verify costs by width
    (``analysis.speedup.costs_from_result``) and drafting seconds: ``best_nodes`` (0: plain steps pay
    best), ``best_nodes_speedup``, ``model_depth`` and ``predicted_speedup_at_budget``; None without
    timed tree rounds."""
    from analysis.speedup import costs_from_result

    rounds = tree_rounds(_get(result, "trace", None))
    costs = costs_from_result(result, ar_step_s=ar_step_s)
    if not rounds or costs is None:
        return None
    steady = rounds[1:] if len(rounds) > 1 else rounds       # the first carries the prefill
    draft_s = sum(float(_get(r, "draft_s", 0.0) or 0.0) for r in steady) / len(steady)
    rates = rank_rates(rounds)
    depth = max(int(_get(r, "gamma", 0) or 0) for r in rounds) or len(rates)
    own = int(_get(result, "tree", 0) or 0)
    budgets = sorted({0, 1, 2, 4, 8, 16, 32, 64, own})
    per_round = draft_s + costs.other_per_round_s
    try:
        best, speedup = best_tree(rates, depth, costs.target_call, per_round, budgets)
        mine = predicted_tree(rates, own, depth, costs.target_call, per_round)[1] if own else None
    except ValueError:  # costs that cannot price a round
        return None
    return dict(best_nodes=best, best_nodes_speedup=speedup, model_depth=depth, predicted_speedup_at_budget=mine)
