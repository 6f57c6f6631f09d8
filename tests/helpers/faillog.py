"""A pytest plugin for time-boxed runs (a lent GPU's few minutes): each failure's id and first
error line, appended to the file ``SPECDEC_FAILLOG`` names as it happens, so a run cut off by its
time limit still says what failed. ``-p tests.helpers.faillog`` turns it on (scripts/gpu_check.sh)."""

import os


def pytest_runtest_logreport(report):
    path = os.environ.get("SPECDEC_FAILLOG")
    if not path or not report.failed or hasattr(report, "node"):   # a worker's report, once
        return
    crash = getattr(getattr(report, "longrepr", None), "reprcrash", None)
    line = crash.message if crash is not None else (str(report.longrepr).strip().splitlines() or [""])[-1]
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{report.nodeid} [{report.when}] {' '.join(line.split())[:400]}\n")
