"""Speculative decoding with each self-drafter against target AR, on the built-in prompts.

    .venv/bin/python scripts/selfdraft_bench.py [--per-category 1] [--length 96] [--gamma 4]

Loads the default pair the way ``infer.py`` does (with no ``--drafter``: the
self-drafter chosen by measuring, with its predicted speedup), takes
the other candidates the loader measured (``self:bf16``, ``self:fp16``,
``self:int8``, and ``self:int8=weight-only`` where bfloat16 is native) and the
chosen (or searched) ``self:skip`` next to it, and runs greedy target AR and speculative decoding
with each drafter through the engine (``run_strategy``, as the REPL and the
benchmark run them: drafting on the target's cache) on the first ``--per-category`` built-in prompts of every category (chat template on),
the strategies in a rotating order per prompt after one untimed warm-up.
Prints tokens/s and the speedup over target AR (summed over the prompts), the
load-time prediction beside the measured speedup of the chosen drafter, the
load time, the CPU and its flags, the versions and the load average before and after.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cpu_line() -> str:
    from utils.machine_load import cpu_description

    name, flags = cpu_description()
    wanted = [f for f in flags.split() if f.startswith(("avx512", "amx", "avx2", "fma"))]
    return f"{name} ({os.cpu_count()} cores; {' '.join(wanted)})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's); 1 on a busy machine")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print("load before:", os.getloadavg())
    start = time.perf_counter()
    import torch
    import transformers

    if args.threads:
        torch.set_num_threads(args.threads)

    from bench.prompts import builtin_prompts
    from scripts.rtt_check import first_of_each_category
    from engine import Strategy, load_pair, run_strategy
    from sampling import GreedyProcessor
    from utils.vocab import encode_prompt

    imported = time.perf_counter()
    pair = load_pair()
    loaded = time.perf_counter()
    print(f"import {imported - start:.1f} s, load_pair {loaded - imported:.1f} s")
    print("\n".join(pair.banner_lines()))
    chosen = pair.drafter_name.split()[1]
    # Each drafter as the engine runs it (the REPL's and the benchmark's path): the
    # pair's own drafter as kind "model", the others built from the target by spec.
    drafters = {f"{chosen} (chosen)": ("model", None)}
    skip = next((line.split("(")[1].split(")")[0] for line in pair.notes if line.startswith("self:skip=auto")), None)
    from model_drafters.selfdraft import candidates_here

    measured = [label for label in candidates_here(pair.device) if label != "self:skip=auto"]
    for label in measured + ([f"self:skip={skip}"] if skip else []):
        if label != chosen:
            drafters[label] = ("self", label)
    counts: dict[str, list[float]] = {"target AR": [0, 0.0], **{k: [0, 0.0] for k in drafters}}
    prompts = [encode_prompt(pair.tokenizer, p.text)
               for p in first_of_each_category(builtin_prompts(), args.per_category)]

    def run(name, ids):
        if name == "target AR":
            strategy = Strategy("target", processor=GreedyProcessor(), max_gen_len=args.length)
        else:
            kind, options = drafters[name]
            strategy = Strategy(name, drafter=kind, drafter_options=options, gamma=args.gamma,
                                processor=GreedyProcessor(), max_gen_len=args.length)
        return run_strategy(strategy, pair, ids)

    names = list(counts)
    for name in names:  # warm-up
        run(name, prompts[0][:32])
    for i, ids in enumerate(prompts):
        order = names[i % len(names):] + names[:i % len(names)]
        outputs = {}
        for name in order:
            gc.collect()
            result = run(name, ids)
            counts[name][0] += len(result.tokens)
            counts[name][1] += result.seconds
            outputs[name] = result.tokens
        differ = [n for n in names if outputs[n] != outputs["target AR"]]
        print(f"prompt {i}: {len(ids)} tokens; outputs differing from target AR: {differ or 'none'}", flush=True)
    ar = counts["target AR"][0] / counts["target AR"][1]
    print(f"\n{platform.node() and ''}date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {cpu_line()}")
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads) · transformers {transformers.__version__} · "
          f"{len(prompts)} prompts · greedy · {args.length} new tokens · γ {args.gamma} constant")
    for name, (tokens, seconds) in counts.items():
        print(f"{name:28s} {tokens / seconds:6.1f} tok/s  {tokens / seconds / ar:5.2f}x target AR")
    print("load after:", os.getloadavg())
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
