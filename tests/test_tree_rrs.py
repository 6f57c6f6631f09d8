"""Sampled token trees verified by recursive rejection sampling (``accept_tree_rrs``):
the output follows the target exactly, on hand-built distributions and through
the engine, and each part of the rule is needed (mutations below are caught)."""

from __future__ import annotations

import itertools
import zlib

import pytest
import torch

from generation.accept import accept_tree_rrs
from generation.tree import Tree
from generation.tree_draft import draw_children
from sampling import MultinomialProcessor, TopKProcessor
from tests.helpers.decode import speculative
from tests.helpers.distribution import (
    PROMPT,
    SAMPLES,
    V,
    chi_square_excess,
    exact_distribution,
    sample_counts,
)

W = 5            # vocabulary of the hand-built distributions
SHAPE = (3, 2)   # children per node at depth 0 and 1: the root gets 3, each of them 2
LENGTH = 3       # outputs are continued to this many tokens, as the next rounds would
TRIALS = 4000
SAMPLE = MultinomialProcessor().sample


def dist(kind: str, path: tuple[int, ...]) -> torch.Tensor:
    """A fixed distribution over W tokens for each path: the target's (p) or the drafter's (q)."""
    seed = zlib.crc32(repr((kind, path)).encode())
    g = torch.Generator().manual_seed(seed)
    # A flat p and a peaked q: first children are often rejected, so the later
    # ones, the residual and q's renormalisation all decide the output.
    scale = 0.5 if kind == "p" else 1.5
    return (torch.randn(W, generator=g) * scale).softmax(-1)


def draw_tree(g, top: bool = False) -> Tree:
    """Children drawn from q without replacement (the engine's ``draw_children``),
    or, with ``top``, q's most likely ones (a deterministic tree)."""
    tokens, parents, ranks, paths = [], [], [], {-1: ()}
    frontier = [-1]
    for count in SHAPE:
        nxt = []
        for node in frontier:
            q = dist("q", paths[node]).view(1, -1)
            if top:
                kids = [(t, 0.0) for t in q[0].topk(count).indices.tolist()]
            else:
                kids = draw_children(q, [count], g)[0]
            for rank, (token, _) in enumerate(kids):
                tokens.append(token)
                parents.append(node)
                ranks.append(rank)
                paths[len(tokens) - 1] = paths[node] + (token,)
                nxt.append(len(tokens) - 1)
        frontier = nxt
    return Tree(tuple(tokens), tuple(parents), tuple(ranks)), paths


def rows(tree: Tree, paths: dict, kind: str) -> torch.Tensor:
    return torch.stack([dist(kind, paths[node]) for node in range(-1, len(tree))])


def continued(tree, paths, deepest, token, g) -> tuple[int, ...]:
    """The round's output, continued by ancestral sampling from p to LENGTH tokens."""
    out = paths[deepest] + (token,)
    while len(out) < LENGTH:
        out += (SAMPLE(dist("p", out).view(1, -1), g).item(),)
    return out[:LENGTH]


def exact() -> dict:
    """P(first LENGTH tokens) under the target alone."""
    out = {}
    for seq in itertools.product(range(W), repeat=LENGTH):
        mass = 1.0
        for i, t in enumerate(seq):
            mass *= dist("p", seq[:i])[t].item()
        out[seq] = mass
    return out


def counts(rule=accept_tree_rrs, top: bool = False) -> dict:
    g = torch.Generator().manual_seed(5)
    seen: dict = {}
    for _ in range(TRIALS):
        tree, paths = draw_tree(g, top)
        _, deepest, token = rule(rows(tree, paths, "p"), rows(tree, paths, "q"), tree, SAMPLE, g)
        out = continued(tree, paths, deepest, token, g)
        seen[out] = seen.get(out, 0) + 1
    return seen


def test_recursive_rejection_sampling_keeps_the_target_distribution():
    assert chi_square_excess(counts(), exact(), TRIALS) < 5.0


def test_a_rejected_first_child_lets_a_later_one_through():
    """What the rule buys: a child of rank > 0 is accepted in some rounds."""
    g = torch.Generator().manual_seed(3)
    taken = set()
    for _ in range(300):
        tree, paths = draw_tree(g)
        depth, deepest, _ = accept_tree_rrs(rows(tree, paths, "p"), rows(tree, paths, "q"), tree, SAMPLE, g)
        taken.update(tree.ranks[i] for i in tree.path_to(deepest))
    assert taken >= {0, 1, 2}


def _rrs_variant(*, residual: bool = True, renormalise: bool = True):
    """The accept rule with one of its parts removed (for the mutation checks)."""

    def rule(p, q, tree, sample, g):
        node, depth = -1, 0
        while True:
            kids = tree.children(node)
            r = p[node + 1]
            if not kids:
                return depth, node, int(sample(r.view(1, -1), g)[0])
            q_left = q[node + 1].clone()
            kept = None
            for child in kids:
                token = tree.tokens[child]
                if torch.rand((), generator=g) < (r[token] / q_left[token]).clamp(max=1.0):
                    kept = child
                    break
                if residual:
                    rest = (r - q_left).clamp(min=0.0)
                    r = rest / rest.sum()
                q_left[token] = 0.0
                if renormalise:
                    q_left = q_left / q_left.sum()
            if kept is None:
                return depth, node, int(sample(r.view(1, -1), g)[0])
            node, depth = kept, depth + 1

    return rule


def test_the_reference_variant_is_the_rule_itself():
    """The mutations below change one part of this reimplementation, which passes whole."""
    assert chi_square_excess(counts(_rrs_variant()), exact(), TRIALS) < 5.0


@pytest.mark.parametrize("broken", [{"residual": False}, {"renormalise": False}], ids=str)
def test_each_part_of_the_rule_is_needed(broken):
    assert chi_square_excess(counts(_rrs_variant(**broken)), exact(), TRIALS) > 5.0


def test_children_must_be_drawn_not_picked():
    """Mutation: the rule on a tree of q's top children (not drawn) is biased."""
    assert chi_square_excess(counts(top=True), exact(), TRIALS) > 5.0


# ------------------------------------------------------------- the engine

def sampled_run(target, drafter, processor, sample=True):
    return lambda g: speculative(PROMPT, drafter, target, processor=processor, gamma=3, max_gen_len=3,
                                 generator=g, tree=6, tree_branch=2, tree_sample=sample)


def test_sampled_trees_reproduce_the_target_distribution(target, drafter):
    processor = TopKProcessor(1.0, 4)
    counts_ = sample_counts(sampled_run(target, drafter, processor))
    assert chi_square_excess(counts_, exact_distribution(target, processor), SAMPLES) < 5.0


def test_the_engine_runs_sampled_trees_and_takes_later_children(target, drafter):
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        results = [sampled_run(target, drafter, MultinomialProcessor(1.0))(g) for _ in range(100)]
    assert {r.tree_rule for r in results} == {"sampled"}
    rounds = [r for res in results for r in res.trace]
    assert any(r.tree_size > r.gamma for r in rounds)
    assert any(any(rank > 0 for rank in r.ranks) for r in rounds)


def test_greedy_ignores_the_sampled_rule(target, drafter):
    from sampling import GreedyProcessor

    result = sampled_run(target, drafter, GreedyProcessor())(None)
    assert result.tree_rule == "top"


def test_a_sampled_tree_holds_a_full_depth_first_drawn_line_and_spends_its_budget(target, drafter):
    """The budget is shared over the levels and first-drawn lines grow first, so
    the tree holds the chain a chain round would draw (rank 0 at every depth)."""
    from generation.tree_draft import sample_tree
    from kvcache.probe import cached_model

    cached = cached_model(drafter)
    ids = torch.tensor([PROMPT])
    cached.begin(PROMPT)
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        for _ in range(5):
            cached.rollback(len(PROMPT) - 1)
            tree, q = sample_tree(cached, MultinomialProcessor(1.0), V, ids, 4, 16, 3, g)
            line, node = [], -1
            while kids := tree.children(node):
                node = kids[0]
                line.append(node)
            assert len(line) == 4 and tree.depth == 4 and 12 <= len(tree) <= 16
            assert [tree.ranks[i] for i in line] == [0, 0, 0, 0]
            assert cached.length == len(PROMPT)                   # the nodes left the drafter's cache, the root stays
            expanded = {-1} | {p for p in tree.parents if p >= 0}
            assert all(q[n + 1].sum().item() == pytest.approx(1.0) for n in expanded)
