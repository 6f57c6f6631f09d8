"""Lookahead decoding (Fu et al., ICML 2024, "Break the Sequential Dependency of LLM Inference
Using Lookahead Decoding"): n-grams made by Jacobi iteration, verified in the same forward pass.

Each round is one target forward (``generation.tree_round``) over the committed tokens the cache
lacks (the last is the *root*), the *verification branch* (up to G pooled n-grams starting with the
root, merged into a deterministic token tree) and the *lookahead branch*: a Jacobi window of N - 1
levels by W columns fed as extra rows that never see a candidate. The target's argmax at the top
level's column c closes an n-gram, which joins the pool; then the window moves one step.

The pool keeps, per first token, the G most recently seen n-grams, and may be kept across prompts
(as NASD's storage). The window starts from prompt tokens drawn by a fixed-seed generator, so a run
is reproducible and draws nothing from the run's own generator.
"""

from __future__ import annotations

import random

import torch

from generation.drafter import Drafter, DrafterReport
from generation.tree import ExtraRows, Tree

WINDOW_SEED = 0    # the fixed seed of the window's first tokens


class NGramPool:
    """N-grams keyed by their first token; each key keeps its ``guesses`` most recent ones."""

    def __init__(self, guesses: int):
        self.guesses = guesses
        self.table: dict[int, list[tuple[int, ...]]] = {}   # key -> rests, oldest first
        self.size = 0

    def add(self, key: int, rest: tuple[int, ...]) -> None:
        """Add the n-gram ``(key, *rest)``; one seen before moves to the front; the oldest of a
        full key goes."""
        rests = self.table.setdefault(key, [])
        if rest in rests:
            rests.remove(rest)
            self.size -= 1
        rests.append(rest)
        self.size += 1
        if len(rests) > self.guesses:
            del rests[0]
            self.size -= 1

    def clear(self) -> None:
        self.table.clear()
        self.size = 0

    def candidates(self, key: int) -> list[tuple[int, ...]]:
        """The rests of the n-grams that start with ``key``, most recent first."""
        return self.table.get(key, [])[::-1]

    def __len__(self) -> int:
        return self.size


class JacobiWindow:
    """The lookahead branch's window: ``levels`` (N - 1) levels of ``width`` (W) columns; ``lines[0]`` holds
    level 0's columns 1..W-1 (column 0 is the root), ``lines[l]`` level l's W columns."""

    def __init__(self, width: int, levels: int, seed_tokens: list[int]):
        rng = random.Random(WINDOW_SEED)
        self.width, self.levels = width, levels
        self.lines = [[rng.choice(seed_tokens) for _ in range(width - 1)]] + \
                     [[rng.choice(seed_tokens) for _ in range(width)] for _ in range(levels - 1)]

    def row(self, level: int, column: int) -> int:
        """Index of the extra row of (level, column); -1 for level 0's column 0 (the root)."""
        if level == 0:
            return column - 1
        return self.width - 1 + (level - 1) * self.width + column

    def rows(self) -> ExtraRows:
        """The window as extra rows: level 0 a line after the root, each column above it a line
        up the levels (see the module docstring)."""
        tokens = [t for line in self.lines for t in line]
        parents = [c - 1 for c in range(self.width - 1)]                       # level 0: a line from the root
        for level in range(1, self.levels):
            parents += [self.row(level - 1, c) for c in range(self.width)]
        return ExtraRows(tuple(tokens), tuple(parents))

    def advance(self, root: int, top: list[int], pool: NGramPool) -> None:
        """Take the argmax ``top`` at the top level's W rows: the n-gram of each column joins the
        pool, then the window moves one position on."""
        for c in range(self.width):
            key = root if c == 0 else self.lines[0][c - 1]
            pool.add(key, tuple(self.lines[level][c] for level in range(1, self.levels)) + (top[c],))
        self.lines = [self.lines[1][1:]] + self.lines[2:] + [list(top)]


def candidate_tree(candidates: list[tuple[int, ...]], depth: int, nodes: int) -> Tree:
    """The candidates (their first ``depth`` tokens) merged into one token tree of at most
    ``nodes`` nodes; siblings ranked by the first candidate that reached them."""
    tokens: list[int] = []
    parents: list[int] = []
    ranks: list[int] = []
    index: dict[tuple[int, int], int] = {}          # (parent, token) -> node
    children: dict[int, int] = {}
    for rest in candidates:
        parent = -1
        for token in rest[:depth]:
            node = index.get((parent, token))
            if node is None:
                if len(tokens) >= nodes:
                    break
                node = index[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                ranks.append(children.get(parent, 0))
                children[parent] = ranks[-1] + 1
            parent = node
    return Tree(tuple(tokens), tuple(parents), tuple(ranks))


class LookaheadDrafter(Drafter):
    """Lookahead decoding as a drafter: the pool's candidates as the tree, the Jacobi window as extra
    rows of the same verify pass; ``pool``: one kept from earlier generations (None: a new one).
    Where the target cannot take a tree, no window is fed and the pool stays empty: target AR, and
    the result says why."""

    kind = "ngram"     # deterministic drafts: q is one-hot

    def __init__(self, window: int, ngram: int, guesses: int, pool: NGramPool | None = None):
        if ngram < 3:
            raise ValueError(f"lookahead needs n-grams of at least 3 tokens, got {ngram}")
        if window < 1 or guesses < 1:
            raise ValueError(f"lookahead needs a window and a guess count of at least 1, got {window}, {guesses}")
        self.width, self.ngram, self.guesses = window, ngram, guesses
        self.most_extra_rows = (window - 1) + (ngram - 2) * window    # the window: W - 1 rows, then W per level
        self.pool = pool if pool is not None else NGramPool(guesses)
        self.window: JacobiWindow | None = None
        self.last = -1
        self.root = -1
        self.notes: list[dict | None] = []
        self._pending: dict | None = None
        self._rows = 0      # window rows fed with this round's verify (0: a chain round fed none)

    def tree_support(self) -> str | None:
        return None

    def begin(self, prompt: list[int]) -> None:
        self.window = JacobiWindow(self.width, self.ngram - 1, prompt)
        self.last = prompt[-1]
        self.notes, self._pending = [], None

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None) -> tuple[torch.Tensor, None]:
        """The chain fallback: the pool's latest n-gram after the last token (q one-hot)."""
        found = self.pool.candidates(self.last)[:1]
        draft = list(found[0][:k]) if found else []
        self._pending = {"candidates": len(found)}
        return torch.tensor(draft, dtype=torch.long, device=ids.device), None

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        """Up to G n-grams whose first token is the last committed one, merged into a tree."""
        found = self.pool.candidates(self.last)[:self.guesses]
        self._pending = {"candidates": len(found)}
        return candidate_tree(found, depth, nodes)

    def extra_rows(self, ids: torch.Tensor, tree: Tree) -> ExtraRows:
        self.root = self.last
        rows = self.window.rows()
        self._rows = len(rows.tokens)
        return rows

    def extra_outputs(self, tokens: list[int]) -> None:
        """The argmax at every window row; the top level's W close this round's n-grams."""
        self.window.advance(self.root, tokens[-self.width:], self.pool)

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        self.last = new_tokens[-1]
        note = self._pending or {"candidates": 0}
        # ``rows``: the window rows this round's verify fed besides its candidates (the speedup
        # model prices a round at its whole width: analysis.acceptance.verify_width).
        self.notes.append({**note, "pool": len(self.pool), "rows": self._rows})
        self._pending, self._rows = None, 0

    def report(self) -> DrafterReport:
        return DrafterReport(round_notes=list(self.notes))
