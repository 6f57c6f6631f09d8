"""Forwards read between timed shapes against the same forwards timed: how far a cost table's shapes carry.

    python scripts/check_shapes.py [--context 300] [--batches 1,4,16,32] [--widths 1,4,16]

The default pair's target (the offline SmolLM2-135M-Instruct) is timed by shape
(``engine.shapes.time_shapes``: B sequences of w new tokens over a cache of ``--context`` tokens,
device-synced, the median of its turns) on the grid ``--batches`` x ``--widths``, then on every
(B, w) of B in 1, 2, 4, 8, 16, 32 and w in 1, 2, 4, 8, 16 the grid leaves out. Each left-out
forward is read off the grid (``engine.shapes.read_between``, as ``--costs FILE --whatif batch``
reads a width or batch size its file lacks) and set against its timed seconds: the error per point,
the worst and the mean, and whether the point lies inside the grid or past it (read on the last
segment). A round at batch B is a sum of such forwards, so its error is at most the worst of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from engine.loading import load_pair  # noqa: E402
from engine.shapes import read_between, time_shapes  # noqa: E402
from utils.machine_load import cpu_description, other_load, read_load  # noqa: E402

ALL_BATCHES = (1, 2, 4, 8, 16, 32)
ALL_WIDTHS = (1, 2, 4, 8, 16)


def ints(text: str) -> tuple[int, ...]:
    return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--batches", type=ints, default=(1, 4, 16, 32))
    parser.add_argument("--widths", type=ints, default=(1, 4, 16))
    parser.add_argument("--out", default="check_shapes.json")
    args = parser.parse_args(argv)

    pair = load_pair(device="cpu")
    before = read_load()
    started = time.perf_counter()
    grid = time_shapes(pair.target, args.batches, args.widths, args.context, pair.vocab_size)
    grid_s = time.perf_counter() - started
    left = [(b, w) for b in ALL_BATCHES for w in ALL_WIDTHS if (b, w) not in grid]
    timed: dict[tuple[int, int], float] = {}
    for b in ALL_BATCHES:
        widths = [w for w in ALL_WIDTHS if (b, w) in left]
        if widths:
            timed.update(time_shapes(pair.target, (b,), widths, args.context, pair.vocab_size))
    load = other_load(before, read_load())
    name, flags = cpu_description()
    simd = " ".join(f for f in flags.split() if f.startswith(("avx", "amx", "fma"))) or "no AVX"
    print(f"{name} ({simd}), {torch.get_num_threads()} threads, other processes {load or 0:.2f} cores; "
          f"context {args.context}; grid B {args.batches} x w {args.widths} timed in {grid_s:.0f} s", flush=True)
    rows, errors = [], []
    for (b, w), seconds in sorted(timed.items()):
        read = read_between(grid, b, w)
        inside = min(args.batches) <= b <= max(args.batches) and min(args.widths) <= w <= max(args.widths)
        error = (read - seconds) / seconds
        errors.append(abs(error))
        rows.append({"batch": b, "width": w, "timed_ms": 1e3 * seconds, "read_ms": 1e3 * read,
                     "error": error, "inside": inside})
        print(f"B={b:<3} w={w:<3} timed {1e3 * seconds:8.2f} ms · read {1e3 * read:8.2f} ms · {100 * error:+6.1f}%"
              + ("" if inside else " (past the grid)"), flush=True)
    within = sum(1 for e in errors if e <= 0.10)
    print(f"{within} of {len(errors)} within 10%; worst {100 * max(errors, default=0):.1f}%, "
          f"mean {100 * statistics.mean(errors or [0]):.1f}%", flush=True)
    Path(args.out).write_text(json.dumps({
        "cpu": f"{name} ({simd})", "threads": torch.get_num_threads(), "other_load": load,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "context": args.context,
        "grid": {f"{b},{w}": s for (b, w), s in grid.items()}, "grid_s": grid_s, "points": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
