"""The copy ceiling (``analysis.ceiling``): the cheapest split of an output into copied rounds,
checked against an exhaustive search, and where the REPL shows it (``/stats``, ``--json``)."""

from __future__ import annotations

import json
import random

import pytest

import analysis.ceiling
from analysis.ceiling import copy_ceiling
from engine import NGramOptions, Strategy, pair_of, run_strategy
from repl.runs import PromptRun, StrategyRun
from repl.settings import Settings
from repl.stats_view import stats_view
from sampling import GreedyProcessor, MultinomialProcessor
from tests.helpers.models import tiny_llama
from tests.helpers.repl import console

# Forward costs by width shaped like a CPU's where 2 and 3 rows cost more than 4 (docs/results.md).
STEP_COSTS = {1: 1.0, 2: 2.0, 3: 2.5, 4: 1.6}


def cheapest_split(prompt, output, gamma: int, length: int, cost, match: int = 1) -> tuple[float, int]:
    """By exhaustion: (least cost, fewest calls at it) over every way to split ``output`` into
    rounds, each keeping any number of drafts up to what the continuation of some earlier
    occurrence of the last ``match`` tokens would have kept; the first round is not priced."""

    def most(at: int) -> tuple[int, int]:
        sequence, k = list(prompt) + list(output[:at]), min(gamma, length - at - 1)
        best = 0
        for end in range(match - 1, len(sequence) - 1):
            if k > 0 and sequence[end - match + 1:end + 1] == sequence[len(sequence) - match:]:
                run = 0
                while run < k and end + 1 + run < len(sequence) and at + run < len(output) \
                        and sequence[end + 1 + run] == output[at + run]:
                    run += 1
                best = max(best, run)
        return best, k

    def least(at: int) -> tuple[float, int]:
        if at >= len(output):
            return 0.0, 0
        kept_most, k = most(at)
        options = []
        for kept in range(kept_most + 1):
            step = 0.0 if at == 0 else min(cost(w) for w in range(kept + 1, max(k, kept) + 2))
            rest, calls = least(min(len(output), at + kept + 1))
            options.append((step + rest, calls + 1))
        return min(options)

    return least(0)


@pytest.mark.parametrize("match", [1, 2])
def test_the_ceiling_is_the_cheapest_split_of_the_output(match):
    generator = random.Random(3)
    for _ in range(300):
        prompt = [generator.randint(1, 4) for _ in range(6)]
        output = [generator.randint(1, 4) for _ in range(7)]
        for cost in (STEP_COSTS.__getitem__, None):
            ceiling = copy_ceiling(prompt, output, 3, 20, cost, match=match)
            spent, calls = cheapest_split(prompt, output, 3, 20, cost or (lambda w: 1.0), match)
            priced = sum((cost or (lambda w: 1.0))(w) * n for w, n in ceiling.widths.items())
            assert priced == pytest.approx(spent) and ceiling.calls == calls
            assert ceiling.tokens == len(output) and sum(ceiling.widths.values()) == ceiling.calls - 1


def test_taking_the_most_each_round_is_not_the_ceiling():
    # Mutation check: taking the most each round costs 5.2 here. The two drafts kept in the prefill
    # round land on a token never seen before; keeping one fewer lands on a long copy.
    ceiling = copy_ceiling([2, 1, 3, 1, 4, 4], [4, 4, 2, 1, 4, 1, 4], 3, 20, STEP_COSTS.__getitem__)
    assert sum(STEP_COSTS[w] * n for w, n in ceiling.widths.items()) == pytest.approx(4.6)


def test_a_round_is_verified_at_the_cheapest_width_that_holds_its_drafts():
    # The prefill round copies "4 5" after the last "3" (the target then says 9); 9 is new, so
    # one token; after "1", "2 3 6" is copied whole; after 7, nothing. Keeping nothing after "1"
    # and copying "3 6 7" after "2" costs as much in one round more.
    prompt, output = [1, 2, 3, 4, 5, 1, 2, 3, 6, 7, 3], [4, 5, 9, 1, 2, 3, 6, 7, 8]
    for cost in (STEP_COSTS.__getitem__, lambda w: float(w), None):
        ceiling = copy_ceiling(prompt, output, 3, 20, cost)
        assert (ceiling.calls, ceiling.kept, ceiling.widths) == (4, 5, {1: 2, 4: 1})
    assert ceiling.tokens_per_call == 9 / 4
    # One draft kept after "5" (6, then the target's 1): 2 wide at a cost rising with width,
    # 4 wide where 2 and 3 cost more than 4.
    prompt, output = [7, 5, 6, 9, 5], [3, 5, 6, 1]
    assert copy_ceiling(prompt, output, 3, 20, lambda w: float(w)).widths == {1: 1, 2: 1}
    assert copy_ceiling(prompt, output, 3, 20, STEP_COSTS.__getitem__).widths == {1: 1, 4: 1}


def test_equal_costs_summed_in_another_order_still_take_the_fewest_calls():
    # 0.1 + 0.1 + 0.4 and 0.1 + 0.1 + 0.1 + 0.3 are both 0.6, but not to the last bit: a plain
    # comparison of the sums kept the five-call split.
    ceiling = copy_ceiling([1, 1, 2, 2, 2, 2], [3, 3, 2, 2, 2, 2, 4], 3, 20, {1: 0.1, 2: 0.2, 3: 0.3, 4: 0.4}.get)
    assert (ceiling.calls, ceiling.widths) == (4, {1: 2, 4: 1})


@pytest.mark.parametrize("kwargs, message", [
    ({"match": 0}, "the match length must be an integer >= 1, got 0"),
    ({"match": True}, "the match length must be an integer >= 1, got True"),
    ({"gamma": -1}, "the gamma must be an integer >= 0, got -1"),
])
def test_bad_arguments_are_refused_in_one_line(kwargs, message):
    args = {"gamma": 3, "match": 1, **kwargs}
    with pytest.raises(ValueError, match=message):
        copy_ceiling([1, 2], [1], args["gamma"], 10, match=args["match"])


# ------------------------------------------------------------------ the REPL: /stats and --json

V = 48
PROMPT = [8, 5, 17, 33, 1, 8, 5, 17, 12, 2, 8, 5, 17, 33, 3, 8, 5, 17]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(3, vocab_size=V, logit_scale=4.0)


def prompt_run(target, storage: str, processor) -> PromptRun:
    options = NGramOptions(storage=storage, max_pattern=4, max_outputs=8)
    runs = [StrategyRun("ngram", run_strategy(Strategy("ngram", drafter="ngram", drafter_options=options, gamma=4,
                                                       processor=processor, max_gen_len=40), pair_of(target), PROMPT))]
    runs.append(StrategyRun("target", run_strategy(Strategy("target", processor=processor, max_gen_len=40),
                                                   pair_of(target), PROMPT)))
    return PromptRun("p", PROMPT, greedy=processor.is_greedy, runs=runs,
                     settings=Settings(gamma=4, length=40, ngram_storage=storage).to_dict())


def test_stats_and_json_give_the_ceiling_of_a_greedy_nasd_run(target):
    pr = prompt_run(target, "suffix", GreedyProcessor())
    nasd = pr.runs[0].result
    entry = json.loads(json.dumps(pr.to_dict()))["strategies"]["ngram"]
    after = {m: copy_ceiling(PROMPT, nasd.tokens, 4, 40, match=m).tokens_per_call for m in (1, 2)}
    assert entry["copy_ceiling"] == {"gamma": 4, "after_1": after[1], "after_2": after[2]}
    # a bound: the suffix storage copies after matches of 1 token or more
    assert after[1] >= nasd.tokens_per_target_call and after[1] >= after[2]
    assert "copy_ceiling" not in json.loads(json.dumps(pr.to_dict()))["strategies"]["target"]
    c, out = console()
    c.print(stats_view(pr))
    text = " ".join(out.getvalue().split())
    assert (f"copy ceiling at γ 4: at most {after[1]:.2f} tokens a target call for any drafter copying from this "
            f"prompt and output after a 1-token match, {after[2]:.2f} after 2") in text
    assert f"this run {nasd.tokens_per_target_call:.2f}" in text and "look-ups can pass it" not in text


def test_a_table_is_told_it_can_pass_the_ceiling(target):
    c, out = console()
    c.print(stats_view(prompt_run(target, "basic", GreedyProcessor())))
    assert "a table's chained look-ups can pass it" in " ".join(out.getvalue().split())


def test_no_ceiling_under_sampling(target):
    pr = prompt_run(target, "suffix", MultinomialProcessor(1.0))
    assert "copy_ceiling" not in pr.to_dict()["strategies"]["ngram"]
    c, out = console()
    c.print(stats_view(pr))
    assert "copy ceiling" not in out.getvalue()


def test_a_long_prompt_says_why_it_has_no_ceiling(target, monkeypatch):
    monkeypatch.setattr(analysis.ceiling, "MAX_TOKENS", 20)
    pr = prompt_run(target, "suffix", GreedyProcessor())
    total = len(PROMPT) + len(pr.runs[0].result.tokens)
    assert pr.to_dict()["strategies"]["ngram"]["copy_ceiling"] == {
        "skipped": f"prompt and output hold {total} tokens (it is computed up to 20)"}
    c, out = console()
    c.print(stats_view(pr))
    assert "copy ceiling: not computed: prompt and output hold" in " ".join(out.getvalue().split())
