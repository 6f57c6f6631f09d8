"""Time the cache probe (kvcache.probe) on a pair: what it adds to loading.

    .venv/bin/python scripts/probe_timing.py [--target ID --drafter ID] [--repeats 5]

Loads the pair (the offline default without flags), warms both models with one forward, then
probes each model ``--repeats`` times afresh and prints the median and the range per model and for
the pair, with the CPU, the torch threads, the versions and the load average, so the figure can be
put beside the machine it came from.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return platform.processor() or "unknown CPU"
    fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
    name = fields.get("Model name", "unknown CPU").strip()
    flags = fields.get("Flags", "")
    extras = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags.split()]
    return f"{name} ({', '.join(extras) or 'no avx512'}; {os.cpu_count()} cores)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target")
    parser.add_argument("--drafter")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    import torch
    import transformers

    from engine import load_pair
    from kvcache.probe import forget, probe_model

    pair = load_pair(args.target, args.drafter)
    print(pair.probe.summary())
    with torch.inference_mode():
        for model in (pair.target, pair.drafter):
            model(input_ids=torch.tensor([[5, 6, 7]], device=pair.device), use_cache=False)   # warm
    times: dict[str, list[float]] = {"target": [], "drafter": [], "pair": []}
    for _ in range(args.repeats):
        begun = time.perf_counter()
        for role, model in (("target", pair.target), ("drafter", pair.drafter)):
            forget(model)
            start = time.perf_counter()
            probe_model(model)
            times[role].append(time.perf_counter() - start)
        times["pair"].append(time.perf_counter() - begun)
    for role, values in times.items():
        print(f"{role:8s} median {statistics.median(values):.3f} s (min {min(values):.3f}, max {max(values):.3f}, "
              f"{len(values)} runs)")
    print(f"{_cpu()} · torch {torch.__version__} ({torch.get_num_threads()} threads) · transformers "
          f"{transformers.__version__} · {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
