"""The three compile paths on this CPU, in one run, beside transformers' compiled static ``generate``.

    python scripts/cpu_paths.py [--length 64] [--gamma 4] [--rounds 3] [--out cpu_paths.json]

The default pair (the offline SmolLM2-135M-Instruct and its self-drafter), greedy, one built-in
prompt. Target AR, speculative decoding (the pair's drafter) and NASD (the REPL's storage) each run
on ``off``, ``static`` and ``graphs`` (inductor, as a user's ``--compile graphs`` here), beside
transformers' ``generate`` eager and on its static cache compiled by inductor (``CompileConfig``,
told to compile on a CPU too). Each group is warmed (every entry once: the captures and
transformers' compilation happen there, their seconds printed) and timed ``--rounds`` rounds in
alternating order (``gpu_figures.alternate``).

Printed per entry: tokens/s (median), the target's step (decode seconds per token after the first
round) against the memory-bandwidth floor (the target's weight bytes over this machine's read
bandwidth, measured here with one pass over a buffer far larger than the caches), the path each
run took and its captures, and whether its output is target AR's on ``off``. Last, the path a CPU
user is better served by: the fastest in the timed rounds, and the fastest once the captures a
first run pays are counted in.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import transformers  # noqa: E402

import gpu_figures  # noqa: E402  (the alternating timer and the row printer, shared with the GPU figures)
from engine import pair_of  # noqa: E402
from engine.loading import load_pair  # noqa: E402
from engine.named import named_strategy  # noqa: E402
from sampling import GreedyProcessor  # noqa: E402
from utils.builtin_prompts import BUILTIN  # noqa: E402
from utils.machine_load import cpu_description  # noqa: E402
from utils.method_name import parse_method_name  # noqa: E402
from utils.vocab import encode_prompt  # noqa: E402
from utils.options import COMPILE_PATHS  # noqa: E402


def read_bandwidth(mib: int = 1024, repeats: int = 5) -> float:
    """Bytes per second one pass of ``sum`` reads from a ``mib`` MiB float32 buffer (best of ``repeats``)."""
    buffer = torch.ones(mib * 2**20 // 4)
    buffer.sum()
    best = min(gpu_figures.timed("cpu", buffer.sum) for _ in range(repeats))
    return buffer.numel() * 4 / best


def compiled_generate(model, prompt: list[int], length: int):
    """transformers' ``generate`` on its static cache, its forward compiled by inductor on this CPU."""
    config = transformers.CompileConfig(backend="inductor", mode="default", fullgraph=False, dynamic=False)
    config._compile_all_devices = True          # transformers compiles on CUDA only unless told
    return gpu_figures.hf_entry(model, prompt, length, "cpu", static=True, compile_config=config)


def groups(pair, prompt: list[int], length: int, gamma: int) -> dict[str, dict]:
    """Group title -> entries (name -> zero-argument run), target AR's first."""
    def engine(name: str, path: str):
        strategy = named_strategy(parse_method_name(name), processor=GreedyProcessor(), max_gen_len=length,
                                  compile=path, inspect=False)
        return gpu_figures.engine_entry(strategy, pair, prompt)

    ar = {f"target AR {path}": gpu_figures.engine_entry(
        named_strategy(parse_method_name("target"), processor=GreedyProcessor(), max_gen_len=length, compile=path,
                       inspect=False), pair_of(pair.target), prompt) for path in COMPILE_PATHS}
    ar["transformers generate"] = gpu_figures.hf_entry(pair.target, prompt, length, "cpu")
    ar["transformers generate static, inductor"] = compiled_generate(pair.target, prompt, length)
    return {"target AR": ar,
            f"speculative γ{gamma}": {f"speculative@{gamma} {p}": engine(f"speculative@{gamma}", p)
                                      for p in COMPILE_PATHS},
            f"NASD γ{gamma}": {f"ngram@{gamma} {p}": engine(f"ngram@{gamma}", p) for p in COMPILE_PATHS}}


def first_run_s(row: dict, length: int) -> float | None:
    """Seconds a first run of ``length`` tokens takes on this path: the timed run's pace plus the
    captures its warm-up paid (a ``graphs`` run's capture seconds are left out of its own seconds)."""
    if row.get("tok_s") is None:
        return None
    return length / row["tok_s"] + (row.get("warm_capture_s") or 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=0, help="the built-in prompt's index")
    parser.add_argument("--rounds", type=int, default=3, help="timed alternating rounds after the warm-up")
    parser.add_argument("--out", default="cpu_paths.json")
    args = parser.parse_args()

    torch.manual_seed(0)
    pair = load_pair(device="cpu")
    prompt = encode_prompt(pair.tokenizer, BUILTIN[args.prompt][1])
    bandwidth = read_bandwidth()
    weights = gpu_figures.weight_bytes(pair.target)
    floor_ms = 1000 * weights / bandwidth
    name, flags = cpu_description()
    simd = " ".join(f for f in flags.split() if f.startswith(("avx", "amx", "fma", "f16c"))) or "no AVX"
    report = {"cpu": f"{name} ({simd})", "torch": torch.__version__, "transformers": transformers.__version__,
              "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "length": args.length, "gamma": args.gamma, "prompt_tokens": len(prompt),
              "read_bandwidth_gb_s": bandwidth / 1e9, "target_weight_bytes": weights, "floor_ms": floor_ms,
              "groups": {}}
    print(f"{report['cpu']}, {report['threads']} threads; read bandwidth {bandwidth / 1e9:.1f} GB/s; the target's "
          f"weights {weights / 2**20:.0f} MiB: a step's floor {floor_ms:.1f} ms", flush=True)
    reference = None
    for title, entries in groups(pair, prompt, args.length, args.gamma).items():
        runs = gpu_figures.alternate(entries, args.rounds)
        first = {name: first_run_s(row, args.length) for name, row in runs.items()}
        figures, found = gpu_figures.describe(title, runs, args.rounds, str(pair.target.dtype).removeprefix("torch."),
                                              floor_ms, reference)
        reference = reference or found
        for name, seconds in first.items():
            figures[name]["first_run_s"] = seconds
        report["groups"][title] = figures
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    print("-- the fastest path of each strategy here (timed rounds; a first run, captures counted in)")
    for title, figures in report["groups"].items():
        ours = {name: row for name, row in figures.items() if name.rsplit(" ", 1)[-1] in COMPILE_PATHS
                and row.get("tok_s")}
        if not ours:
            continue
        timed = max(ours, key=lambda n: ours[n]["tok_s"])
        first = min(ours, key=lambda n: ours[n]["first_run_s"])
        print(f"{title}: {timed} ({ours[timed]['tok_s']:.1f} tok/s); a first run: {first} "
              f"({ours[first]['first_run_s']:.1f} s against "
              + ", ".join(f"{n.rsplit(' ', 1)[-1]} {r['first_run_s']:.1f} s" for n, r in ours.items()) + ")",
              flush=True)
    print(json.dumps({k: report[k] for k in ("cpu", "torch", "transformers", "date")}))


if __name__ == "__main__":
    main()
