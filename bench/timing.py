"""One timer for every strategy and peer: a device sync on both sides of the call."""

from __future__ import annotations

import gc
import time

from utils.devices import synchronize


def timed(fn, device) -> tuple[object, float]:
    """Call ``fn()`` between two syncs; returns (its value, wall seconds).

    The young generations are collected before the clock starts and the collector is paused while it
    runs (as ``timeit`` does), so no run pays for another's garbage; a full collection would walk every
    object the process holds, which no run's time depends on.
    """
    gc.collect(1)
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
