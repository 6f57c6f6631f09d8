"""The default pair's drafter at several γ: speedup, acceptance and where a round's time goes.

    .venv/bin/python scripts/gamma_phases.py [--gammas 2,3,4,5,6] [--per-category 1] [--length 96]

Loads the default pair the way ``infer.py`` does and, for each γ, runs greedy
target AR and speculative decoding with the pair's drafter through the engine
(``run_strategy``) on the first ``--per-category`` built-in prompts of every
category, the two in turn per prompt after one untimed warm-up. Prints, per γ,
the speedup over target AR (summed over the prompts), the acceptance, tokens
per round and the engine's own phase clock per round: drafting, verifying (the
target's forward over γ + 1 tokens, and its prefill of the prompt) and the
rest. Every output is checked against target AR's.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gammas", default="2,3,4,5,6")
    parser.add_argument("--per-category", type=int, default=1)
    parser.add_argument("--length", type=int, default=96)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print("load before:", os.getloadavg())
    import torch
    import transformers

    from engine import Strategy, load_pair, run_strategy
    from sampling import GreedyProcessor
    from scripts.selfdraft_bench import cpu_line
    from bench.prompts import builtin_prompts
    from scripts.rtt_check import first_of_each_category
    from utils.vocab import encode_prompt

    pair = load_pair()
    print("\n".join(pair.banner_lines()))
    prompts = [encode_prompt(pair.tokenizer, p.text)
               for p in first_of_each_category(builtin_prompts(), args.per_category)]
    target = Strategy("target", processor=GreedyProcessor(), max_gen_len=args.length)
    print(f"\ndate {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {cpu_line()}")
    print(f"torch {torch.__version__} ({torch.get_num_threads()} threads) · transformers {transformers.__version__} · "
          f"{len(prompts)} prompts · greedy · {args.length} new tokens · drafter {pair.drafter_name}")
    for gamma in (int(g) for g in args.gammas.split(",")):
        spec = Strategy("speculative", drafter="model", gamma=gamma, processor=GreedyProcessor(),
                        max_gen_len=args.length)
        run_strategy(target, pair, prompts[0][:32])                # warm-up
        run_strategy(spec, pair, prompts[0][:32])
        ar_tokens = ar_seconds = tokens = seconds = drafted = accepted = rounds = 0
        phases = {"draft": 0.0, "verify": 0.0, "other": 0.0}
        for i, ids in enumerate(prompts):
            order = (target, spec) if i % 2 == 0 else (spec, target)
            results = {s.key: run_strategy(s, pair, ids) for s in order}
            ar, sd = results[target.key], results[spec.key]
            if ar.tokens != sd.tokens:
                raise SystemExit(f"γ {gamma}, prompt {i}: speculative output differs from target AR")
            ar_tokens, ar_seconds = ar_tokens + len(ar.tokens), ar_seconds + ar.seconds
            tokens, seconds = tokens + len(sd.tokens), seconds + sd.seconds
            drafted, accepted, rounds = drafted + sd.drafted, accepted + sd.accepted, rounds + sd.rounds
            for name in phases:
                phases[name] += sd.phases[name]
        speedup = (tokens / seconds) / (ar_tokens / ar_seconds)
        per_round = ", ".join(f"{name} {value / rounds * 1e3:.1f}" for name, value in phases.items())
        print(f"γ {gamma}: {speedup:.2f}x target AR ({ar_seconds / ar_tokens * 1e3:.1f} ms a token); "
              f"acceptance {accepted / drafted:.1%}, {tokens / rounds:.2f} tokens a round; "
              f"ms a round: {per_round}", flush=True)
    print("load after:", os.getloadavg())


if __name__ == "__main__":
    main()
