"""The speedup model and the acceptance statistics, on hand-built numbers."""

import random

import pytest

from analysis.acceptance import (
    acceptance_histogram,
    conditional_acceptance_per_position,
    draft_share,
    mean_acceptance_length,
    position_counts,
    verify_width,
    yield_by_position,
)
from analysis.speedup import CostModel, ar_step_from_result, best_gamma, costs_from_result, expected_tokens, predicted_speedup
from generation.result import GenerationResult, Round


# ---------------------------------------------------------------- expected tokens

@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 0.8, 0.99])
@pytest.mark.parametrize("gamma", [0, 1, 2, 5, 9])
def test_expected_tokens_matches_the_papers_closed_form(alpha, gamma):
    closed = (1 - alpha ** (gamma + 1)) / (1 - alpha)
    assert expected_tokens([alpha], gamma) == pytest.approx(closed)


def test_expected_tokens_per_position_rates():
    # 1 + a0 + a0*a1 + a0*a1*a2, positions past the list reuse the last rate
    assert expected_tokens([0.5, 0.4], 3) == pytest.approx(1 + 0.5 + 0.2 + 0.08)
    assert expected_tokens([1.0], 4) == 5
    assert expected_tokens([], 6) == 1.0  # nothing measured: no draft accepted
    with pytest.raises(ValueError):
        expected_tokens([0.5], -1)


# ---------------------------------------------------------------- cost model

def test_verify_interpolates_and_extrapolates_linearly():
    costs = CostModel(0.0, {1: 1.0, 3: 2.0, 5: 4.0})
    assert costs.verify(1) == 1.0
    assert costs.verify(2) == pytest.approx(1.5)
    assert costs.verify(4) == pytest.approx(3.0)
    assert costs.verify(7) == pytest.approx(6.0)  # slope of the widest two: 1 per token


def test_verify_never_falls_above_the_widest_and_bounds_below_the_narrowest():
    noisy = CostModel(0.0, {2: 2.0, 4: 1.8})
    assert noisy.verify(8) == pytest.approx(1.8)  # a falling slope is clamped flat
    steep = CostModel(0.0, {4: 1.0, 5: 3.0})
    # the line through (4, 1) and (5, 3) would say -5 s at width 1
    assert steep.verify(1) == pytest.approx(0.25)
    mild = CostModel(0.0, {2: 1.0, 4: 1.2})
    assert mild.verify(1) == pytest.approx(0.9)


def test_one_measured_width_is_flat():
    costs = CostModel(0.0, {1: 0.02})
    assert costs.verify(1) == costs.verify(9) == 0.02


def test_verify_rejects_nonsense():
    with pytest.raises(ValueError):
        CostModel(0.0, {}).verify(1)
    with pytest.raises(ValueError):
        CostModel(0.0, {1: 1.0}).verify(0)


# ---------------------------------------------------------------- speedup

def test_free_drafts_and_flat_verify_give_expected_tokens():
    # n-gram drafting: draft cost 0, verify flat, no host work -> speedup == E
    costs = CostModel(0.0, {1: 0.01})
    for gamma in range(1, 8):
        assert predicted_speedup([0.6], gamma, costs) == pytest.approx(expected_tokens([0.6], gamma))


def test_the_papers_walltime_improvement():
    # Leviathan et al. 2023, eq. for walltime: (1 - a^(g+1)) / ((1 - a)(g c + 1))
    alpha, c = 0.7, 0.05
    costs = CostModel(c, {1: 1.0})
    for gamma in range(1, 10):
        paper = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))
        assert predicted_speedup([alpha], gamma, costs) == pytest.approx(paper)


def test_gamma_zero_is_plain_decoding():
    costs = CostModel(0.5, {1: 1.0}, other_per_round_s=0.3)
    assert predicted_speedup([0.9], 0, costs) == 1.0


def test_costs_enter_the_denominator():
    costs = CostModel(0.1, {1: 1.0, 3: 1.4}, other_per_round_s=0.2)
    # gamma 2: E = 1 + .5 + .25 = 1.75; round = 2*0.1 + 1.4 + 0.2 = 1.8
    assert predicted_speedup([0.5], 2, costs) == pytest.approx(1.75 / 1.8)


def test_best_gamma():
    # Perfect acceptance and free drafts with flat verify: the longest draft wins.
    assert best_gamma([1.0], CostModel(0.0, {1: 1.0}), max_gamma=6) == (6, pytest.approx(7.0))
    # No acceptance: drafting only costs, so do not draft.
    assert best_gamma([0.0], CostModel(0.1, {1: 1.0}), max_gamma=6) == (0, 1.0)
    # alpha 0.8, c 0.1: check against brute force of the closed form.
    gamma, speedup = best_gamma([0.8], CostModel(0.1, {1: 1.0}), max_gamma=16)
    paper = [(1 - 0.8 ** (g + 1)) / (0.2 * (g * 0.1 + 1)) for g in range(1, 17)]
    assert gamma == 1 + paper.index(max(paper))
    assert speedup == pytest.approx(max(paper))


# ---------------------------------------------------------------- costs from a result

def test_costs_from_result():
    trace = [
        Round((9, 9), 1, 3, False, gamma=2, draft_s=0.9, verify_s=5.0),  # carries the prefill: skipped
        Round((1, 2), 2, 3, True, gamma=2, draft_s=0.2, verify_s=1.2),
        Round((4, 5), 0, 6, False, gamma=2, draft_s=0.2, verify_s=1.0),
        Round((), 0, 7, False, gamma=2, draft_s=0.0, verify_s=0.8),
    ]
    result = GenerationResult(tokens=[9, 3, 1, 2, 3, 6, 7], trace=trace,
                              phases={"draft": 1.3, "verify": 8.0, "other": 0.4})
    costs = costs_from_result(result)
    assert costs.draft_step_s == pytest.approx(0.1)
    assert costs.verify_s == {3: pytest.approx(1.1), 1: pytest.approx(0.8)}
    assert costs.other_per_round_s == pytest.approx(0.1)
    assert costs_from_result(result, ar_step_s=0.5).verify_s[1] == 0.5
    # the trace-file form gives the same model
    as_dict = result.to_dict(with_trace=True)
    assert costs_from_result(as_dict) == costs
    # a single round is all there is: it is used, prefill and all
    single = GenerationResult(tokens=[1], trace=trace[:1], phases={"draft": 0.9, "verify": 5.0, "other": 0.0})
    assert costs_from_result(single).verify_s == {3: 5.0}


def _tree_round(verify_s: float) -> Round:
    """A tree of 6 nodes (root children 10, 11, 12; 20, 21 under 10; 30 under 20),
    accepted path 10 -> 20, a first-choice line 10, 20, 30: drafted is 3 long, the
    verify fed 6 + 1 tokens."""
    return Round((10, 20, 30), 2, 5, False, gamma=3, draft_s=0.3, verify_s=verify_s,
                 tree_tokens=(10, 11, 12, 20, 21, 30), tree_parents=(-1, -1, -1, 0, 0, 3),
                 path=(0, 3), ranks=(0, 0))


def test_a_tree_round_is_priced_at_its_tree_width():
    trace = [_tree_round(9.0)] + [_tree_round(v) for v in (2.0, 2.4)]   # the first carries the prefill
    result = GenerationResult(tokens=[10, 20, 5] * 3, trace=trace, tree=6,
                              phases={"draft": 0.9, "verify": 13.4, "other": 0.0})
    assert verify_width(trace[1]) == 7
    costs = costs_from_result(result)
    assert costs.verify_s == {7: pytest.approx(2.2)}      # not width 4 (drafted + 1)
    assert costs_from_result(result.to_dict(with_trace=True)) == costs
    # a chain round beside it keeps its own width
    chain = Round((1, 2), 2, 3, True, gamma=2, verify_s=1.0)
    assert verify_width(chain) == 3 and verify_width({"drafted": [1, 2], "tree_tokens": []}) == 3


def test_ar_step_leaves_the_prefill_out():
    trace = [Round((), 0, t, False, verify_s=v) for t, v in ((1, 0.5), (2, 0.1), (3, 0.1), (4, 0.1))]
    ar = GenerationResult(tokens=[1, 2, 3, 4], seconds=0.84, trace=trace,
                          phases={"draft": 0.0, "verify": 0.8, "other": 0.04})
    assert ar_step_from_result(ar) == pytest.approx(0.1 + 0.01)
    untimed = GenerationResult(tokens=[1, 2, 3, 4], seconds=0.8, trace=[])
    assert ar_step_from_result(untimed) == pytest.approx(0.2)
    assert ar_step_from_result(GenerationResult()) is None


def test_draft_share_mixes_plain_steps_in():
    # Half the rounds draft (gamma 2, every draft accepted: 3 tokens), half are
    # plain steps (1 token). Flat verify 1 s, free drafts: 2 tokens per 1 s round.
    costs = CostModel(0.0, {1: 1.0})
    assert predicted_speedup([1.0], 2, costs, draft_share=0.5) == pytest.approx(2.0)
    # with verify(3) = 2 s: tokens 2, cost 0.5 * 2 + 0.5 * 1 = 1.5
    costs = CostModel(0.0, {1: 1.0, 3: 2.0})
    assert predicted_speedup([1.0], 2, costs, draft_share=0.5) == pytest.approx(2.0 / 1.5)
    assert predicted_speedup([1.0], 2, costs, draft_share=0.0) == pytest.approx(1.0)
    assert best_gamma([1.0], costs, 4, draft_share=0.5)[0] == 4  # slope 0.5 s/token: drafting pays
    with pytest.raises(ValueError):
        predicted_speedup([1.0], 2, costs, draft_share=1.5)


def test_costs_from_result_without_timings_is_none():
    assert costs_from_result(GenerationResult()) is None
    untimed = GenerationResult(trace=[Round((1,), 1, 2, True)])
    assert costs_from_result(untimed) is None


# ---------------------------------------------------------------- acceptance

def test_conditional_acceptance_per_position_by_hand():
    rounds = [
        Round((1, 2, 3), 3, 9, True),   # positions 0,1,2 accepted
        Round((1, 2, 3), 1, 9, False),  # 0 accepted, 1 rejected, 2 never judged
        Round((1, 2), 0, 9, False),     # 0 rejected
        Round((), 0, 9, False),         # nothing drafted
    ]
    assert conditional_acceptance_per_position(rounds) == pytest.approx([2 / 3, 1 / 2, 1.0])
    assert acceptance_histogram(rounds) == [1, 1, 0, 1]
    assert mean_acceptance_length(rounds) == pytest.approx(1 + 4 / 3)


def test_a_round_cut_short_does_not_count_unjudged_drafts():
    # an end token among the accepted drafts: token None, drafts after it unjudged
    rounds = [Round((1, 2, 3), 1, None, False)]
    assert conditional_acceptance_per_position(rounds) == [1.0]


def test_dict_rounds_match_round_objects():
    rounds = [Round((1, 2), 1, 5, False, gamma=2), Round((3,), 1, 4, True, gamma=1)]
    dicts = [{"drafted": list(r.drafted), "accepted": r.accepted, "token": r.token} for r in rounds]
    assert conditional_acceptance_per_position(dicts) == conditional_acceptance_per_position(rounds)
    assert acceptance_histogram(dicts) == acceptance_histogram(rounds)


def test_empty_rounds():
    assert conditional_acceptance_per_position([]) == []
    assert acceptance_histogram([Round((), 0, 1, False)]) == []
    assert mean_acceptance_length([]) == 1.0


def test_histogram_invariants_on_random_rounds():
    rng = random.Random(0)
    for _ in range(200):
        rounds = []
        for _ in range(rng.randint(0, 30)):
            drafted = tuple(range(rng.randint(0, 6)))
            accepted = rng.randint(0, len(drafted))
            rounds.append(Round(drafted, accepted, 1, accepted == len(drafted) and bool(drafted)))
        histogram = acceptance_histogram(rounds)
        drafting = [r for r in rounds if r.drafted]
        assert sum(histogram) == len(drafting)
        assert sum(i * n for i, n in enumerate(histogram)) == sum(r.accepted for r in rounds)
        rates = conditional_acceptance_per_position(rounds)
        assert all(0.0 <= a <= 1.0 for a in rates)


def test_expected_tokens_reproduces_the_measured_mean_at_a_fixed_gamma():
    # When every round drafts gamma tokens, the measured per-position rates put
    # back into E(gamma) give exactly the measured mean acceptance length.
    rng = random.Random(1)
    for gamma in (1, 3, 5):
        rounds = []
        for _ in range(300):
            accepted = min(gamma, int(rng.expovariate(0.6)))
            rounds.append(Round(tuple(range(gamma)), accepted, 1, accepted == gamma))
        rates = conditional_acceptance_per_position(rounds)
        assert expected_tokens(rates, gamma) == pytest.approx(mean_acceptance_length(rounds))


def test_yield_counts_missing_drafts_as_rejections():
    rounds = [
        Round((1, 2), 2, 3, True, gamma=3),  # asked 3, got 2, both accepted: position 2 missing
        Round((), 0, 3, False, gamma=3),     # an n-gram miss: nothing drafted, a plain step
        Round((1,), 0, 3, False, gamma=3),
    ]
    assert conditional_acceptance_per_position(rounds) == pytest.approx([0.5, 1.0])
    assert yield_by_position(rounds) == pytest.approx([0.5, 1.0, 0.0])
    assert draft_share(rounds) == pytest.approx(2 / 3)
    assert position_counts(rounds) == [(1, 2), (1, 1)]
    # gamma 0 (not recorded) falls back to the draft length
    assert yield_by_position([Round((1,), 1, 2, True)]) == [1.0]
    assert draft_share([]) == 1.0


def test_run_prediction_takes_the_first_round_as_measured_and_prices_the_rest():
    """A run whose first round took 1 s for 3 tokens, then 7 tokens priced at
    E = 1 + a + a^2 tokens per round of cost 2 drafts + verify(3)."""
    from analysis.speedup import CostModel, expected_tokens, first_round, predicted_run_speedup

    rounds = [{"drafted": [1, 2], "accepted": 2, "token": 3, "bonus": True, "draft_s": 0.4, "verify_s": 0.6},
              {"drafted": [4, 5], "accepted": 1, "token": 6, "bonus": False, "draft_s": 0.1, "verify_s": 0.2}]
    result = {"tokens": list(range(10)), "trace": rounds}
    assert first_round(result) == (1.0, 3)
    costs = CostModel(draft_step_s=0.05, verify_s={1: 0.1, 3: 0.2})
    rates = [0.5]
    per_round = (2 * 0.05 + 0.2) / expected_tokens(rates, 2)
    seconds = 1.0 + 7 * per_round
    ar_tps = 5.0
    assert predicted_run_speedup(result, rates, 2, costs, ar_tps) == pytest.approx(10 / seconds / ar_tps)
    # Nothing to price after the first round, or no AR speed: no prediction.
    assert predicted_run_speedup({"tokens": [1, 2, 3], "trace": rounds}, rates, 2, costs, ar_tps) is None
    assert predicted_run_speedup(result, rates, 2, costs, 0.0) is None


# ---------------------------------------------------------------- the network what-if (/rtt)

def test_a_round_trip_is_added_to_every_target_call():
    """speedup = E * (verify(1) + rtt) / (gamma * draft + verify(gamma + 1) + rtt + other), by hand."""
    costs = CostModel(draft_step_s=0.01, verify_s={1: 0.05, 5: 0.07}, other_per_round_s=0.002, rtt_s=0.02)
    rates = [0.8]
    e = expected_tokens(rates, 4)
    assert costs.target_call(5) == pytest.approx(0.09)
    assert predicted_speedup(rates, 4, costs) == pytest.approx(e * 0.07 / (4 * 0.01 + 0.09 + 0.002))
    local = CostModel(draft_step_s=0.01, verify_s={1: 0.05, 5: 0.07}, other_per_round_s=0.002)
    assert predicted_speedup(rates, 4, costs) > predicted_speedup(rates, 4, local)
    # plain steps of a partly drafting run pay the round trip too
    m = 0.5
    mixed = (m * e + 1 - m) * 0.07 / (m * (0.04 + 0.09) + (1 - m) * 0.07 + 0.002)
    assert predicted_speedup(rates, 4, costs, draft_share=m) == pytest.approx(mixed)


def test_a_long_round_trip_favours_longer_drafts():
    costs = {rtt: CostModel(draft_step_s=0.01, verify_s={1: 0.05, 2: 0.052}, rtt_s=rtt) for rtt in (0.0, 0.2)}
    rates = [0.9]
    assert best_gamma(rates, costs[0.2])[0] > best_gamma(rates, costs[0.0])[0]


def test_tokens_per_s_at_a_round_trip():
    from analysis.speedup import tokens_per_s_at_rtt

    ar = GenerationResult(tokens=list(range(10)), seconds=1.0, target_calls=10)
    assert tokens_per_s_at_rtt(ar, 0.0) == pytest.approx(10.0)
    assert tokens_per_s_at_rtt(ar, 0.02) == pytest.approx(10 / 1.2)


def _uniform_runs(rtt: float):
    """A speculative run of 8 identical rounds (2 drafts, the first accepted: 2
    tokens a round) and a target AR run of 16 steps, each target call taking
    ``rtt`` longer: what --rtt-inject would measure if the model were exact."""
    from repl.runs import PromptRun, StrategyRun

    spec_rounds = [Round((1, 2), 1, 3, False, gamma=2, draft_s=0.02, verify_s=0.06 + rtt) for _ in range(8)]
    spec = GenerationResult(tokens=list(range(16)), drafted=16, accepted=8, target_calls=8,
                            seconds=8 * (0.08 + rtt), trace=spec_rounds,
                            phases={"draft": 0.16, "verify": 8 * (0.06 + rtt), "other": 0.0})
    ar_rounds = [Round((), 0, 1, False, verify_s=0.05 + rtt) for _ in range(16)]
    ar = GenerationResult(tokens=list(range(16)), target_calls=16, seconds=16 * (0.05 + rtt), trace=ar_rounds,
                          phases={"draft": 0.0, "verify": 16 * (0.05 + rtt), "other": 0.0})
    runs = [StrategyRun("speculative", spec), StrategyRun("target", ar)]
    return PromptRun("p", [1, 2], greedy=True, runs=runs, settings={"gamma": 2})


def test_the_what_if_predicts_what_an_injected_round_trip_measures(monkeypatch):
    plain, injected = _uniform_runs(0.0), _uniform_runs(0.02)
    spec = plain.runs[0]
    why = plain.why(spec, rtt_ms=20)
    assert why.what_if.rtt_ms == 20 and plain.why(spec).what_if is None  # /rtt 0: no what-if
    measured = injected.speedup(injected.runs[0])
    assert why.what_if.predicted == pytest.approx(measured, rel=1e-9)
    assert why.what_if.predicted > why.predicted  # the round trip favours drafting
    entry = plain.strategy_dict(spec)
    assert "what_if_rtt" not in entry
    plain.settings["rtt"] = 20
    assert plain.strategy_dict(spec)["what_if_rtt"]["predicted_speedup"] == pytest.approx(measured)
    # Mutation check: a baseline left without its round trips misses the measurement.
    monkeypatch.setattr("analysis.report.tokens_per_s_at_rtt", lambda result, rtt_s: result.tokens_per_second)
    assert plain.why(spec, rtt_ms=20).what_if.predicted != pytest.approx(measured, rel=0.05)


# ---------------------------------------------------------------- draft lengths that vary per round

from analysis.speedup import RoundMix, best_cap, measured_mix, mix_run_speedup, mix_speedup  # noqa: E402
from analysis.speedup import predicted_run_speedup  # noqa: E402


def _old_round(rates, gamma, costs, m):
    """The constant-γ formula as the model computed it before draft lengths could vary
    (tokens and seconds of one round when a share m of the rounds drafts gamma)."""
    plain = costs.target_call(1)
    tokens = m * expected_tokens(rates, gamma) + (1 - m)
    seconds = (m * (gamma * costs.draft_step_s + costs.target_call(gamma + 1)) + (1 - m) * plain
               + costs.other_per_round_s)
    return tokens, seconds


def _constant_matches_the_old_formula() -> bool:
    rng = random.Random(7)
    result = {"tokens": list(range(40)), "trace": [{"drafted": [1, 2], "accepted": 1, "token": 3,
                                                    "draft_s": 0.03, "verify_s": 0.4}]}
    for _ in range(200):
        rates = [rng.random() for _ in range(rng.randint(1, 6))]
        gamma, m = rng.randint(1, 12), rng.choice([1.0, 0.7, 0.3, 0.0, rng.random()])
        costs = CostModel(rng.random() * 0.02, {1: 0.05 + rng.random() * 0.05, 4: 0.1 + rng.random() * 0.1,
                                                9: 0.2 + rng.random() * 0.2},
                          other_per_round_s=rng.random() * 0.01, rtt_s=rng.choice([0.0, 0.02]))
        tokens, seconds = _old_round(rates, gamma, costs, m)
        steady = tokens * costs.target_call(1) / seconds
        run = (40 / (0.43 + costs.rtt_s + 38 * seconds / tokens)) / 12.0   # first round: 0.43 s, 2 tokens
        if (predicted_speedup(rates, gamma, costs, draft_share=m) != pytest.approx(steady, rel=1e-12)
                or mix_speedup(RoundMix.constant(rates, gamma, m), costs) != pytest.approx(steady, rel=1e-12)
                or predicted_run_speedup(result, rates, gamma, costs, 12.0, draft_share=m)
                != pytest.approx(run, rel=1e-12)):
            return False
    return True


def test_a_constant_gamma_is_the_mix_of_gamma_and_plain_steps_and_gives_the_old_numbers(monkeypatch):
    assert _constant_matches_the_old_formula()
    # Mutation check: a constant mix that forgets the plain steps (share 1 - m) no longer matches.
    monkeypatch.setattr(RoundMix, "constant", classmethod(
        lambda cls, rates, gamma, draft_share=1.0: cls({gamma: draft_share}, {gamma: expected_tokens(rates, gamma)})))
    assert not _constant_matches_the_old_formula()


def test_measured_lengths_of_a_constant_gamma_run_give_the_constant_models_number():
    """Every drafting round drafted γ = 3 (some rounds drafted nothing): the rounds priced as
    measured and E(3) from the conditional rates are the same prediction (the rates telescope)."""
    rounds = [Round((1, 2, 3), a, 9, a == 3, gamma=3) for a in (3, 1, 0, 2, 3, 3, 1)]
    rounds += [Round((), 0, 9, False, gamma=3) for _ in range(3)]
    costs = CostModel(0.01, {1: 0.05, 4: 0.09}, other_per_round_s=0.004)
    constant = predicted_speedup(yield_by_position(rounds), 3, costs, draft_share=draft_share(rounds))
    assert mix_speedup(measured_mix(rounds), costs) == pytest.approx(constant, rel=1e-12)


# A skewed distribution of draft lengths: 2 plain steps, one round of 1 draft, two of 8.
SKEWED = [Round(tuple(range(8)), 8, 99, True), Round(tuple(range(8)), 2, 99, False), Round((1,), 0, 99, False),
          Round((), 0, 99, False), Round((), 0, 99, False)]
SKEWED_COSTS = CostModel(draft_step_s=0.01, verify_s={1: 1.0, 2: 1.1, 9: 3.0}, other_per_round_s=0.1)
# By hand: shares {0: 2/5, 1: 1/5, 8: 2/5}; tokens 9, 3, 1, 1, 1 (mean 3); cost per round
# (2 * 1.0 + (0.01 + 1.1) + 2 * (0.08 + 3.0)) / 5 + 0.1 = 1.954; plain step 1.0.
SKEWED_BY_HAND = 3.0 * 1.0 / 1.954


def _mean_length_mix(rounds, cap=None) -> RoundMix:
    """The mutation: every round priced at the mean draft length (rounded), with the mean yield."""
    mix = measured_mix(rounds, cap)
    return RoundMix({round(mix.mean_length): 1.0}, {round(mix.mean_length): sum(
        s * mix.tokens[k] for k, s in mix.shares.items())})


def test_rounds_of_varying_length_are_priced_as_measured_by_hand():
    mix = measured_mix(SKEWED)
    assert mix.shares == pytest.approx({0: 0.4, 1: 0.2, 8: 0.4}) and mix.tokens == pytest.approx({0: 1, 1: 1, 8: 6})
    assert mix.mean_length == pytest.approx(3.4)
    assert mix_speedup(mix, SKEWED_COSTS) == pytest.approx(SKEWED_BY_HAND)
    # Mutation check: the mean draft length (3) in place of the distribution gives another number.
    assert mix_speedup(_mean_length_mix(SKEWED), SKEWED_COSTS) != pytest.approx(SKEWED_BY_HAND, rel=0.05)
    # So does one γ (the longest draft, 8) with the conditional rates, the constant model.
    assert predicted_speedup(yield_by_position(SKEWED), 8, SKEWED_COSTS,
                             draft_share=draft_share(SKEWED)) != pytest.approx(SKEWED_BY_HAND, rel=0.05)
    # The run's prediction: its first round (1 s, 9 tokens) as measured, the other 11 tokens priced.
    result = {"tokens": list(range(20)),
              "trace": [dict(drafted=list(range(8)), accepted=8, token=99, draft_s=0.0, verify_s=1.0)]}
    assert mix_run_speedup(result, mix, SKEWED_COSTS, 5.0) == pytest.approx(20 / (1.0 + 11 * 1.954 / 3.0) / 5.0)


def test_a_cap_cuts_each_chain_and_keeps_what_it_would_have_accepted():
    cut = Round((4, 5, 6), 3, None, False)         # an end token ended the round inside its drafts
    rounds = [Round((1, 2, 3, 4), 1, 9, False), Round((1, 2, 3, 4), 4, 9, True), cut, Round((), 0, 9, False)]
    # uncut: lengths 4, 4, 3, 0 yielding 2, 5, 3 (no token of the target's own after the cut), 1
    assert measured_mix(rounds).tokens == pytest.approx({0: 1, 3: 3, 4: 3.5})
    # cut to 2: every drafting round drafts 2; yields min(accepted, 2) + the target's token: 2, 3, 3, 1
    two = measured_mix(rounds, cap=2)
    assert two.shares == pytest.approx({0: 0.25, 2: 0.75}) and two.tokens == pytest.approx({0: 1, 2: 8 / 3})
    assert measured_mix(rounds, cap=3).tokens == pytest.approx({0: 1, 3: 3})    # 2, 4, 3 over three rounds
    tree = Round((1, 2), 1, 9, False, tree_tokens=(1, 2, 3), tree_parents=(-1, 0, -1), path=(0,), ranks=(0,))
    assert measured_mix([tree]).shares == {3: 1.0}                               # a tree round: its nodes
    with pytest.raises(ValueError):
        measured_mix([tree], cap=2)


def test_the_best_cap_on_measured_lengths_by_hand():
    """Two long drafts with one token accepted each, one of 2 fully accepted; verify flat up to
    width 3, then steep: a cap of 2 keeps every accepted token and drops the costly width 9."""
    rounds = [Round(tuple(range(8)), 1, 9, False), Round(tuple(range(8)), 1, 9, False), Round((1, 2), 2, 9, True)]
    costs = CostModel(0.0, {1: 1.0, 3: 1.0, 9: 5.0})
    assert mix_speedup(measured_mix(rounds), costs) == pytest.approx((7 / 3) / (1 / 3 + 2 / 3 * 5.0))
    assert mix_speedup(measured_mix(rounds, 1), costs) == pytest.approx(2.0)
    assert best_cap(rounds, costs, 16) == (2, pytest.approx(7 / 3))
    assert best_cap(rounds, CostModel(0.0, {1: 1.0, 3: 10.0, 9: 50.0}), 16) == (0, 1.0)   # drafting never pays


def test_a_served_target_pays_a_round_trip_per_position_scored():
    """llama.cpp's server scores one position per request: a call of width w pays w round trips."""
    local = CostModel(0.0, {1: 0.02, 4: 0.05}, rtt_s=0.01)
    served = CostModel(0.0, {1: 0.02, 4: 0.05}, rtt_s=0.01, trip_per_position=True)
    assert local.target_call(4) == pytest.approx(0.06)
    assert served.target_call(4) == pytest.approx(0.09)
    assert served.target_call(1) == local.target_call(1)
    assert served.round_s(3) > local.round_s(3)
