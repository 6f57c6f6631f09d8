"""SuffixDecoding's storage (Oliaro et al., NeurIPS 2025): suffix tries with counts.

Two tries, as Snowflake ArcticInference and vLLM (``method: "suffix"``) ship it: a *per-prompt* trie
over the prompt and output so far, and a *global* trie over at most ``max_outputs`` earlier outputs.
A trie holds every substring of at most ``depth = 2 * max_pattern`` tokens with its count. Drafting
finds the longest suffix of the sequence (at most ``max_pattern``) seen with a continuation and
follows the children by count: the chain the most frequent, the tree best first by path
probability. A draft after a match of m tokens has at most ``floor(factor * m)`` tokens (at least 1).
The trie whose draft has the larger expected accepted length drafts (the per-prompt one on a tie);
children below ``min_prob`` are not drafted. An append costs O(P), a match O(P log P) look-ups.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from generation.tree import Tree
from ngram_assisted.storage import check_token
from utils.options import check_int

DEFAULT_MAX_PATTERN = 16
DEFAULT_MAX_OUTPUTS = 64
DEFAULT_FACTOR = 1.0
MIN_PROB = 0.1


@dataclass(frozen=True)
class Draft:
    """What a model-free storage proposes in one round: ``tree`` (a chain is a tree of one path),
    ``source`` (``prompt``, ``global``, ``context``, ``corpus``, ``""`` when nothing matched) and
    ``match``, the tail tokens matched there."""

    tree: Tree
    source: str = ""
    match: int = 0

    def note(self) -> dict:
        """The round's record (``generation.result.Round.note``)."""
        return {"source": self.source, "match": self.match}


NO_DRAFT = Draft(Tree((), (), ()))


def draft_budget(match: int, factor: float, k: int) -> int:
    """How many tokens a match of ``match`` tokens may draft: floor(factor * match), at least 1, at most k."""
    if match <= 0 or k <= 0:
        return 0
    return max(1, min(k, int(factor * match)))


class _Node:
    """One substring: how often it occurred, and its one-token extensions."""

    __slots__ = ("children", "count")

    def __init__(self):
        self.children: dict[int, _Node] | None = None
        self.count = 0


class SuffixTrie:
    """Every substring of at most ``depth`` tokens of the sequences given, with occurrence counts;
    streamed (:meth:`start`, :meth:`append`) or added and removed whole (a node at count 0 is dropped)."""

    def __init__(self, depth: int):
        if depth < 2:
            raise ValueError(f"a suffix trie needs depth >= 2, got {depth}")
        self.depth = depth
        self.root = _Node()
        self._open: list[_Node] = [self.root]   # the suffixes of 0..depth-1 tokens ending at the stream's end

    def start(self) -> None:
        """Begin a new streamed sequence (its substrings do not join the previous one's)."""
        self._open = [self.root]

    def append(self, token: int) -> None:
        """Count every substring the token ends (O(depth))."""
        self._open = [self.root] + [self._step(node, token, 1) for node in self._open][:self.depth - 1]

    def add(self, tokens: Iterable[int]) -> None:
        """Count every substring of a whole sequence."""
        self.start()
        for token in tokens:
            self.append(token)
        self.start()

    def remove(self, tokens: Sequence[int]) -> None:
        """Uncount every substring of a sequence added earlier with :meth:`add`."""
        open_nodes = [self.root]
        for token in tokens:
            open_nodes = [self.root] + [self._step(node, token, -1) for node in open_nodes][:self.depth - 1]

    @staticmethod
    def _step(node: _Node, token: int, delta: int) -> _Node:
        """The child of ``node`` for ``token`` with its count moved by ``delta`` (made or dropped as needed)."""
        if node.children is None:
            node.children = {}
        child = node.children.get(token)
        if child is None:
            child = node.children[token] = _Node()
        child.count += delta
        if child.count <= 0:
            del node.children[token]
        return child

    def find(self, tokens: Sequence[int]) -> _Node | None:
        """The node of the substring ``tokens``, or None when it never occurred."""
        node = self.root
        for token in tokens:
            if not node.children:
                return None
            node = node.children.get(token)
            if node is None:
                return None
        return node

    def longest_match(self, tail: Sequence[int], max_len: int) -> tuple[int, _Node]:
        """The longest suffix of ``tail`` (at most ``max_len`` tokens) that occurred with a continuation,
        and its node; (0, root) when none did. Binary search: a suffix that occurred followed by a token
        implies its own suffix did too, so the property only weakens with length."""
        lo, hi = 0, min(max_len, len(tail), self.depth - 1)
        best = self.root
        while lo < hi:
            mid = (lo + hi + 1) // 2
            node = self.find(tail[len(tail) - mid:])
            if node is not None and node.children:
                lo, best = mid, node
            else:
                hi = mid - 1
        return lo, best

    def __len__(self) -> int:
        """Distinct substrings stored (walks the trie: for tests and reports)."""
        total, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            for child in (node.children or {}).values():
                total += 1
                stack.append(child)
        return total


def _ranked(node: _Node) -> list[tuple[int, float]]:
    """``node``'s continuations, most frequent first (the first seen wins ties), with their count shares."""
    children = node.children or {}
    total = sum(c.count for c in children.values())
    ranked = sorted(children.items(), key=lambda kv: -kv[1].count)
    return [(token, child.count / total) for token, child in ranked] if total else []


def grow_tree(node: _Node, depth: int, nodes: int, branch: int, min_prob: float) -> tuple[Tree, float]:
    """A best-first tree of continuations below ``node`` (at most ``nodes`` nodes, ``depth`` levels,
    ``branch`` children, path probabilities >= ``min_prob``; ``branch`` 1: the chain) and its score,
    the sum of its nodes' path probabilities (ArcticInference's expected accepted length)."""
    heap: list[tuple[float, int, int, int, int, _Node, int]] = []
    counter = 0

    def offer(parent: int, trie_node: _Node, prob: float, level: int) -> None:
        nonlocal counter
        if level >= depth:
            return
        for rank, (token, share) in enumerate(_ranked(trie_node)[:branch]):
            if prob * share >= min_prob:
                heapq.heappush(heap, (-prob * share, counter, parent, token, rank,
                                      trie_node.children[token], level))
                counter += 1

    tokens: list[int] = []
    parents: list[int] = []
    ranks: list[int] = []
    score = 0.0
    offer(-1, node, 1.0, 0)
    while heap and len(tokens) < nodes:
        negative, _, parent, token, rank, child, level = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        ranks.append(rank)
        score -= negative
        offer(len(tokens) - 1, child, -negative, level + 1)
    return Tree(tuple(tokens), tuple(parents), tuple(ranks)), score


class SuffixStorage:
    """SuffixDecoding's two tries. ``max_pattern`` (P): the longest tail matched (the tries keep 2P
    tokens, so a draft goes at most 2P - m past a match of m); ``max_outputs`` (M): earlier outputs
    kept (0: no global trie). :meth:`initialize` moves the previous output into the global trie."""

    kind = "suffix"
    wants_top_k = 0

    def __init__(self, vocab_size: int, *, max_pattern: int = DEFAULT_MAX_PATTERN,
                 max_outputs: int = DEFAULT_MAX_OUTPUTS, min_prob: float = MIN_PROB):
        for name, value, low in (("vocab_size", vocab_size, 1), ("max_pattern", max_pattern, 1),
                                 ("max_outputs", max_outputs, 0)):
            check_int(value, name, low)
        self.vocab_size = vocab_size
        self.max_pattern = max_pattern
        self.max_outputs = max_outputs
        self.min_prob = min_prob
        self.depth = 2 * max_pattern      # substrings kept: a match of up to P, then up to 2P - m drafts
        self.reset()

    def reset(self) -> None:
        """Forget everything: the per-prompt trie, the global trie and the pending output."""
        self.local = SuffixTrie(self.depth)
        self.global_trie = SuffixTrie(self.depth)
        self.outputs: deque[tuple[int, ...]] = deque()
        self.sequence: list[int] = []
        self.prompt_length = 0

    def initialize(self, prompt: Sequence[int]) -> None:
        """A new generation from ``prompt``: retire the last output to the global trie, then index the prompt."""
        self._retire_output()
        self.local = SuffixTrie(self.depth)
        self.sequence = []
        self.extend(prompt)
        self.prompt_length = len(self.sequence)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens to the sequence and to the per-prompt trie (O(P) each)."""
        for token in tokens:
            token = check_token(self.vocab_size, token)
            self.sequence.append(token)
            self.local.append(token)

    def _retire_output(self) -> None:
        """Move the finished generation's output into the global trie; drop the oldest beyond M."""
        output = tuple(self.sequence[self.prompt_length:])
        self.sequence, self.prompt_length = [], 0
        if not output or self.max_outputs == 0:
            return
        self.global_trie.add(output)
        self.outputs.append(output)
        while len(self.outputs) > self.max_outputs:
            self.global_trie.remove(self.outputs.popleft())

    def draft(self, k: int, factor: float, *, nodes: int | None = None, branch: int = 1) -> Draft:
        """The better of the two tries' drafts: a chain of up to k tokens (``nodes`` None), or a
        tree of up to ``nodes`` nodes, k levels and ``branch`` children per node."""
        best, best_score = NO_DRAFT, 0.0
        for source, trie in (("prompt", self.local), ("global", self.global_trie)):
            match, node = trie.longest_match(self.sequence, self.max_pattern)
            depth = min(draft_budget(match, factor, k), trie.depth - match)
            if depth <= 0:
                continue
            tree, score = grow_tree(node, depth, depth if nodes is None else nodes,
                                    1 if nodes is None else branch, self.min_prob)
            if len(tree) and score > best_score:
                best, best_score = Draft(tree, source, match), score
        return best

    def __len__(self) -> int:
        return len(self.sequence)

    def __repr__(self) -> str:
        return (f"SuffixStorage(P={self.max_pattern}, M={self.max_outputs}, "
                f"outputs={len(self.outputs)}, sequence={len(self.sequence)})")
