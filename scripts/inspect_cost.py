"""What recording the per-token inspector's numbers costs, on the default pair.

    .venv/bin/python scripts/inspect_cost.py [--reps 5] [--length 64] [--threads N]

Two figures:
1. the recorder alone, in CPU time on one thread (``time.process_time``, which a
   shared machine disturbs far less than wall time): ``record_round``, the
   transfer and the host-side ``decode`` for a round of γ = 4 drafts at the
   default pair's vocabulary (model drafts under sampling and under greedy,
   where the models' softmax is added; n-gram drafts), against the target's
   forward over the 5 tokens a verify of 4 drafts scores (the prompt's last
   5, after the rest of the prompt as cache);
2. with ``--end-to-end``: speculative decoding and NASD, greedy and
   multinomial (T=1), on built-in prompts, recording on and off in
   alternation (ABAB...); median tokens/s of each and the relative difference
   (wall time: meaningful on a quiet machine only).
docs/repl.md records a run.
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

from engine import NGramOptions, Strategy, run_strategy  # noqa: E402
from generation.inspection import decode, record_round  # noqa: E402
from sampling import GreedyProcessor, MultinomialProcessor  # noqa: E402
from utils.builtin_prompts import BUILTIN  # noqa: E402
from kvcache.probe import cached_model  # noqa: E402
from engine import load_pair  # noqa: E402
from utils.vocab import encode_prompt  # noqa: E402


def run(pair, key: str, ids: list[int], processor, length: int, inspect: bool):
    """One decode through the engine, the inspector's recording switched by ``Strategy.inspect``."""
    options = NGramOptions(n=3, top_k_filler=3) if key == "ngram" else None
    strategy = Strategy(key, drafter={"speculative": "model", "ngram": "ngram"}[key], drafter_options=options,
                        gamma=4, processor=processor, max_gen_len=length, seed=42, inspect=inspect)
    return run_strategy(strategy, pair, ids)


def cpu_seconds(fn, reps: int) -> float:
    """Median CPU seconds of ``fn()`` (after one untimed call)."""
    fn()
    times = []
    for _ in range(reps):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def recorder(kind: str, vocab: int, k: int = 4):
    """One round's recording as the verify loop adds it: "sampling", "greedy" or "ngram".

    The rule's p and q (which the loop computes anyway) are made outside the
    timed part; under greedy the models' softmax, which only the recording
    needs, is inside it.
    """
    logits = torch.randn(k + 1, vocab) * 3
    draft_logits = torch.randn(k, vocab) * 3
    draft = torch.randint(vocab, (k,))
    n, token = torch.tensor(2), torch.tensor(7)
    rule = GreedyProcessor() if kind == "greedy" else MultinomialProcessor(1.0)
    p_rule = rule(logits)
    q_rule = None if kind == "ngram" else rule(draft_logits)

    def once():
        p_view, q_view = p_rule, q_rule
        if kind == "greedy":
            p_view, q_view = logits.float().softmax(-1), draft_logits.float().softmax(-1)
        flat = record_round(p_rule, q_rule, draft, n, token, p_view=p_view, q_view=q_view).tolist()
        decode(flat, draft.tolist(), 2, vocab=vocab, has_q=q_rule is not None, shown=kind)

    return once


def cached_forward(model, ids: list[int], width: int):
    """``model`` scoring the last ``width`` of ``ids`` after the rest as cache, then rolled back."""
    cached = cached_model(model)
    seq = torch.tensor([cached.begin(ids)])                # (1, L)
    with torch.inference_mode():
        cached.forward(seq[:, :-width], keep=1)

    def once():
        with torch.inference_mode():
            cached.forward(seq, keep=width)
            cached.rollback(seq.shape[1] - width)

    return once


def cpu_figures(pair, ids: list[int], reps: int) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        verify = cpu_seconds(cached_forward(pair.target, ids, 5), reps)
        draft = cpu_seconds(cached_forward(pair.drafter, ids, 1), reps)
        spec_round = 4 * draft + verify
        print(f"CPU time on one thread, after {len(ids) - 5} cached tokens: target verify forward of 5 tokens "
              f"{verify * 1000:.1f} ms; drafter step {draft * 1000:.1f} ms; a speculative round of 4 drafts "
              f"{spec_round * 1000:.1f} ms", flush=True)
        for kind, per_round, what in (("sampling", spec_round, "speculative round"),
                                      ("greedy", spec_round, "speculative round"),
                                      ("ngram", verify, "NASD round (verify)")):
            seconds = cpu_seconds(recorder(kind, pair.vocab_size), reps)
            print(f"  recording 4 drafts ({kind}, V={pair.vocab_size}): {seconds * 1000:.2f} ms = "
                  f"{seconds / verify:.1%} of the verify forward, {seconds / per_round:.1%} of a {what}",
                  flush=True)
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--prompts", type=int, default=2, help="how many built-in prompts (1 or 2)")
    parser.add_argument("--end-to-end", action="store_true", help="also the tokens/s A/B (quiet machine)")
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
    cpu_figures(pair, encoded[0], max(args.reps, 5) * 4)
    if not args.end_to_end:
        return
    run(pair, "speculative", encoded[0], GreedyProcessor(), 16, True)          # warm-up
    overall = []
    for key in ("speculative", "ngram"):
        for processor in (GreedyProcessor(), MultinomialProcessor(1.0)):
            for index, ids in enumerate(encoded):
                rates = {True: [], False: []}
                for rep in range(args.reps):
                    for inspect in ((True, False) if rep % 2 == 0 else (False, True)):
                        result = run(pair, key, ids, processor, args.length, inspect)
                        rates[inspect].append(result.tokens_per_second)
                on, off = statistics.median(rates[True]), statistics.median(rates[False])
                overall.append(on / off)
                print(f"{key:11} {processor!r:18} prompt {index}: on {on:6.2f} tokens/s · off {off:6.2f} · "
                      f"on/off {on / off - 1:+.1%}", flush=True)
    print(f"end to end, median of on/off over {len(overall)} configurations: "
          f"{statistics.median(overall) - 1:+.1%} (geometric mean "
          f"{statistics.geometric_mean(overall) - 1:+.1%})")
    with open("/proc/loadavg") as f:
        print(f"load average at the end {' '.join(f.read().split()[:3])}")


if __name__ == "__main__":
    main()
