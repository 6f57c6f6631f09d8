"""Watching a generation round by round, without the watching counting as its time.

An observer is told each round's drafts and what it appended (the REPL's live view is one). The
loops call it through :class:`Watch`, which times the calls so the result's ``seconds`` leave them
out: drawing is not decoding.
"""

from __future__ import annotations

import time
from typing import Protocol

from generation.result import Round
from utils.devices import synchronize


class Observer(Protocol):
    """What a loop tells whoever watches it."""

    def drafted(self, draft: list[int]) -> None:
        """The drafts of the round now being verified (ids; may be empty)."""

    def round(self, rnd: Round, new_tokens: list[int], elapsed_s: float) -> None:
        """A finished round, the tokens it appended, and the generation's
        seconds so far (observer time left out)."""


class NoObserver:
    """The default: nobody is watching."""

    def drafted(self, draft: list[int]) -> None:
        pass

    def round(self, rnd: Round, new_tokens: list[int], elapsed_s: float) -> None:
        pass


class Watch:
    """An observer plus the host seconds spent inside it (``paused_s``, taken out of the run's seconds;
    it is called after the round's host sync, so host time is the whole cost). ``active`` is False for
    no observer, so a loop can skip work done only to feed one. :meth:`first_token` gives the run's
    time to first token, watched or not."""

    def __init__(self, observer: Observer | None):
        self.observer = observer if observer is not None else NoObserver()
        self.active = observer is not None
        self.paused_s = 0.0
        self._start = time.perf_counter()
        self._first: tuple[float, float, int] | None = None   # (clock, paused_s then, tokens)

    def drafted(self, draft: list[int]) -> None:
        if self.active:
            t0 = time.perf_counter()
            try:
                self.observer.drafted(draft)
            finally:
                self.paused_s += time.perf_counter() - t0

    def round(self, rnd: Round, new_tokens: list[int]) -> None:
        if self._first is None:   # after the round's host sync: its tokens are on the host now
            self._first = (time.perf_counter(), self.paused_s, len(new_tokens))
        if self.active:
            t0 = time.perf_counter()
            try:
                self.observer.round(rnd, new_tokens, t0 - self._start - self.paused_s)
            finally:
                self.paused_s += time.perf_counter() - t0


    def first_token(self, start: float) -> tuple[float | None, int]:
        """(seconds from ``start`` until the first round's tokens were on the host, observer time
        left out; how many tokens that round appended), or (None, 0) when no round ended."""
        if self._first is None:
            return None, 0
        clock, paused, tokens = self._first
        return max(0.0, clock - start - paused), tokens


def target_delay(seconds: float, device) -> None:
    """An injected network round trip before a target forward (``--rtt-inject``), after the device has
    finished its queued work, so the wait never overlaps compute."""
    if seconds > 0:
        synchronize(device)
        time.sleep(seconds)
