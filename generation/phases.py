"""Phase clocks: how long each round spent drafting and verifying, without extra host syncs.

On a GPU a mark is a CUDA event recorded on the current stream, so timing adds
no synchronisation; a round reads its events only after its own host sync (the
verify loop's one ``.tolist()`` per round), when they have completed. On a CPU
work is synchronous and a mark is ``time.perf_counter()``.
"""

from __future__ import annotations

import time

import torch


class PhaseClock:
    """Marks points in a generation and measures the seconds between two marks."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start, end) -> float:
        """Seconds between two marks; on a GPU, call only after ``end`` has completed."""
        if self.cuda:
            return start.elapsed_time(end) / 1000.0
        return end - start


def split_phases(seconds: float, draft: float, verify: float) -> dict[str, float]:
    """The record's ``phases``: draft, verify, and the rest of ``seconds`` as other, so the three add up
    to ``seconds`` exactly."""
    return {"draft": draft, "verify": verify, "other": seconds - draft - verify}


def fill_target_first(drafter, ids: torch.Tensor, clock: PhaseClock):
    """Run the drafter's ``fill_target(ids)`` (a drafter on the target's own cache feeds it the tokens it
    lacks) and return its (start, end) marks; the round counts that span as verify: the target's
    prefill is target work, wherever the drafter needs it done."""
    start = clock.mark()
    drafter.fill_target(ids)
    return start, clock.mark()
