"""One timer for every strategy and peer: a device sync on both sides of the call."""

from __future__ import annotations

import gc
import time

from utils.devices import synchronize


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
