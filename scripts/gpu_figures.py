"""Figures on a GPU with random-weight models of real shapes (docs/results.md, "On a GPU").

    python scripts/gpu_figures.py [--device cuda] [--length 64] [--out FILE]
    python scripts/gpu_figures.py --small --device cpu      # the same steps on tiny shapes (a smoke run)

No download: the models are built from the Llama-3.2-1B and Llama-3.2-3B configurations (written
below) with random weights. Weights change acceptance, not speed, so acceptance figures say nothing
about real text; the costs do.

The default part, ``paths`` (``--dtypes``, bfloat16 first: the figures that matter most come first
and each group is printed and saved as it ends, so a time box that cuts the run keeps them):
for each dtype, two groups, each warmed (every entry run once, untimed: captures and transformers'
compilation happen there) and then timed ``--ab-rounds`` times alternating (A B C ..., then
... C B A):

- target AR of the 3B through the engine on each compile path (off, static, graphs) beside
  transformers' ``generate`` eager and on its static cache (which transformers compiles on CUDA);
- speculative decoding, the 1B drafting for the 3B (γ ``--gamma``), on each path, beside
  assisted generation eager and on a static cache (where the release takes one:
  ``bench.peers.static_peer_refusal``).

Each group prints tokens/s (median), the engine's target step (decode seconds per token, ms)
against the memory-bandwidth floor (the 3B's weight bytes over the card's bandwidth, from
``BANDWIDTH`` by the card's name, printed), each path's captures and recompilations, and, against
the engine's target AR on the eager path: in float32 which outputs are identical, in bfloat16 how
many diverge (and where first).

The one-shot check's parts (``--parts identity,verdicts,speed``, what ``scripts/gpu_check.sh`` runs;
``oneshot``): the same entries, in float32 run once each (every output must equal the engine's
eager target AR), in bfloat16 run once each with every difference judged (near-tie or
unexplained, ``analysis.divergence``), then the bfloat16 entries timed; each part under its share
of the time (``--shares``) and saved to ``--out-dir``/PART/ as soon as it ends. An entry that
raises is recorded with its one line and the others go on.

The older parts stay selectable (``--parts 1,2,3``):
1. What a forward of w tokens costs after a 512-token cached prefix (w = 1 ... 128).
2. The engine end to end beside transformers (target AR, speculative, the 3B drafting for itself,
   NASD suffix).
3. Greedy identity on this device, in float32 and in the run's dtype.
"""

from __future__ import annotations

import argparse
import json
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import transformers  # noqa: E402

from bench.peers import static_peer_refusal  # noqa: E402
from kvcache import static as static_path  # noqa: E402
from kvcache.cache import drop_last  # noqa: E402
from engine import NGramOptions, Strategy, pair_of, run_strategy  # noqa: E402
from utils.options import COMPILE_PATHS  # noqa: E402
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
# Peak memory bandwidth (bytes/s) by a card's name, most specific first: the floor of a decode step
# is its weights' bytes over this (every weight is read once a step).
BANDWIDTH = (("H200", 4.8e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12))


def build(name: str, small: bool, device: str, dtype: torch.dtype, seed: int, layers: int | None = None):
    """The model of ``name``'s shapes (``layers`` of them where given: the same layer, fewer times)."""
    shape = (SMALL if small else SHAPES)[name]
    if layers:
        shape = {**shape, "num_hidden_layers": min(layers, shape["num_hidden_layers"])}
    config = transformers.LlamaConfig(**{**COMMON, **shape, **({"vocab_size": 512, "bos_token_id": 1} if small else {})})
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config = transformers.GenerationConfig(eos_token_id=None, pad_token_id=None,
                                                            bos_token_id=config.bos_token_id)
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


# ------------------------------------------------------------------ the compile paths

def card_name(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_properties(device).name
    return f"{platform.processor() or platform.machine()} (no GPU)"


def bandwidth_of(name: str) -> float | None:
    """The card's peak memory bandwidth in bytes/s from ``BANDWIDTH``, None when not listed."""
    return next((bw for key, bw in BANDWIDTH if key.lower() in name.lower()), None)


def weight_bytes(model) -> int:
    """Bytes of the model's weights (a tied embedding counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def engine_entry(strategy: Strategy, pair, prompt: list[int]):
    """A zero-argument run of ``strategy`` that returns (tokens, seconds, the result)."""
    def go():
        result = run_strategy(strategy, pair, prompt)
        return result.tokens, result.seconds, result
    return go


def hf_entry(model, prompt: list[int], length: int, device: str, *, static: bool = False, **kwargs):
    """A zero-argument transformers ``generate`` (greedy, exactly ``length`` new tokens) that returns
    (tokens, seconds, None); ``static``: on its static cache, which transformers compiles on CUDA."""
    ids = torch.tensor([prompt], device=device)
    mask = torch.ones_like(ids)
    extra = {"cache_implementation": "static"} if static else {}
    if static and kwargs.get("assistant_model") is not None:   # a round's drafts may pass the budget
        extra["max_cache_len"] = len(prompt) + length + kwargs.get("num_assistant_tokens", 4) + 1

    def go():
        synchronize(device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=length,
                                 min_new_tokens=length, do_sample=False, **extra, **kwargs)
        synchronize(device)
        return out[0, len(prompt):].tolist(), time.perf_counter() - start, None
    return go


def step_ms(result) -> float | None:
    """The engine's target step: decode seconds per token after the first round, in ms."""
    if result is None or result.decode_seconds is None or len(result.tokens) <= result.first_tokens:
        return None
    return 1000 * result.decode_seconds / (len(result.tokens) - result.first_tokens)


def first_difference(tokens: list[int], want: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b),
                None if len(tokens) == len(want) else min(len(tokens), len(want)))


def _failure(error: BaseException) -> str:
    """One line for an entry that raised: the error's type and first line."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def warm_once(entries: dict, deadline: float | None = None) -> dict:
    """Run every entry once (warm: captures, transformers' compile). Returns name -> {tokens, result,
    warm_s, ..., error}: an entry that raises is recorded with its one line and the rest go on; one not
    begun by ``deadline`` (``time.perf_counter()``) is recorded as left out."""
    out = {}
    for name, go in entries.items():
        row = {"tok_s_runs": [], "tokens": None, "result": None, "warm_s": None, "warm_captures": None,
               "warm_capture_s": None, "error": None}
        out[name] = row
        if deadline is not None and time.perf_counter() > deadline:
            row["error"] = "left out: the part's share of the time was spent"
            continue
        try:
            tokens, seconds, result = go()
        except Exception as e:  # noqa: BLE001  (one entry's failure is its figure; the rest still run)
            row["error"] = _failure(e)
            print(f"{name}: failed: {row['error']}", flush=True)
            continue
        warm = (result.compile or {}) if result is not None else {}
        row.update(tokens=tokens, result=result, warm_s=seconds, warm_captures=warm.get("captures"),
                   warm_capture_s=warm.get("capture_s"))
    return out


def time_rounds(entries: dict, out: dict, rounds: int, deadline: float | None = None) -> dict:
    """Time ``rounds`` rounds of the entries ``warm_once`` ran without error, the order reversed every
    other round; an entry that raises is recorded and left out of the later rounds; no round begins
    after ``deadline``. Sets each row's ``tok_s`` (median of its runs, None without one)."""
    names = [name for name in entries if out[name]["error"] is None]
    for r in range(rounds):
        if deadline is not None and time.perf_counter() > deadline:
            break
        for name in (names if r % 2 == 0 else names[::-1]):
            row = out[name]
            if row["error"] is not None:
                continue
            try:
                tokens, seconds, result = entries[name]()
            except Exception as e:  # noqa: BLE001  (as in warm_once)
                row["error"] = _failure(e)
                print(f"{name}: failed in a timed round: {row['error']}", flush=True)
                continue
            row["tok_s_runs"].append(len(tokens) / seconds if seconds > 0 else 0.0)
            row.update(tokens=tokens, result=result)
    for row in out.values():
        row["tok_s"] = statistics.median(row["tok_s_runs"]) if row["tok_s_runs"] else None
    return out


def alternate(entries: dict, rounds: int, deadline: float | None = None) -> dict:
    """Warm every entry once, then time ``rounds`` rounds, the order reversed every other round.
    Returns name -> {tok_s (median), tok_s_runs, tokens, result (the last), error}: an entry that
    raises is recorded with its one line (``error``) and every other entry goes on."""
    return time_rounds(entries, warm_once(entries, deadline), rounds, deadline)


def path_group(title: str, entries: dict, rounds: int, dtype: str, floor_ms: float | None,
               reference: list[int] | None = None, deadline: float | None = None) -> tuple[dict, list[int]]:
    """One group of entries timed alternating, printed; (the figures as JSON, tokens dropped; the
    reference tokens). ``reference``: the tokens outputs are held to (default: the first entry's,
    the engine's target AR on the eager path)."""
    return describe(title, alternate(entries, rounds, deadline), rounds, dtype, floor_ms, reference)


def describe(title: str, runs: dict, rounds: int, dtype: str, floor_ms: float | None,
             reference: list[int] | None = None, judge=None) -> tuple[dict, list[int] | None]:
    """Print one group's rows (``alternate``'s) and return (the figures as JSON, tokens dropped; the
    reference tokens). ``judge(tokens, result)``: the verdict on an output that differs from the
    reference (``analysis.divergence.Divergence``), where one is wanted."""
    if reference is None:
        reference = runs[next(iter(runs))]["tokens"]
    timed = f"{rounds} alternating rounds after a warm-up" if rounds else "one run each"
    print(f"-- {title} ({dtype}; {timed}; identity against the engine's target AR on the eager path)", flush=True)
    figures = {}
    for name, row in runs.items():
        result = row.pop("result")
        tokens = row.pop("tokens")
        if row["error"] is not None:
            figures[name] = {**row, "identical": None, "first_difference": None}
            print(f"{name}: {row['error']}", flush=True)
            continue
        diff = first_difference(tokens, reference) if reference is not None else None
        compiled = result.compile if result is not None else None
        step = step_ms(result)
        figures[name] = {**row, "identical": diff is None if reference is not None else None,
                         "first_difference": diff, "step_ms": step,
                         "step_over_floor": step / floor_ms if step and floor_ms else None,
                         "tokens_per_target_call": (len(tokens) / result.target_calls
                                                    if result is not None and result.target_calls else None),
                         "compile": compiled}
        parts = [f"{row['tok_s']:.1f} tok/s" if row.get("tok_s") is not None else "no timed run"]
        if step is not None and result is not None and not result.drafted:      # target AR: one token a step
            parts.append(f"target step {step:.2f} ms" + (f" ({step / floor_ms:.1f}x the floor)" if floor_ms else ""))
        elif step is not None:
            parts.append(f"decode {step:.2f} ms a token")
        if compiled:
            parts.append(f"path {compiled['path']}" + (f" ({compiled['reason']})" if compiled["reason"] else ""))
            if compiled["path"] == "graphs":
                parts.append(f"warm-up captured {row['warm_captures']} in {row['warm_capture_s'] or 0:.1f} s, then "
                             f"{compiled['captures']} captures and {compiled['recompiles']} recompiles")
        elif row["warm_s"] is not None:
            parts.append(f"warm-up {row['warm_s']:.1f} s")
        if result is not None and "speculative" in name:
            parts.append(f"{figures[name]['tokens_per_target_call']:.2f} tokens/target call")
        if reference is None:
            parts.append("no reference output")
        elif diff is None:
            parts.append("identical")
        else:
            parts.append(f"differs from token {diff}")
            if judge is not None:
                found = judge(tokens, result)
                verdict = (found.verdict or "no verdict") if found is not None else "no verdict"
                figures[name]["verdict"] = verdict
                figures[name]["verdict_note"] = found.note if found is not None else ""
                parts.append(f"verdict {verdict}" + (f" ({found.note})" if found is not None and found.note else ""))
        print(f"{name}: " + " · ".join(parts), flush=True)
    return figures, reference


def paths_part(args, report: dict, save) -> None:
    """The compile paths beside transformers' eager and static peers, per dtype (module docstring)."""
    name = card_name(args.device)
    bandwidth = bandwidth_of(name)
    report["card"] = {"name": name, "bandwidth_bytes_s": bandwidth}
    print(f"card: {name} · bandwidth {bandwidth / 1e12:.2f} TB/s (table)" if bandwidth
          else f"card: {name} · bandwidth not in the table: no floor", flush=True)
    if not args.device.startswith("cuda"):
        static_path.BACKEND = "eager"               # a smoke run: no inductor build on a CPU
    gen = torch.Generator(device="cpu").manual_seed(3)
    report["paths"] = {}
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        target = build("llama-3.2-3b", args.small, args.device, dtype, seed=0)
        drafter = build("llama-3.2-1b", args.small, args.device, dtype, seed=1)
        prompt = torch.randint(0, target.config.vocab_size, (args.prompt,), generator=gen).tolist()
        weights = weight_bytes(target)
        floor_ms = 1000 * weights / bandwidth if bandwidth else None
        print(f"== {dtype_name}: 3B weights {weights / 2**30:.2f} GiB"
              + (f", bandwidth floor {floor_ms:.2f} ms a step" if floor_ms else "") + f"; prompt {args.prompt}, "
              f"{args.length} new tokens", flush=True)
        warm_device(args.device)
        group = {"floor_ms": floor_ms, "weight_bytes": weights}
        report["paths"][dtype_name] = group
        ar, spec = group_entries(args, target, drafter, prompt)
        group["target_ar"], reference = path_group("target AR", ar, args.ab_rounds, dtype_name, floor_ms)
        save()
        group["speculative"], _ = path_group("speculative decoding", spec, args.ab_rounds, dtype_name, floor_ms,
                                             reference)
        rows = {**group["target_ar"], **group["speculative"]}
        group["divergences"] = {n: r["first_difference"] for n, r in rows.items() if not r["identical"]}
        print(f"{dtype_name}: {len(rows) - len(group['divergences'])} of {len(rows)} outputs identical to the "
              "engine's eager target AR" + ("" if not group["divergences"] else "; first differences at "
                                            + ", ".join(f"{n} {i}" for n, i in group["divergences"].items())),
              flush=True)
        save()
        del target, drafter, ar, spec
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()


# ------------------------------------------------------------------ the one-shot parts

ONESHOT_PARTS = ("identity", "verdicts", "speed")


def group_entries(args, target, drafter, prompt: list[int]) -> tuple[dict, dict]:
    """(target AR entries, speculative entries): the engine on each compile path beside transformers'
    eager and static peers (the assisted static peer where the release takes one, else said why)."""
    alone, both = pair_of(target), pair_of(target, drafter)
    ar = {f"engine target AR {path}": engine_entry(
        Strategy("target", processor=GREEDY, max_gen_len=args.length, compile=path), alone, prompt)
        for path in COMPILE_PATHS}
    ar["transformers generate"] = hf_entry(target, prompt, args.length, args.device)
    ar["transformers generate static"] = hf_entry(target, prompt, args.length, args.device, static=True)
    # as the benchmark runs it beside transformers' decoders: no inspection record a round
    spec = {f"engine speculative 1B→3B γ{args.gamma} {path}": engine_entry(
        Strategy("speculative", drafter="model", gamma=args.gamma, processor=GREEDY, max_gen_len=args.length,
                 compile=path, inspect=False), both, prompt) for path in COMPILE_PATHS}
    assisted = dict(assistant_model=drafter, num_assistant_tokens=args.gamma,
                    num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
    spec[f"transformers assisted (1B, {args.gamma})"] = hf_entry(target, prompt, args.length, args.device, **assisted)
    try:
        refused = static_peer_refusal("hf_assisted", target, drafter)
    except Exception as e:  # noqa: BLE001  (the trial itself failed: the peer is left out, said why)
        refused = f"its trial failed: {_failure(e)}"
    if refused is None:
        spec[f"transformers assisted static (1B, {args.gamma})"] = hf_entry(
            target, prompt, args.length, args.device, static=True, **assisted)
    else:
        print(f"transformers assisted static left out: {refused}", flush=True)
    return ar, spec


class _Tee:
    """stdout that also keeps every line written (a part's summary file)."""

    def __init__(self, stream):
        self.stream, self.lines = stream, []

    def write(self, text):
        self.lines.append(text)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()


def _part_models(args, dtype_name: str, layers: int | None = None):
    dtype = getattr(torch, dtype_name)
    target = build("llama-3.2-3b", args.small, args.device, dtype, seed=0, layers=layers)
    drafter = build("llama-3.2-1b", args.small, args.device, dtype, seed=1, layers=layers)
    gen = torch.Generator(device="cpu").manual_seed(3)
    prompt = torch.randint(0, target.config.vocab_size, (args.prompt,), generator=gen).tolist()
    return target, drafter, prompt


def _tally(dtype_name: str, figures: dict) -> dict:
    """Of a part's rows: how many ran, are identical, differ (by verdict), and failed; printed."""
    ran = [r for r in figures.values() if r.get("error") is None]
    differ = [r for r in ran if r.get("identical") is False]
    verdicts = [r.get("verdict", "no verdict") for r in differ]
    counts = {"entries": len(figures), "ran": len(ran), "identical": sum(r.get("identical") is True for r in ran),
              "differ": len(differ), "near_ties": verdicts.count("near-tie"),
              "unexplained": verdicts.count("unexplained"), "failed": len(figures) - len(ran)}
    print(f"{dtype_name}: {counts['identical']} of {counts['ran']} outputs identical to the engine's eager target AR"
          + (f"; {counts['differ']} differ ({counts['near_ties']} near-ties, {counts['unexplained']} unexplained)"
             if differ else "") + (f"; {counts['failed']} failed or left out" if counts["failed"] else ""), flush=True)
    return counts


def _judge(base, reference):
    """The verdict on an output that differs from ``base`` (the engine's eager target AR result), from
    the rows both recorded and ``reference`` (``analysis.reference``); a peer records no rows."""
    from analysis.divergence import explain

    def judge(tokens, result):
        rows = result.decisions if result is not None else None
        return explain(base.tokens, base.decisions, tokens, rows, reference=reference)
    return judge


def _time_boxed() -> None:
    """Turn the time box's SIGTERM (``timeout``) into ``SystemExit(124)``, so that the part it cuts
    still saves what it has (``oneshot``'s ``finally``)."""
    def stop(signum, frame):
        raise SystemExit(124)
    signal.signal(signal.SIGTERM, stop)


def oneshot(args) -> int:
    """The one-shot check's figure parts, in order (``--parts identity,verdicts,speed``), each under its
    share of the time (``--shares``; a part's unused time goes to the next) and each saved to
    ``--out-dir``/PART/ (figures.json, summary.txt) as soon as it ends:

    - identity: float32, every compile path and peer run once: each output must equal the engine's
      eager target AR (float32 leaves no near-tie to excuse a difference); the models keep their
      layer shapes but have ``--identity-layers`` layers (the H200's captures of the full 3B and 1B
      took 94 s of this part in float32, 120 s in bfloat16);
    - verdicts: bfloat16, every path and peer run once (the warm-up of ``speed``): each difference
      judged (``analysis.divergence``: near-tie or unexplained; a peer records no rows: no verdict);
    - speed: the bfloat16 entries timed ``--ab-rounds`` alternating rounds.

    Returns the exit status: 1 when an output differs in float32, a difference is unexplained, or
    an entry failed; else 0."""
    from analysis.reference import referee_for

    _time_boxed()
    begun = time.perf_counter()
    shares = {name: float(v) for name, v in (item.split("=") for item in args.shares.split(","))}
    wanted = [p for p in ONESHOT_PARTS if p in args.parts.split(",")]
    out_dir = Path(args.out_dir)
    if not args.device.startswith("cuda"):
        static_path.BACKEND = "eager"               # a rehearsal: no inductor build on a CPU
    name = card_name(args.device)
    bandwidth = bandwidth_of(name)
    status, elapsed_share, held = 0, 0.0, {}
    print(f"card: {name}; machine: {json.dumps(machine(args.device))}", flush=True)
    for part in wanted:
        elapsed_share += shares.get(part, 60.0)
        deadline = begun + elapsed_share
        tee = _Tee(sys.stdout)
        sys.stdout = tee
        part_begun = time.perf_counter()
        report: dict = {"part": part, "small": args.small, "length": args.length, "gamma": args.gamma,
                        "share_s": shares.get(part), "transformers": transformers.__version__}
        try:
            print(f"== part {part}: until {elapsed_share:.0f} s of the figures' {sum(shares.values()):.0f} s", flush=True)
            dtype_name = "float32" if part == "identity" else "bfloat16"
            if part == "speed" and "verdicts" in held:
                target, drafter, prompt, entries, warm = held.pop("verdicts")
            else:
                layers = args.identity_layers if part == "identity" else None
                target, drafter, prompt = _part_models(args, dtype_name, layers)
                if layers:
                    report["layers"] = {"target": target.config.num_hidden_layers,
                                        "drafter": drafter.config.num_hidden_layers}
                    print(f"float32 identity on the models' own layer shapes, {layers} layers each "
                          f"(a capture's cost grows with the layers; the arithmetic of a layer does not)", flush=True)
                entries = group_entries(args, target, drafter, prompt)
                warm = None
            weights = weight_bytes(target)
            floor_ms = 1000 * weights / bandwidth if bandwidth else None
            report.update(dtype=dtype_name, floor_ms=floor_ms, weight_bytes=weights)
            judge, base = None, None
            groups, reference = {}, None
            report["groups"] = groups            # each group saved as it ends, when the time box cuts the next
            for title, group in zip(("target_ar", "speculative"), entries):
                if part == "speed":
                    rows = warm[title] if warm is not None else warm_once(group, deadline)
                    left = {n: go for n, go in group.items() if (rows[n]["error"] or "").startswith("left out")}
                    rows.update(warm_once(left, deadline))      # what the verdicts part had no time for
                    warm_device(args.device)
                    time_rounds(group, rows, args.ab_rounds, deadline)
                else:
                    rows = warm_once(group, deadline)
                if part == "verdicts":
                    held_rows = held.setdefault("rows", {})
                    held_rows[title] = {n: dict(r) for n, r in rows.items()}
                    base = rows[next(iter(rows))]["result"] if title == "target_ar" else base
                    referee = referee_for(target)
                    if base is not None and referee is not None:
                        check = referee.for_prompt(prompt)
                        judge = _judge(base, check)
                groups[title], reference = describe(title.replace("_", " "), rows, args.ab_rounds if part == "speed"
                                                    else 0, dtype_name, floor_ms, reference, judge)
            counts = _tally(dtype_name, {**groups["target_ar"], **groups["speculative"]})
            report["counts"] = counts
            if counts["failed"] or counts["unexplained"] or (part == "identity" and counts["differ"]):
                status = 1
            if part == "verdicts":
                held["verdicts"] = (target, drafter, prompt, entries, held.pop("rows"))
            del target, drafter, entries
        except Exception as e:  # noqa: BLE001  (a part that cannot run says why; the next part still runs)
            report["error"] = _failure(e)
            print(f"part {part} failed: {report['error']}", flush=True)
            status = 1
        except SystemExit:          # the time box's SIGTERM (_time_boxed): this part is saved as it stands
            report["error"] = "stopped by the check's time box"
            print(f"part {part}: {report['error']}", flush=True)
            raise
        finally:
            sys.stdout = tee.stream
            report["seconds"] = time.perf_counter() - part_begun
            folder = out_dir / part
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "figures.json").write_text(json.dumps(report, indent=1, default=str))
            (folder / "summary.txt").write_text("".join(tee.lines))
            print(f"== part {part} ended after {report['seconds']:.0f} s (saved in {folder})", flush=True)
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
    return status


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
    parser.add_argument("--length", type=int, default=None, help="new tokens (default 64; 16 with --small)")
    parser.add_argument("--prompt", type=int, default=None, help="prompt tokens of the paths part (default 64; "
                                                                  "16 with --small)")
    parser.add_argument("--dtypes", default="bfloat16,float32", help="the paths part's dtypes, in order")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--prefix", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--identity-prompts", type=int, default=6)
    parser.add_argument("--ab-rounds", type=int, default=None,
                        help="timed alternating rounds after the warm-up (default 2; 1 with --small)")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke run of every step)")
    parser.add_argument("--parts", default="paths", help="paths (default); identity,verdicts,speed "
                        "(the one-shot check's parts, scripts/gpu_check.sh); or the older 1,2,3")
    parser.add_argument("--out", default="gpu_figures.json")
    parser.add_argument("--out-dir", default="gpu_out", help="the one-shot parts' folder (a subfolder each)")
    parser.add_argument("--identity-layers", type=int, default=None,
                        help="layers of each model in the identity part (default 4; all with --small)")
    parser.add_argument("--shares", default="identity=60,verdicts=170,speed=70",
                        help="seconds of each one-shot part (a part's unused time goes to the next)")
    args = parser.parse_args()
    small = args.small
    args.length = args.length or (16 if small else 64)
    args.prompt = args.prompt or (16 if small else 64)
    args.ab_rounds = args.ab_rounds or (1 if small else 2)
    args.identity_layers = args.identity_layers if args.identity_layers is not None else (0 if small else 4)
    dtype = getattr(torch, args.dtype)
    parts = set(args.parts.split(","))
    if parts & set(ONESHOT_PARTS):
        sys.exit(oneshot(args))
    report: dict = {"machine": machine(args.device), "dtype": args.dtype, "length": args.length,
                    "gamma": args.gamma, "small": args.small}

    def save():
        Path(args.out).write_text(json.dumps(report, indent=1))

    if "paths" in parts:
        paths_part(args, report, save)
    if not parts & {"1", "2", "3"}:
        print(json.dumps(report["machine"]))
        return
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
