"""What a greedy run's records cost per round: the decisions, the load marks, the first-token clock.

    .venv/bin/python scripts/record_cost.py [--drafter SPEC] [--length 64] [--repeats 2]

Loads the default pair (``--drafter`` names the drafter, so no calibration runs) and runs target
AR, speculative decoding and NASD (γ 4, greedy) on the first built-in code-editing and chat
prompts. The decisions (``generation.decisions.DecisionLog.add`` and ``read``) are timed in place
inside those runs and set against each run's seconds per round (median over the repeats after a
warm one). The load marks (two ``utils.machine_load`` readings and their difference, as the
REPL takes around each strategy) and the first-token clock (``generation.observer.Watch.round``
against the same call without its first-round check) are timed alone, median of 7, and spread
over a speculative run's rounds. Prints the CPU and torch's thread count with the figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--drafter", default=None)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import torch

    import generation.decisions as decisions
    from engine import NGramOptions, Strategy, load_pair, run_strategy
    from generation.observer import Watch
    from generation.result import Round
    from sampling import GreedyProcessor
    from scripts.selftest_timing import cpu_description
    from utils.builtin_prompts import BUILTIN
    from utils.machine_load import other_load, read_load
    from utils.vocab import encode_prompt

    spent = [0.0]
    add, read = decisions.DecisionLog.add, decisions.DecisionLog.read

    def timed_add(self, *a):
        start = time.perf_counter()
        add(self, *a)
        spent[0] += time.perf_counter() - start

    def timed_read(self):
        start = time.perf_counter()
        rows = read(self)
        spent[0] += time.perf_counter() - start
        return rows

    decisions.DecisionLog.add, decisions.DecisionLog.read = timed_add, timed_read
    pair = load_pair(None, args.drafter)
    print(f"pair: {pair.target_name} + {pair.drafter_name}")
    print(f"cpu: {cpu_description()} · torch threads: {torch.get_num_threads()} · "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    firsts = {}
    for category, text in BUILTIN:
        firsts.setdefault(category, text)
    prompts = [encode_prompt(pair.tokenizer, firsts[c], chat=True) for c in ("code_editing", "chat")]
    kinds = {"target AR": dict(key="target"),
             "speculative γ 4": dict(key="speculative", drafter="model", gamma=4),
             "NASD γ 4": dict(key="ngram", drafter="ngram", gamma=4, drafter_options=NGramOptions())}
    round_s = {}
    for name, fields in kinds.items():
        shares, costs, rounds = [], [], []
        for repeat in range(args.repeats + 1):
            for ids in prompts:
                spent[0] = 0.0
                result = run_strategy(Strategy(processor=GreedyProcessor(), max_gen_len=args.length, **fields),
                                      pair, ids)
                n = result.rounds or len(result.tokens)
                if repeat:                                    # the first repeat warms up
                    shares.append(spent[0] / result.seconds)
                    costs.append(spent[0] / n)
                    rounds.append(result.seconds / n)
        round_s[name] = statistics.median(rounds)
        print(f"decisions, {name}: {statistics.median(costs) * 1e6:.0f} µs per round of "
              f"{round_s[name] * 1e3:.1f} ms = {100 * statistics.median(shares):.2f}% (at most {100 * max(shares):.2f}%)")

    def per_call(fn, calls: int) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - start) / calls

    def marks() -> None:
        before = read_load()
        other_load(before, read_load())

    spec_round = round_s["speculative γ 4"]
    spec_rounds = max(1, round(args.length / 4))
    mark = statistics.median(per_call(marks, 200) for _ in range(7))
    print(f"load marks: {mark * 1e6:.0f} µs per run = {100 * mark / spec_rounds / spec_round:.4f}% of a "
          f"speculative round over {spec_rounds} rounds")

    rnd = Round((1,), 1, 2, False)

    class Unclocked(Watch):
        def round(self, rnd, new_tokens):       # the same call without the first-round check
            if self.active:
                pass

    def clocked() -> None:
        watch = Watch(None)
        for _ in range(spec_rounds):
            watch.round(rnd, [1, 2])
        watch.first_token(0.0)

    def unclocked() -> None:
        watch = Unclocked(None)
        for _ in range(spec_rounds):
            watch.round(rnd, [1, 2])

    clock = (statistics.median(per_call(clocked, 2000) for _ in range(7))
             - statistics.median(per_call(unclocked, 2000) for _ in range(7))) / spec_rounds
    print(f"first-token clock: {clock * 1e9:.0f} ns per round = {100 * clock / spec_round:.5f}% of a speculative round")
    return 0


if __name__ == "__main__":
    sys.exit(main())
