"""The advisor's replay (``advisor.replay``, ``advisor.teacher``) against the engine's own runs.

Under greedy every drafter's rounds are replayed from target AR's output: a drafter model's
chains by teacher forcing (one forward), trees and self-drafters by the drafter's own proposals.
Each replay must count what ``engine.run_strategy`` counts on the same prompts: target calls,
drafted and accepted tokens, tokens made, and the drafter's forwards (by width where the model is
the drafter's own). The drafter is the target with its output layer perturbed, so it agrees often
enough for rounds of several accepted drafts and rejects often enough for every rollback to run.
"""

from __future__ import annotations

import copy

import pytest
import torch

import advisor.memo
import advisor.recorded
import advisor.replay
from advisor.recorded import Replayed, record
from advisor.replay import (
    Method, ReplayEntry, default_grid, method, replay_grid, replay_mode, unreplayable,
)
from engine import HybridOptions, NGramOptions, pair_of, run_strategy
from tests.helpers.models import tiny_llama

V = 24
LENGTH = 24
PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 3, 7, 5, 9], [3, 11, 3, 11, 12, 13, 3, 11]]


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(1, vocab_size=V, logit_scale=6.0)
    drafter = copy.deepcopy(target)
    torch.manual_seed(7)
    with torch.no_grad():
        noise = torch.randn(drafter.lm_head.weight.shape, device="cpu")        # the same on every device
        drafter.lm_head.weight.add_(0.1 * noise.to(drafter.lm_head.weight.device))
    return pair_of(target, drafter)


@pytest.fixture(scope="module")
def recorded(pair):
    return record(pair, PROMPTS, LENGTH)


FIRSTS: dict[str, list[int]] = {}     # per method key: each prompt's first round's tokens in the engine's run
STEADY: dict[str, tuple[dict[int, int], int]] = {}   # per method key: its runs' later rounds by width, their tokens


def steady_of(results) -> tuple[dict[int, int], int]:
    """The rounds after each run's first, by the width their verify fed (the last token and the
    drafts, a tree's nodes), and the tokens they made, read off the runs' traces."""
    widths, tokens = {}, 0
    for result in results:
        for rnd in result.trace[1:]:
            width = 1 + (len(rnd.tree_tokens) if rnd.tree_tokens else len(rnd.drafted))
            widths[width] = widths.get(width, 0) + 1
        tokens += len(result.tokens) - (result.trace[0].accepted + (result.trace[0].token is not None))
    return widths, tokens


def engine_run(pair, m: Method, widths_of=None) -> tuple[tuple[int, int, int, int], int, dict[int, int]]:
    """What the engine's runs of ``m`` on the prompts counted: (calls, drafted, accepted, tokens),
    drafter forwards, and the widths of ``widths_of``'s forwards (a hook); each prompt's first
    round's tokens go to ``FIRSTS``."""
    counts, calls, widths = [0, 0, 0, 0], 0, {}

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        widths[ids.shape[1]] = widths.get(ids.shape[1], 0) + 1

    handle = widths_of.register_forward_pre_hook(hook, with_kwargs=True) if widths_of is not None else None
    try:
        FIRSTS[m.key], results = [], []
        for prompt in PROMPTS:
            result = run_strategy(m.strategy(max_gen_len=LENGTH), pair, prompt)
            FIRSTS[m.key].append(result.first_tokens)
            results.append(result)
            for i, n in enumerate((result.target_calls, result.drafted, result.accepted, len(result.tokens))):
                counts[i] += n
            calls += result.drafter_calls
    finally:
        if handle is not None:
            handle.remove()
    STEADY[m.key] = steady_of(results)
    return tuple(counts), calls, widths


def check_steady(entry: ReplayEntry) -> None:
    """The replay's steady state (the rounds after each prompt's first, what the ranking prices per
    round) is the engine's runs': the same rounds by verify width and the same tokens."""
    widths, tokens = STEADY[entry.method.key]
    assert entry.replayed.steady == widths and entry.replayed.steady_tokens == tokens
    assert entry.replayed.tokens_per_round == pytest.approx(tokens / sum(widths.values()))


def counts(r: Replayed) -> tuple[int, int, int, int]:
    return r.calls, r.drafted, r.accepted, r.tokens


def replay_one(pair, recorded, m: Method) -> ReplayEntry:
    [entry] = replay_grid(pair, recorded, [m], max_gen_len=LENGTH)
    return entry


def engine_counts(m, pair, prompts, max_gen_len: int = 16) -> list[int]:
    """What ``engine.run_strategy`` counts for method ``m`` over ``prompts``, summed: target calls,
    drafted, accepted, tokens and drafter calls (the replay's counts are held to these)."""
    want = [0] * 5
    for prompt in prompts:
        result = run_strategy(m.strategy(max_gen_len=max_gen_len), pair, prompt)
        for i, n in enumerate((result.target_calls, result.drafted, result.accepted, len(result.tokens),
                               result.drafter_calls)):
            want[i] += n
    return want


@pytest.mark.parametrize("policy", ["constant", "heuristic"])
@pytest.mark.parametrize("gamma", [1, 3, 5])
def test_teacher_forced_chains_count_what_the_engine_runs(pair, recorded, gamma, policy):
    m = method("model", None, gamma, policy)
    assert replay_mode(pair, m) == "teacher"
    entry = replay_one(pair, recorded, m)
    want, calls, widths = engine_run(pair, m, pair.drafter)
    assert counts(entry.replayed) == want
    check_steady(entry)
    assert entry.draft_steps == widths and sum(widths.values()) == calls      # the drafter's forwards, by width
    assert [f[0] for f in entry.firsts] == FIRSTS[m.key]                     # what the time to first token covers
    assert entry.exact and entry.mode == "teacher"
    assert 0 < entry.replayed.accepted < entry.replayed.drafted              # drafts kept and rejected
    if gamma > 1:
        assert entry.rates[1] > 0                                           # rounds that kept two drafts
    assert sum(entry.replayed.widths.values()) == entry.replayed.calls - len(PROMPTS)


@pytest.mark.parametrize("m", [method("model", HybridOptions(min_match=2), 3),
                               method("model", HybridOptions(min_match=3), 5, "heuristic")], ids=lambda m: m.key)
def test_a_hybrids_drafter_model_is_taught_too(pair, recorded, m):
    # The storage drafts the rounds whose match is long; the taught drafter model the others, and
    # its cache after a storage round is fed as ModelDrafter feeds it (the widths say so).
    assert replay_mode(pair, m) == "teacher"
    entry = replay_one(pair, recorded, m)
    want, calls, widths = engine_run(pair, m, pair.drafter)
    assert counts(entry.replayed) == want and entry.draft_steps == widths and sum(widths.values()) == calls
    assert 0 < entry.replayed.accepted < entry.replayed.drafted and entry.exact


def test_a_teacher_reading_one_position_off_is_caught(pair, recorded, monkeypatch):
    # Mutation check: the guesses shifted by one position (the match read one position late).
    m = method("model", None, 3)
    want, _, _ = engine_run(pair, m)
    real = advisor.replay.guesses
    monkeypatch.setattr(advisor.replay, "guesses", lambda *args: real(*args)[1:] + (0,))
    assert counts(replay_one(pair, recorded, m).replayed) != want


SELF = "self:skip=1"


@pytest.mark.parametrize("m", [
    method("model", None, 3, tree=8),
    method("model", None, 5, "heuristic", tree=8),
    method("self", SELF, 1),
    method("self", SELF, 3),
    method("self", SELF, 5, "heuristic"),
    method("self", SELF, 3, tree=8),
    method("self", "self:bf16", 3),                 # a cast copy on the target's cache, through its lean step
    method("model", HybridOptions(min_match=2), 3, tree=8),
    method("ngram", NGramOptions(storage="suffix"), 4, "heuristic", tree=8),
], ids=lambda m: m.key)
def test_the_drafters_own_proposals_count_what_the_engine_runs(pair, recorded, m):
    assert replay_mode(pair, m) == "drafter"
    entry = replay_one(pair, recorded, m)
    want, calls, _ = engine_run(pair, m)
    assert counts(entry.replayed) == want
    check_steady(entry)
    assert sum(entry.draft_steps.values()) == calls
    assert [f[0] for f in entry.firsts] == FIRSTS[m.key]
    assert all(sum(f[2].values()) <= sum(entry.draft_steps.values()) for f in entry.firsts)
    assert 0 < entry.replayed.accepted < entry.replayed.drafted
    # a self-drafter's kept tokens reach the target's cache through other forwards than a run's verifies
    assert entry.exactness == ("rounding" if m.drafter == "self" else "exact")
    assert all(entry.draft_steps.get(w, 0) >= n for w, n in entry.prefill_steps.items())


@pytest.mark.parametrize("m", [method("model", None, 3, tree=8), method("ngram", NGramOptions(storage="suffix"), 4)],
                         ids=lambda m: m.key)
def test_recorded_rows_read_one_position_off_are_caught(pair, recorded, monkeypatch, m):
    # Mutation check: the recorded target answers each position with the row one position late.
    import advisor.stored

    want, _, _ = engine_run(pair, m)
    real = advisor.stored.RecordedTarget._row_of
    monkeypatch.setattr(advisor.stored.RecordedTarget, "_row_of", lambda self, index: real(self, index + 1))
    assert counts(replay_one(pair, recorded, m).replayed) != want


def test_the_grid_names_methods_as_the_benchmark_does(pair):
    from bench.variants import parse_variant_name

    grid = default_grid(pair, gammas=(2, 4), trees=(0, 16), self_specs=())
    keys = [m.key for m in grid]
    assert len(keys) == len(set(keys)) == (5 + 2) * 2 * 2 * 2           # 5 storages, the model, the hybrid
    for key in ("speculative@4", "speculative:heuristic@2", "speculative+tree16@4", "ngram[suffix]@2",
                "speculative+hybrid4@4", "ngram[sam]+tree16:heuristic@4"):
        assert key in keys and parse_variant_name(key).name == key
    assert method("self", "self:int8", 4).key == "speculative[self:int8]@4"
    offered = {m.options for m in default_grid(pair, gammas=(2,), trees=(0,), policies=("constant",))
               if m.drafter == "self"}
    assert offered == {"self:bf16", "self:int8"}
    bf16 = pair_of(tiny_llama(1, vocab_size=V, dtype=torch.bfloat16), None)     # a bf16 copy would be itself
    assert {m.options for m in default_grid(bf16, gammas=(2,), trees=(0,)) if m.drafter == "self"} == {"self:int8"}
    # A pair whose drafter is a self-drafter already: that spec again would replay the same drafter under
    # two names (the default pair's self:bf16); the other is offered. Mutation: with the pair's own drafter
    # not recognised, both are offered.
    from model_drafters.selfdraft import build_self_drafter, parse_self_draft

    target = tiny_llama(1, vocab_size=V)
    own = pair_of(target, build_self_drafter(target, parse_self_draft("self:bf16")))
    assert {m.options for m in default_grid(own, gammas=(2,), trees=(0,)) if m.drafter == "self"} == {"self:int8"}
    assert "speculative@2" in {m.key for m in default_grid(own, gammas=(2,), trees=(0,))}
    assert {replay_mode(pair, m) for m in grid} == {"teacher", "drafter"}


def kinds_of(pair) -> tuple[set[str], list[str]]:
    """(drafters of the default grid, what unreplayable names) for ``pair``."""
    grid = default_grid(pair, gammas=(2,), policies=("constant",), trees=(0,), self_specs=())
    return {m.drafter for m in grid if m.drafter != "ngram"}, [name for name, _ in unreplayable(pair)]


def test_the_plain_and_self_pairs_replay_their_drafter(pair):
    from model_drafters.selfdraft.build import build_self_drafter
    from model_drafters.selfdraft.spec import parse_self_draft

    assert kinds_of(pair) == ({"model"}, ["lookahead", "speculative:model"])
    self_pair = pair_of(pair.target, build_self_drafter(pair.target, parse_self_draft(SELF)))
    assert kinds_of(self_pair) == ({"model"}, ["lookahead", "speculative:model"])
    assert replay_mode(self_pair, method("model", None, 3)) == "drafter"     # on the target's cache: not taught


def _mtp_pair():
    from tests.helpers.mtp import mtp_layers_for, tiny_target

    target = tiny_target("deepseek_v3", layers=2, mtp_layers=1, vocab_size=8, seed=0)
    return pair_of(target, mtp_layers_for(target, 1, seed=1))


def _gemma4_pair():
    from model_drafters.gemma4_assistant import mark_assistant
    from model_drafters.gemma4_assistant.model import assistant_class

    assistant_class()                               # refused in one line where its transformers is not run
    from tests.helpers.gemma4_assistant import tiny_assistant, tiny_target

    target = tiny_target(seed=0)
    return pair_of(target, mark_assistant(tiny_assistant(target, seed=1), target))


def _eagle3_pair(folder):
    from tests.helpers.eagle3 import zoo_head

    target, head = zoo_head("llama", folder)
    return pair_of(target, head)


def _cross_pair():
    from tests.helpers.cross_pairs import byte_bpe, make_pair, tiny_metaspace, tiny_models

    bpe, meta = byte_bpe(), tiny_metaspace()
    return make_pair(*tiny_models(bpe, meta, target_seed=3, drafter_seed=4), bpe, meta)


@pytest.mark.parametrize("kind", ["mtp", "gemma4_assistant", "eagle3", "cross_tokenizer"])
def test_drafters_of_the_targets_state_replay_as_estimates(kind, tmp_path):
    builders = {"mtp": _mtp_pair, "gemma4_assistant": _gemma4_pair, "eagle3": lambda: _eagle3_pair(tmp_path),
                "cross_tokenizer": _cross_pair}
    try:
        built = builders[kind]()
    except (ImportError, ValueError, RuntimeError) as exc:          # a release without the family
        pytest.skip(f"{kind}: {str(exc).splitlines()[0]}")
    drafters, names = kinds_of(built)
    assert drafters == {"model"} and names == ["lookahead", "speculative:model"]
    prompts = [[1, 2, 3, 1, 2, 3, 4, 5], [3, 1, 4, 1, 5, 2, 6]]
    recorded = record(built, prompts, 16)
    for m in (method("model", None, 3), method("model", None, 2, "heuristic", tree=8)):
        assert replay_mode(built, m) == "drafter"
        [entry] = replay_grid(built, recorded, [m], max_gen_len=16)
        want = engine_counts(m, built, prompts)
        assert [*counts(entry.replayed), sum(entry.draft_steps.values())] == want
        assert not entry.exact and kind in entry.note and "\n" not in entry.note


def test_an_end_token_ends_the_replay_as_it_ends_the_run(pair):
    # 18 first comes fifth in the second prompt's output: that output stops there, drafts past it drop.
    ended = pair_of(pair.target, pair.drafter, end_tokens=[18])
    recorded = record(ended, PROMPTS, LENGTH)
    assert recorded[1].output[-1] == 18 and len(recorded[1].output) < LENGTH
    ends = []                                   # runs whose accepted drafts reach the output's end
    for m in (method("model", None, 5), method("model", None, 3, "heuristic"), method("model", None, 4, tree=8),
              method("self", SELF, 5)):
        entry = replay_one(ended, recorded, m)
        want, calls, _ = engine_run(ended, m)
        assert counts(entry.replayed) == want and sum(entry.draft_steps.values()) == calls
        last = run_strategy(m.strategy(max_gen_len=LENGTH), ended, PROMPTS[1]).trace[-1]
        ends.append(last.token is None and 18 in last.drafted)
    assert any(ends)                            # the end token was an accepted draft


def test_a_sessions_state_lends_its_built_self_drafters_not_its_storages(pair, recorded):
    from engine import EngineState

    state = EngineState()
    replay_grid(pair, recorded, [method("self", SELF, 3), method("ngram", NGramOptions(storage="suffix"), 3)],
                max_gen_len=LENGTH, state=state)
    assert list(state.built) == [SELF] and state.storage is None


def test_a_served_target_is_refused_in_one_line(pair):
    from dataclasses import replace

    from kvcache.cache import SessionModel

    with pytest.raises(ValueError) as refused:
        record(replace(pair, target=SessionModel()), PROMPTS, LENGTH)
    assert "served" in str(refused.value) and "\n" not in str(refused.value)


def test_a_recurrent_target_and_drafter_replay_as_the_engine_runs_them():
    # mamba2: the target prefills all but the last prompt token at begin (one more call) and both
    # caches restore snapshots; the drafter re-feeds tokens, so it is not taught but run.
    from tests.helpers.arch_zoo import PROMPTS as ZOO_PROMPTS, FamilyUnavailable, _pair, build

    try:
        zoo = _pair(build("mamba2"), build("mamba2", "drafter"))
    except FamilyUnavailable as exc:
        pytest.skip(str(exc))
    from kvcache.cache import UnsupportedCacheError

    prompts = [list(p) for p in ZOO_PROMPTS[:2]]
    try:
        recorded = record(zoo, prompts, 16)
    except UnsupportedCacheError as exc:         # 4.57: a cache class of the model's own (docs/versions.md)
        pytest.skip(str(exc))
    for m in (method("model", None, 3), method("model", None, 3, "heuristic", tree=8),
              method("ngram", NGramOptions(storage="suffix"), 3)):
        assert replay_mode(zoo, m) == "drafter"
        [entry] = replay_grid(zoo, recorded, [m], max_gen_len=16)
        want = engine_counts(m, zoo, prompts)
        assert [*counts(entry.replayed), sum(entry.draft_steps.values())] == want and entry.exact


def test_a_stepwise_target_makes_every_entry_an_estimate(pair, recorded, monkeypatch):
    # A target whose probe feeds one token a forward counts a call per token: the replay says so.
    monkeypatch.setattr(advisor.replay, "_target_path", lambda pair: "stepwise")
    [entry] = replay_grid(pair, recorded, [method("ngram", NGramOptions(storage="suffix"), 3)], max_gen_len=LENGTH)
    assert not entry.exact and "one token at a time" in entry.note


# ------------------------------------------------------- exact, up to rounding, or estimated

def check_exactness(pair, recorded, methods, want: list[str], words: str = "") -> list[ReplayEntry]:
    """Each method's replay carries the label ``want`` says, and a label short of exact its reason."""
    entries = replay_grid(pair, recorded, methods, max_gen_len=LENGTH)
    assert [e.exactness for e in entries] == want
    for e in entries:
        assert bool(e.note) == (e.exactness != "exact") and "\n" not in e.note
        assert words in e.note or e.exactness != "rounding"
    return entries


@pytest.fixture(scope="module")
def bf16_pair():
    return pair_of(tiny_llama(1, vocab_size=V, logit_scale=6.0, dtype=torch.bfloat16), None)


FLOAT32_CHAINS = [method("model", None, 3), method("model", HybridOptions(min_match=2), 3),
                  method("ngram", NGramOptions(storage="suffix"), 4)]
BF16_METHODS = [method("ngram", NGramOptions(storage="suffix"), 4), method("ngram", NGramOptions(storage="sam"), 3)]


def test_a_float32_chain_replay_is_exact(pair, recorded):
    check_exactness(pair, recorded, FLOAT32_CHAINS, ["exact"] * 3)


def test_mutation_a_float32_replay_said_rounded_fails_the_check(pair, recorded, monkeypatch):
    monkeypatch.setattr(advisor.replay, "_rounding_note", lambda pair, fed: "rounded")
    with pytest.raises(AssertionError):
        check_exactness(pair, recorded, FLOAT32_CHAINS, ["exact"] * 3)


def test_a_bfloat16_targets_replays_are_exact_only_up_to_rounding(bf16_pair):
    # A run's verifies round a bfloat16 target's logits otherwise than target AR's steps: a
    # near-tie can part a run from the output the replay reads.
    recorded = record(bf16_pair, PROMPTS, LENGTH)
    entries = check_exactness(bf16_pair, recorded, BF16_METHODS, ["rounding"] * 2, "bfloat16 target")
    advice = rank_entries(entries)
    assert all(not a.exact and not a.estimate and a.to_dict()["exactness"] == "rounding" for a in advice)


def test_mutation_a_bfloat16_replay_labelled_exact_fails_the_check(bf16_pair, monkeypatch):
    recorded = record(bf16_pair, PROMPTS, LENGTH)
    monkeypatch.setattr(advisor.replay, "_rounding_note", lambda pair, fed: "")
    with pytest.raises(AssertionError):
        check_exactness(bf16_pair, recorded, BF16_METHODS, ["rounding"] * 2, "bfloat16 target")


def rank_entries(entries):
    from advisor.costs import CostTable
    from advisor.rank import rank

    widths = {w for e in entries for w in e.replayed.widths} | {1}
    return rank(entries, CostTable(target_s={w: 0.01 + 0.001 * w for w in widths}, draft_s={}, host_s=0.0,
                                   where="a test machine"))


# ------------------------------------------------------- the stored keys and values (advisor.stored)

STORED = [method("self", SELF, 3), method("self", "self:bf16", 3), method("self", "self:bf16", 5, tree=8)]


def target_forwards(pair, run) -> int:
    """The target's own cached forwards (a real verify, a tree's, a store's build) while ``run()`` runs."""
    from unittest import mock

    from kvcache.cache import CachedModel

    seen = []
    real, masked = CachedModel._forward, CachedModel.forward_masked

    def counted(self, ids, keep):
        seen.append(self.model is pair.target)
        return real(self, ids, keep)

    def counted_masked(self, *args, **kwargs):
        seen.append(self.model is pair.target)
        return masked(self, *args, **kwargs)

    with mock.patch.object(CachedModel, "_forward", counted), \
            mock.patch.object(CachedModel, "forward_masked", counted_masked):
        run()
    return sum(seen)


def test_a_self_drafters_replay_copies_the_stored_keys_and_feeds_the_target_nothing(pair, recorded):
    from advisor.stored import Stores

    stores = Stores(pair)
    entries = []
    forwards = target_forwards(pair, lambda: entries.extend(
        replay_grid(pair, recorded, STORED, max_gen_len=LENGTH, stores=stores)))
    # One store per prompt for the three methods (the prefill, then the rest in one forward):
    # the feeds of every round, dozens of them, copied instead.
    assert stores.built == len(PROMPTS) and forwards == 2 * len(PROMPTS)
    for m, entry in zip(STORED, entries):
        want, calls, _ = engine_run(pair, m)
        assert counts(entry.replayed) == want and sum(entry.draft_steps.values()) == calls


def test_the_stored_replay_equals_the_fed_one(pair, recorded, monkeypatch):
    stored = replay_grid(pair, recorded, STORED, max_gen_len=LENGTH)
    # The same replays with the target fed for real (as for a drafter reading its hidden states).
    monkeypatch.setattr(advisor.replay, "_target_reads", lambda pair, m: "states")
    fed = []
    forwards = target_forwards(pair, lambda: fed.extend(replay_grid(pair, recorded, STORED, max_gen_len=LENGTH)))
    assert forwards == sum(b.replayed.calls for b in fed) > 30      # fed for real: every target call
    for a, b in zip(stored, fed):
        assert (counts(a.replayed), a.draft_steps, a.replayed.widths, a.rates) == \
               (counts(b.replayed), b.draft_steps, b.replayed.widths, b.rates)


@pytest.mark.parametrize("late", [1, -1], ids=["one-late", "one-early"])
def test_stored_keys_copied_one_position_off_are_caught(pair, recorded, monkeypatch, late):
    # Mutation check: each verify copies the stored positions one off; the drafts read the wrong
    # keys and values and the counts part from the engine's. (The lean step's batched chains, when
    # on, read the store on their own, checked below: off here, so the copies are what the drafts read.)
    import advisor.memo
    import advisor.stored

    monkeypatch.setattr(advisor.memo, "BATCH", False)
    real = advisor.stored.append_positions

    def off(cache, store, positions):
        last = store.layers[0].keys.shape[-2] - 1
        real(cache, store, [min(last, max(0, p + late)) if p >= 0 else p for p in positions])

    monkeypatch.setattr(advisor.stored, "append_positions", off)
    wrong = 0
    for m in STORED[:2]:
        want, _, _ = engine_run(pair, m)
        wrong += counts(replay_one(pair, recorded, m).replayed) != want
    assert wrong


def test_a_stored_replay_is_exact_only_up_to_rounding_even_in_float32(pair, recorded):
    # The kept tokens' keys and values come from the store's one wide forward where a run's come
    # from its verifies: the same values up to rounding.
    check_exactness(pair, recorded, STORED, ["rounding"] * len(STORED), "the store's one wide forward")


def test_mutation_a_stored_replay_labelled_exact_fails_the_check(pair, recorded, monkeypatch):
    monkeypatch.setattr(advisor.replay, "_rounding_note", lambda pair, fed: "")
    with pytest.raises(AssertionError):
        check_exactness(pair, recorded, STORED, ["rounding"] * len(STORED), "the store's one wide forward")


def test_a_store_over_budget_is_rebuilt_not_kept(pair, recorded):
    from advisor.stored import Stores

    stores = Stores(pair, budget_bytes=0)
    replay_grid(pair, recorded, STORED[:2], max_gen_len=LENGTH, stores=stores)
    assert stores.built == 2 * len(PROMPTS)               # each method built its own: none was kept


def test_the_record_keeps_the_rows_that_decided_each_token(pair):
    # The record's top-k are the rows the target AR run kept; they equal one forward's over the
    # whole sequence (float32), and a run that kept none is read by that forward.
    from dataclasses import replace

    from advisor.recorded import recorded_from
    from sampling import GreedyProcessor
    from engine import Strategy

    prompt = PROMPTS[0]
    result = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=LENGTH), pair, prompt)
    kept = recorded_from(pair, prompt, result)
    with torch.inference_mode():
        logits = pair.target(input_ids=torch.tensor([prompt + result.tokens])).logits[0, len(prompt) - 1:-1]
    assert [row[0] for row in kept.top] == result.tokens
    assert [list(r[:3]) for r in kept.top] == logits.topk(3, dim=-1).indices.tolist()
    assert recorded_from(pair, prompt, replace(result, decisions=None)).top == kept.top


# A self-drafter's proposals are computed once per position and served to every method of its
# drafter (advisor.memo): the grid below asks for the same positions at several γ, policies and
# trees, on the target's layers (skip) and on a cast copy through its lean step (bf16), and as a
# hybrid's drafter model.
MEMO = [method("self", SELF, g, p) for g in (1, 3, 5) for p in ("constant", "heuristic")] + [
    method("self", SELF, 3, tree=8), method("self", SELF, 3, "heuristic", tree=8),
    method("self", "self:bf16", 2), method("self", "self:bf16", 4), method("self", "self:bf16", 4, "heuristic"),
    method("self", "self:bf16", 3, tree=8), method("self", "self:bf16", 3, "heuristic", tree=8)]


@pytest.fixture(scope="module")
def memo_runs(pair):
    return {m.key: engine_run(pair, m) for m in MEMO}


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-by-one"])
def test_memoised_proposals_count_what_the_engine_runs(pair, recorded, memo_runs, monkeypatch, batched):
    # A cast copy's chains batched for every position (advisor.memo.batched_chains), or one step at a
    # time where batching does not pay: the counts are the engine's either way.
    from advisor.stored import Stores

    monkeypatch.setattr(advisor.memo, "BATCH", True)
    monkeypatch.setattr(advisor.memo, "batching_pays", lambda *args: batched)

    stores = Stores(pair)
    entries = replay_grid(pair, recorded, MEMO, max_gen_len=LENGTH, stores=stores)
    memo = stores.proposals
    assert memo.served > 0 and memo.computed > 0     # proposals served as well as computed
    for m, entry in zip(MEMO, entries):
        want, calls, _ = memo_runs[m.key]
        assert (m.key, counts(entry.replayed), sum(entry.draft_steps.values())) == (m.key, want, calls)
        assert [f[0] for f in entry.firsts] == FIRSTS[m.key]
    chains = [e for e in entries if e.method.tree == 0]
    assert sum(e.timed[1] for e in chains) > 0 and all(e.timed[0] >= 0 for e in chains)


def test_memoised_proposals_equal_the_unmemoised_replay(pair, recorded, monkeypatch):
    # Every field the ranking reads, memo on (one grid) and off (each method alone, the memo
    # never serving a position twice within one run).
    from advisor.stored import Stores

    together = replay_grid(pair, recorded, MEMO, max_gen_len=LENGTH, stores=Stores(pair))
    monkeypatch.setattr(advisor.memo, "memoisable", lambda drafter: False)
    alone = [replay_one(pair, recorded, m) for m in MEMO]
    for a, b in zip(together, alone):
        assert (a.method.key, counts(a.replayed), a.draft_steps, a.prefill_steps, a.replayed.widths, a.rates,
                a.firsts, a.exactness) == \
               (b.method.key, counts(b.replayed), b.draft_steps, b.prefill_steps, b.replayed.widths, b.rates,
                b.firsts, b.exactness)


BATCHED = [m for m in MEMO if m.options == "self:bf16" and m.tree == 0]     # a cast copy's chains: its lean step


def test_a_lean_steps_chains_are_batched_once_per_prompt_and_count_what_the_engine_runs(pair, recorded, memo_runs,
                                                                                       monkeypatch):
    # The cast copy's chains (its lean step) come from one batched forward per depth for every
    # position of a prompt, and the replay still counts what the engine runs for every method.
    from advisor.stored import Stores

    monkeypatch.setattr(advisor.memo, "BATCH", True)
    monkeypatch.setattr(advisor.memo, "batching_pays", lambda *args: True)
    stores = Stores(pair)
    entries = replay_grid(pair, recorded, BATCHED, max_gen_len=LENGTH, stores=stores)
    assert len(stores.proposals.batched) == len(PROMPTS)
    assert stores.proposals.computed >= len(PROMPTS) * LENGTH       # every position's chain, at once
    for m, entry in zip(BATCHED, entries):
        want, calls, _ = memo_runs[m.key]
        assert (m.key, counts(entry.replayed), sum(entry.draft_steps.values())) == (m.key, want, calls)


def test_mutation_batched_chains_reading_the_store_one_position_off_are_caught(pair, recorded, memo_runs,
                                                                              monkeypatch):
    import kvcache.shared
    from advisor.stored import Stores

    real = kvcache.shared.committed_positions

    def late(cache, start, stop):       # the store's positions one later (the last kept in place)
        shifted = real(cache, min(start + 1, stop), stop)
        return [(torch.cat([k, k[:, :, -1:]], dim=2)[:, :, :stop - start],
                 torch.cat([v, v[:, :, -1:]], dim=2)[:, :, :stop - start]) for k, v in shifted]

    monkeypatch.setattr(kvcache.shared, "committed_positions", late)
    monkeypatch.setattr(advisor.memo, "BATCH", True)
    monkeypatch.setattr(advisor.memo, "batching_pays", lambda *args: True)
    entries = replay_grid(pair, recorded, BATCHED, max_gen_len=LENGTH, stores=Stores(pair))
    assert [m.key for m, e in zip(BATCHED, entries) if counts(e.replayed) != memo_runs[m.key][0]]


MUTATED_KEYS = {
    "no-position": ("chain_key", lambda index, model, length: (index, id(model))),
    "no-prompt": ("chain_key", lambda index, model, length: (id(model), length)),
    "no-model": ("chain_key", lambda index, model, length: (index, length)),
    "no-tree-depth": ("tree_key", lambda index, model, length, depth, nodes, branch:
                      (index, id(model), length, nodes, branch)),
}


@pytest.mark.parametrize("mutation", list(MUTATED_KEYS))
def test_a_memo_keyed_without_what_decides_a_proposal_is_caught(pair, recorded, memo_runs, monkeypatch, mutation):
    # Mutation check: a memo that forgets the position, the prompt, the drafter or (for trees) the
    # depth serves another proposal, and the counts part from the engine's.
    from advisor.stored import Stores

    name, key = MUTATED_KEYS[mutation]
    monkeypatch.setattr(advisor.memo, name, key)
    entries = replay_grid(pair, recorded, MEMO, max_gen_len=LENGTH, stores=Stores(pair))
    assert [m.key for m, e in zip(MEMO, entries) if counts(e.replayed) != memo_runs[m.key][0]]


def test_a_chain_cut_before_its_first_wrong_draft_is_caught(pair, recorded, memo_runs, monkeypatch):
    # Mutation check: a chain served past its computed drafts though none of them was wrong (as if
    # settled): the filler is judged where a real draft would have been kept.
    from advisor.stored import Stores

    monkeypatch.setattr(advisor.memo.Chain, "serves", lambda self, k: True)
    entries = replay_grid(pair, recorded, MEMO, max_gen_len=LENGTH, stores=Stores(pair))
    assert [m.key for m, e in zip(MEMO, entries) if counts(e.replayed) != memo_runs[m.key][0]]


@pytest.mark.parametrize("m", [method("model", None, 3), method("self", "self:bf16", 3)], ids=lambda m: m.key)
def test_mutation_a_steady_state_that_keeps_the_first_round_is_caught(pair, recorded, monkeypatch, m):
    # Mutation check: the first round (the prompt's) counted with the later ones.
    from advisor.recorded import Replayed

    engine_run(pair, m)
    real = Replayed.add_run

    def with_first(self, result, verify_widths, prompt_tokens=0):
        real(self, result, verify_widths, prompt_tokens)
        self.steady_tokens += result.trace[0].accepted + (result.trace[0].token is not None)
        width = 1 + len(result.trace[0].drafted)
        self.steady[width] = self.steady.get(width, 0) + 1

    monkeypatch.setattr(Replayed, "add_run", with_first)
    with pytest.raises(AssertionError):
        check_steady(replay_one(pair, recorded, m))


@pytest.mark.parametrize("m", [method("model", None, 3), method("ngram", NGramOptions(), 4)], ids=lambda m: m.key)
def test_each_steady_round_keeps_where_it_ran(pair, recorded, m):
    """``Replayed.steady_rounds`` (what ``--whatif context`` splits by length) holds the engine's own runs'
    rounds after the first, each with the tokens before it (its prompt's included), its verify width
    and what it made."""
    want = []
    for prompt in PROMPTS:
        trace = run_strategy(m.strategy(max_gen_len=LENGTH), pair, prompt).trace
        position = len(prompt) + trace[0].accepted + (trace[0].token is not None)
        for r in trace[1:]:
            made = r.accepted + (r.token is not None)
            want.append((position, len(r.drafted) + 1, made))
            position += made
    got = replay_one(pair, recorded, m).replayed
    assert got.steady_rounds == want and len(want) > 6
    assert sum(made for _, _, made in got.steady_rounds) == got.steady_tokens
    assert {w: sum(1 for _, width, _ in want if width == w) for w in got.steady} == got.steady
