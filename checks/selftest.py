"""A self-test for a loaded model pair: do speculative decoding and NASD keep
the target's output on *this* pair, on this machine?

Greedy: on a few built-in prompts, speculative decoding and NASD must give the
target's autoregressive tokens exactly, with the KV cache on and with it off.
Sampling: under top-k sampling (k = 3) the first token of speculative
decoding and of NASD, drawn many times from one seeded generator, must follow
the target's exact top-k distribution; a chi-square test decides, so the check
is deterministic and can fail. Each draw costs a prefill of both models, so the
draws are few (SAMPLING_RUNS) and the test only catches gross errors (a
zero-probability token, a strongly biased resample), not subtle ones.

Every check yields one :class:`Check` with a one-line detail: what passed, or
what differed and where.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from checks.stats import goodness_of_fit
from engine import DEFAULT_GAMMA, NGramOptions, Strategy, run_strategy
from generation.result import first_divergence
from sampling import GreedyProcessor, TopKProcessor
from utils.builtin_prompts import BUILTIN
from utils.vocab import encode_prompt

DEFAULT_LENGTH = 32
# Without a cache every forward recomputes the whole sequence: the cache-off
# checks stop after this many tokens to keep the self-test to minutes on a CPU.
CACHE_OFF_LENGTH = 16
SAMPLING_RUNS = 200
SAMPLING_TOP_K = 3
SAMPLING_STEPS = 1
SAMPLING_SEED = 1234
# A p-value below this fails: about one false alarm in 10^6 runs of a correct engine.
ALPHA = 1e-6
# (category, index within it) in utils.builtin_prompts.BUILTIN: one prompt whose
# answer copies from it (n-gram drafts find material), one open question.
PROMPTS = (("code_editing", 0), ("chat", 0))
# Raw text (no chat template) ending in a phrase it already holds, so NASD's
# storage drafts from the first position on.
SAMPLING_TEXT = "one two three four, one two three four, one two three"


@dataclass(frozen=True)
class Check:
    """One self-test check: its name, whether it passed, and one line of detail."""

    name: str
    passed: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name}: {self.detail}"


def builtin_texts() -> list[str]:
    out = []
    for category, index in PROMPTS:
        texts = [text for cat, text in BUILTIN if cat == category]
        out.append(texts[index])
    return out


def _encode(pair, text: str, *, chat: bool = True) -> list[int]:
    ids = encode_prompt(pair.tokenizer, text, chat=chat)
    if not ids:
        raise ValueError(f"the prompt {text[:30]!r} encodes to no tokens")
    return ids


def _strategies(pair, ngram: NGramOptions, gamma: int, tree: int = 0, tree_branch: int = 2) -> dict[str, Callable]:
    """name -> run(ids, processor, use_cache, max_gen_len, generator) for the two drafting strategies
    (verifying token trees of at most ``tree`` nodes when ``tree`` > 0)."""

    def runner(key: str, drafter: str, options) -> Callable:
        def run(ids, processor, use_cache, length, generator=None):
            strategy = Strategy(key, drafter=drafter, drafter_options=options, gamma=gamma,
                                processor=processor, use_cache=use_cache, max_gen_len=length,
                                tree=tree, tree_branch=tree_branch)
            return run_strategy(strategy, pair, ids, generator=generator)

        return run

    return {"speculative": runner("speculative", "model", None), "NASD": runner("ngram", "ngram", ngram)}


def _target_ar(pair, ids, use_cache: bool, length: int) -> list[int]:
    strategy = Strategy("target", processor=GreedyProcessor(), use_cache=use_cache, max_gen_len=length)
    return run_strategy(strategy, pair, ids).tokens


def _difference(name: str, prompt_no: int, got: list[int], want: list[int]) -> str | None:
    """'prompt 2: token 17 is 345, target AR gave 12', or None when equal."""
    index = first_divergence(got, want)
    if index is None:
        return None
    where = f"prompt {prompt_no}"
    if index >= len(got) or index >= len(want):
        return f"{where}: {len(got)} tokens, target AR gave {len(want)}"
    return f"{where}: token {index} is {got[index]}, target AR gave {want[index]}"


def _guard(name: str, body: Callable[[], Check]) -> Check:
    """A check that raised fails with the exception's first line."""
    try:
        return body()
    except Exception as e:  # noqa: BLE001  (the self-test reports, it never crashes)
        text = str(e).strip().splitlines()
        return Check(name, False, f"{type(e).__name__}: {text[0] if text else ''}")


def greedy_checks(pair, *, length: int, gamma: int, ngram: NGramOptions | None = None,
                  tree: int = 0, tree_branch: int = 2) -> list[Callable[[], Check]]:
    """One deferred check per (strategy, cache setting): greedy output == target AR
    (the same strategy and cache setting), ``length`` tokens with the cache and at
    most CACHE_OFF_LENGTH without."""
    prompts = [_encode(pair, text) for text in builtin_texts()]

    def budget(use_cache: bool) -> int:
        return length if use_cache else min(length, CACHE_OFF_LENGTH)

    @functools.cache  # target AR runs once per cache setting, for both strategies
    def reference(use_cache: bool) -> list[list[int]]:
        return [_target_ar(pair, ids, use_cache, budget(use_cache)) for ids in prompts]

    def make(strategy: str, run, use_cache: bool) -> Callable[[], Check]:
        name = f"{strategy} greedy (cache {'on' if use_cache else 'off'})"

        def body() -> Check:
            accepted = drafted = 0
            for i, (ids, want) in enumerate(zip(prompts, reference(use_cache)), start=1):
                result = run(ids, GreedyProcessor(), use_cache, budget(use_cache))
                drafted += result.drafted
                accepted += result.accepted
                if (diff := _difference(name, i, result.tokens, want)) is not None:
                    return Check(name, False, diff)
            return Check(name, True, f"same tokens as target AR on {len(prompts)} prompts, up to "
                                     f"{budget(use_cache)} each ({accepted} of {drafted} drafts accepted)")

        return lambda: _guard(name, body)

    runs = _strategies(pair, ngram or NGramOptions(), gamma, tree, tree_branch)
    return [make(s, run, c) for c in (True, False) for s, run in runs.items()]


def _last_logits(model, ids: list[int], prefixes: list[tuple], encoder_decoder: bool) -> torch.Tensor:
    """Logits after each prefix of generated tokens, (len(prefixes), V), in one forward."""
    device = getattr(model, "device", torch.device("cpu"))
    if encoder_decoder:  # the prompt feeds the encoder; the decoder starts from its start token
        start = model.config.decoder_start_token_id
        decoder = torch.tensor([[start, *p] for p in prefixes], device=device)
        encoder = torch.tensor([ids] * len(prefixes), device=device)
        return model(input_ids=encoder, decoder_input_ids=decoder).logits[:, -1, :]
    batch = torch.tensor([ids + list(p) for p in prefixes], device=device)
    return model(input_ids=batch).logits[:, -1, :]


def exact_first_tokens(model, ids: list[int], processor, steps: int, vocab: int, *,
                       encoder_decoder: bool = False) -> dict[tuple, float]:
    """P(first ``steps`` tokens) under the processed target, by enumerating the
    outcomes with non-zero probability (one batched forward per step, no cache)."""
    probs: dict[tuple, float] = {(): 1.0}
    with torch.inference_mode():
        for _ in range(steps):
            prefixes = [p for p, mass in probs.items() if mass > 0]
            logits = _last_logits(model, ids, prefixes, encoder_decoder)[:, :vocab].float()
            step = processor(logits)
            probs = {p + (t,): probs[p] * step[i, t].item()
                     for i, p in enumerate(prefixes) for t in step[i].nonzero().flatten().tolist()}
    return probs


def sampling_checks(pair, *, gamma: int, runs: int = SAMPLING_RUNS, ngram: NGramOptions | None = None,
                    tree: int = 0, tree_branch: int = 2) -> list[Callable[[], Check]]:
    """One deferred check per drafting strategy: first tokens ~ the exact target distribution."""
    processor = TopKProcessor(1.0, SAMPLING_TOP_K)
    ids = _encode(pair, SAMPLING_TEXT, chat=False)
    exact: dict = {}

    def make(strategy: str, run) -> Callable[[], Check]:
        what = "first token" if SAMPLING_STEPS == 1 else f"first {SAMPLING_STEPS} tokens"
        name = f"{strategy} sampling (top-{SAMPLING_TOP_K}, {what}, {runs} runs)"

        def body() -> Check:
            if not exact:
                exact.update(exact_first_tokens(pair.target, ids, processor, SAMPLING_STEPS, pair.vocab_size,
                                                encoder_decoder=getattr(pair, "is_encoder_decoder", False)))
            generator = torch.Generator(device=pair.device).manual_seed(SAMPLING_SEED)
            counts: dict = {}
            drafted = accepted = 0
            for _ in range(runs):
                # One token more than compared: the first round drafts, so every
                # compared token goes through the accept rule.
                result = run(ids, processor, True, SAMPLING_STEPS + 1, generator)
                key = tuple(result.tokens[:SAMPLING_STEPS])
                counts[key] = counts.get(key, 0) + 1
                drafted += result.drafted
                accepted += result.accepted
            fit = goodness_of_fit(counts, exact)
            detail = f"{fit.describe()} ({accepted} of {drafted} drafts accepted)"
            if drafted == 0:
                return Check(name, False, "no drafts were proposed, so the accept rule was not exercised")
            return Check(name, fit.p_value >= ALPHA, detail)

        return lambda: _guard(name, body)

    runs_by = _strategies(pair, ngram or NGramOptions(), max(gamma, SAMPLING_STEPS), tree, tree_branch)
    return [make(s, run) for s, run in runs_by.items()]


def run_selftest(pair, *, length: int = DEFAULT_LENGTH, gamma: int | None = None,
                 sampling_runs: int = SAMPLING_RUNS, tree: int = 0, tree_branch: int = 2,
                 report: Callable[[Check], None] | None = None) -> list[Check]:
    """Run every check on ``pair`` (a ``utils.models.ModelPair``); return them in order.

    ``report`` is called with each check as soon as it is done (to print it).
    ``gamma`` defaults to the engine's default. ``tree`` > 0 checks token
    trees of at most that many nodes (``tree_branch`` children per node) like chains.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f"length must be an integer >= 1, got {length!r}")
    gamma = DEFAULT_GAMMA if gamma is None else gamma
    pending = greedy_checks(pair, length=length, gamma=gamma, tree=tree, tree_branch=tree_branch)
    pending += sampling_checks(pair, gamma=gamma, runs=sampling_runs, tree=tree, tree_branch=tree_branch)
    checks = []
    for body in pending:
        check = body()
        checks.append(check)
        if report is not None:
            report(check)
    return checks


def selftest_exit_code(pair, out: Callable[[str], None] = print, **options) -> int:
    """Run the self-test, print one line per check and a summary; 0 when all pass, 1 otherwise."""
    checks = run_selftest(pair, report=lambda c: out(c.line()), **options)
    failed = [c.name for c in checks if not c.passed]
    if failed:
        out(f"self-test failed: {len(failed)} of {len(checks)} checks ({', '.join(failed)})")
        return 1
    out(f"self-test passed: {len(checks)} checks")
    return 0
