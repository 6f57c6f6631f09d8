"""Edge cases: tiny budgets, end tokens inside drafts, several end tokens,
gamma beyond the budget, prompts at the context limit, bad arguments."""

import pytest
import torch

from generation import ContextLengthError
from ngram_assisted import NGramStorage
from sampling import GreedyProcessor
from tests.helpers.decode import autoregressive, nasd, speculative
from tests.helpers.models import tiny_llama

GREEDY = GreedyProcessor()
PROMPT = [1, 5, 7, 9, 5, 7, 9, 5, 7]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, logit_scale=20.0, max_positions=64)


@pytest.fixture(scope="module")
def greedy_tokens(target):
    with torch.inference_mode():
        return autoregressive(PROMPT, target, processor=GREEDY, max_gen_len=30).tokens


def strategies(target):
    """Every strategy as f(prompt, **kwargs); self-drafting accepts every draft."""
    return {
        "autoregressive": lambda p, **kw: autoregressive(
            p, target, processor=GREEDY, **{k: v for k, v in kw.items() if k != "gamma"}),
        "speculative": lambda p, **kw: speculative(p, target, target, processor=GREEDY, **kw),
        "nasd": lambda p, **kw: nasd(p, NGramStorage(3, 64), target, processor=GREEDY, filler_top_k=3, **kw),
    }


@pytest.mark.parametrize("name", ["autoregressive", "speculative", "nasd"])
@pytest.mark.parametrize("length", [0, 1, 2])
def test_tiny_budgets(target, greedy_tokens, name, length):
    with torch.inference_mode():
        result = strategies(target)[name](PROMPT, max_gen_len=length, gamma=4)
    assert result.tokens == greedy_tokens[:length]
    if length <= 1:                          # no budget left for drafts: plain target steps
        assert result.target_calls == length and result.drafted == 0
    if length == 0:
        assert result.rounds == 0 and result.stop_reason == "length"


def test_two_token_budget_drafts_one(target, greedy_tokens):
    with torch.inference_mode():
        result = speculative(PROMPT, target, target, processor=GREEDY, gamma=4, max_gen_len=2)
    # gamma capped at budget - 1 = 1: one draft, accepted, plus the bonus token.
    assert result.tokens == greedy_tokens[:2]
    assert (result.drafted, result.accepted, result.target_calls) == (1, 1, 1)


@pytest.mark.parametrize("name", ["speculative", "nasd"])
@pytest.mark.parametrize("gamma", [5, 8])
def test_gamma_larger_than_remaining_budget(target, greedy_tokens, name, gamma):
    with torch.inference_mode():
        result = strategies(target)[name](PROMPT, max_gen_len=3, gamma=gamma)
    assert result.tokens == greedy_tokens[:3]
    assert all(len(r.drafted) <= 2 for r in result.trace)


@pytest.mark.parametrize("name", ["autoregressive", "speculative", "nasd"])
def test_end_token_inside_accepted_drafts_stops_right_after_it(target, greedy_tokens, name):
    # Choose the 3rd generated token as the end token (first occurrence).
    end_at = next(i for i in range(2, 30) if greedy_tokens[i] not in greedy_tokens[:i])
    eos = greedy_tokens[end_at]
    with torch.inference_mode():
        result = strategies(target)[name](PROMPT, max_gen_len=30, gamma=8, eos=eos)
    assert result.tokens == greedy_tokens[:end_at + 1]
    assert result.stop_reason == "eos"
    if name == "speculative":
        # Self-drafting: the end token arrives as an accepted draft, and the
        # drafts after it are dropped from the count.
        assert result.trace[-1].token is None
        assert result.drafted == result.accepted == end_at + 1


def test_several_end_tokens_first_one_wins(target, greedy_tokens):
    first = next(i for i in range(1, 30) if greedy_tokens[i] not in greedy_tokens[:i])
    later = next(i for i in range(first + 1, 30) if greedy_tokens[i] not in greedy_tokens[:i])
    eos = [greedy_tokens[later], greedy_tokens[first], 63]
    with torch.inference_mode():
        for name, run in strategies(target).items():
            result = run(PROMPT, max_gen_len=30, gamma=4, eos=eos)
            assert result.tokens == greedy_tokens[:first + 1], name


@pytest.mark.parametrize("name", ["autoregressive", "speculative", "nasd"])
def test_prompt_at_context_limit_is_a_clear_error(target, name):
    run = strategies(target)[name]
    with pytest.raises(ContextLengthError, match="64 tokens") as info:
        run([1] * 64, max_gen_len=1, gamma=4)
    assert (info.value.prompt_tokens, info.value.context_length) == (64, 64)
    with pytest.raises(ContextLengthError, match="at most 4 new tokens"):
        run([1] * 60, max_gen_len=5, gamma=4)
    with torch.inference_mode():
        assert len(run([1] * 60, max_gen_len=4, gamma=4).tokens) == 4   # exactly fits


@pytest.mark.parametrize("kwargs, message", [
    ({"inputs": []}, "empty"),
    ({"max_gen_len": -1}, "max_gen_len"),
    ({"gamma": 0}, "gamma"),
])
def test_bad_arguments(target, kwargs, message):
    args = {"inputs": PROMPT, "max_gen_len": 4, "gamma": 2} | kwargs
    with pytest.raises(ValueError, match=message):
        speculative(args.pop("inputs"), target, target, processor=GREEDY, **args)


def test_interruptible_generation_returns_partial_result(target):
    class InterruptAfter(torch.nn.Module):
        def __init__(self, model, calls):
            super().__init__()
            self.inner, self.config, self.left = model, model.config, calls

        def forward(self, **kwargs):
            self.left -= 1
            if self.left < 0:
                raise KeyboardInterrupt
            return self.inner(**kwargs)

    from kvcache.probe import probe_of

    def interrupt_after(calls):
        model = InterruptAfter(target, 10**6)
        probe_of(model)             # the engine's probe on first use: not the run's forwards
        model.left = calls
        return model

    with torch.inference_mode():
        result = autoregressive(PROMPT, interrupt_after(5), processor=GREEDY, max_gen_len=30, interruptible=True)
        assert result.stop_reason == "interrupted" and len(result.tokens) == 5
        assert result.seconds > 0
        # The verify loop keeps every completed round: self-drafting at gamma 3
        # gives 4 tokens per round, and the third target call is interrupted.
        result = speculative(PROMPT, target, interrupt_after(2), processor=GREEDY, gamma=3, max_gen_len=30,
                             interruptible=True)
        assert result.stop_reason == "interrupted" and len(result.tokens) == 8
        with pytest.raises(KeyboardInterrupt):
            speculative(PROMPT, target, interrupt_after(2), processor=GREEDY, max_gen_len=30)


@pytest.mark.parametrize("rounds", [1, 2])
def test_max_rounds_ends_a_drafting_run_after_that_many_rounds(target, greedy_tokens, rounds):
    """A drafter that disagrees with the target every round (an independent tiny model), so each round
    adds fewer tokens than the budget allows: the run stops after ``rounds`` of them, the tokens
    it kept still target AR's."""
    from engine import Strategy, pair_of, run_strategy

    drafter = tiny_llama(1, logit_scale=20.0, max_positions=64)
    strategy = Strategy("speculative", drafter="model", gamma=2, processor=GREEDY, max_gen_len=20,
                        max_rounds=rounds)
    with torch.inference_mode():
        result = run_strategy(strategy, pair_of(target, drafter), PROMPT)
        unlimited = run_strategy(Strategy("speculative", drafter="model", gamma=2, processor=GREEDY,
                                          max_gen_len=20), pair_of(target, drafter), PROMPT)
    assert result.rounds == rounds and result.stop_reason == "rounds"
    assert [r.accepted for r in result.trace] == [r.accepted for r in unlimited.trace[:rounds]]
    assert result.tokens == greedy_tokens[:len(result.tokens)] and len(result.tokens) < 20
