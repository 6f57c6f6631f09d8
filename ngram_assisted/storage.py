"""N-gram storages: the draft source of NASD.

An n-gram storage counts which token followed which context. ``NGramStorage``
(basic) counts every k-gram for k = 2..n, i.e. contexts of 1..n-1 tokens, and
predicts from the longest context it has seen; ``OneLevelNGramStorage`` counts
only n-grams (contexts of exactly n-1 tokens).

Every operation works on plain Python ints and touches only the last n-1
tokens of a context, so drafting costs a few dict look-ups per token and never
a device sync. For each context the storage keeps the running best
continuation, so a prediction is O(1).

Weights: a token seen in the text adds 1. A *filler* candidate (the target's
top-k prediction at a verified position, see NASD) of rank r adds
``FILLER_WEIGHT / (r + 1)``, so a filler never outweighs a real observation.
Ties keep the continuation that reached the count first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

FILLER_WEIGHT = 0.5


class _Table:
    """context tuple -> continuation weights, with the running best per context."""

    def __init__(self):
        self.weights: dict[tuple[int, ...], dict[int, float]] = {}
        self.best: dict[tuple[int, ...], tuple[int, float]] = {}

    def add(self, context: tuple[int, ...], token: int, weight: float) -> None:
        counts = self.weights.setdefault(context, {})
        total = counts.get(token, 0.0) + weight
        counts[token] = total
        best = self.best.get(context)
        if best is None or total > best[1]:
            self.best[context] = (token, total)

    def __len__(self) -> int:
        return len(self.weights)


class NGramStorage:
    """Basic storage: every k-gram for k = 2..n; predicts from the longest known context."""

    kind = "basic"

    def __init__(self, n: int, vocab_size: int):
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"n must be an integer >= 2, got {n!r}")
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
        self.n = n
        self.vocab_size = vocab_size
        self.reset()

    # Context lengths this storage counts, longest first.
    def _orders(self) -> range:
        return range(self.n - 1, 0, -1)

    def reset(self) -> None:
        """Forget everything."""
        self._tables = {c: _Table() for c in self._orders()}
        self._unigrams = _Table()

    def __len__(self) -> int:
        """Number of distinct contexts stored."""
        return sum(len(t) for t in self._tables.values())

    def initialize(self, prompt: Sequence[int]) -> None:
        """Add the n-grams of a prompt (without forgetting what was stored before)."""
        self.update((), prompt)

    def update(self, context: Sequence[int], tokens: Iterable[int]) -> None:
        """Count ``tokens`` as the continuation of ``context`` (only its tail matters)."""
        history = list(context[-(self.n - 1):]) if self.n > 1 else []
        for token in tokens:
            token = self._check(token)
            self._record(history, token, 1.0)
            self._unigrams.add((), token, 1.0)
            history.append(token)
            if len(history) > self.n - 1:
                del history[0]

    def fill(self, context: Sequence[int], candidates: Sequence[int]) -> None:
        """Register ranked candidate continuations of ``context`` with filler weights."""
        history = list(context[-(self.n - 1):])
        for rank, token in enumerate(candidates):
            self._record(history, self._check(token), FILLER_WEIGHT / (rank + 1))

    def next_token(self, context: Sequence[int], *, min_context: int = 1) -> tuple[int, bool]:
        """The most frequent continuation of the longest known context tail.

        Only tails of at least ``min_context`` tokens count. Returns (token, True),
        or (the most frequent token seen at all, False) when no such tail is known
        (0 for an empty storage).
        """
        for c in self._orders():
            if c >= min_context and len(context) >= c:
                best = self._tables[c].best.get(tuple(context[-c:]))
                if best is not None:
                    return best[0], True
        fallback = self._unigrams.best.get(())
        return (fallback[0] if fallback else 0), False

    def _record(self, history: list[int], token: int, weight: float) -> None:
        for c in self._orders():
            if len(history) >= c:
                self._tables[c].add(tuple(history[-c:]), token, weight)

    def _check(self, token: int) -> int:
        if not 0 <= token < self.vocab_size:
            raise ValueError(f"token id {token} is outside the vocabulary (size {self.vocab_size})")
        return token

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, contexts={len(self)})"


class OneLevelNGramStorage(NGramStorage):
    """One-level storage: only n-grams, i.e. contexts of exactly n-1 tokens."""

    kind = "onelevel"

    def _orders(self) -> range:
        return range(self.n - 1, self.n - 2, -1)
