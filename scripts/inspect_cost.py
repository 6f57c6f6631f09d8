"""What recording the per-token inspector's numbers costs, on the default pair.

    .venv/bin/python scripts/inspect_cost.py [--reps 5] [--length 64] [--threads N]

Two figures:
1. end to end: speculative decoding and NASD, greedy and multinomial (T=1), on
   two built-in prompts, with recording on and off in alternation (ABAB...);
   median tokens/s of each and the relative difference;
2. the recorder alone: ``record_round`` plus the host-side ``decode`` on
   tensors of the default pair's sizes (γ = 4, V = the vocabulary), against
   the median verify-round seconds measured in (1). This one is far less
   sensitive to a shared machine.
Prints one line per configuration and a summary; docs/repl.md records a run.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.builtin_prompts import BUILTIN  # noqa: E402
from generation.inspection import decode, record_round  # noqa: E402
from generation.speculative import speculative_generate  # noqa: E402
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate  # noqa: E402
from sampling import GreedyProcessor, MultinomialProcessor  # noqa: E402
from utils.models import load_pair  # noqa: E402
from utils.vocab import encode_prompt  # noqa: E402


def run(pair, key: str, ids: list[int], processor, length: int, inspect: bool):
    generator = torch.Generator().manual_seed(42)
    torch.manual_seed(42)
    if key == "speculative":
        return speculative_generate(ids, pair.drafter, pair.target, logits_processor=processor, gamma=4,
                                    max_gen_len=length, eos_tokens_id=pair.end_tokens,
                                    vocab_size=pair.vocab_size, generator=generator, inspect=inspect)
    return ngram_assisted_speculative_generate(
        ids, NGramStorage(3, pair.vocab_size), pair.target, logits_processor=processor, gamma=4,
        filler_top_k=3, max_gen_len=length, eos_tokens_id=pair.end_tokens, generator=generator,
        inspect=inspect)


def recorder_seconds(vocab: int, k: int = 4, reps: int = 200) -> float:
    """Median seconds of record_round + tolist + decode for one round of k model drafts."""
    p = torch.rand(k + 1, vocab).softmax(-1)
    q = torch.rand(k, vocab).softmax(-1)
    draft = torch.randint(vocab, (k,))
    n, token = torch.tensor(2), torch.tensor(7)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        flat = record_round(p, q, draft, n, token, p_view=p, q_view=q).tolist()
        decode(flat, draft.tolist(), 2, vocab=vocab, has_q=True, shown="rule")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=2, help="how many built-in prompts (1 or 2)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    pair = load_pair()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"{platform.processor() or platform.machine()} · torch {torch.__version__} · "
          f"threads {torch.get_num_threads()} · load average at start {' '.join(load)}")
    prompts = [next(text for cat, text in BUILTIN if cat == wanted)
               for wanted in ("chat", "code_editing")][:args.prompts]
    encoded = [encode_prompt(pair.tokenizer, text, chat=True) for text in prompts]
    warm = run(pair, "speculative", encoded[0], GreedyProcessor(), 16, True)          # warm-up
    recorder = recorder_seconds(pair.vocab_size)
    verify = statistics.median(r.verify_s for r in warm.trace[1:] if r.drafted)
    print(f"recorder alone: {recorder * 1000:.2f} ms per round of 4 drafts (V={pair.vocab_size}) · "
          f"median verify round (warm-up run) {verify * 1000:.1f} ms · {recorder / verify:.1%} of a verify",
          flush=True)
    overall, verify_rounds = [], []
    for key in ("speculative", "ngram"):
        for processor in (GreedyProcessor(), MultinomialProcessor(1.0)):
            for index, ids in enumerate(encoded):
                rates = {True: [], False: []}
                for rep in range(args.reps):
                    for inspect in ((True, False) if rep % 2 == 0 else (False, True)):
                        result = run(pair, key, ids, processor, args.length, inspect)
                        rates[inspect].append(result.tokens_per_second)
                        verify_rounds += [r.verify_s for r in result.trace[1:] if r.drafted]
                on, off = statistics.median(rates[True]), statistics.median(rates[False])
                overall.append(on / off)
                print(f"{key:11} {processor!r:18} prompt {index}: on {on:6.2f} tokens/s · off {off:6.2f} · "
                      f"on/off {on / off - 1:+.1%}", flush=True)
    print(f"end to end, median of on/off over {len(overall)} configurations: "
          f"{statistics.median(overall) - 1:+.1%} (geometric mean "
          f"{statistics.geometric_mean(overall) - 1:+.1%})")
    verify = statistics.median(verify_rounds)
    print(f"recorder alone against the median verify round of every run: {recorder * 1000:.2f} ms / "
          f"{verify * 1000:.1f} ms = {recorder / verify:.1%}")
    with open("/proc/loadavg") as f:
        print(f"load average at the end {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
