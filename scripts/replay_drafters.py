"""Replay NASD's storages and transformers' prompt lookup over target AR's greedy output.

    .venv/bin/python scripts/replay_drafters.py [--categories code_editing,summarization,qa_over_text]
        [--length 96] [--gamma 4,8,16] [--storages basic,onelevel,recycling,suffix,sam]
        [--oracle] [--target ID] [--dtype float32] [--threads N] [--repeats 5]

Runs target AR (greedy) once on each built-in prompt of the categories, keeps its output
and the target's top-8 at every output position (one forward over the whole sequence),
measures what a verify forward costs by width on this machine (the engine's cached
model, a cache of the first prompt), then replays every storage and prompt lookup at
every γ over the outputs (``advisor.recorded``): no target forward per round, so each
takes seconds. Prints, per drafter and γ, the target calls, tokens per call,
acceptance and the speedup over target AR predicted from forward costs alone (no host
work: the benchmark measures that); with ``--oracle`` also the same drafter with every
draft cut to what the target accepted, the most any draft-length rule could gain, and
the copy ceiling after a match of 1 and of 2 tokens (``advisor.recorded.copy_ceiling``): the
most any drafter that copies a continuation from the text could make of these outputs.
The CPU, its flags, the versions and the load average are printed with the figures.
``suffix+fill`` and ``sam+fill`` replay those storages filling their verify widths
(``/fill_width``; the widths they choose by are measured once per γ, apart from the
pricing table).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

GROUNDED = "code_editing,summarization,qa_over_text"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--categories", default=GROUNDED)
    parser.add_argument("--length", type=int, default=96)
    parser.add_argument("--gamma", default="4,8,16")
    parser.add_argument("--storages", default="basic,onelevel,recycling,suffix,sam",
                        help="storages to replay (suffix+fill and sam+fill fill their verify widths)")
    parser.add_argument("--oracle", action="store_true",
                        help="also replay each drafter with a perfect length cut, and the copy ceiling")
    parser.add_argument("--target", help="the target model (default: the offline model)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--repeats", type=int, default=5, help="turns of forwards timed per width (medians used)")
    args = parser.parse_args(argv)
    try:
        gammas = [int(g) for g in args.gamma.split(",")]
        if not gammas or min(gammas) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--gamma takes integers >= 1 separated by commas, got {args.gamma!r}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers

    from bench.prompts import builtin_prompts
    from analysis.speedup import CostModel
    from advisor.recorded import copy_ceiling, drafter_factory, oracle, record, replay
    from generation.timing import time_target
    from engine import load_pair
    from scripts.selfdraft_bench import cpu_line
    from utils.vocab import encode_prompt

    if args.threads:
        torch.set_num_threads(args.threads)
    from utils.method_name import STORAGE_NAMES

    storages = args.storages.split(",")
    unknown = [s for s in storages if s not in STORAGE_NAMES]
    if unknown:
        parser.error(f"unknown storage {unknown[0]!r} (choose from {', '.join(STORAGE_NAMES)})")
    categories = args.categories.split(",")
    texts = [p.text for p in builtin_prompts() if p.category in categories]
    if not texts:
        parser.error(f"no built-in prompt in {args.categories!r}")
    pair = load_pair(args.target, None, dtype=args.dtype)
    vocab_size = pair.vocab_size or pair.target.config.vocab_size
    prompts = [encode_prompt(pair.tokenizer, text) for text in texts]
    print(f"CPU: {cpu_line()}; torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"transformers {transformers.__version__}; load {os.getloadavg()[0]:.2f}")
    recorded = record(pair, prompts, args.length)
    costs = time_target(pair.target, torch.tensor([prompts[0]]), widths=range(1, max(gammas) + 2),
                        repeats=args.repeats).verify_s
    print("verify forward ms by width: " + " ".join(f"{w}:{s * 1000:.1f}" for w, s in sorted(costs.items())))
    cost = CostModel(draft_step_s=0.0, verify_s=costs).verify
    tokens = sum(len(r.output) for r in recorded)
    target_s = (tokens - len(recorded)) * cost(1)          # target AR: one width-1 forward a token after the prefill
    print(f"{len(recorded)} prompts ({args.categories}), {tokens} tokens, target AR {tokens} calls")
    print(f"{'drafter':28s} {'γ':>3s} {'calls':>6s} {'tok/call':>8s} {'accept':>7s} {'predicted':>9s}")
    for storage in storages + ["prompt_lookup"]:
        for gamma in gammas:
            make = drafter_factory(pair, storage, vocab_size, gamma)
            rows = [(storage, replay(pair, make, recorded, gamma, args.length))]
            if args.oracle:
                rows.append((f"{storage} (oracle cut)", replay(pair, make, recorded, gamma, args.length, cut=oracle)))
            if args.oracle and storage == "prompt_lookup":
                rows += [(f"copy ceiling, match {m}", copy_ceiling(recorded, gamma, args.length, cost, match=m))
                         for m in (1, 2)]
            for name, run in rows:
                speedup = target_s / run.forward_s(cost) if run.forward_s(cost) else float("nan")
                print(f"{name:28s} {gamma:3d} {run.calls:6d} {run.tokens_per_call:8.2f} "
                      f"{run.acceptance:7.0%} {speedup:8.2f}x")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
