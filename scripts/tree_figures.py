"""Token trees on this machine: what a verify of N tokens costs, and what trees
buy over chains on the built-in prompts (docs/trees.md records a run).

    .venv/bin/python scripts/tree_figures.py [--length 64] [--prompts 12] [--out FILE]

Part 1 times the target (default pair: SmolLM2-135M, float32) verifying
1, 2, 4, 8, 16, 32 tokens after a 200-token cached prefix (median of repeats,
warm). Part 2 runs greedy speculative decoding and NASD (basic 3-gram storage
with filler top-3, and the token-recycling storage) at gamma 4 with chains and
trees of 8, 16 and 32 nodes (branch 3) on every built-in prompt, and reports
tokens per target call and tokens/s; every tree run is checked token for token
against the chain.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402


def verify_costs(pair, widths=(1, 2, 4, 8, 16, 32), repeats: int = 9) -> dict[int, float]:
    from generation.tree import Tree
    from generation.tree_forward import tree_forward
    from kvcache.probe import cached_model

    prefix = list(range(1000, 1200))
    out = {}
    with torch.inference_mode():
        cached = cached_model(pair.target)
        cached.begin(prefix)
        cached.forward(torch.tensor([prefix[:-1]]), keep=1)
        ids = torch.tensor([prefix])
        times: dict[int, list[float]] = {w: [] for w in widths}
        for _ in range(repeats):                  # widths interleaved, so load drifts hit all alike
            for width in widths:
                # The root and width - 1 nodes (a bushy tree: the shape does not change the cost).
                nodes = width - 1
                tree = Tree(tuple(range(2000, 2000 + nodes)),
                            tuple(-1 if i < 4 else (i - 4) // 3 for i in range(nodes)), (0,) * nodes)
                start = time.perf_counter()
                tree_forward(cached, ids, tree)
                times[width].append(time.perf_counter() - start)
                cached.keep_block(width, [])      # back to the 199-token prefix
        out = {w: statistics.median(t[1:]) for w, t in times.items()}
    return out


def run_prompts(pair, length: int, limit: int, stride: int, on_row=None, only=None) -> list[dict]:
    from utils.builtin_prompts import BUILTIN
    from bench.prompts import chat_ids
    from engine import EngineState, NGramOptions, Strategy, run_strategy
    from sampling import GreedyProcessor

    greedy = GreedyProcessor()
    rows = []
    kinds = {
        "speculative": ("model", None),
        "ngram": ("ngram", NGramOptions("basic", 3, 3)),
        "ngram-recycling": ("ngram", NGramOptions("recycling", 2, 1)),
    }

    def runner(drafter, options):
        def run(ids, tree):
            strategy = Strategy("tree-figures", drafter=drafter, drafter_options=options, gamma=4,
                                processor=greedy, max_gen_len=length, tree=tree, tree_branch=3)
            return run_strategy(strategy, pair, ids, state=EngineState())
        return run

    strategies = {name: runner(*kind) for name, kind in kinds.items()}
    strategies = {k: v for k, v in strategies.items() if only is None or k in only}
    with torch.inference_mode():
        next(iter(strategies.values()))(chat_ids(pair.tokenizer, "warm up"), 8)   # warm
        chains: dict = {}
        picked = list(enumerate(BUILTIN))[::stride][:limit]
        for trees in ((0, 16), (8, 32)):          # the chain-vs-16 comparison first
            for index, (category, text) in picked:
                ids = chat_ids(pair.tokenizer, text)
                for name, run in strategies.items():
                    for tree in trees:
                        result = run(ids, tree)
                        if tree == 0:
                            chains[name, index] = result.tokens
                        rows.append(dict(prompt=index, category=category, strategy=name, tree=tree,
                                         tokens=len(result.tokens), target_calls=result.target_calls,
                                         drafter_calls=result.drafter_calls, seconds=result.seconds,
                                         same_as_chain=result.tokens == chains[name, index],
                                         fallback=result.tree_fallback,
                                         trace=[dict(size=r.tree_size, depth=len(r.path), ranks=list(r.ranks))
                                                for r in result.trace]))
                        print(name, index, tree, rows[-1]["tokens"], rows[-1]["target_calls"],
                              f"{rows[-1]['seconds']:.2f}s", flush=True)
                        if on_row is not None:
                            on_row(rows)
    return rows


def summary(rows: list[dict]) -> list[dict]:
    out = []
    for name in dict.fromkeys(r["strategy"] for r in rows):
        for tree in (0, 8, 16, 32):
            sel = [r for r in rows if r["strategy"] == name and r["tree"] == tree]
            if not sel:
                continue
            tokens = sum(r["tokens"] for r in sel)
            out.append(dict(strategy=name, tree=tree, tokens=tokens,
                            tokens_per_target_call=tokens / sum(r["target_calls"] for r in sel),
                            tokens_per_s=tokens / sum(r["seconds"] for r in sel),
                            identical=all(r["same_as_chain"] for r in sel)))
    return out


def environment() -> dict:
    import transformers

    def sh(cmd):
        try:
            return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:  # noqa: BLE001 - best effort
            return ""
    return dict(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), python=platform.python_version(),
                torch=torch.__version__, transformers=transformers.__version__, threads=torch.get_num_threads(),
                cpu=sh("lscpu | grep 'Model name' | sed 's/.*: *//'"),
                flags=" ".join(f for f in sh("grep -m1 flags /proc/cpuinfo").split()
                               if f.startswith(("avx", "amx", "fma"))),
                load=sh("uptime"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=18, help="how many built-in prompts")
    parser.add_argument("--stride", type=int, default=1, help="take every STRIDE-th built-in prompt")
    parser.add_argument("--out", default="tree_figures.json")
    parser.add_argument("--strategies", default="speculative,ngram,ngram-recycling",
                        help="comma-separated subset of speculative,ngram,ngram-recycling")
    parser.add_argument("--no-verify-costs", dest="verify_costs", action="store_false",
                        help="skip part 1 (the verify cost by width)")
    args = parser.parse_args()
    from engine import load_pair

    pair = load_pair()
    env_before = environment()
    costs = verify_costs(pair) if args.verify_costs else {}
    print("verify seconds by width:", {w: round(c * 1000, 1) for w, c in costs.items()}, flush=True)

    def write(rows, final=False):
        result = dict(environment=env_before, load_after=environment()["load"] if final else "",
                      verify_s=costs, summary=summary(rows), rows=rows)
        Path(args.out).write_text(json.dumps(result, indent=1))
        return result

    rows = run_prompts(pair, args.length, args.prompts, args.stride, on_row=write,
                       only=args.strategies.split(","))
    result = write(rows, final=True)
    for line in result["summary"]:
        print(line)


if __name__ == "__main__":
    main()
