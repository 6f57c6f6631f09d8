"""The engine through its public API (docs/engine.md): ``run_strategy`` refuses bad input in
one line, a ``Strategy`` is a value, ``EngineState`` keeps the n-gram storage and one γ
policy per strategy key, ``register_drafter`` makes a new kind run, ``pair_of`` wraps models.

Tiny random Llamas (``tests.helpers.models``); every test decodes through ``run_strategy``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import DRAFTERS, Drafter, EngineState, NGramOptions, Strategy, pair_of, register_drafter, run_strategy
from ngram_assisted import NGramStorage, OneLevelNGramStorage
from sampling import GreedyProcessor
from tests.helpers.devices import TEST_DEVICE
from tests.helpers.models import tiny_llama
import model_drafters.selfdraft.kind

GREEDY = GreedyProcessor()
PROMPT = [1, 5, 7, 9, 5, 7, 9, 5, 7]
OTHER_PROMPT = [3, 14, 15, 9, 26, 5, 35, 8]


@pytest.fixture(scope="module")
def pair():
    """A sharp target and an independent drafter, no end tokens (runs go to the length)."""
    return pair_of(tiny_llama(0, logit_scale=20.0), tiny_llama(1, logit_scale=20.0))


def target_ar(pair, prompt=PROMPT, length=16) -> list[int]:
    return run_strategy(Strategy("target", processor=GREEDY, max_gen_len=length), pair, prompt).tokens


# ------------------------------------------------------------------ bad input

@pytest.mark.parametrize("strategy, prompt, message", [
    (Strategy("s", drafter="no-such-kind"), PROMPT, "unknown drafter 'no-such-kind'"),
    (Strategy("s", drafter="model", gamma=0), PROMPT, "gamma must be an integer >= 1, got 0"),
    (Strategy("s", drafter="ngram", gamma=0), PROMPT, "gamma must be an integer >= 1, got 0"),
    (Strategy("s", drafter="model"), [], "the prompt is empty"),
    (Strategy("target"), [], "the prompt is empty"),
    (Strategy("s", drafter="model", max_gen_len=-1), PROMPT, "max_gen_len must be an integer >= 0, got -1"),
    (Strategy("target", max_gen_len=-1), PROMPT, "max_gen_len must be an integer >= 0, got -1"),
], ids=["unknown-kind", "gamma-0", "gamma-0-ngram", "empty-prompt", "empty-prompt-ar", "negative-length",
        "negative-length-ar"])
def test_bad_input_is_a_one_line_value_error(pair, strategy, prompt, message):
    with pytest.raises(ValueError) as info:
        run_strategy(dataclasses.replace(strategy, processor=GREEDY), pair, prompt)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_the_unknown_kind_message_lists_the_registered_kinds(pair):
    with pytest.raises(ValueError) as info:
        run_strategy(Strategy("s", drafter="nope", processor=GREEDY), pair, PROMPT)
    assert all(kind in str(info.value) for kind in DRAFTERS)


# ------------------------------------------------------------------ Strategy is a value

def test_a_strategy_is_a_frozen_value():
    strategy = Strategy("speculative", drafter="model", gamma=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        strategy.gamma = 5
    assert strategy == Strategy("speculative", drafter="model", gamma=3)
    assert hash(strategy) == hash(Strategy("speculative", drafter="model", gamma=3))
    changed = dataclasses.replace(strategy, gamma=5)
    assert (changed.gamma, strategy.gamma) == (5, 3)
    assert strategy.drafts and not Strategy("target").drafts
    with pytest.raises(dataclasses.FrozenInstanceError):
        NGramOptions().n = 4


# ------------------------------------------------------------------ EngineState

def nasd(n=3, storage="basic", reset=False) -> Strategy:
    """Greedy NASD whose storage is kept between runs unless ``reset``."""
    options = NGramOptions(storage=storage, n=n, top_k_filler=1, reset=reset)
    return Strategy("ngram", drafter="ngram", drafter_options=options, gamma=3, processor=GREEDY,
                    max_gen_len=12)


def test_the_ngram_storage_is_kept_across_runs(pair):
    state = EngineState()
    run_strategy(nasd(), pair, PROMPT, state=state)
    kept, learned = state.storage, len(state.storage)
    assert isinstance(kept, NGramStorage) and learned > 0
    context = tuple(PROMPT[-2:])
    before = kept.next_token(context)
    run_strategy(nasd(), pair, OTHER_PROMPT, state=state)
    assert state.storage is kept and len(kept) > learned     # the same table, grown by the second prompt
    assert before[1] and kept.next_token(context) == before  # what the first prompt taught is still there


def test_reset_empties_the_kept_storage(pair):
    state = EngineState()
    run_strategy(nasd(), pair, PROMPT, state=state)
    kept = state.storage
    run_strategy(nasd(), pair, PROMPT, state=state)
    grown = len(kept)
    run_strategy(nasd(reset=True), pair, OTHER_PROMPT, state=state)   # emptied first: holds the second prompt only
    fresh = EngineState()
    run_strategy(nasd(), pair, OTHER_PROMPT, state=fresh)
    assert state.storage is kept and len(kept) == len(fresh.storage) != grown


@pytest.mark.parametrize("change, cls", [({"n": 4}, NGramStorage), ({"storage": "onelevel"}, OneLevelNGramStorage)])
def test_a_new_kind_or_n_rebuilds_the_storage(pair, change, cls):
    state = EngineState()
    run_strategy(nasd(), pair, PROMPT, state=state)
    old = state.storage
    run_strategy(nasd(**change), pair, OTHER_PROMPT, state=state)
    assert state.storage is not old and type(state.storage) is cls
    assert state.storage.n == change.get("n", 3)
    fresh = EngineState()
    run_strategy(nasd(**change), pair, OTHER_PROMPT, state=fresh)
    assert len(state.storage) == len(fresh.storage)                       # nothing of the first prompt


def test_an_unknown_storage_kind_is_a_value_error(pair):
    with pytest.raises(ValueError, match="unknown n-gram storage 'nope'"):
        run_strategy(nasd(storage="nope"), pair, PROMPT)


def test_one_gamma_policy_per_strategy_key():
    state = EngineState()
    spec = Strategy("speculative", drafter="model", gamma=3, gamma_policy="heuristic")
    policy = state.gamma_policy(spec)
    assert state.gamma_policy(spec) is policy                              # kept: it learns across prompts
    assert state.gamma_policy(dataclasses.replace(spec, processor=None)) is policy   # other fields: same policy
    other_key = state.gamma_policy(dataclasses.replace(spec, key="ngram"))
    assert other_key is not policy and state.gamma_policy(spec) is policy  # one per key, side by side
    assert state.gamma_policy(dataclasses.replace(spec, gamma=5)) is not policy          # a new γ: fresh
    assert type(state.gamma_policy(dataclasses.replace(spec, gamma_policy="constant"))).__name__ == "ConstantPolicy"


def test_a_run_uses_the_states_policy_for_its_key(pair):
    """The policy object a run drafts with is the state's: a heuristic policy's γ moves
    after a run on the state, and a second state starts from its own γ again."""
    state = EngineState()
    strategy = Strategy("speculative", drafter="model", gamma=3, gamma_policy="heuristic", processor=GREEDY,
                        max_gen_len=24)
    policy = state.gamma_policy(strategy)
    start = vars(policy).copy()
    run_strategy(strategy, pair, PROMPT, state=state)
    assert state.gamma_policy(strategy) is policy and vars(policy) != start


# ------------------------------------------------------------------ register_drafter

class FixedDrafter(Drafter):
    """Proposes the same token ``k`` times, without probabilities (deterministic drafts,
    checked with a one-hot q as n-gram drafts are); counts its proposals. Everything
    else is the contract's default."""

    kind = "ngram"

    def __init__(self, token: int, device):
        self.token, self.device, self.proposals = token, device, 0

    def begin(self, prompt):
        self.proposals = 0

    def propose(self, ids, k, stop_below=None):
        self.proposals += 1
        return torch.full((k,), self.token, dtype=torch.long, device=self.device), None


def test_a_registered_drafter_kind_runs_and_stays_lossless(monkeypatch, pair):
    want = target_ar(pair, length=16)
    made = []

    def factory(pair_, strategy, state, context):
        made.append(FixedDrafter(strategy.drafter_options, pair_.target.device))
        return made[-1]

    monkeypatch.setitem(DRAFTERS, "fixed", None)          # undone after the test: the kind is removed again
    assert register_drafter("fixed", factory) is factory and DRAFTERS["fixed"] is factory
    strategy = Strategy("fixed", drafter="fixed", drafter_options=want[0], gamma=3, processor=GREEDY,
                        max_gen_len=16)
    result = run_strategy(strategy, pair, PROMPT)
    assert result.tokens == want
    assert len(made) == 1 and made[0].proposals == sum(1 for r in result.trace if r.drafted) > 0
    assert all(set(r.drafted) == {want[0]} for r in result.trace if r.drafted)
    assert result.accepted >= 1 and result.drafted > result.accepted   # the first draft is right, not all


# ------------------------------------------------------------------ pair_of

def test_pair_of_wraps_models_in_memory():
    target, drafter = tiny_llama(0, vocab_size=64), tiny_llama(1, vocab_size=60, max_positions=128)
    pair = pair_of(target, drafter, end_tokens=5)
    assert pair.target is target and pair.drafter is drafter
    assert pair.end_tokens == [5] and pair.vocab_size == 60           # the shorter vocabulary
    assert pair.context_length == 256 and not pair.is_encoder_decoder
    assert pair.device.type == torch.device(TEST_DEVICE).type
    alone = pair_of(target, end_tokens=None, vocab_size=50)
    assert alone.drafter is None and alone.drafter_name == "none"
    assert alone.end_tokens == [] and alone.vocab_size == 50
    assert pair_of(target, end_tokens=(3, 4)).end_tokens == [3, 4]


def test_a_pair_of_runs_every_front_end_strategy(pair):
    """The pair ``pair_of`` builds is one ``run_strategy`` takes for every drafting kind."""
    want = target_ar(pair, length=12)
    for strategy in (Strategy("speculative", drafter="model", gamma=3, processor=GREEDY, max_gen_len=12),
                     nasd()):
        assert run_strategy(strategy, pair, PROMPT).tokens == want, strategy.key


# ------------------------------------------------------------------ what the state keeps per pair

def test_what_is_built_for_a_pair_is_built_once_and_let_go_for_another():
    state, built = EngineState(), []

    def build(tag):
        built.append(tag)
        return object()

    first, second = object(), object()
    kept = state.for_pair(first, "map", lambda: build("first"))
    assert state.for_pair(first, "map", lambda: build("again")) is kept and built == ["first"]
    other = state.for_pair(second, "map", lambda: build("second"))
    assert other is not kept and built == ["first", "second"]
    assert all(owner is second for owner, _ in state.built.values())   # the first pair's builds are gone


def test_a_self_draft_model_is_built_once_per_pair_and_spec(monkeypatch, pair):
    import engine.drafters

    calls = []
    real = model_drafters.selfdraft.kind.build_self_drafter
    monkeypatch.setattr(model_drafters.selfdraft.kind, "build_self_drafter", lambda *a: calls.append(a) or real(*a))
    state = EngineState()
    strategy = Strategy("self", drafter="self", drafter_options="self:skip=1", gamma=2, processor=GREEDY,
                        max_gen_len=6)
    want = target_ar(pair, length=6)
    assert run_strategy(strategy, pair, PROMPT, state=state).tokens == want
    assert run_strategy(strategy, pair, PROMPT, state=state).tokens == want
    assert len(calls) == 1


def test_strategy_model_names_a_model_of_the_pair():
    with pytest.raises(ValueError, match="model must be one of target, drafter"):
        Strategy("x", model="teacher")


def test_drafter_ar_decodes_with_the_drafter_and_key_is_only_a_label(pair):
    drafter_ar = Strategy("anything", model="drafter", processor=GREEDY, max_gen_len=8)
    labelled = Strategy("drafter", processor=GREEDY, max_gen_len=8)      # a label: still the target
    want_drafter = run_strategy(Strategy("t", processor=GREEDY, max_gen_len=8), pair_of(pair.drafter), PROMPT)
    assert run_strategy(drafter_ar, pair, PROMPT).tokens == want_drafter.tokens
    assert run_strategy(labelled, pair, PROMPT).tokens == target_ar(pair, length=8)
    assert want_drafter.tokens != target_ar(pair, length=8)            # the two models differ here
