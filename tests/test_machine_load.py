"""utils.machine_load: the CPU other processes take during a measured span.

Fake readings pin the arithmetic (this process's own time is taken out; a window shorter than a
kernel tick says nothing); a real busy-loop process pins the reading of /proc/stat."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from utils import machine_load
from utils.machine_load import (BUSY_CORES, LoadReading, busy_warning, is_busy, load_record, other_load,
                                read_load, sample_other_load)


def reading(clock, system, own, loadavg=(0.5, 0.4, 0.3), cores=2) -> LoadReading:
    return LoadReading(clock=clock, system_busy_s=system, own_busy_s=own, loadavg=loadavg, cores=cores)


def test_other_load_takes_this_process_out():
    # Over 2 s the machine was busy 3.0 CPU seconds, 1.8 of them this process's own.
    assert other_load(reading(10.0, 100.0, 5.0), reading(12.0, 103.0, 6.8)) == pytest.approx(0.6)


def test_other_load_is_never_negative_and_unknown_without_the_system_reading():
    assert other_load(reading(0.0, 50.0, 1.0), reading(1.0, 50.5, 1.6)) == 0.0   # tick rounding
    assert other_load(reading(0.0, None, 1.0), reading(1.0, None, 1.6)) is None
    assert other_load(reading(0.0, 50.0, 1.0), reading(0.005, 50.0, 1.0)) is None   # under a tick


def test_busy_is_above_one_core_of_other_load():
    assert BUSY_CORES == 1.0
    assert not is_busy(None) and not is_busy(1.0) and is_busy(1.01)
    assert busy_warning(0.9, 2, "this run") is None
    line = busy_warning(1.62, 2, "the calibration")
    assert line.startswith("busy machine: other processes used 1.6 of 2 cores during the calibration")
    assert "\n" not in line


def test_load_record_is_json_ready():
    record = load_record(reading(10.0, 100.0, 5.0, (1.234, 0.5, 0.25)), reading(12.0, 104.0, 6.0, (1.5, 0.6, 0.3)))
    assert record == {"cores": 2, "loadavg_start": [1.23, 0.5, 0.25], "loadavg_end": [1.5, 0.6, 0.3],
                      "other_load": 1.5, "busy": True}


def test_proc_stat_busy_time_leaves_idle_and_iowait_out(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 20 30 5000 400 5 6 7 50 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    monkeypatch.setattr(os, "sysconf", lambda name: 100)
    assert machine_load._system_busy_seconds(str(stat)) == pytest.approx((100 + 20 + 30 + 5 + 6 + 7) / 100)
    assert machine_load._system_busy_seconds(str(tmp_path / "missing")) is None


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc/stat (Linux)")
def test_a_busy_process_beside_this_one_is_seen():
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.3)                                   # the spinners are running
        load = sample_other_load(0.6)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    # Two spinners on this machine take at least one core between them, whatever else runs.
    assert load is not None and load > 0.8


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs /proc/stat (Linux)")
def test_this_process_spinning_is_not_other_load():
    before = read_load()
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        pass
    after = read_load()
    own = (after.own_busy_s - before.own_busy_s) / (after.clock - before.clock)
    assert own > 0.1                                      # this process was busy (on a loaded machine, less than a core)...
    system = (after.system_busy_s - before.system_busy_s) / (after.clock - before.clock)
    # ...and its own share is taken out of the system's busy time.
    assert other_load(before, after) == pytest.approx(max(0.0, system - own), abs=1e-9)
