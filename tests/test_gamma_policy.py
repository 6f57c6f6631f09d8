"""Gamma policies on simulated rounds: synthetic acceptance and cost curves, no models."""

from __future__ import annotations

import collections
import random
import sys

import pytest

from generation.gamma_policies import (
    ConfidencePolicy, ConstantPolicy, HeuristicPolicy, ModelPolicy, make_policy,
)
from generation.result import Round


def _round(k, drafted, accepted, *, token=7, draft_s=0.0, verify_s=0.0):
    return Round(tuple(range(drafted)), accepted, token, token is not None and accepted == drafted > 0,
                 k, draft_s, verify_s)


def true_speed(gamma, rates, verify, draft_step):
    """Tokens per second of a drafter that always proposes gamma tokens."""
    tokens, reach = 1.0, 1.0
    for i in range(gamma):
        reach *= rates[min(i, len(rates) - 1)]
        tokens += reach
    return tokens / (draft_step * gamma + verify(gamma + 1))


def simulate(policy, *, kind, rates, verify, draft_step, rounds, seed=0, propose=1.0,
             per_generation=64, prefill_s=50.0):
    """Run ``rounds`` simulated rounds; returns the gamma asked in each.

    Each generation's first round carries a prefill (``prefill_s`` more verify
    seconds), as the real loop's does. The drafter proposes each next position
    with probability ``propose`` (an n-gram drafter that may not know the
    context) and the target accepts draft i with probability rates[i].
    """
    rng = random.Random(seed)
    asked = []
    for r in range(rounds):
        first = r % per_generation == 0
        if first:
            policy.begin(kind)
        k = policy.next_gamma()
        asked.append(k)
        drafted = 0
        while drafted < k and rng.random() < propose:
            drafted += 1
        accepted = 0
        while accepted < drafted and rng.random() < rates[min(accepted, len(rates) - 1)]:
            accepted += 1
        policy.observe(_round(k, drafted, accepted, draft_s=draft_step * drafted,
                              verify_s=verify(drafted + 1) + (prefill_s if first else 0.0)))
    return asked


def copying_text(policy, verify, *, seed, prompts=20, tokens=128, stay=0.85, enter=0.1,
                 copy=(0.95, 0.95), free=(0.5, 0.15)):
    """Tokens per second of NASD on text that now and then copies a passage.

    Each round the text is in a copying stretch or not (a two-state chain: a
    stretch goes on with probability ``stay``, starts with ``enter``). The n-gram
    drafter proposes each next position with probability ``copy[0]`` or
    ``free[0]``, and the target accepts it with ``copy[1]`` or ``free[1]``.
    """
    rng = random.Random(seed)
    seconds = produced = 0
    for _ in range(prompts):
        policy.begin("ngram")
        copying, done, first = False, 0, True
        while done < tokens:
            k = min(policy.next_gamma(), tokens - done - 1)
            propose, accept = copy if copying else free
            drafted = 0
            while drafted < k and rng.random() < propose:
                drafted += 1
            accepted = 0
            while accepted < drafted and rng.random() < accept:
                accepted += 1
            cost = verify(drafted + 1) + 0.001 * drafted
            policy.observe(_round(k, drafted, accepted, draft_s=0.001 * drafted,
                                  verify_s=cost + (100.0 if first else 0.0)))
            first = False
            seconds += cost
            done += accepted + 1
            produced += accepted + 1
            copying = rng.random() < (stay if copying else enter)
    return produced / seconds


@pytest.mark.parametrize("verify", [
    lambda w: 10.0 * (1 + 0.3 * (w - 1)),                     # CPU-like, even steps
    lambda w: 10.0 if w == 1 else 17.0 + (w - 2),              # CPU: 2 tokens cost 1.7x one
    lambda w: 10.0 + 0.1 * (w - 1),                            # GPU-like
])
def test_model_policy_keeps_up_with_the_best_constant_on_copying_text(verify):
    """The goal the benchmark checks, on a simulation: >= 0.95x the best constant of 2, 4, 8."""
    def mean_speed(make):
        return sum(copying_text(make(), verify, seed=seed, prompts=40) for seed in range(3)) / 3

    constants = [mean_speed(lambda: make_policy("constant", g)) for g in (2, 4, 8)]
    model = mean_speed(lambda: ModelPolicy(16, clock=None))
    assert model >= 0.95 * max(constants), model / max(constants)


# ---------------------------------------------------------------- names and values

def test_make_policy_builds_each_kind():
    assert isinstance(make_policy("constant", 4), ConstantPolicy)
    assert isinstance(make_policy("heuristic", 4), HeuristicPolicy)
    assert isinstance(make_policy("model", 16), ModelPolicy)
    conf = make_policy("confidence", 20)
    assert isinstance(conf, ConfidencePolicy) and conf.threshold == 0.4
    assert conf.name == "confidence 0.4"
    assert make_policy("confidence 0.25", 8).threshold == 0.25
    assert make_policy("confidence", 8, 0.3).name == "confidence 0.3"
    assert [make_policy(n, 4).name for n in ("constant", "heuristic", "model")] == \
        ["constant", "heuristic", "model"]
    assert make_policy("model", 16).threshold is None


@pytest.mark.parametrize("args, message", [
    (("beam", 4), "unknown gamma policy 'beam'"),
    (("", 4), "empty gamma policy"),
    (("constant", 0), "gamma must be an integer >= 1"),
    (("model", 2.5), "gamma must be an integer >= 1"),
    (("heuristic", 4, 0.4), "takes no threshold"),
    (("confidence", 4, 0.0), "between 0 and 1"),
    (("confidence", 4, 1.5), "between 0 and 1"),
    (("confidence x", 4), "is not a number"),
    (("confidence 0.4", 4, 0.5), "disagree"),
    (("confidence 0.4 1", 4), "at most one threshold"),
])
def test_bad_names_and_values_raise_one_line_errors(args, message):
    with pytest.raises(ValueError, match=message) as info:
        make_policy(*args)
    assert "\n" not in str(info.value)


def test_unknown_drafter_kind_is_refused():
    with pytest.raises(ValueError, match="drafter kind"):
        make_policy("model", 8).begin("oracle")


def test_policies_import_without_torch():
    import subprocess

    code = "import sys, generation.gamma_policies; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- constant, heuristic, confidence

def test_constant_is_constant():
    policy = make_policy("constant", 3)
    policy.begin("model")
    for accepted in (0, 3, 1):
        assert policy.next_gamma() == 3
        policy.observe(_round(3, 3, accepted))
    assert policy.next_gamma() == 3


def test_heuristic_follows_transformers_rule_exactly():
    """+2 when every draft was accepted, -1 otherwise, never below 1; no drafts: unchanged."""
    policy = make_policy("heuristic", 4)
    policy.begin("model")
    steps = [  # (drafted, accepted) -> gamma asked next
        ((4, 4), 6), ((6, 6), 8), ((8, 3), 7), ((7, 0), 6), ((6, 5), 5),
        ((5, 0), 4), ((4, 0), 3), ((3, 0), 2), ((2, 0), 1), ((1, 0), 1), ((1, 1), 3),
        ((0, 0), 3),            # the drafter proposed nothing: no evidence either way
        ((2, 2), 5),            # fewer drafts than asked, all accepted: +2
    ]
    assert policy.next_gamma() == 4
    for (drafted, accepted), expected in steps:
        k = policy.next_gamma()
        policy.observe(_round(k, drafted, accepted))
        assert policy.next_gamma() == expected, (drafted, accepted)
    policy.begin("model")                      # every generation starts again at gamma
    assert policy.next_gamma() == 4


def test_confidence_sets_the_threshold_for_model_drafters_only():
    policy = make_policy("confidence 0.4", 20)
    policy.begin("model")
    assert (policy.next_gamma(), policy.threshold) == (20, 0.4)
    policy.observe(_round(20, 3, 2))
    assert policy.next_gamma() == 20
    policy.begin("ngram")                      # no probabilities: the constant policy
    assert (policy.next_gamma(), policy.threshold) == (20, None)
    policy.begin("model")
    assert policy.threshold == 0.4


# ---------------------------------------------------------------- the model policy

def _cpu_verify(w):
    return 10.0 * (1 + 0.3 * (w - 1))


def _gpu_verify(w):
    return 10.0 + 0.2 * (w - 1)


@pytest.mark.parametrize("rates, verify, draft_step", [
    ([0.8], _cpu_verify, 1.0),                                # CPU-like: verify grows with width
    ([0.9, 0.85, 0.8, 0.7, 0.5, 0.3], _gpu_verify, 1.0),     # GPU-like: flat verify
])
def test_model_policy_converges_to_the_analytic_best_gamma(rates, verify, draft_step):
    speeds = [true_speed(g, rates, verify, draft_step) for g in range(17)]
    best = max(range(17), key=speeds.__getitem__)
    policy = ModelPolicy(16, clock=None)
    asked = simulate(policy, kind="model", rates=rates, verify=verify, draft_step=draft_step,
                     rounds=3000, per_generation=3000)
    assert policy.best()[0] == best
    late = asked[-1000:]
    assert collections.Counter(late).most_common(1)[0][0] == best
    # Exploration and noisy estimates cost little: within 3% of always asking the best,
    # also when every 64 rounds a new generation weakens what it knew about acceptance.
    assert sum(speeds[g] for g in late) / len(late) >= 0.97 * speeds[best]
    asked = simulate(ModelPolicy(16, clock=None), kind="model", rates=rates, verify=verify,
                     draft_step=draft_step, rounds=3000, seed=1, per_generation=64)
    late = asked[-1000:]
    assert sum(speeds[g] for g in late) / len(late) >= 0.97 * speeds[best]


def test_model_policy_picks_zero_for_ngram_drafts_never_accepted():
    """Verifying 2 tokens costs 1.7 times one (this CPU): drafts that always fail do not pay."""
    policy = ModelPolicy(16, clock=None)
    asked = simulate(policy, kind="ngram", rates=[0.0], verify=lambda w: 10.0 * (1 + 0.7 * (w - 1)),
                     draft_step=0.01, rounds=1000)
    assert policy.best()[0] == 0
    late = asked[-500:]
    assert late.count(0) >= 0.85 * len(late)     # the rest: a look at gamma 1 every 8 rounds
    assert set(late) <= {0, 1, ModelPolicy.FIRST_LOOK}     # and each prompt's first round


def test_model_policy_drafts_long_when_ngram_drafts_are_accepted():
    policy = ModelPolicy(16, clock=None)
    simulate(policy, kind="ngram", rates=[0.97], verify=lambda w: 10.0 * (1 + 0.1 * (w - 1)),
             draft_step=0.01, rounds=1000)
    assert policy.best()[0] >= 4


def test_model_drafter_that_does_not_pay_looks_ever_more_rarely():
    """Drafts cost 3 target steps each: never draft, and look (gamma 1) at growing gaps."""
    policy = ModelPolicy(8, clock=None)
    asked = simulate(policy, kind="model", rates=[0.9], verify=_cpu_verify, draft_step=30.0,
                     rounds=1200, per_generation=1200)
    assert policy.best()[0] == 0
    looks = [i for i, g in enumerate(asked) if g > 0 and i > 10]
    gaps = [b - a for a, b in zip(looks, looks[1:])]
    assert set(asked[10:]) <= {0, 1}                       # no re-probing while idle
    assert gaps == sorted(gaps) and gaps[-1] >= 256 and len(looks) <= 8


def test_model_drafter_that_does_not_pay_never_looks_before_it_has_drafted_in_a_generation():
    """Once not drafting is best, a new generation asks for no drafts at all: a look
    would make the drafter prefill the whole prompt. Within a generation where it
    already drafted, the rare looks go on."""
    policy = ModelPolicy(8, clock=None)
    first = simulate(policy, kind="model", rates=[0.9], verify=_cpu_verify, draft_step=30.0,
                     rounds=1200, per_generation=1200)
    assert policy.best()[0] == 0 and any(g > 0 for g in first[10:])   # looks in the warm generation
    later = simulate(policy, kind="model", rates=[0.9], verify=_cpu_verify, draft_step=30.0,
                     rounds=600, per_generation=200, seed=1)
    assert set(later) == {0}


def test_ngram_policy_adapts_when_a_prompt_repeats_itself():
    """After prompts whose drafts always fail, a prompt whose drafts always pass gets drafts soon."""
    policy = ModelPolicy(16, clock=None)
    cpu = lambda w: 10.0 * (1 + 0.3 * (w - 1))                  # noqa: E731
    simulate(policy, kind="ngram", rates=[0.0], verify=cpu, draft_step=0.01, rounds=256)
    assert policy.best()[0] == 0
    asked = simulate(policy, kind="ngram", rates=[0.98], verify=cpu, draft_step=0.01, rounds=64)
    assert asked[0] == ModelPolicy.FIRST_LOOK           # the free look inside the prefill
    assert asked[1] >= 2                                  # drafting from the next round on
    assert sorted(asked)[len(asked) // 2] >= 8


def test_model_policy_learns_from_what_the_drafter_proposes():
    """An n-gram drafter that proposes only 30% of the time costs less than asked."""
    policy = ModelPolicy(16, clock=None)
    simulate(policy, kind="ngram", rates=[0.9], verify=_cpu_verify, draft_step=0.01, rounds=1500,
             propose=0.3)
    assert policy.propose_rates()[0] == pytest.approx(0.3, abs=0.15)
    assert policy.rates()[0] == pytest.approx(0.27, abs=0.15)   # proposed and accepted


def test_model_policy_ignores_the_prefill_round_and_probes_widths_first():
    policy = ModelPolicy(16, clock=None)
    asked = simulate(policy, kind="model", rates=[0.7], verify=_cpu_verify, draft_step=1.0,
                     rounds=8, prefill_s=1000.0)
    assert asked[1:6] == [1, 2, 4, 8, 0]
    costs = policy.cost_model()
    assert set(costs.verify_s) == {k + 1 for k in asked[1:]}          # always-drafting drafter
    assert max(costs.verify_s.values()) < 100          # the 1000 s prefill round left out
    assert costs.verify_s[3] == pytest.approx(_cpu_verify(3))
    assert costs.draft_step_s == pytest.approx(1.0)


def test_one_slow_forward_does_not_mislead_the_verify_cost():
    policy = ModelPolicy(4, probes=(), explore_every=0, clock=None)
    policy.begin("ngram")
    policy.observe(_round(0, 0, 0, verify_s=99.0))              # prefill
    for verify_s in (1.0, 1.1, 30.0, 0.9, 1.0):                 # another process stole a forward
        policy.observe(_round(0, 0, 0, verify_s=verify_s))
    assert policy.cost_model().verify_s[1] == pytest.approx(1.0)
    for _ in range(5):                                          # a lasting change is followed
        policy.observe(_round(0, 0, 0, verify_s=2.0))
    assert policy.cost_model().verify_s[1] == pytest.approx(2.0)


def test_model_policy_prices_tree_rounds_at_the_width_they_verified():
    """A tree round that drafted 2 along its line verified 8 nodes + 1: its verify
    time is the cost of width 9, and rounds of 2 drafts are priced there."""
    policy = ModelPolicy(4, probes=(), explore_every=0, clock=None)
    policy.begin("model")
    tree = dict(tree_tokens=tuple(range(100, 108)), tree_parents=(-1, -1, -1, -1, 0, 0, 1, 1),
                path=(0,), ranks=(0,))
    policy.observe(Round((100, 104), 1, 7, False, gamma=2, draft_s=0.2, verify_s=99.0, **tree))  # prefill
    policy.observe(Round((), 0, 7, False, gamma=0, verify_s=1.0))
    for _ in range(3):
        policy.observe(Round((100, 104), 1, 7, False, gamma=2, draft_s=0.2, verify_s=3.0, **tree))
    assert policy.cost_model().verify_s == {1: pytest.approx(1.0), 9: pytest.approx(3.0)}
    assert policy.costs.width(2) == 9 and policy.costs.width(1) == 2
    assert policy.costs.verify_table(4)[2] == pytest.approx(3.0)


def test_model_policy_reprobes_widths_now_and_then():
    policy = ModelPolicy(16, reprobe_every=32, clock=None)
    asked = simulate(policy, kind="model", rates=[0.6], verify=_gpu_verify, draft_step=1.0,
                     rounds=600, per_generation=600)
    assert {0, 1, 2, 4, 8} <= set(asked[100:])


def test_ngram_looks_grow_rarer_while_they_fail_and_runs_raise_gamma():
    policy = ModelPolicy(8, probes=(), reprobe_every=0, explore_every=0, clock=None)
    policy.begin("ngram")
    for verify_s in (99.0, 10.0):                          # prefill, then one plain step
        policy.observe(_round(0, 0, 0, verify_s=verify_s))
    policy.observe(_round(1, 1, 0, verify_s=17.0))         # a rejected draft: width 2 costs 1.7x
    assert policy.best()[0] == 0
    asked = []
    for _ in range(40):
        k = policy.next_gamma()
        asked.append(k)
        policy.observe(_round(k, k, 0, verify_s=10.0 + 7.0 * k))
    looks = [i for i, k in enumerate(asked) if k]
    assert [b - a for a, b in zip(looks, looks[1:])][:3] == [8, 8, 8]   # 4, then 8 at most
    # A look whose draft is accepted: the next round asks for at least 2 (a run may be starting).
    while policy.next_gamma() == 0:
        policy.observe(_round(0, 0, 0, verify_s=10.0))
    policy.observe(_round(1, 1, 1, verify_s=17.0))
    assert policy.next_gamma() >= 2


def test_model_policy_counts_host_time_between_rounds():
    now = [0.0]
    policy = ModelPolicy(8, clock=lambda: now[0])
    policy.begin("model")
    for i in range(5):
        k = policy.next_gamma()
        now[0] += 0.5 + 0.1 * k + 0.2            # verify + draft + 0.2 s of host work
        policy.observe(_round(k, k, 0, draft_s=0.1 * k, verify_s=0.5))
    assert policy.cost_model().other_per_round_s == pytest.approx(0.2)


def test_model_drafter_catch_up_after_a_round_without_drafts_is_not_a_draft_cost():
    policy = ModelPolicy(8, clock=None)
    policy.begin("model")
    policy.observe(_round(4, 4, 4, draft_s=0.4, verify_s=9.0))        # prefill round: not used
    policy.observe(_round(2, 2, 1, draft_s=0.2, verify_s=1.0))        # 0.1 s a draft
    policy.observe(_round(0, 0, 0, verify_s=0.8))
    policy.observe(_round(1, 1, 1, draft_s=0.5, verify_s=0.9))        # catching up two tokens
    assert policy.cost_model().draft_step_s == pytest.approx(0.1)
    policy.begin("ngram")                      # an n-gram drafter has nothing to catch up
    policy.observe(_round(2, 2, 0, draft_s=0.002, verify_s=9.0))
    policy.observe(_round(0, 0, 0, verify_s=0.8))
    policy.observe(_round(2, 2, 0, draft_s=0.002, verify_s=1.0))
    assert policy.cost_model().draft_step_s == pytest.approx(0.001)


def test_model_policy_end_token_cut_is_not_a_rejection():
    policy = ModelPolicy(4, clock=None)
    policy.begin("model")
    policy.observe(_round(4, 4, 2, token=None))     # an end token inside the accepted drafts
    assert policy.accept[2].trials == 0 and policy.accept[1].successes == 1
    policy.observe(_round(4, 4, 2))                  # draft 2 rejected
    assert policy.accept[2].trials == 1 and policy.accept[2].successes == 0


def test_model_policy_starts_afresh_for_another_drafter_kind():
    policy = ModelPolicy(16, clock=None)
    simulate(policy, kind="ngram", rates=[0.0], verify=_cpu_verify, draft_step=0.01, rounds=200)
    assert policy.rounds == 200
    policy.begin("ngram")
    assert policy.rounds == 200                  # same kind: it keeps what it learned
    policy.begin("model")
    assert policy.rounds == 0 and policy.cost_model() is None


# ---------------------------------------------------------------- the confidence stop, on a drafter's rows

def _peaked(top: float, vocab: int = 8):
    """Logits (1, V) whose softmax puts ``top`` on id 0 and the rest evenly."""
    import math

    import torch

    logits = torch.zeros(1, vocab)
    logits[0, 0] = math.log(top * (vocab - 1) / (1 - top))
    return logits


def _drafted(processor, tops, stop_below):
    import torch

    from generation.model_drafter import draft_tokens

    rows = iter([_peaked(t) for t in tops])
    drafts, q = draft_tokens(lambda seq: next(rows), torch.tensor([[1]]), len(tops), processor,
                             torch.Generator().manual_seed(0), None, stop_below)
    return drafts.shape[0]


def test_confidence_stops_on_the_drafters_probabilities_under_greedy_too():
    """The next token's top probability, 0.9, 0.9, then 0.3: a threshold of 0.5 stops after two drafts
    under greedy (the drafter's softmax, where q is one-hot and its top always 1) and under sampling at
    temperature 1 (q itself); a top-1 filter makes q certain, so nothing stops."""
    from sampling import GreedyProcessor, MultinomialProcessor, TopKProcessor

    tops = [0.9, 0.9, 0.3, 0.9]
    assert _drafted(GreedyProcessor(), tops, 0.5) == 2
    assert _drafted(MultinomialProcessor(1.0), tops, 0.5) == 2
    assert _drafted(TopKProcessor(1.0, 1), tops, 0.5) == 4
    assert _drafted(GreedyProcessor(), tops, None) == 4
    assert _drafted(GreedyProcessor(), tops, 0.2) == 4


def test_mutation_a_confidence_read_off_greedys_one_hot_rows_never_stops(monkeypatch):
    import generation.model_drafter as model_drafter
    from sampling import GreedyProcessor

    monkeypatch.setattr(model_drafter, "confidence", lambda logits, q, processor: processor(logits).max().item())
    assert _drafted(GreedyProcessor(), [0.9, 0.9, 0.3, 0.9], 0.5) == 4


def test_greedy_drafts_carry_the_same_one_hot_rows_as_the_processor_gives():
    """Under greedy the round's q is built once; it must be the rows ``processor(logits)`` gives each step
    (one-hot at the argmax, in float32 for bfloat16 logits), over the first ``vocab_size`` ids."""
    import torch

    from generation.model_drafter import draft_tokens
    from sampling import GreedyProcessor

    greedy = GreedyProcessor()
    for dtype, vocab in ((torch.float32, None), (torch.bfloat16, 6)):
        rows = [torch.randn(1, 8, generator=torch.Generator().manual_seed(i)).to(dtype) for i in range(4)]
        steps = iter(rows)
        ids, q = draft_tokens(lambda seq: next(steps), torch.tensor([[1]]), 4, greedy, None, vocab, None)
        trimmed = [r if vocab is None else r[:, :vocab] for r in rows]
        assert ids.tolist() == [int(r.argmax()) for r in trimmed]
        expected = torch.cat([greedy(r) for r in trimmed])
        assert q.dtype == expected.dtype == torch.float32 and torch.equal(q, expected)
