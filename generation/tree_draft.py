"""A drafter model's dynamic token tree, in the style of EAGLE-2 (Li et al. 2024).

Candidates are scored by cumulative draft probability; level by level the ``branch`` best of the
newest level are fed together (one forward, their own tree mask), each getting its ``branch`` most
likely children; the ``nodes`` best overall form the tree (a child never outscores its parent, so
every ancestor is kept). The tree depends on the drafter only, so the draw-following rule stays exact.
"""

from __future__ import annotations

import math

import torch

from generation.tree import Tree
from generation.tree_forward import masked_forward
from kvcache.cache import CachedModel


def top_children(q: torch.Tensor, branch: int) -> list[list[tuple[int, float]]]:
    """(rows, V) probabilities -> per row, up to ``branch`` (token, log q) with q > 0, best first."""
    top = q.topk(min(branch, q.shape[-1]), dim=-1)
    values, indices = top.values.tolist(), top.indices.tolist()
    return [[(t, math.log(v)) for t, v in zip(ts, vs) if v > 0] for ts, vs in zip(indices, values)]


def child_scores(processor, logits: torch.Tensor, vocab_size: int | None) -> torch.Tensor:
    """The distribution children are ranked by: q, or plain softmax under greedy
    (whose q is one-hot and would leave one child per node)."""
    logits = logits[:, :vocab_size] if vocab_size else logits
    return logits.float().softmax(dim=-1) if processor.is_greedy else processor(logits)


def draft_tree(cached: CachedModel, processor, vocab_size: int | None, ids: torch.Tensor,
               depth: int, nodes: int, branch: int, *, drop_root: bool = False) -> Tree:
    """Grow a tree of at most ``nodes`` nodes and ``depth`` levels after ``ids`` (1, L), ``depth``
    drafter forwards.

    The drafter's cache must hold a prefix of ``ids``; on return it holds ``ids`` (or a shorter prefix
    where snapshotted layers were restored; with ``drop_root`` ``ids`` but its last token). Nodes and
    root go in one crop: a sliding-window layer cropped twice in a row would lose a position.
    """
    device = ids.device
    length = ids.shape[1]
    logits = cached.forward(ids, keep=1)                                    # (1, V)
    q = child_scores(processor, logits, vocab_size)                         # (1, V)
    # Candidates: token, parent (index into cand; -1 root), rank, depth, score (log prob).
    cand: list[tuple[int, int, int, int, float]] = []
    for rank, (token, logq) in enumerate(top_children(q, branch)[0]):
        cand.append((token, -1, rank, 0, logq))
    level = list(range(len(cand)))
    fed: list[int] = []                      # candidate index of each node fed to the cache
    for d in range(1, depth):
        expand = _fitting(cached, sorted(level, key=lambda c: -cand[c][4])[:branch])
        if not expand:
            break
        logits = _feed_level(cached, cand, fed, expand, length, device)
        q = child_scores(processor, logits, vocab_size)                     # (E, V)
        level = []
        for c, kids in zip(expand, top_children(q, branch)):
            for rank, (token, logq) in enumerate(kids):
                level.append(len(cand))
                cand.append((token, c, rank, d, cand[c][4] + logq))
    cached.keep_block(len(fed) + int(drop_root), [])
    return best_tree(cand, nodes)


def _fitting(cached: CachedModel, expand: list[int]) -> list[int]:
    """The best of ``expand`` that a static cache still has room for (all of them on a growing
    cache): near a static cache's end a tree grows fewer nodes, never past it."""
    room = cached.room
    return expand if room is None else expand[:max(0, room)]


def _feed_level(cached: CachedModel, cand, fed: list[int], expand: list[int],
                length: int, device) -> torch.Tensor:
    """Feed the candidates ``expand`` in one pass, each seeing the sequence (``length`` positions), its
    fed ancestors and itself; returns their logits (E, V) and grows ``fed``."""
    tokens = torch.tensor([[cand[c][0] for c in expand]], dtype=torch.long, device=device)
    # Positions of every key: the sequence, the fed nodes, the new ones.
    positions = torch.tensor(list(range(length)) + [length + cand[c][3] for c in fed + expand],
                             dtype=torch.long, device=device)
    visible = tree_visibility(cand, fed, expand, length)
    fed.extend(expand)
    return masked_forward(cached, tokens, positions, visible.to(device), keep=len(expand))


def tree_visibility(cand, fed: list[int], expand: list[int], prefix: int) -> torch.Tensor:
    """(E, prefix + F + E) bool: each expanded candidate sees the ``prefix`` positions before
    the tree, those of its ancestors among the ``fed`` candidates (F, in cache order) and itself."""
    where = {c: prefix + i for i, c in enumerate(fed)}
    visible = torch.zeros(len(expand), prefix + len(fed) + len(expand), dtype=torch.bool)
    visible[:, :prefix] = True
    for row, c in enumerate(expand):
        visible[row, prefix + len(fed) + row] = True
        parent = cand[c][1]
        while parent >= 0:
            visible[row, where[parent]] = True
            parent = cand[parent][1]
    return visible


def draw_children(q: torch.Tensor, counts: list[int], generator) -> list[list[tuple[int, float]]]:
    """Per row of q (rows, V), ``counts[row]`` tokens drawn without replacement, in order, as (token,
    log q): the Gumbel top-k of log q (Kool et al. 2019). Tokens with q = 0 are never drawn."""
    u = torch.rand(q.shape, generator=generator, device=q.device).clamp_(min=1e-30)
    keys = q.float().log() - (-u.log()).log()
    top = keys.topk(min(max(counts, default=0), q.shape[-1]), dim=-1).indices        # (rows, k)
    values = q.gather(-1, top).tolist()
    return [[(t, math.log(v)) for t, v in zip(tokens[:count], vs[:count]) if v > 0]
            for tokens, vs, count in zip(top.tolist(), values, counts)]


def _share(budget: int, levels: int) -> int:
    """Nodes for the next level: an equal share of ``budget`` over ``levels`` (rounded up)."""
    return -(-budget // levels) if levels > 0 and budget > 0 else 0


def sample_tree(cached: CachedModel, processor, vocab_size: int | None, ids: torch.Tensor, depth: int,
                nodes: int, branch: int, generator, *, drop_root: bool = False) -> tuple[Tree, torch.Tensor]:
    """A tree of at most ``nodes`` nodes whose children are *drawn* from q without replacement, for
    :func:`generation.accept.accept_tree_rrs`, and q at the root and every node (n + 1, V).

    Nothing can be pruned afterwards (a node must keep its first-drawn children for the rule to stay
    exact), so each level gets an equal share of the budget left over the levels to come, given to the
    nodes before it (first-drawn lines first, then by cumulative q), one drafter forward per level.
    It holds the chain a chain round would have drawn, and more. The cache is left as by
    :func:`draft_tree`.
    """
    device = ids.device
    length = ids.shape[1]
    logits = cached.forward(ids, keep=1)                                    # (1, V)
    q = processor(logits[:, :vocab_size] if vocab_size else logits)          # (1, V)
    rows: dict[int, torch.Tensor] = {-1: q[0]}
    cand: list[tuple[int, int, int, int, float]] = []
    first = min(branch, _share(nodes, depth))
    later: list[int] = []                    # per candidate: sum of the ranks on its path
    for rank, (token, logq) in enumerate(draw_children(q, [first], generator)[0]):
        cand.append((token, -1, rank, 0, logq))
        later.append(rank)
    level = list(range(len(cand)))
    fed: list[int] = []
    for d in range(1, depth):
        share = _share(nodes - len(cand), depth - d)
        counts = [min(branch, share - branch * i) for i in range(-(-share // branch))]
        # First-drawn children first: a node's first child is kept as often as a
        # chain's draft (min(1, p/q)), later ones only after it was rejected; so
        # the rank-0 line is always grown, as deep as a chain, and the rest of
        # the share goes to the next-best nodes (fewest later draws on their
        # path, then cumulative q).
        expand = _fitting(cached, sorted(level, key=lambda c: (later[c], -cand[c][4]))[:len(counts)])
        if not expand:
            break
        logits = _feed_level(cached, cand, fed, expand, length, device)
        q = processor(logits[:, :vocab_size] if vocab_size else logits)       # (E, V)
        level = []
        for row, (c, kids) in enumerate(zip(expand, draw_children(q, counts, generator))):
            if kids:
                rows[c] = q[row]
            for rank, (token, logq) in enumerate(kids):
                level.append(len(cand))
                cand.append((token, c, rank, d, cand[c][4] + logq))
                later.append(later[c] + rank)
    cached.keep_block(len(fed) + int(drop_root), [])
    tree = Tree(tokens=tuple(c[0] for c in cand), parents=tuple(c[1] for c in cand),
                ranks=tuple(c[2] for c in cand))
    q_rows = torch.zeros(len(cand) + 1, rows[-1].shape[-1], device=rows[-1].device, dtype=rows[-1].dtype)
    for node, row in rows.items():
        q_rows[node + 1] = row
    return tree, q_rows


def best_tree(cand, nodes: int) -> Tree:
    """The ``nodes`` best candidates (score, then shallower first) as a parents-first Tree."""
    order = sorted(range(len(cand)), key=lambda c: (-cand[c][4], cand[c][3], c))[:nodes]
    index = {c: i for i, c in enumerate(order)}
    return Tree(tokens=tuple(cand[c][0] for c in order),
                parents=tuple(index[cand[c][1]] if cand[c][1] >= 0 else -1 for c in order),
                ranks=tuple(cand[c][2] for c in order))
