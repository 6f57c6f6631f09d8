"""One timer for every strategy and peer: a device sync on both sides of the call."""

from __future__ import annotations

import gc
import time

import torch


def synchronize(device: str | torch.device | None) -> None:
    """Wait for queued device work, so a timer does not stop before the kernels do."""
    kind = torch.device(device).type if device is not None else "cpu"
    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    elif kind == "mps" and hasattr(torch, "mps"):
        torch.mps.synchronize()
    elif kind == "xpu" and hasattr(torch, "xpu"):
        torch.xpu.synchronize(device)


def timed(fn, device) -> tuple[object, float]:
    """Call ``fn()`` between two syncs; returns (its value, wall seconds).

    Garbage is collected before the clock starts and the collector is paused
    while it runs (as ``timeit`` does), so no run pays for another's garbage.
    """
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        synchronize(device)
        start = time.perf_counter()
        value = fn()
        synchronize(device)
        return value, time.perf_counter() - start
    finally:
        if was_enabled:
            gc.enable()
