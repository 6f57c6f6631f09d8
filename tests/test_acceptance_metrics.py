"""Acceptance as the serving engines count it (analysis.acceptance): hand-computed values on
hand-built rounds, the checks that hold the numbers together, mutations that break a
definition on purpose (the checks must then fail), and one run on tiny models whose
independent drafter gets rejected."""

from __future__ import annotations

import random

import pytest

import analysis.acceptance as acceptance
from analysis.acceptance import (
    AcceptanceCounts,
    acceptance_counts,
    acceptance_histogram,
    acceptance_histogram_by_draft_length,
    acceptance_rate_per_position,
    conditional_acceptance_per_position,
    draft_acceptance_rate,
    engine_numbers,
    mean_acceptance_length,
)
from generation.result import Round


def hand_trace() -> list[Round]:
    """γ = 3; five rounds: every kind a run records."""
    return [
        Round((1, 2, 3), 3, 9, True, gamma=3),     # all three accepted, then the bonus token
        Round((1, 2, 3), 1, 9, False, gamma=3),    # draft 1 rejected, draft 2 never judged
        Round((1, 2, 3), 0, 9, False, gamma=3),    # draft 0 rejected
        Round((), 0, 9, False, gamma=3),           # nothing drafted (an n-gram miss): a plain step
        Round((1, 2), 2, None, False, gamma=3),    # cut short: an end token in draft 1 (the rest dropped)
    ]


def check_hand_values(rounds) -> None:
    """The hand-computed numbers of :func:`hand_trace`.

    Drafting rounds: 4 (the plain step is not one). Accepted 3 + 1 + 0 + 2 = 6 of
    3 + 3 + 3 + 2 = 11 drafts. Draft 0 accepted in 3 rounds of the 4 that reached it;
    draft 1 in 2 of 3 (the first, second and the cut round reached it); draft 2 in 1 of 1.
    """
    assert mean_acceptance_length(rounds) == pytest.approx(1 + 6 / 4)
    assert draft_acceptance_rate(rounds) == pytest.approx(6 / 11)
    assert acceptance_rate_per_position(rounds) == pytest.approx([3 / 4, 2 / 4, 1 / 4])
    assert conditional_acceptance_per_position(rounds) == pytest.approx([3 / 4, 2 / 3, 1 / 1])
    assert acceptance_histogram(rounds) == [1, 1, 1, 1]
    assert acceptance_histogram_by_draft_length(rounds) == {2: [0, 0, 1], 3: [1, 1, 0, 1]}


def check_holds_together(rounds) -> None:
    """What must hold on any run, with the drafting rounds and the accepted drafts
    counted here independently of analysis.acceptance."""
    drafting = [r for r in rounds if r.drafted or r.tree_tokens]
    accepted = sum(r.accepted for r in drafting)
    counts = acceptance_counts(rounds)
    assert counts.drafting_rounds == len(drafting)
    if drafting:
        assert counts.mean_acceptance_length == pytest.approx(1 + accepted / len(drafting))
    unconditional = counts.acceptance_rate_per_position
    conditional = counts.conditional_acceptance_per_position
    for u, c in zip(unconditional, conditional):
        assert u <= c + 1e-12
    assert all(u == 0 for u in unconditional[len(conditional):])      # no round reached them
    assert sum(counts.histogram) == len(drafting)
    assert sum(sum(h) for h in counts.by_draft_length.values()) == len(drafting)
    # 1 + the per-position rates summed is the mean acceptance length (each accepted draft counted once)
    assert 1 + sum(unconditional) == pytest.approx(counts.mean_acceptance_length)
    assert sum(k * n for k, n in enumerate(counts.histogram)) == accepted


# ---------------------------------------------------------------- by hand

def test_the_engines_numbers_on_a_hand_built_trace():
    check_hand_values(hand_trace())
    check_holds_together(hand_trace())


def test_trace_dicts_give_the_same_numbers():
    dicts = [{"drafted": list(r.drafted), "accepted": r.accepted, "token": r.token, "gamma": r.gamma}
             for r in hand_trace()]
    check_hand_values(dicts)
    assert acceptance_counts(dicts) == acceptance_counts(hand_trace())


def test_no_drafting_round():
    plain = [Round((), 0, 5, False), Round((), 0, 6, False)]
    counts = acceptance_counts(plain)
    assert counts.drafting_rounds == 0 and counts.histogram == [] and counts.by_draft_length == {}
    assert counts.mean_acceptance_length == 1.0 and counts.draft_acceptance_rate == 0.0
    assert counts.acceptance_rate_per_position == [] == counts.conditional_acceptance_per_position


def test_tree_rounds_draft_every_node_and_count_positions_by_depth():
    """Round 1: a 4-node tree (two root children; a line 0 -> 2 -> 3 below the first); the
    path took nodes 0 and 2 (depth 2) and the target rejected node 3. Round 2: a 2-node tree
    whose root children were both rejected. Round 3: cut short by an end token at depth 1."""
    rounds = [
        Round((10, 12, 13), 2, 77, False, tree_tokens=(10, 11, 12, 13), tree_parents=(-1, -1, 0, 2),
              path=(0, 2), ranks=(0, 0)),
        Round((10,), 0, 5, False, tree_tokens=(10, 11), tree_parents=(-1, -1)),
        Round((10,), 1, None, False, tree_tokens=(10, 11, 12), tree_parents=(-1, -1, 0), path=(0,), ranks=(0,)),
    ]
    counts = acceptance_counts(rounds)
    assert (counts.drafting_rounds, counts.drafted, counts.accepted) == (3, 4 + 2 + 1, 3)
    assert counts.mean_acceptance_length == pytest.approx(1 + 3 / 3)
    assert counts.draft_acceptance_rate == pytest.approx(3 / 7)
    assert counts.acceptance_rate_per_position == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert counts.conditional_acceptance_per_position == pytest.approx([2 / 3, 1 / 1, 0 / 1])
    assert counts.histogram == [1, 1, 1, 0]
    assert counts.by_draft_length == {1: [0, 1], 2: [1, 0, 0], 4: [0, 0, 1, 0, 0]}
    check_holds_together(rounds)


def test_json_numbers_and_pooling():
    counts = acceptance_counts(hand_trace())
    numbers = engine_numbers(counts)
    assert numbers["mean_acceptance_length"] == pytest.approx(2.5) and numbers["acceptance_rate"] == pytest.approx(6 / 11)
    assert numbers["acceptance_histogram_by_draft_length"] == {"2": [0, 0, 1], "3": [1, 1, 0, 1]}
    assert numbers["drafting_rounds"] == 4
    assert AcceptanceCounts.from_dict(counts.to_dict()) == counts
    # pooled counters are the counters of the runs' rounds together (the engines pool requests)
    other = [Round((4, 5, 6, 7, 8), 5, 1, True, gamma=5), Round((4,), 0, 2, False, gamma=1)]
    assert counts + acceptance_counts(other) == acceptance_counts(hand_trace() + other)
    assert AcceptanceCounts() + counts == counts


def test_the_histograms_by_draft_length_appear_when_gamma_adapts():
    adaptive = [Round((1,), 1, 2, True, gamma=1), Round((1, 2, 3), 2, 4, False, gamma=3),
                Round((1, 2, 3), 3, 4, True, gamma=3)]
    assert acceptance_histogram_by_draft_length(adaptive) == {1: [0, 1], 3: [0, 0, 1, 1]}
    assert acceptance_histogram(adaptive) == [0, 1, 1, 1]
    check_holds_together(adaptive)


def test_the_checks_hold_on_random_rounds():
    rng = random.Random(0)
    for _ in range(300):
        rounds = []
        for _ in range(rng.randint(0, 25)):
            drafted = tuple(range(rng.randint(0, 6)))
            accepted = rng.randint(0, len(drafted))
            if drafted and rng.random() < 0.1:   # cut short inside the accepted drafts
                rounds.append(Round(drafted[:accepted], accepted, None, False))
            else:
                rounds.append(Round(drafted, accepted, 1, accepted == len(drafted) and bool(drafted)))
        check_holds_together(rounds)


# ---------------------------------------------------------------- mutations: the checks have power

def test_counting_the_plain_steps_as_drafting_rounds_fails(monkeypatch):
    """A mutation: every round counted as a drafting round (a plain step "drafted" one token)."""
    real = acceptance.drafted_count
    monkeypatch.setattr(acceptance, "drafted_count", lambda rnd: max(1, real(rnd)))
    with pytest.raises(AssertionError):
        check_hand_values(hand_trace())
    with pytest.raises(AssertionError):
        check_holds_together(hand_trace())


def test_leaving_out_the_bonus_token_fails(monkeypatch):
    """A mutation: mean acceptance length without the target's own token (the old mean accepted length)."""
    monkeypatch.setattr(AcceptanceCounts, "mean_acceptance_length",
                        property(lambda self: self.accepted / self.drafting_rounds if self.drafting_rounds else 0.0))
    with pytest.raises(AssertionError):
        check_hand_values(hand_trace())
    with pytest.raises(AssertionError):
        check_holds_together(hand_trace())


def test_conditioning_on_drafted_instead_of_reached_fails(monkeypatch):
    """A mutation: the conditional rate over the rounds that drafted position i (not those that reached it)."""
    def over_drafted(self):
        rounds = hand_trace()
        drafted = [sum(1 for r in rounds if len(r.drafted) > i) for i in range(len(self.accepted_by_position))]
        return [a / d for a, d in zip(self.accepted_by_position, drafted) if d]

    monkeypatch.setattr(AcceptanceCounts, "conditional_acceptance_per_position", property(over_drafted))
    with pytest.raises(AssertionError):
        check_hand_values(hand_trace())


def test_a_tree_counting_only_its_path_fails(monkeypatch):
    """A mutation: a tree round's drafted tokens counted as its recorded line, not its nodes:
    the rate no longer matches what the engine counted (GenerationResult.drafted)."""
    rounds = [Round((10, 12, 13), 2, 77, False, tree_tokens=(10, 11, 12, 13), tree_parents=(-1, -1, 0, 2),
                    path=(0, 2), ranks=(0, 0))]
    assert draft_acceptance_rate(rounds) == pytest.approx(2 / 4)
    monkeypatch.setattr(acceptance, "drafted_count", lambda rnd: acceptance.round_counts(rnd)[0])
    assert draft_acceptance_rate(rounds) != pytest.approx(2 / 4)


# ---------------------------------------------------------------- a real run

@pytest.fixture(scope="module")
def models():
    from tests.helpers.models import tiny_llama

    # independent random weights over 8 tokens: the drafter is right now and then and
    # wrong far more often, so both acceptances and rejections (and rollbacks) happen
    return tiny_llama(0, vocab_size=8, logit_scale=20.0), tiny_llama(1, vocab_size=8, logit_scale=20.0)


@pytest.mark.parametrize("gamma_policy, tree", [("constant", 0), ("heuristic", 0), ("constant", 8)])
def test_a_tiny_run_holds_together(models, gamma_policy, tree):
    from sampling import GreedyProcessor
    from tests.helpers.decode import speculative

    target, drafter = models
    prompt = [1, 5, 3, 2, 7]
    result = speculative(prompt, drafter, target, processor=GreedyProcessor(), gamma=4, max_gen_len=40,
                         gamma_policy=gamma_policy, tree=tree, inspect=False)
    trace = result.trace
    assert any(r.accepted < len(r.drafted) for r in trace), "the drafter was never rejected"
    assert any(r.accepted > 0 for r in trace), "the drafter was never accepted"
    check_holds_together(trace)
    counts = acceptance_counts(trace)
    # the engine's own tallies agree (a tree round drafted every node it verified)
    assert (counts.drafted, counts.accepted) == (result.drafted, result.accepted)
    assert counts.draft_acceptance_rate == pytest.approx(result.acceptance_rate)
    if tree:
        assert counts.drafted > sum(len(r.drafted) for r in trace)
    if gamma_policy == "heuristic":
        assert len(counts.by_draft_length) > 1


# ---------------------------------------------------------------- the benchmark pools runs like an engine

def test_the_benchmark_pools_the_counters_of_its_runs():
    from bench.aggregate import ALL, summarize
    from bench.records import RunRecord

    other = [Round((4, 5, 6, 7, 8), 5, 1, True, gamma=5), Round((4,), 0, 2, False, gamma=1)]
    records = []
    for prompt, rounds in (("a", hand_trace()), ("b", other)):
        counts = acceptance_counts(rounds)
        records.append(RunRecord("ngram@4", "ngram", 4, "ours", prompt, "chat", 0, 5, tokens=[1] * 10,
                                 seconds=1.0, drafted=counts.drafted, accepted=counts.accepted, target_calls=5,
                                 acceptance=counts.to_dict()))
    row = next(r for r in summarize(records, greedy=False) if r.category == ALL)
    pooled = acceptance_counts(hand_trace() + other)
    # drafting rounds 4 + 2, accepted 6 + 5: not the mean of the two runs' lengths (2.5 and 3.5)
    assert row.mean_acceptance_length == pytest.approx(1 + 11 / 6) == pooled.mean_acceptance_length
    assert row.acceptance_rate == pytest.approx(11 / 17)
    assert row.acceptance_rate_per_position == pytest.approx(pooled.acceptance_rate_per_position)
    assert row.conditional_acceptance_per_position == pytest.approx(pooled.conditional_acceptance_per_position)
    assert row.acceptance_histogram == pooled.histogram
    assert row.acceptance_histogram_by_draft_length == {"1": [1, 0], "2": [0, 0, 1], "3": [1, 1, 0, 1],
                                                         "5": [0, 0, 0, 0, 0, 1]}
    # a run that reports only its totals leaves the per-round numbers out, never half-pooled
    records[1].acceptance = None
    row = next(r for r in summarize(records, greedy=False) if r.category == ALL)
    assert row.acceptance_rate == pytest.approx(11 / 17) and row.mean_acceptance_length is None
