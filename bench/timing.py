"""One timer for every strategy and peer: a device sync on both sides of the call."""

from __future__ import annotations

import gc
import time

from utils.devices import synchronize


def timed(fn, device) -> tuple[object, float]:
    """Call ``fn()`` between two syncs; returns (its value, wall seconds).

    Garbage is collected before the clock starts and the collector is paused
    while it runs (as ``timeit`` does), so no run pays for another's garbage.
    The collection is of the young generations: the last run's objects are all
    there, since none is promoted while the collector is paused. A full one walks
    every object the process holds (0.24 s a call in the test process, three
    quarters of a tiny benchmark's wall time), and no run's time depends on it.
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
