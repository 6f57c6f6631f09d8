"""The n-gram drafter: proposes the storage's continuations of the sequence's tail."""

from __future__ import annotations

import heapq

import torch

from generation.drafter import Drafter
from generation.tree import Tree
from ngram_assisted.storage import NGramStorage


class NGramDrafter(Drafter):
    """Drafts deterministically from an n-gram storage and keeps it up to date; it mirrors the sequence
    as a host list (fed from the loop's one sync per round), so drafting never reads the device."""

    kind = "ngram"  # no model: no forward passes, no cache to roll back

    def __init__(self, storage: NGramStorage, *, filler_top_k: int = 1,
                 stop_if_unknown: bool = True, confident_start: bool = True,
                 device: torch.device | str = "cpu"):
        self.storage = storage
        self.wants_top_k = max(filler_top_k if filler_top_k > 1 else 0, storage.wants_top_k)
        self.stop_if_unknown = stop_if_unknown
        self.confident_start = confident_start
        self.device = torch.device(device)
        self.history: list[int] = []

    def tree_support(self) -> str | None:
        return None

    def begin(self, prompt: list[int]) -> None:
        self.history = list(prompt)
        self.storage.initialize(prompt)

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None) -> tuple[torch.Tensor, None]:
        """Up to k tokens, following the storage's best continuation of the tail (deterministic: q is
        one-hot, so ``stop_below`` does not apply).

        Stops at an unknown context when ``stop_if_unknown``. With ``confident_start`` the first token must
        come from a full (n-1)-token context: a backed-off draft is rarely accepted, and where verifying one
        draft costs nearly as much as several (CPUs: ~1.7x one token), a round without drafts is cheaper.
        """
        width = self.storage.n - 1
        context = self.history[-width:]
        drafts: list[int] = []
        for i in range(k):
            min_context = width if (i == 0 and self.confident_start) else 1
            token, known = self.storage.next_token(context, min_context=min_context)
            if not known and self.stop_if_unknown:
                break
            drafts.append(token)
            context = (context + [token])[-width:]
        return torch.tensor(drafts, dtype=torch.long, device=ids.device), None

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        """A trie of the storage's continuations, at most ``nodes`` nodes and ``depth`` levels, grown best
        first by the product of weight shares along each path; the first level obeys ``confident_start``,
        and an unknown context ends a branch when ``stop_if_unknown``."""
        width = self.storage.n - 1
        heap: list[tuple[float, int, int, int, int, int, tuple[int, ...]]] = []
        counter = 0

        def offer(parent: int, context: list[int], score: float, level: int) -> None:
            nonlocal counter
            if level >= depth:
                return
            min_context = width if (level == 0 and self.confident_start) else 1
            candidates, known = self.storage.top_tokens(context, branch, min_context=min_context)
            if not known and self.stop_if_unknown:
                return
            for rank, (token, share) in enumerate(candidates):
                heapq.heappush(heap, (-score * share, counter, parent, token, rank, level, tuple(context)))
                counter += 1

        tokens: list[int] = []
        parents: list[int] = []
        ranks: list[int] = []
        offer(-1, self.history[-width:], 1.0, 0)
        while heap and len(tokens) < nodes:
            negative, _, parent, token, rank, level, context = heapq.heappop(heap)
            tokens.append(token)
            parents.append(parent)
            ranks.append(rank)
            offer(len(tokens) - 1, (list(context) + [token])[-width:], -negative, level + 1)
        return Tree(tuple(tokens), tuple(parents), tuple(ranks))

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        """Count the appended tokens; with filler, also the target's top-k at each position."""
        width = self.storage.n - 1
        if top_k is not None:
            for i, candidates in enumerate(top_k):
                context = (self.history[-width:] + new_tokens[:i])[-width:]
                self.storage.fill(context, candidates)
        self.storage.update(self.history[-width:], new_tokens)
        self.history.extend(new_tokens)
