"""Figures on a GPU with random-weight models of real shapes (docs/results.md, "On a GPU").

    python scripts/gpu_figures.py [--device cuda] [--dtype bfloat16] [--length 128] [--out FILE]
    python scripts/gpu_figures.py --small --device cpu      # the same steps on tiny shapes (a smoke run)

No download: the models are built from the Llama-3.2-1B and Llama-3.2-3B configurations (written
below) with random weights. Weights change acceptance, not speed, so the acceptance figures of part 2
say nothing about real text; the costs do.

1. What a forward of w tokens costs after a 512-token cached prefix (w = 1 ... 128; median of
   repeats, the device synchronised), for both models: the width cost that trees and long drafts pay.
2. The engine end to end (``run_strategy``, greedy, one random prompt): target AR of the 3B beside
   transformers' ``generate`` (once each, then alternating ``--ab-rounds`` times); speculative decoding with the 1B drafting (γ 4); the 3B drafting for
   itself (every draft accepted: a round's cost at full acceptance, γ 4); NASD with the suffix
   storage. Tokens/s, tokens per target call and the engine's phase clock per round.
3. Greedy identity on this device: speculative (1B drafter and self) and NASD against target AR, on
   several random prompts, in float32 and in the run's dtype.
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
import transformers  # noqa: E402

from kvcache.cache import drop_last  # noqa: E402
from engine import NGramOptions, Strategy, pair_of, run_strategy  # noqa: E402
from sampling import GreedyProcessor  # noqa: E402
from utils.devices import synchronize  # noqa: E402

# The published configurations' shapes (meta-llama/Llama-3.2-1B and -3B), random weights.
SHAPES = {
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True),
    "llama-3.2-3b": dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                         num_attention_heads=24, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
}
COMMON = dict(vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
              rope_scaling={"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0,
                            "low_freq_factor": 1.0, "original_max_position_embeddings": 8192},
              bos_token_id=128000, eos_token_id=None, pad_token_id=None)
SMALL = {
    "llama-3.2-1b": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=16, tie_word_embeddings=True),
    "llama-3.2-3b": dict(hidden_size=96, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=24, tie_word_embeddings=True),
}
GREEDY = GreedyProcessor()
WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128)


def build(name: str, small: bool, device: str, dtype: torch.dtype, seed: int):
    shape = (SMALL if small else SHAPES)[name]
    config = transformers.LlamaConfig(**{**COMMON, **shape, **({"vocab_size": 512} if small else {})})
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config = transformers.GenerationConfig(eos_token_id=None, pad_token_id=None,
                                                            bos_token_id=COMMON["bos_token_id"])
    return model


def timed(device: str, fn) -> float:
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def width_costs(model, device: str, prefix: int, repeats: int) -> dict[int, float]:
    """Median ms of a forward over w new tokens after ``prefix`` cached tokens."""
    vocab = model.config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(0)
    ids = torch.randint(0, vocab, (1, prefix + max(WIDTHS)), generator=gen).to(device)
    out = {}
    with torch.inference_mode():
        cache = transformers.DynamicCache()
        model(input_ids=ids[:, :prefix], past_key_values=cache, use_cache=True)
        for w in WIDTHS:
            def step():
                model(input_ids=ids[:, prefix:prefix + w], past_key_values=cache, use_cache=True)
                drop_last(cache, w)
            step()                                   # warm
            out[w] = 1000 * statistics.median(timed(device, step) for _ in range(repeats))
    return out


def engine_run(strategy: Strategy, pair, prompt: list[int]) -> dict:
    result = run_strategy(strategy, pair, prompt)
    rounds = max(result.rounds, 1)
    return {
        "tokens": result.tokens, "tok_s": len(result.tokens) / result.seconds, "seconds": result.seconds,
        "target_calls": result.target_calls, "drafted": result.drafted, "accepted": result.accepted,
        "tokens_per_call": len(result.tokens) / max(result.target_calls, 1),
        "ms_per_round": {k: 1000 * v / rounds for k, v in result.phases.items()}, "rounds": result.rounds,
    }


def hf_generate(model, prompt: list[int], length: int, device: str, **kwargs) -> dict:
    ids = torch.tensor([prompt], device=device)
    mask = torch.ones_like(ids)

    def go():
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=length,
                                  min_new_tokens=length, do_sample=False, **kwargs)
    go()                                             # warm
    synchronize(device)
    start = time.perf_counter()
    out = go()
    synchronize(device)
    seconds = time.perf_counter() - start
    tokens = out[0, len(prompt):].tolist()
    return {"tokens": tokens, "tok_s": len(tokens) / seconds, "seconds": seconds}


def warm_device(device: str, seconds: float = 2.0) -> None:
    """Keep the device busy for a while before timing (a GPU idles at a low clock)."""
    if not device.startswith("cuda"):
        return
    a = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(20):
            a @ a
        synchronize(device)


def ab_target_ar(model, prompt: list[int], length: int, device: str, rounds: int) -> dict:
    """Target AR through the engine against transformers' ``generate``, alternating (ABAB...):
    median tok/s of each, so that a drift of the machine falls on both."""
    pair = pair_of(model)
    strategy = Strategy("target", processor=GREEDY, max_gen_len=length)
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(engine_run(strategy, pair, prompt)["tok_s"])
        theirs.append(hf_generate(model, prompt, length, device)["tok_s"])
    return {"engine_target_ar_tok_s": ours, "transformers_generate_tok_s": theirs,
            "median_ratio_engine_over_generate": statistics.median(ours) / statistics.median(theirs)}


def strategies(length: int, gamma: int) -> dict[str, tuple[Strategy, str]]:
    """name -> (strategy, which pair runs it: 'pair' (1B drafter), 'self' or 'alone')."""
    return {
        "target AR": (Strategy("target", processor=GREEDY, max_gen_len=length), "alone"),
        f"speculative 1B→3B γ{gamma}": (Strategy("speculative", drafter="model", gamma=gamma, processor=GREEDY,
                                                  max_gen_len=length), "pair"),
        f"speculative self γ{gamma}": (Strategy("self", drafter="model", gamma=gamma, processor=GREEDY,
                                                 max_gen_len=length), "self"),
        "NASD suffix γ16": (Strategy("ngram", drafter="ngram", gamma=16, processor=GREEDY, max_gen_len=length,
                                     drafter_options=NGramOptions(storage="suffix")), "alone"),
    }


def identity(small: bool, device: str, dtype: torch.dtype, prompts: int, length: int, gamma: int) -> dict:
    """How many prompts each strategy decodes token-identically to target AR (greedy), per dtype."""
    out = {}
    for dt in dict.fromkeys((torch.float32, dtype)):
        target = build("llama-3.2-1b", small, device, dt, seed=0)
        drafter = build("llama-3.2-1b", small, device, dt, seed=1)
        pairs = {"pair": pair_of(target, drafter), "self": pair_of(target, target), "alone": pair_of(target)}
        gen = torch.Generator(device="cpu").manual_seed(7)
        counts: dict[str, list[int]] = {}
        for _ in range(prompts):
            prompt = torch.randint(0, target.config.vocab_size, (64,), generator=gen).tolist()
            runs = {name: run_strategy(s, pairs[which], prompt).tokens
                    for name, (s, which) in strategies(length, gamma).items()}
            runs["transformers generate"] = hf_generate(target, prompt, length, device)["tokens"]
            want = runs.pop("target AR")
            for name, tokens in runs.items():
                counts.setdefault(name.replace("1B→3B", "1B→1B"), []).append(int(tokens == want))
        out[str(dt).removeprefix("torch.")] = {name: f"{sum(v)}/{len(v)}" for name, v in counts.items()}
        del target, drafter, pairs
    return out


def machine(device: str) -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                    multiprocessors=props.multi_processor_count, cuda=torch.version.cuda)
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem", "--format=csv,noheader"],
                capture_output=True, text=True, check=False, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        cpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        info["cpu"] = next((line.split(":", 1)[1].strip() for line in cpu.splitlines()
                            if line.startswith("Model name")), "")
    except OSError:
        pass
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prefix", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--identity-prompts", type=int, default=6)
    parser.add_argument("--ab-rounds", type=int, default=3, help="alternations of target AR and generate")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke run of every step)")
    parser.add_argument("--parts", default="1,2,3")
    parser.add_argument("--out", default="gpu_figures.json")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    parts = set(args.parts.split(","))
    report: dict = {"machine": machine(args.device), "dtype": args.dtype, "length": args.length,
                    "gamma": args.gamma, "small": args.small}

    def save():
        Path(args.out).write_text(json.dumps(report, indent=1))

    target = build("llama-3.2-3b", args.small, args.device, dtype, seed=0)
    drafter = build("llama-3.2-1b", args.small, args.device, dtype, seed=1)
    warm_device(args.device)
    if "1" in parts:
        report["width_ms"] = {}
        for name, model in (("llama-3.2-1b", drafter), ("llama-3.2-3b", target)):
            costs = width_costs(model, args.device, args.prefix, args.repeats)
            report["width_ms"][name] = costs
            print(f"{name} ({args.dtype}), forward after {args.prefix} cached tokens: "
                  + ", ".join(f"w{w} {ms:.2f} ms" for w, ms in costs.items()), flush=True)
        save()
    if "2" in parts:
        gen = torch.Generator(device="cpu").manual_seed(3)
        prompt = torch.randint(0, target.config.vocab_size, (256,), generator=gen).tolist()
        pairs = {"pair": pair_of(target, drafter), "self": pair_of(target, target), "alone": pair_of(target)}
        runs = {}
        for name, (strategy, which) in strategies(args.length, args.gamma).items():
            run_strategy(strategy, pairs[which], prompt)           # warm
            runs[name] = engine_run(strategy, pairs[which], prompt)
        runs["transformers generate"] = hf_generate(target, prompt, args.length, args.device)
        runs[f"transformers assisted (1B, {args.gamma})"] = hf_generate(
            target, prompt, args.length, args.device, assistant_model=drafter, num_assistant_tokens=args.gamma,
            num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        runs["transformers prompt lookup"] = hf_generate(target, prompt, args.length, args.device,
                                                         prompt_lookup_num_tokens=10)
        want = runs["target AR"]["tokens"]
        for name, r in runs.items():
            r["identical_to_target_ar"] = r.pop("tokens") == want
            extra = ""
            if "target_calls" in r:
                phases = ", ".join(f"{k} {v:.2f}" for k, v in r["ms_per_round"].items())
                extra = (f", {r['tokens_per_call']:.2f} tokens/target call, accepted {r['accepted']}/{r['drafted']}, "
                         f"ms per round: {phases}")
            print(f"{name}: {r['tok_s']:.1f} tok/s{extra}, identical to target AR: {r['identical_to_target_ar']}",
                  flush=True)
        report["engine"] = runs
        report["target_ar_ab"] = ab_target_ar(target, prompt, args.length, args.device, args.ab_rounds)
        print("target AR, engine against transformers generate (alternating):", json.dumps(report["target_ar_ab"]),
              flush=True)
        save()
    del target, drafter
    if "3" in parts:
        report["identity"] = identity(args.small, args.device, dtype, args.identity_prompts, min(args.length, 64),
                                      args.gamma)
        print("greedy identity with target AR (prompts identical / run):", json.dumps(report["identity"]), flush=True)
        save()
    print(json.dumps(report["machine"]))


if __name__ == "__main__":
    main()
