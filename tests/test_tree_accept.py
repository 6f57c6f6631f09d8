"""The tree accept rule on hand-built distributions: exact paths, exact tokens,
and (under sampling) the exact output distribution for any tree."""


import pytest
import torch

from generation.accept import accept_tree
from generation.tree import Tree, ancestors, layer_mask, tree_positions, visibility
from sampling import GreedyProcessor, MultinomialProcessor
from tests.helpers.distribution import chi_square_excess

V = 6
GREEDY = GreedyProcessor()
# Root children 1, 2; under 1: 3, 4; under 2: 5; under 3: 0.
TREE = Tree(tokens=(1, 2, 3, 4, 5, 0), parents=(-1, -1, 0, 0, 1, 2), ranks=(0, 1, 0, 1, 0, 0))


def run(tree, p, sample, generator=None):
    t = torch.tensor(tree.tokens, dtype=torch.long)
    parents = torch.tensor(tree.parents, dtype=torch.long)
    n, deepest, token = accept_tree(p, t, parents, ancestors(tree), sample, generator)
    return n.item(), deepest.item(), token.item()


def one_hot_rows(*argmaxes):
    return GREEDY(torch.eye(V)[list(argmaxes)] * 10)


@pytest.mark.parametrize("argmaxes, want", [
    # rows: root, node0..node5
    ((1, 3, 5, 0, 4, 4, 2), (3, 5, 2)),        # 1 -> 3 -> 0, then the target's 2
    ((2, 3, 5, 0, 4, 4, 2), (2, 4, 4)),        # the second root child, then its child 5
    ((1, 4, 5, 0, 4, 4, 2), (2, 3, 4)),        # rank-1 child 4 saves depth 2
    ((4, 3, 5, 0, 4, 4, 2), (0, -1, 4)),       # no root child matches
    ((1, 2, 5, 0, 4, 4, 2), (1, 0, 2)),        # 2 is not a child of node 0
])
def test_greedy_follows_the_argmax_path(argmaxes, want):
    assert run(TREE, one_hot_rows(*argmaxes), GREEDY.sample) == want


def test_an_empty_tree_is_a_plain_step():
    tree = Tree((), (), ())
    assert run(tree, one_hot_rows(3), GREEDY.sample) == (0, -1, 3)


def test_chain_tree_matches_the_chain_rule():
    from generation.accept import accept_drafts
    chain = Tree.chain([3, 4, 5])
    for argmaxes in [(3, 4, 5, 1), (3, 0, 5, 1), (2, 4, 5, 1)]:
        p = one_hot_rows(*argmaxes)
        n, token = accept_drafts(p, None, torch.tensor(chain.tokens), GREEDY.sample)
        got = run(chain, p, GREEDY.sample)
        assert (got[0], got[2]) == (n.item(), token.item())


# ------------------------------------------------------ exact distribution

def random_p(seed, rows):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, V, generator=g) * 1.5).softmax(-1)


def exact(tree, p):
    """P(output tokens, padded to depth + 1) by walking the tree analytically.

    Every node's p row stands for "the target's distribution after this path",
    so outputs are sequences; a node's children consume draws, the first draw
    with no child ends the round.
    """
    out = {}

    def walk(node, mass, prefix):
        kids = {tree.tokens[c]: c for c in tree.children(node)}
        row = p[node + 1]
        for t in range(V):
            m = mass * row[t].item()
            if t in kids:
                walk(kids[t], m, prefix + (t,))
            else:
                out[prefix + (t,)] = out.get(prefix + (t,), 0.0) + m
    walk(-1, 1.0, ())
    return out


def sampled(tree, p, trials, rule=None):
    g = torch.Generator().manual_seed(7)
    sample = MultinomialProcessor().sample
    counts = {}
    for _ in range(trials):
        n, deepest, token = run(tree, p, sample, g) if rule is None else rule(tree, p, sample, g)
        out = tuple(tree.tokens[i] for i in tree.path_to(deepest)) + (token,)
        counts[out] = counts.get(out, 0) + 1
    return counts


def test_sampling_output_is_exactly_the_target_walk():
    p = random_p(0, len(TREE) + 1)
    want = exact(TREE, p)
    assert sum(want.values()) == pytest.approx(1.0)
    # Ancestral sampling from p is the reference: the tree must not change it.
    assert chi_square_excess(sampled(TREE, p, 6000), want, 6000) < 5.0


def test_following_the_best_ranked_child_regardless_of_the_draw_is_caught():
    """Mutation: accept the rank-0 child with probability p(child) and else stop,
    resampling from p (the chain's mistake, per depth): biased."""
    p = random_p(0, len(TREE) + 1)

    def wrong(tree, p, sample, g):
        node, depth = -1, 0
        while True:
            kids = tree.children(node)
            draw = sample(p[node + 1].view(1, -1), g).item()
            if kids and torch.rand((), generator=g).item() < p[node + 1, tree.tokens[kids[0]]].item():
                node, depth = kids[0], depth + 1
                continue
            return depth, node, draw

    assert chi_square_excess(sampled(TREE, p, 6000, wrong), exact(TREE, p), 6000) > 5.0


# ---------------------------------------------------------------- the mask

def test_visibility_rows():
    vis = visibility(TREE, past=2, chain=1)
    assert vis.shape == (7, 9)
    assert vis[:, :3].all()                        # prefix and root seen by all
    node5 = vis[1 + 5, 3:].tolist()                # node 5 sees 0, 2, 5
    assert node5 == [True, False, True, False, False, True]
    assert tree_positions(TREE, 3).tolist() == [3, 3, 4, 4, 4, 5]


def test_window_inside_the_mask():
    vis = visibility(Tree.chain([1, 2]), past=4, chain=1)        # 7 keys, positions 0..6
    positions = torch.arange(7)
    full = layer_mask(vis, positions, window=None, dtype=torch.float32)
    slide = layer_mask(vis, positions, window=3, dtype=torch.float32)
    assert full.shape == (1, 1, 3, 7) and (full == 0).sum() == 5 * 3 + 1 + 2
    # Keys handed to a sliding layer: the last window - 1 cached ones + the block.
    assert slide.shape == (1, 1, 3, 5)
    # Query at position 6 sees 4, 5, 6 only.
    assert ((slide[0, 0, 2] == 0).nonzero().flatten() + 2).tolist() == [4, 5, 6]
