"""Time to first token and the decode part of a run (``GenerationResult.first_token_s``,
``first_tokens``, ``decode_tokens_per_second``), through ``run_strategy``.

The target is slowed on purpose in its prompt forward only (a hook that sleeps when a forward
feeds more than one new token while the cache is empty), so the prefill is a known, large share of
the run: the time to first token must hold it, the decode part must not. An observer that sleeps in
every round checks that watching stays out of both."""

from __future__ import annotations

import time

import pytest

from engine import Strategy, pair_of, run_strategy
from generation.result import GenerationResult, decode_rate
from sampling import GreedyProcessor
from tests.helpers.models import tiny_llama

PROMPT = [1, 5, 7, 9, 5, 7, 9, 5, 7]
PREFILL_S = 0.6       # long beside a run's compute, so the decode rate stands clear of the whole run's on a loaded machine
STEP_S = 0.01          # every other target forward sleeps this long
LENGTH = 12


class SlowPrefill:
    """A forward pre-hook that sleeps PREFILL_S in every forward fed the whole prompt, STEP_S in
    every other one."""

    def __init__(self, model):
        self.calls = 0
        model.register_forward_pre_hook(self, with_kwargs=True)

    def __call__(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[-1] >= len(PROMPT):
            self.calls += 1
            time.sleep(PREFILL_S)
        else:
            time.sleep(STEP_S)


class SleepyObserver:
    """Sleeps when shown the first round's drafts (before its verify) and after every round:
    watching must count neither in the run's time nor in its time to first token."""

    def __init__(self):
        self.shown = 0

    def drafted(self, draft):
        self.shown += 1
        if self.shown == 1:
            time.sleep(0.2)

    def round(self, rnd, new_tokens, elapsed_s):
        time.sleep(0.02)


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(0, logit_scale=20.0)
    pair = pair_of(target, tiny_llama(1, logit_scale=20.0))
    run_strategy(Strategy("target", max_gen_len=2), pair, PROMPT)    # the cache probe runs once, first
    pair.slow = SlowPrefill(target)
    return pair


@pytest.mark.parametrize("strategy", [
    Strategy("target", processor=GreedyProcessor(), max_gen_len=LENGTH),
    Strategy("speculative", drafter="model", gamma=3, processor=GreedyProcessor(), max_gen_len=LENGTH),
    Strategy("nasd", drafter="ngram", gamma=3, processor=GreedyProcessor(), max_gen_len=LENGTH),
], ids=["target", "speculative", "nasd"])
def test_the_prefill_is_in_the_first_token_and_not_in_the_decode(pair, strategy):
    calls = pair.slow.calls
    result = run_strategy(strategy, pair, PROMPT, observer=SleepyObserver())
    assert pair.slow.calls == calls + 1                       # one slow prompt forward in the run
    assert len(result.tokens) == LENGTH
    # The first round holds the prefill; the observer's sleeps (0.2 s before the first verify, 0.02 s
    # after each round) are left out.
    assert PREFILL_S <= result.first_token_s < PREFILL_S + 0.15
    assert result.seconds < PREFILL_S + 0.04 * result.rounds + 0.15
    first = result.trace[0]
    assert result.first_tokens == first.accepted + (first.token is not None)
    assert result.decode_seconds == pytest.approx(result.seconds - result.first_token_s)
    assert result.decode_seconds < 0.04 * result.rounds + 0.1     # no prefill in the decode part
    assert result.decode_seconds >= STEP_S * (result.target_calls - 1)   # every later target step in it
    rate = (LENGTH - result.first_tokens) / result.decode_seconds
    assert result.decode_tokens_per_second == pytest.approx(rate)
    assert result.decode_tokens_per_second > 2 * result.tokens_per_second
    assert result.to_dict()["decode_tokens_per_s"] == pytest.approx(rate)


def test_decode_rate_is_none_where_nothing_follows_the_first_round():
    assert decode_rate(5, 1.0, None, 0) is None               # unknown time to first token
    assert decode_rate(4, 1.0, 0.5, 4) is None                # the first round made every token
    assert decode_rate(5, 0.5, 0.5, 1) is None                # no time after it
    assert decode_rate(9, 1.5, 0.5, 1) == pytest.approx(8.0)
    assert GenerationResult(tokens=[1, 2], seconds=1.0).decode_tokens_per_second is None


def test_an_empty_budget_has_no_first_token(pair):
    result = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=0), pair, PROMPT)
    assert result.tokens == [] and result.first_token_s is None and result.first_tokens == 0
