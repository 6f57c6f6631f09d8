"""A token tree: many candidate continuations verified in one target forward pass.

The tree hangs from the last committed token (the *root*, not a node). Node i has a token, a parent
(-1: the root), a depth (0 for the root's children) and a *rank* among its siblings (0: the drafter's
first choice); nodes are stored parents-first, so ``parents[i] < i``.

Verifying a tree (SpecInfer, Miao et al. 2024; Medusa, Cai et al. 2024) feeds the root and every node
in one pass, equal to running each path on its own because a node sees only the prefix, the root,
its ancestors and itself (:func:`visibility`) and sits at ``prefix length + depth``
(:func:`tree_positions`); sliding-window layers also hide keys ``window`` or more back
(:func:`layer_mask`). *Extra rows* (:class:`ExtraRows`, lookahead's window) form a second forest
from the root that neither sees nor is seen by a node.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def depths_of(parents) -> tuple[int, ...]:
    """Each node's depth below the root (0: a child of the root), for parents that come first."""
    out: list[int] = []
    for parent in parents:
        out.append(0 if parent < 0 else out[parent] + 1)
    return tuple(out)


@dataclass(frozen=True)
class Tree:
    """Draft nodes in parents-first order (all tuples have one entry per node)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    ranks: tuple[int, ...]

    def __post_init__(self):
        n = len(self.tokens)
        if len(self.parents) != n or len(self.ranks) != n:
            raise ValueError("tokens, parents and ranks must have one entry per node")
        seen: set[tuple[int, int]] = set()
        for i, (token, parent) in enumerate(zip(self.tokens, self.parents)):
            if not -1 <= parent < i:
                raise ValueError(f"node {i}: parent {parent} must be -1 or an earlier node")
            if (parent, token) in seen:
                raise ValueError(f"node {i}: token {token} repeats a sibling's")
            seen.add((parent, token))

    @classmethod
    def chain(cls, tokens) -> "Tree":
        """A chain of drafts as a tree (each node the only child of the previous one)."""
        tokens = tuple(int(t) for t in tokens)
        return cls(tokens, tuple(range(-1, len(tokens) - 1)), (0,) * len(tokens))

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> tuple[int, ...]:
        return depths_of(self.parents)

    @property
    def depth(self) -> int:
        """Levels in the tree (0 when empty)."""
        return max(self.depths) + 1 if self.tokens else 0

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (empty for -1)."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def children(self, node: int) -> list[int]:
        """Nodes whose parent is ``node`` (-1: the root), by rank."""
        kids = [i for i, p in enumerate(self.parents) if p == node]
        return sorted(kids, key=lambda i: self.ranks[i])


@dataclass(frozen=True)
class ExtraRows:
    """Rows a drafter asks to have fed in a tree's verify pass, after the nodes; ``parents[i]``: -1 (the
    root) or an earlier extra row. Siblings may carry equal tokens: their outputs never enter acceptance."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]

    def __post_init__(self):
        if len(self.parents) != len(self.tokens):
            raise ValueError("tokens and parents must have one entry per extra row")
        for i, parent in enumerate(self.parents):
            if not -1 <= parent < i:
                raise ValueError(f"extra row {i}: parent {parent} must be -1 or an earlier row")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> tuple[int, ...]:
        return depths_of(self.parents)


NO_EXTRA = ExtraRows((), ())


def ancestors_of(parents: tuple[int, ...]) -> torch.Tensor:
    """(n, n) bool over a parents-first forest: [i, j] when j is i or one of its ancestors."""
    n = len(parents)
    out = torch.zeros(n, n, dtype=torch.bool)
    for i, parent in enumerate(parents):
        out[i, i] = True
        if parent >= 0:
            out[i] |= out[parent]
    return out


def ancestors(tree: Tree, device=None) -> torch.Tensor:
    """(n, n) bool: [i, j] is True when node j is node i or one of its ancestors."""
    out = ancestors_of(tree.parents)
    return out.to(device) if device is not None else out


def tree_positions(tree: Tree, prefix: int, device=None) -> torch.Tensor:
    """(n,) position ids of the nodes: ``prefix`` (the root's position + 1) plus depth."""
    return torch.tensor(tree.depths, dtype=torch.long, device=device) + prefix


def visibility(tree: Tree, past: int, chain: int, device=None, extra: ExtraRows = NO_EXTRA) -> torch.Tensor:
    """Which keys each query of one tree-verify block may see, before windows: (chain + n + m,
    past + chain + n + m) bool, for ``chain`` committed tokens the cache lacks (the last is the root),
    n nodes and m ``extra`` rows over ``past`` cached positions. The chain is causal; a node sees the
    prefix, the chain and its ancestors; an extra row the same among the extra rows (never a node)."""
    n, m = len(tree), len(extra)
    nodes = past + chain
    rows = torch.zeros(chain + n + m, nodes + n + m, dtype=torch.bool)
    rows[:, :past] = True
    rows[:chain, past:nodes] = torch.ones(chain, chain, dtype=torch.bool).tril()
    rows[chain:, past:nodes] = True
    rows[chain:chain + n, nodes:nodes + n] = ancestors(tree)
    rows[chain + n:, nodes + n:] = ancestors_of(extra.parents)
    return rows.to(device) if device is not None else rows


def extra_positions(extra: ExtraRows, prefix: int, device=None) -> torch.Tensor:
    """(m,) position ids of the extra rows: ``prefix`` (the root's position + 1) plus depth."""
    return torch.tensor(extra.depths, dtype=torch.long, device=device) + prefix


def layer_mask(visible: torch.Tensor, positions: torch.Tensor, *, window: int | None,
               dtype: torch.dtype) -> torch.Tensor:
    """The additive 4D mask one kind of attention layer is given: (1, 1, m, K'), 0 where a query may
    look, the dtype's minimum elsewhere. visible: (m, K) bool; positions: (K,). A sliding layer sees a
    key only when ``q_pos - k_pos < window`` and gets only the last ``window - 1`` cached keys plus the
    block (``DynamicSlidingWindowLayer``)."""
    m, keys = visible.shape
    allowed = visible
    if window is not None:
        q_pos = positions[keys - m:].view(m, 1)
        allowed = allowed & (q_pos - positions.view(1, keys) < window)
        past = keys - m
        start = max(past - window + 1, 0)
        allowed = allowed[:, start:]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=visible.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.view(1, 1, *allowed.shape)
