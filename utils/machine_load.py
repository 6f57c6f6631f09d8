"""How busy the machine was while a figure was measured, apart from this process.

:func:`read_load` before and after a measurement; :func:`other_load` is the CPU time every *other*
process used between them (``/proc/stat``'s busy time, steal included, less this process's
``os.times()``), in cores per second of wall time: exact in kind, unlike a load average. None where
``/proc/stat`` cannot be read. Torch-free.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

# Above one busy core's worth of CPU taken by other processes, a figure is marked as measured on
# a busy machine (a warning line; the benchmark marks the run).
BUSY_CORES = 1.0

# /proc/stat's cpu line: user nice system idle iowait irq softirq steal guest guest_nice (in ticks).
# Busy is everything but idle and iowait; guest time is already inside user.
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class LoadReading:
    """One reading: wall clock, the system's and this process's CPU seconds, the load average."""

    clock: float                      # time.perf_counter()
    system_busy_s: float | None       # CPU seconds all processes used since boot (None: unreadable)
    own_busy_s: float                 # CPU seconds this process used (all its threads)
    loadavg: tuple[float, float, float] | None
    cores: int


def _system_busy_seconds(path: str = "/proc/stat") -> float | None:
    """Busy CPU seconds of the whole machine since boot, or None where the file is missing."""
    try:
        with open(path, encoding="ascii") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    try:
        ticks = [int(x) for x in first[1:]]
        hz = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return None
    return sum(ticks[i] for i in _BUSY_FIELDS if i < len(ticks)) / hz


def _loadavg() -> tuple[float, float, float] | None:
    try:
        one, five, fifteen = os.getloadavg()
    except (AttributeError, OSError):
        return None
    return (one, five, fifteen)


def read_load() -> LoadReading:
    """A reading now (cheap: two small reads, no sleep)."""
    own = os.times()
    return LoadReading(clock=time.perf_counter(), system_busy_s=_system_busy_seconds(),
                       own_busy_s=own.user + own.system, loadavg=_loadavg(), cores=os.cpu_count() or 1)


def other_load(before: LoadReading, after: LoadReading) -> float | None:
    """Cores' worth of CPU that other processes used between two readings (>= 0), or None.

    None where the system's busy time is unknown or the readings are less than 10 ms apart
    (the kernel counts in ticks of 10 ms: a shorter window says nothing).
    """
    wall = after.clock - before.clock
    if before.system_busy_s is None or after.system_busy_s is None or wall < 0.01:
        return None
    others = (after.system_busy_s - before.system_busy_s) - (after.own_busy_s - before.own_busy_s)
    return max(0.0, others / wall)


def is_busy(load: float | None) -> bool:
    """Whether other processes took more than one busy core's worth (:data:`BUSY_CORES`)."""
    return load is not None and load > BUSY_CORES


def load_mark(load: float | None) -> dict:
    """The other processes' load as a record keeps it (cores' worth to 3 places, None where unknown)
    and whether that was busy."""
    return {"other_load": None if load is None else round(load, 3), "busy": is_busy(load)}


def load_record(before: LoadReading, after: LoadReading) -> dict:
    """The JSON record of a measured span: cores, the load average at its start and end, the
    other processes' load during it (None where unknown) and whether that was busy."""
    return {
        "cores": after.cores,
        "loadavg_start": _rounded(before.loadavg),
        "loadavg_end": _rounded(after.loadavg),
        **load_mark(other_load(before, after)),
    }


def _rounded(values: tuple[float, ...] | None) -> list[float] | None:
    return None if values is None else [round(v, 2) for v in values]


def busy_warning(load: float | None, cores: int, what: str) -> str | None:
    """One warning line when ``load`` is busy, else None: ``what`` names the measured thing
    ("this prompt's runs", "the calibration")."""
    if not is_busy(load):
        return None
    return (f"busy machine: other processes used {load:.1f} of {cores} cores during {what}; "
            "its times are slower than this machine's own and its speedups may be off")


def cpu_description() -> tuple[str, str]:
    """(CPU model name, its flags) from /proc/cpuinfo, or what platform says."""
    name, flags = platform.processor() or platform.machine(), ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name in ("", platform.machine(), platform.processor()):
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.strip()
    except OSError:
        pass
    return name, flags
