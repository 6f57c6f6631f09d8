"""Measure the int8 routes of this stack on the default model: one-token step time and top-1 agreement.

    .venv/bin/python scripts/int8_paths.py [--steps 20] [--torchao-path DIR]

For each route in ``selfdraft.spec.INT8_ROUTES`` that imports: the median
seconds of a one-token decode step (with a cache of 200 prompt positions), and
the share of next-token argmaxes over the target's own greedy continuation of
the calibration prompt that equal the float32 target's. Prints one line per route, and the CPU, torch version and load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def step_seconds(model, ids, steps: int) -> float:
    import torch

    from kvcache.cache import CachedModel

    cached = CachedModel(model, path="cached")   # on a cache, as a self-drafter drafts (the dynamic route's own cache runs uncached)
    cached.begin(ids[0].tolist())
    times = []
    with torch.inference_mode():
        cached.forward(ids, keep=1)
        seq = ids
        for i in range(steps):
            seq = torch.cat([seq, seq[:, -1:]], dim=1)
            start = time.perf_counter()
            cached.forward(seq, keep=1)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--torchao-path", help="a folder to import torchao from (pip install --target DIR torchao)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.torchao_path:
        sys.path.append(args.torchao_path)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from engine.run import greedy_run
    from model_drafters.selfdraft import agreement, calibration_ids, greedy_continuation
    from model_drafters.selfdraft import INT8_ROUTES, int8_available, int8_copy
    from utils.models import load_model

    target, tokenizer = load_model(None, device="cpu", dtype="float32")
    ids = calibration_ids(tokenizer)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"torch {torch.__version__} · {torch.get_num_threads()} threads · load {os.getloadavg()}")
    text = greedy_continuation(greedy_run, target, ids)  # agreement is scored on the target's own continuation
    base = step_seconds(target, ids, args.steps)
    print(f"float32 target: step {base * 1e3:.1f} ms")
    for method in INT8_ROUTES:
        if not int8_available(method):
            print(f"{method}: not installed")
            continue
        try:
            model = int8_copy(target, method)
            seconds = step_seconds(model, ids, args.steps)
            agree = agreement(target, model, text, ids.shape[1])
        except Exception as exc:  # noqa: BLE001  (a route that fails is reported, not fatal)
            print(f"{method}: failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        print(f"{method}: step {seconds * 1e3:.1f} ms ({seconds / base:.2f}x float32) · top-1 agreement {agree:.3f}")


if __name__ == "__main__":
    main()
