"""The replay of model-free drafters over a recorded greedy output (``advisor.recorded``) against the
engine's own runs: the same target calls, drafts and acceptance, token for token; and the copy
ceiling against the drafters it bounds (its search: tests/test_copy_ceiling.py)."""

from __future__ import annotations

import pytest
import torch

import advisor.recorded
import engine.drafters
from advisor.recorded import PromptLookup, Replayed, copy_ceiling, drafter_factory, oracle, record, replay
from generation.timing import time_target
from engine import NGramOptions, Strategy, pair_of, run_strategy
from sampling import GreedyProcessor
from tests.helpers.models import tiny_llama

V = 24
LENGTH = 40
PROMPTS = [[1, 5, 9, 5, 9, 5, 9, 3, 7, 5, 9, 5, 9, 5, 9, 3, 7, 5, 9],
           [2, 4, 6, 8, 2, 4, 6, 8, 10, 2, 4, 6],
           [3, 11, 3, 11, 12, 13, 3, 11]]
STORAGES = ("basic", "onelevel", "recycling", "suffix", "sam")


@pytest.fixture(scope="module")
def pair():
    return pair_of(tiny_llama(1, vocab_size=V, logit_scale=6.0))


@pytest.fixture(scope="module")
def recorded(pair):
    return record(pair, PROMPTS, LENGTH)


def engine_counts(pair, storage: str, gamma: int, *, fill: bool = False) -> Replayed:
    """What the engine's NASD runs on the prompts counted (calls, drafted, accepted, tokens)."""
    out = Replayed()
    for prompt in PROMPTS:
        options = NGramOptions(storage=storage, fill_width=fill)
        strategy = Strategy("ngram", drafter="ngram", drafter_options=options, gamma=gamma,
                            processor=GreedyProcessor(), max_gen_len=LENGTH, inspect=False)
        result = run_strategy(strategy, pair, prompt)
        out.calls += result.target_calls
        out.drafted += result.drafted
        out.accepted += result.accepted
        out.tokens += len(result.tokens)
    return out


def counts(run: Replayed) -> tuple[int, int, int, int]:
    return run.calls, run.drafted, run.accepted, run.tokens


@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("gamma", [2, 5])
def test_the_replay_counts_what_the_engine_counts(pair, recorded, storage, gamma):
    engine = engine_counts(pair, storage, gamma)
    replayed = replay(pair, drafter_factory(pair, storage, V), recorded, gamma, LENGTH)
    assert counts(replayed) == counts(engine)
    assert 0 < engine.accepted < engine.drafted             # drafts both accepted and rejected
    # after the prefills, a round of k drafts verified k + 1 tokens
    assert sum(replayed.widths.values()) == replayed.calls - len(PROMPTS)
    assert sum((w - 1) * n for w, n in replayed.widths.items()) <= replayed.drafted


@pytest.mark.parametrize("storage", ["suffix", "sam"])
def test_a_filling_storage_replays_as_the_engine_runs_it(pair, recorded, monkeypatch, storage):
    # Both ends fill by one table: every width from 2 up costs more than 6 (as measured, a table
    # could say; the replay itself is priced apart).
    table = {1: 1.0, **{w: 2.0 for w in range(2, 6)}, 6: 1.5, **{w: 3.0 for w in range(7, 12)}}
    measured = []
    monkeypatch.setattr(engine.drafters, "verify_costs", lambda *args: measured.append(args[2]) or table)
    engine_run = engine_counts(pair, storage, 5, fill=True)
    measured.clear()
    replayed = replay(pair, drafter_factory(pair, f"{storage}+fill", V, 5), recorded, 5, LENGTH)
    assert counts(replayed) == counts(engine_run) != counts(engine_counts(pair, storage, 5))
    assert replayed.widths.get(6, 0) > 0 and measured == [5] * len(PROMPTS)


def test_a_replay_that_misjudges_a_draft_is_caught(pair, recorded, monkeypatch):
    import advisor.stored

    engine = engine_counts(pair, "suffix", 5)
    # Mutation check: the recorded target answers with the next position's row (the record read one late).
    real = advisor.stored.RecordedTarget._row_of
    monkeypatch.setattr(advisor.stored.RecordedTarget, "_row_of", lambda self, index: real(self, index + 1))
    assert counts(replay(pair, drafter_factory(pair, "suffix", V), recorded, 5, LENGTH)) != counts(engine)


def test_the_record_is_target_ar_and_its_top_k(pair, recorded):
    for prompt, rec in zip(PROMPTS, recorded):
        with torch.inference_mode():
            ids = torch.tensor([prompt + list(rec.output)])
            logits = pair.target(input_ids=ids).logits[0]
        assert len(rec.top) == len(rec.output) and all(len(row) == advisor.recorded.TOP_K for row in rec.top)
        for i, token in enumerate(rec.output):
            assert rec.top[i][0] == token == int(logits[len(prompt) - 1 + i].argmax())


def test_the_oracle_cut_keeps_the_calls_and_only_accepted_drafts(pair, recorded):
    make = drafter_factory(pair, "suffix", V)
    plain, cut = replay(pair, make, recorded, 5, LENGTH), replay(pair, make, recorded, 5, LENGTH, cut=oracle)
    assert cut.calls == plain.calls and cut.accepted == plain.accepted == cut.drafted < plain.drafted
    assert cut.forward_s(lambda width: width) < plain.forward_s(lambda width: width)


def test_prompt_lookup_is_transformers_candidate_generator():
    ids = torch.tensor([[7, 1, 2, 3, 4, 9, 1, 2]])
    assert PromptLookup().propose(ids, 3)[0].tolist() == [3, 4, 9]      # after the earlier "1 2"
    assert PromptLookup().propose(torch.tensor([[5, 6, 7]]), 3)[0].tolist() == []   # no earlier match


def test_forward_costs_time_every_width(pair):
    costs = time_target(pair.target, torch.tensor([PROMPTS[0]]), widths=[1, 3], repeats=2).verify_s
    assert sorted(costs) == [1, 3] and all(s > 0 for s in costs.values())


@pytest.mark.parametrize("argv, message", [
    (["--gamma", "0"], "--gamma takes integers >= 1"),
    (["--storages", "suffix,nope"], "unknown storage 'nope'"),
])
def test_the_script_refuses_bad_flags_in_one_line(argv, message, capsys):
    from scripts.replay_drafters import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err


# Forward costs by width shaped like a CPU's where 2 and 3 rows cost more than 4 (docs/results.md).
STEP_COSTS = {1: 1.0, 2: 2.0, 3: 2.5, 4: 1.6, 5: 1.8, 6: 2.1}


def test_the_copy_ceiling_bounds_the_copying_drafters(pair, recorded):
    for table in (STEP_COSTS, {w: float(w) for w in range(1, 7)}):
        cost = table.__getitem__
        ceiling = copy_ceiling(recorded, 5, LENGTH, cost)
        assert ceiling.tokens == sum(len(rec.output) for rec in recorded)
        for make in [drafter_factory(pair, storage, V) for storage in ("suffix", "sam")] + [PromptLookup]:
            for cut in (None, oracle):
                assert ceiling.forward_s(cost) <= replay(pair, make, recorded, 5, LENGTH, cut=cut).forward_s(cost)
        # a longer match to copy after allows fewer copies
        assert copy_ceiling(recorded, 5, LENGTH, cost, match=2).forward_s(cost) >= ceiling.forward_s(cost)
