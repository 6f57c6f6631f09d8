"""What every gamma policy is, and the checks they share."""

from __future__ import annotations

from typing import Protocol

from generation.result import Round

DRAFTER_KINDS = ("model", "ngram")


class GammaPolicy(Protocol):
    """How many drafts each round asks for: ``begin(drafter_kind)`` once per generation ("model" or
    "ngram"), ``next_gamma()`` before each round (capped by the budget), ``observe(round)`` after it. A
    model drafter stops early below ``threshold`` (None: never); ``name`` is what results record."""

    name: str
    threshold: float | None

    def begin(self, drafter_kind: str) -> None: ...

    def next_gamma(self) -> int: ...

    def observe(self, rnd: Round) -> None: ...


def check_kind(kind: str) -> None:
    if kind not in DRAFTER_KINDS:
        raise ValueError(f"unknown drafter kind {kind!r} (expected model or ngram)")
