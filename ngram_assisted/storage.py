"""N-gram storages: the draft source of NASD.

``NGramStorage`` (basic) counts every k-gram for k = 2..n and predicts from the longest context it
has seen; ``OneLevelNGramStorage`` counts only n-grams. Plain Python ints, the last n-1 tokens of a
context, the running best continuation per context: a prediction is O(1) and never syncs the device.
A token seen in the text adds 1; a *filler* (the target's top-k at a verified position) of rank r
adds ``FILLER_WEIGHT / (r + 1)``, so it never outweighs a real observation. Ties keep the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from utils.options import check_int

FILLER_WEIGHT = 0.5


def check_token(vocab_size: int, token: int) -> int:
    """``token`` when it is an id of a vocabulary of ``vocab_size``; else a one-line ValueError."""
    if not 0 <= token < vocab_size:
        raise ValueError(f"token id {token} is outside the vocabulary (size {vocab_size})")
    return token


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

    wants_top_k = 0  # the target's top-k is asked for by the drafter's filler, not by the storage

    def __init__(self, n: int, vocab_size: int):
        self.n = check_int(n, "n", 2)
        self.vocab_size = check_int(vocab_size, "vocab_size", 1)
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
            token = check_token(self.vocab_size, token)
            self._record(history, token, 1.0)
            self._unigrams.add((), token, 1.0)
            history.append(token)
            if len(history) > self.n - 1:
                del history[0]

    def fill(self, context: Sequence[int], candidates: Sequence[int]) -> None:
        """Register ranked candidate continuations of ``context`` with filler weights."""
        history = list(context[-(self.n - 1):])
        for rank, token in enumerate(candidates):
            self._record(history, check_token(self.vocab_size, token), FILLER_WEIGHT / (rank + 1))

    def next_token(self, context: Sequence[int], *, min_context: int = 1) -> tuple[int, bool]:
        """(the most frequent continuation of the longest known tail of at least ``min_context`` tokens,
        True), or (the most frequent token seen at all, or 0, False)."""
        for c in self._orders():
            if c >= min_context and len(context) >= c:
                best = self._tables[c].best.get(tuple(context[-c:]))
                if best is not None:
                    return best[0], True
        fallback = self._unigrams.best.get(())
        return (fallback[0] if fallback else 0), False

    def top_tokens(self, context: Sequence[int], k: int, *, min_context: int = 1
                   ) -> tuple[list[tuple[int, float]], bool]:
        """Up to ``k`` continuations of the longest known tail, best first, with their shares of its weight,
        and True; or ([(fallback, 1.0)], False) as :meth:`next_token`. Token trees branch on these."""
        for c in self._orders():
            if c >= min_context and len(context) >= c:
                weights = self._tables[c].weights.get(tuple(context[-c:]))
                if weights:
                    total = sum(weights.values())
                    ranked = sorted(weights.items(), key=lambda kv: -kv[1])[:k]   # stable: first seen wins ties
                    return [(t, w / total) for t, w in ranked], True
        token, _ = self.next_token((), min_context=1)
        return [(token, 1.0)], False

    def _record(self, history: list[int], token: int, weight: float) -> None:
        for c in self._orders():
            if len(history) >= c:
                self._tables[c].add(tuple(history[-c:]), token, weight)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n={self.n}, contexts={len(self)})"


class OneLevelNGramStorage(NGramStorage):
    """One-level storage: only n-grams, i.e. contexts of exactly n-1 tokens."""

    kind = "onelevel"

    def _orders(self) -> range:
        return range(self.n - 1, self.n - 2, -1)


class RecyclingStorage:
    """Token Recycling (Luo et al. 2024): for each token, the target's latest top-k next tokens.

    Every verified position replaces the row of the token before it with the target's top-k there
    (``fill``); a token seen in the text only starts a row when it has none. n = 2; the same interface
    as :class:`NGramStorage`.
    """

    kind = "recycling"
    n = 2

    def __init__(self, n: int, vocab_size: int, width: int = 8):
        self.vocab_size = check_int(vocab_size, "vocab_size", 1)
        self.width = check_int(width, "width", 1)
        self.reset()

    @property
    def wants_top_k(self) -> int:
        """The top-k the verify loop must hand over: a row's width."""
        return self.width

    def reset(self) -> None:
        self.rows: dict[int, list[int]] = {}
        self._first: int | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def initialize(self, prompt: Sequence[int]) -> None:
        self.update((), prompt)

    def update(self, context: Sequence[int], tokens: Iterable[int]) -> None:
        previous = context[-1] if len(context) else None
        for token in tokens:
            token = check_token(self.vocab_size, token)
            if self._first is None:
                self._first = token
            if previous is not None and previous not in self.rows:
                self.rows[previous] = [token]
            previous = token

    def fill(self, context: Sequence[int], candidates: Sequence[int]) -> None:
        """The target's ranked top-k after ``context``: the new row of its last token."""
        if len(context):
            row = [check_token(self.vocab_size, t) for t in candidates[:self.width]]
            self.rows[check_token(self.vocab_size, context[-1])] = row

    def next_token(self, context: Sequence[int], *, min_context: int = 1) -> tuple[int, bool]:
        row = self.rows.get(context[-1]) if len(context) else None
        if row:
            return row[0], True
        return (self._first or 0), False

    def top_tokens(self, context: Sequence[int], k: int, *, min_context: int = 1
                   ) -> tuple[list[tuple[int, float]], bool]:
        """Up to k candidates of the last token's row; weights fall with rank (1/(r+1), normalised)."""
        row = self.rows.get(context[-1]) if len(context) else None
        if not row:
            return [(self._first or 0, 1.0)], False
        weights = [1.0 / (r + 1) for r in range(min(k, len(row)))]
        total = sum(weights)
        return [(t, w / total) for t, w in zip(row, weights)], True

    def __repr__(self) -> str:
        return f"RecyclingStorage(width={self.width}, rows={len(self)})"
