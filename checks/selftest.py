"""A self-test for a loaded model pair: do speculative decoding and NASD keep the target's output on
*this* pair, on this machine?

Greedy: on built-in prompts both must give target AR's tokens exactly, cache on and off.
Sampling: under top-k sampling (k = 3) the first token, drawn many times from one seeded generator,
must follow the target's exact top-k distribution (a chi-square test, so the check is deterministic
and can fail). The speculative draws take the drafter's most likely token as a one-hot q: a drafter
that nearly always agrees would otherwise leave the resample almost untried. Every draw starts from
a copy of one prefilled cache (``kvcache.prefill``); the draws are few, so only gross errors show.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from analysis.divergence import explain
from analysis.reference import referee_for
from checks.stats import goodness_of_fit
from engine import DEFAULT_GAMMA, DRAFTERS, NGramOptions, Strategy, register_drafter, run_strategy
from generation.result import first_divergence
from sampling import GreedyProcessor, TopKProcessor
from utils.builtin_prompts import BUILTIN
from generation.served import ServedModel
from kvcache.prefill import prefill
from kvcache.probe import forget, probe_pair, runs_alone
from utils.options import check_int
from utils.vocab import encode_prompt

DEFAULT_LENGTH = 32
# Without a cache every forward recomputes the whole sequence: the cache-off
# checks stop after this many tokens, on the short prompts (CACHE_OFF_PROMPTS).
CACHE_OFF_LENGTH = 16
SAMPLING_RUNS = 200
SAMPLING_TOP_K = 3
SAMPLING_STEPS = 1
SAMPLING_SEED = 1234
# The speculative sampling draws' q: one-hot on the drafter's most likely token
# (top-1), so that a rejection and its resample come with probability 1 - p(draft).
ONE_HOT_TEMPERATURE = 1.0
ONE_HOT_TOP_K = 1
ONE_HOT_DRAFTER = "selftest:one-hot"
# A p-value below this fails: about one false alarm in 10^6 runs of a correct engine.
ALPHA = 1e-6
# (category, index within it) in utils.builtin_prompts.BUILTIN: one prompt whose
# answer copies from it (n-gram drafts find material), one open question.
PROMPTS = (("code_editing", 0), ("chat", 0))
# Raw text (no chat template) ending in a phrase it already holds, so NASD's
# storage drafts from the first position on.
SAMPLING_TEXT = "one two three four, one two three four, one two three"
# The cache-off prompts: the open question and SAMPLING_TEXT, both raw text. Without a cache
# every forward recomputes the whole sequence, so the long code prompt and the chat template
# are left to the cache-on checks.
CACHE_OFF_PROMPTS = ((("chat", 0), False), (SAMPLING_TEXT, False))


@dataclass(frozen=True)
class Check:
    """One self-test check: its name, whether it passed, and one line of detail."""

    name: str
    passed: bool
    detail: str
    seconds: float = 0.0

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.name}: {self.detail} [{self.seconds:.1f} s]"


def _builtin(category: str, index: int) -> str:
    return [text for cat, text in BUILTIN if cat == category][index]


def builtin_texts() -> list[str]:
    return [_builtin(category, index) for category, index in PROMPTS]


def _cache_off_prompts(pair) -> list[list[int]]:
    """CACHE_OFF_PROMPTS encoded: a (category, index) is a built-in prompt in the chat template."""
    return [_encode(pair, _builtin(*text) if isinstance(text, tuple) else text, chat=chat)
            for text, chat in CACHE_OFF_PROMPTS]


def _encode(pair, text: str, *, chat: bool = True) -> list[int]:
    ids = encode_prompt(pair.tokenizer, text, chat=chat)
    if not ids:
        raise ValueError(f"the prompt {text[:30]!r} encodes to no tokens")
    return ids


def _fit(pair, ids: list[int], budget: int) -> list[int]:
    """``ids`` without as many of its first tokens as a model of a short context needs for ``budget``
    new tokens to fit (a served model of 128 positions, say); unchanged where it fits."""
    room = (pair.context_length or 0) - budget
    if pair.context_length is None or len(ids) <= room:
        return ids
    if room < 1:
        raise ValueError(f"the model's context ({pair.context_length} tokens) holds no prompt beside "
                         f"{budget} new tokens: lower --length")
    return ids[-room:]


def _one_hot_model_drafter(pair, strategy, state, context):
    """The pair's drafter (kind "model") drafting its most likely token, q one-hot."""
    return DRAFTERS["model"](pair, strategy, state,
                             replace(context, processor=TopKProcessor(ONE_HOT_TEMPERATURE, ONE_HOT_TOP_K)))


register_drafter(ONE_HOT_DRAFTER, _one_hot_model_drafter)


def _strategies(pair, ngram: NGramOptions, gamma: int, tree: int = 0, tree_branch: int = 2, *,
                model: str = "model") -> dict[str, Callable]:
    """name -> run(ids, processor, use_cache, max_gen_len, generator, prefills, rounds) for the two
    drafting strategies (trees of at most ``tree`` nodes when ``tree`` > 0)."""

    def runner(key: str, drafter: str, options) -> Callable:
        def run(ids, processor, use_cache, length, generator=None, prefills=(), rounds=0):
            # The self-test reads tokens only: no inspector numbers.
            strategy = Strategy(key, drafter=drafter, drafter_options=options, gamma=gamma,
                                processor=processor, use_cache=use_cache, max_gen_len=length,
                                tree=tree, tree_branch=tree_branch, inspect=False, max_rounds=rounds)
            return run_strategy(strategy, pair, ids, generator=generator, prefills=prefills)

        return run

    return {"speculative": runner("speculative", model, None), "NASD": runner("ngram", "ngram", ngram)}


def _target_ar(pair, ids, use_cache: bool, length: int):
    strategy = Strategy("target", processor=GreedyProcessor(), use_cache=use_cache, max_gen_len=length)
    return run_strategy(strategy, pair, ids)


def token_words(pair, tokens) -> str:
    """Token ids as their decoded text and the ids: ``' the water' (12, 45)`` (the ids alone
    where the tokenizer cannot decode them)."""
    ids = tuple(int(t) for t in tokens)
    try:
        text = pair.tokenizer.decode(list(ids), skip_special_tokens=False)
    except Exception:  # noqa: BLE001  (a line of the self-test must not fail on decoding)
        return repr(ids)
    return f"{text!r} {ids}"


def _difference(pair, prompt_no: int, result, reference, ids) -> str | None:
    """'prompt 2 (near-tie): token 17 is ' water' (345,), target AR gave ' hot' (12,)', or None when the
    tokens are equal; the verdict is ``analysis.divergence``'s."""
    got, want = result.tokens, reference.tokens
    index = first_divergence(got, want)
    if index is None:
        return None
    referee = referee_for(pair.target)
    judged = explain(want, reference.decisions, got, result.decisions,
                     reference=None if referee is None else referee.for_prompt(list(ids)))
    where = f"prompt {prompt_no} ({judged.verdict or 'no verdict'})"
    if index >= len(got) or index >= len(want):
        return f"{where}: {len(got)} tokens, target AR gave {len(want)}"
    return (f"{where}: token {index} is {token_words(pair, [got[index]])}, "
            f"target AR gave {token_words(pair, [want[index]])}")


def _guard(name: str, body: Callable[[], Check]) -> Check:
    """Run one check and time it; a check that raised fails with the exception's first line."""
    start = time.perf_counter()
    try:
        check = body()
    except Exception as e:  # noqa: BLE001  (the self-test reports, it never crashes)
        text = str(e).strip().splitlines()
        check = Check(name, False, f"{type(e).__name__}: {text[0] if text else ''}")
    return replace(check, seconds=time.perf_counter() - start)


def probe_check(pair) -> Check:
    """Probe each model's cached forward afresh (``kvcache.probe``): the path each
    model takes and the largest logit error behind it. A refused model fails."""
    for model in {id(m): m for m in (pair.target, pair.drafter) if m is not None}.values():
        if runs_alone(model):            # a drafter that reads its target's state keeps its recorded probe
            forget(model)
    probe = probe_pair(pair)
    refused = [role for role in ("target", "drafter") if getattr(probe, role).path == "refused"]
    detail = probe.summary() + (f" (refused: {', '.join(refused)})" if refused else "")
    return Check("cache probe", not refused, detail)


def greedy_checks(pair, *, length: int, gamma: int, ngram: NGramOptions | None = None,
                  tree: int = 0, tree_branch: int = 2) -> list[Callable[[], Check]]:
    """One deferred check per (strategy, cache setting): greedy output == target AR, ``length`` tokens
    on PROMPTS with the cache, at most CACHE_OFF_LENGTH on CACHE_OFF_PROMPTS without."""
    def budget(use_cache: bool) -> int:
        return length if use_cache else min(length, CACHE_OFF_LENGTH)

    prompts_by = {True: [_fit(pair, _encode(pair, text), budget(True)) for text in builtin_texts()],
                  False: [_fit(pair, ids, budget(False)) for ids in _cache_off_prompts(pair)]}

    @functools.cache  # target AR runs once per cache setting, for both strategies
    def reference(use_cache: bool) -> list:                 # target AR's results, one per prompt
        return [_target_ar(pair, ids, use_cache, budget(use_cache)) for ids in prompts_by[use_cache]]

    def make(strategy: str, run, use_cache: bool) -> Callable[[], Check]:
        name = f"{strategy} greedy (cache {'on' if use_cache else 'off'})"

        def body() -> Check:
            accepted = drafted = 0
            results = []
            prompts = prompts_by[use_cache]
            for i, (ids, want) in enumerate(zip(prompts, reference(use_cache)), start=1):
                result = run(ids, GreedyProcessor(), use_cache, budget(use_cache))
                results.append(result)
                drafted += result.drafted
                accepted += result.accepted
                if (diff := _difference(pair, i, result, want, ids)) is not None:
                    return Check(name, False, diff)
            return Check(name, True, f"same tokens as target AR on {len(prompts)} prompts, up to "
                                     f"{budget(use_cache)} each ({accepted} of {drafted} drafts accepted"
                                     f"{_tree_note(results, tree)})")

        return lambda: _guard(name, body)

    runs = _strategies(pair, ngram or NGramOptions(), gamma, tree, tree_branch)
    return [make(s, run, c) for c in (True, False) for s, run in runs.items()]


def _tree_note(results, tree: int) -> str:
    """'; trees in 9 of 14 rounds' (more than one node verified), or why chains ran; '' without trees."""
    if tree <= 0:
        return ""
    fallback = next((r.tree_fallback for r in results if r.tree_fallback), "")
    if fallback:
        return f"; {fallback}"
    rounds = [r for result in results for r in result.trace]
    return f"; trees in {sum(r.tree_size > 1 for r in rounds)} of {len(rounds)} rounds"


def _last_logits(model, ids: list[int], prefixes: list[tuple], encoder_decoder: bool) -> torch.Tensor:
    """Logits after each prefix of generated tokens, (len(prefixes), V), in one forward."""
    device = getattr(model, "device", torch.device("cpu"))
    if isinstance(model, ServedModel):   # its rows from the server (top-N: exact for the top-k checked here)
        session = model.session()
        return torch.cat([session.forward(torch.tensor([ids + list(p)]), keep=1) for p in prefixes])
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
    prefills: list = []   # both models' prefills of ``ids``, made once for every draw

    def draws(run) -> list:
        """``runs`` results of ``run``, each beginning from a copy of the prefilled caches."""
        if not prefills:
            models = [pair.target] if pair.drafter is pair.target else [pair.target, pair.drafter]
            prefills.extend(prefill(model, ids, replay_first=True) for model in models
                            if model is not None and runs_alone(model) and not isinstance(model, ServedModel))
        generator = torch.Generator(device=pair.device).manual_seed(SAMPLING_SEED)
        # One token more than compared, so every compared token goes through the accept rule;
        # SAMPLING_STEPS rounds make them all (no plain step after a rejection is run).
        return [run(ids, processor, True, SAMPLING_STEPS + 1, generator, prefills, SAMPLING_STEPS)
                for _ in range(runs)]

    def make(strategy: str, run) -> Callable[[], Check]:
        what = "first token" if SAMPLING_STEPS == 1 else f"first {SAMPLING_STEPS} tokens"
        name = f"{strategy} sampling (top-{SAMPLING_TOP_K}, {what}, {runs} runs)"
        drafts = "drafts: the drafter's most likely token, " if strategy == "speculative" and tree == 0 else ""

        def body() -> Check:
            if not exact:
                exact.update(exact_first_tokens(pair.target, ids, processor, SAMPLING_STEPS, pair.vocab_size,
                                                encoder_decoder=pair.is_encoder_decoder))
            counts: dict = {}
            drafted = accepted = 0
            for result in draws(run):
                key = tuple(result.tokens[:SAMPLING_STEPS])
                counts[key] = counts.get(key, 0) + 1
                drafted += result.drafted
                accepted += result.accepted
            fit = goodness_of_fit(counts, exact)
            detail = f"{fit.describe(lambda tokens: token_words(pair, tokens))} ({drafts}{accepted} of {drafted} drafts accepted)"
            if drafted == 0:
                return Check(name, False, "no drafts were proposed, so the accept rule was not exercised")
            return Check(name, fit.p_value >= ALPHA, detail)

        return lambda: _guard(name, body)

    # A tree's accept rule draws the target's token and follows the child equal
    # to it (no residual): its drafts keep the drafter's own q, which gives a
    # node several children.
    drafter = ONE_HOT_DRAFTER if tree == 0 else "model"
    runs_by = _strategies(pair, ngram or NGramOptions(), max(gamma, SAMPLING_STEPS), tree, tree_branch,
                          model=drafter)
    return [make(s, run) for s, run in runs_by.items()]


def run_selftest(pair, *, length: int = DEFAULT_LENGTH, gamma: int | None = None,
                 sampling_runs: int = SAMPLING_RUNS, tree: int = 0, tree_branch: int = 2,
                 report: Callable[[Check], None] | None = None) -> list[Check]:
    """Run every check on ``pair``; return them in order, each passed to ``report`` as soon as it is
    done. ``tree`` > 0 checks token trees of at most that many nodes like chains."""
    check_int(length, "length", 1)
    gamma = DEFAULT_GAMMA if gamma is None else gamma
    # Every check, in the order they run and print: the cache probe of each model first.
    pending = [
        lambda: _guard("cache probe", lambda: probe_check(pair)),
        *greedy_checks(pair, length=length, gamma=gamma, tree=tree, tree_branch=tree_branch),
        *sampling_checks(pair, gamma=gamma, runs=sampling_runs, tree=tree, tree_branch=tree_branch),
    ]
    checks = []
    for body in pending:
        check = body()
        checks.append(check)
        if report is not None:
            report(check)
    return checks


def summary(checks: list[Check], seconds: float) -> str:
    """The self-test's last line: passed or failed (naming the failed checks), and its total time."""
    failed = [c.name for c in checks if not c.passed]
    if failed:
        return f"self-test failed: {len(failed)} of {len(checks)} checks ({', '.join(failed)}) in {seconds:.1f} s"
    return f"self-test passed: {len(checks)} checks in {seconds:.1f} s"


def timed_selftest(pair, report: Callable[[Check], None] | None = None, **options) -> tuple[list[Check], str]:
    """Run the self-test; return its checks and its summary line (with the total time)."""
    start = time.perf_counter()
    checks = run_selftest(pair, report=report, **options)
    return checks, summary(checks, time.perf_counter() - start)


def selftest_exit_code(pair, out: Callable[[str], None] = print, **options) -> int:
    """Run the self-test, print one line per check and the summary; 0 when all pass, 1 otherwise."""
    checks, last = timed_selftest(pair, report=lambda c: out(c.line()), **options)
    out(last)
    return 0 if all(c.passed for c in checks) else 1
