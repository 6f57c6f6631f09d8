"""The live view: a strategy's panel filling round by round while it runs.

:class:`LiveView` is the engine's observer (``generation.observer``): it records each round's drafts
and outcome and draws at most once every ``interval`` seconds; the loop leaves that time out of the
strategy's seconds. When the strategy ends the ordinary panel replaces it.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from analysis.report import DRAFTING
from generation.result import Round
from repl.render import ACCEPTED, BONUS, GAMMA_MARK, REJECTED, STRATEGY_COLOURS, SUPERSCRIPT, TARGET
from repl.settings import STRATEGY_LABELS
from repl.stream import IncrementalDecoder

REFRESH_S = 0.1  # draw at most ten times a second
PENDING = "dim"
LIVE_MARK = "live"  # the status line starts with it (tests look for it)


class LiveView:
    """Records one running strategy and draws it, at most every ``interval`` seconds; ``draw`` receives
    the renderable (None records without drawing)."""

    def __init__(self, key: str, tokenizer, prompt_ids: list[int], *,
                 draw: Callable[[Panel], None] | None = None, interval: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic, height: int = 40, width: int = 100):
        self.key = key
        self.coloured = key in DRAFTING
        self.decoder = IncrementalDecoder(tokenizer, prompt_ids)
        self.text = Text()
        self.pending: list[int] = []
        self.draw = draw
        self.interval = interval
        self.clock = clock
        self.height = height
        self.tail_chars = height * width  # at most a screenful is ever rendered
        self.draws = 0
        self._last_draw: float | None = None
        self.rounds = self.tokens = self.drafted_total = self.accepted_total = 0
        self.draft_s = self.verify_s = self.elapsed_s = 0.0

    # ------------------------------------------------------------ observer

    def drafted(self, draft: list[int]) -> None:
        self.pending = list(draft)
        self._maybe_draw()

    def round(self, rnd: Round, new_tokens: list[int], elapsed_s: float) -> None:
        self._commit(rnd, new_tokens)
        self.pending = []
        self.rounds += 1
        self.tokens += len(new_tokens)
        self.drafted_total += len(rnd.drafted)
        self.accepted_total += rnd.accepted
        self.draft_s += rnd.draft_s
        self.verify_s += rnd.verify_s
        self.elapsed_s = elapsed_s
        self._maybe_draw()

    # ------------------------------------------------------------ the text

    def _push(self, tokens, style: str) -> None:
        for piece in self.decoder.extend(tokens):
            if piece:
                self.text.append(piece, style=style)

    def _commit(self, rnd: Round, new_tokens: list[int]) -> None:
        """Append the round in the debug view's colours (plain text for AR)."""
        if not self.coloured:
            self._push(new_tokens, "")
            return
        if rnd.gamma > 0:
            self.text.append(str(rnd.gamma).translate(SUPERSCRIPT), style=GAMMA_MARK)
        self._push(new_tokens[:rnd.accepted], ACCEPTED)
        rejected = "".join(self.decoder.preview(rnd.rejected))
        if rejected:
            self.text.append(rejected, style=REJECTED)
        if rnd.token is not None:
            self._push([rnd.token], BONUS if rnd.bonus else TARGET)

    # ------------------------------------------------------------ drawing

    def _maybe_draw(self) -> None:
        if self.draw is None:
            return
        now = self.clock()
        if self._last_draw is not None and now - self._last_draw < self.interval:
            return
        self._last_draw = now
        self.draws += 1
        self.draw(self.panel())

    def status(self) -> str:
        """``live · round 12 · 40 tokens · 15.2 tokens/s · acceptance 90% (36/40) ·
        draft 1.20 s / verify 0.80 s (60/40%)``."""
        parts = [LIVE_MARK, f"round {self.rounds}", f"{self.tokens} tokens"]
        if self.elapsed_s > 0:
            parts.append(f"{self.tokens / self.elapsed_s:.1f} tokens/s")
        if self.coloured:
            rate = self.accepted_total / self.drafted_total if self.drafted_total else 0.0
            parts.append(f"acceptance {rate:.0%} ({self.accepted_total}/{self.drafted_total})")
        split = self.draft_s + self.verify_s
        if split > 0:
            parts.append(f"draft {self.draft_s:.2f} s / verify {self.verify_s:.2f} s "
                         f"({self.draft_s / split * 100:.0f}/{self.verify_s / split * 100:.0f}%)")
        return " · ".join(parts)

    def body(self) -> Text:
        """The text so far (its last lines, so a draw costs the same at token 10 and 10,000) and the
        pending drafts, dim."""
        text = self.text[-self.tail_chars:] if len(self.text) > self.tail_chars else self.text.copy()
        if self.pending:
            text.append("".join(self.decoder.preview(self.pending)), style=PENDING)
        lines = text.split("\n", allow_blank=True)
        if len(lines) > self.height:
            text = Text("\n").join(lines[-self.height:])
        return text

    def panel(self) -> Panel:
        colour = STRATEGY_COLOURS[self.key]
        title = Text(STRATEGY_LABELS[self.key], style=f"bold {colour}")
        title.append("  running", style="dim")
        return Panel(Group(self.body(), Text(self.status(), style="dim")), title=title,
                     title_align="left", border_style=f"dim {colour}")


@contextmanager
def live_panel(console: Console, key: str, tokenizer, prompt_ids: list[int],
               interval: float | None = None) -> Iterator[LiveView]:
    """A :class:`LiveView` drawing into a transient rich ``Live`` on ``console`` that never refreshes on
    its own (no drawing thread competes with decoding); the region is erased when the strategy ends."""
    view = LiveView(key, tokenizer, prompt_ids, interval=REFRESH_S if interval is None else interval,
                    height=max(4, console.size.height - 8), width=console.size.width)
    with Live(view.panel(), console=console, auto_refresh=False, transient=True,
              vertical_overflow="crop") as live:
        view.draw = lambda panel: live.update(panel, refresh=True)
        yield view
