"""The three chain verify rules side by side: accepted tokens per round and tokens/s.

    .venv/bin/python scripts/verify_rules_bench.py [--prompts 3] [--length 48] [--gammas 2 4 8]
                                                   [--temperatures 1.0 0.7] [--drafters model self:skip=auto]

Loads the default pair the way ``infer.py`` does (the self-drafter chosen by
measuring on this machine drafts as ``model``); each further ``--drafters``
entry is a self-drafter spec built from the same target (``self:skip=10,11``:
the target with layers skipped, a different network from the chosen copy).
For every drafter, temperature, γ and rule (``residual``, ``block``,
``strict``) it runs speculative decoding through ``run_strategy`` (multinomial
sampling, the same seed for every rule) on the first built-in prompt of the
first ``--prompts`` categories, and prints the mean acceptance length (1 +
accepted / drafting rounds, the engines' definition), the draft acceptance
rate and tokens/s, with the CPU, its flags, the versions and the date.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

RULES = ("residual", "block", "strict")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--length", type=int, default=48)
    parser.add_argument("--gammas", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 0.7])
    parser.add_argument("--drafters", nargs="+", default=["model"])
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    from bench.prompts import builtin_prompts
    from engine import EngineState, Strategy, load_pair, run_strategy
    from utils.machine_load import cpu_description
    from sampling import ProcessorSpec
    from scripts.rtt_check import first_of_each_category
    from utils.vocab import encode_prompt

    pair = load_pair()
    print("\n".join(pair.banner_lines()))
    prompts = [encode_prompt(pair.tokenizer, p.text) for p in first_of_each_category(builtin_prompts(), 1)]
    prompts = prompts[:args.prompts]
    state = EngineState()
    name, flags = cpu_description()
    wanted = " ".join(f for f in flags.split() if f.startswith(("avx512_bf16", "avx512f", "amx", "avx2", "fma")))
    print(f"date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {name} ({os.cpu_count()} cores; {wanted})")
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads) · transformers {transformers.__version__}"
          f" · {len(prompts)} prompts · {args.length} new tokens · multinomial · seed {args.seed}")
    print(f"{'drafter':26s} {'T':>4s} {'γ':>3s} {'rule':9s} {'accept len':>10s} {'draft rate':>10s} {'tok/s':>7s}")
    for drafter in args.drafters:
        kind, options = ("model", None) if drafter == "model" else ("self", drafter)
        label = pair.drafter_name.split()[1] if drafter == "model" else drafter
        for temperature in args.temperatures:
            for gamma in args.gammas:
                for rule in RULES:
                    strategy = Strategy("speculative", drafter=kind, drafter_options=options, gamma=gamma,
                                        processor=ProcessorSpec("multinomial", temperature), max_gen_len=args.length,
                                        seed=args.seed, verify=rule, inspect=False)
                    run_strategy(strategy, pair, prompts[0][:16], state=state)  # warm
                    accepted = rounds = drafted = tokens = 0
                    seconds = 0.0
                    for ids in prompts:
                        result = run_strategy(strategy, pair, ids, state=state)
                        drafting = [r for r in result.trace if r.drafted]
                        rounds += len(drafting)
                        accepted += sum(r.accepted for r in drafting)
                        drafted += sum(len(r.drafted) for r in drafting)
                        tokens += len(result.tokens)
                        seconds += result.seconds
                    print(f"{label:26s} {temperature:4.1f} {gamma:3d} {rule:9s} "
                          f"{1 + accepted / max(rounds, 1):10.3f} {accepted / max(drafted, 1):10.3f} "
                          f"{tokens / seconds:7.1f}", flush=True)
    print("load after:", os.getloadavg())


if __name__ == "__main__":
    main()
