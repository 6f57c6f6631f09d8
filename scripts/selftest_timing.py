"""Time the self-test on a model pair: each check, the total, and the machine it ran on.

    .venv/bin/python scripts/selftest_timing.py [--target ORG/MODEL --drafter ORG/MODEL]

Loads the pair (the offline default SmolLM2 pair unless told otherwise; loading is
not part of the self-test's time), runs ``checks.selftest`` once, and prints one
line per check with its seconds, the total, and what the figures depend on: the
CPU model and its vector flags, torch's thread count, the library versions and
the load average before and after (a shared machine makes every figure larger;
the process CPU seconds beside each check are less affected).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_description() -> str:
    """'MODEL NAME (avx2 avx512f ...)' from /proc/cpuinfo, or the platform's processor string."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {k.strip(): v.strip() for k, v in fields.items()}
    flags = set(fields.get("flags", "").split())
    present = " ".join(f for f in FLAGS if f in flags) or "none of " + "/".join(FLAGS)
    return f"{fields.get('model name', 'unknown CPU')} ({present}; {os.cpu_count()} cores)"


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None)
    parser.add_argument("--drafter", default=None)
    args = parser.parse_args()

    import torch
    import transformers

    from checks.selftest import timed_selftest
    from engine import load_pair

    start = time.perf_counter()
    pair = load_pair(args.target, args.drafter)
    print(f"pair: {pair.target_name} + {pair.drafter_name} (loaded in {time.perf_counter() - start:.1f} s, "
          "not counted)")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"cpu: {cpu_description()} · torch threads: {torch.get_num_threads()}")
    print(f"versions: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"Python {platform.python_version()}")
    print(f"load average before: {load_average()}")
    cpu = [time.process_time()]

    def report(check) -> None:
        # Process CPU seconds beside each line: less sensitive than wall time to other jobs.
        now = time.process_time()
        print(f"{check.line()} (cpu {now - cpu[0]:.1f} s)", flush=True)
        cpu[0] = now

    checks, last = timed_selftest(pair, report=report)
    print(last)
    print(f"load average after: {load_average()}")
    return 0 if all(c.passed for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
