"""The per-token inspector's numbers equal a recomputation from the two models' logits.

Tiny random models, the drafter initialised independently of the target (so
drafts get rejected), the models re-run *uncached* on each round's prefix.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import generation.verify as verify
from engine import NGramOptions, Strategy, run_strategy
from generation.inspection import Inspection, record_round, record_size
from ngram_assisted import NGramStorage
from sampling import GreedyProcessor, MultinomialProcessor, TopKProcessor
from tests.helpers.decode import nasd, speculative
from tests.helpers.inspection import check_rounds
from tests.helpers.models import tiny_llama

V = 64
PROMPT = [1, 5, 9, 5, 9, 5, 9, 3, 7]


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(1, vocab_size=V, logit_scale=6.0)
    drafter = tiny_llama(2, vocab_size=V, logit_scale=6.0)
    return target, drafter


PROCESSORS = [GreedyProcessor(), MultinomialProcessor(1.0), TopKProcessor(0.8, 6)]


@pytest.mark.parametrize("processor", PROCESSORS, ids=repr)
def test_speculative_inspector_equals_recomputation(models, processor):
    target, drafter = models
    result = speculative(PROMPT, drafter, target, processor=processor, gamma=4, max_gen_len=24,
                         generator=torch.Generator().manual_seed(3))
    assert check_rounds(result, PROMPT, target, drafter, processor) >= 2


@pytest.mark.parametrize("processor", PROCESSORS[:2], ids=repr)
def test_ngram_inspector_equals_recomputation_with_one_hot_q(models, processor):
    target, _ = models
    result = nasd(PROMPT, NGramStorage(2, V), target, processor=processor, gamma=3, max_gen_len=24,
                  generator=torch.Generator().manual_seed(4), confident_start=False)
    assert any(r.drafted for r in result.trace)
    check_rounds(result, PROMPT, target, None, processor)


def test_swapping_p_and_q_in_the_recorder_is_caught(models, monkeypatch):
    target, drafter = models

    def swapped(p_rule, q_rule, draft, n, token, *, p_view, q_view, **kw):
        if q_view is None:
            return record_round(p_rule, q_rule, draft, n, token, p_view=p_view, q_view=q_view, **kw)
        q_padded = torch.cat([q_view, p_view[-1:]])               # q in p's place, and p in q's
        return record_round(p_rule, q_rule, draft, n, token, p_view=q_padded, q_view=p_view[:-1], **kw)

    monkeypatch.setattr(verify, "record_round", swapped)
    processor = MultinomialProcessor(1.0)
    result = speculative(PROMPT, drafter, target, processor=processor, gamma=4, max_gen_len=16,
                         generator=torch.Generator().manual_seed(3))
    with pytest.raises(AssertionError):
        check_rounds(result, PROMPT, target, drafter, processor)


def test_an_off_by_one_row_is_caught(models, monkeypatch):
    """The shown p taken one row late (the row after each draft) must fail the check."""
    target, drafter = models

    def shifted(p_rule, q_rule, draft, n, token, *, p_view, q_view, **kw):
        late = torch.cat([p_view[1:], p_view[-1:]])
        return record_round(p_rule, q_rule, draft, n, token, p_view=late, q_view=q_view, **kw)

    monkeypatch.setattr(verify, "record_round", shifted)
    processor = GreedyProcessor()
    result = speculative(PROMPT, drafter, target, processor=processor, gamma=4, max_gen_len=16)
    with pytest.raises(AssertionError):
        check_rounds(result, PROMPT, target, drafter, processor)


@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
def test_recording_changes_no_output_and_the_strategy_switches_it_off(models, drafter_kind):
    """``Strategy.inspect`` reaches the verify loop through the engine; recording
    changes neither the tokens nor the rounds."""
    target, drafter = models
    pair = SimpleNamespace(target=target, drafter=drafter, end_tokens=None, vocab_size=V)
    runs = {}
    options = NGramOptions(n=2, confident_start=False) if drafter_kind == "ngram" else None
    for inspect in (True, False):
        strategy = Strategy("s", drafter=drafter_kind, drafter_options=options, gamma=4,
                            processor=MultinomialProcessor(1.0), max_gen_len=20, seed=5, inspect=inspect)
        runs[inspect] = run_strategy(strategy, pair, PROMPT)
    assert runs[True].tokens == runs[False].tokens
    assert [(r.drafted, r.accepted, r.token) for r in runs[True].trace] == \
        [(r.drafted, r.accepted, r.token) for r in runs[False].trace]
    assert any(r.drafted for r in runs[True].trace)
    assert all(r.inspection is not None for r in runs[True].trace)
    assert all(r.inspection is None for r in runs[False].trace)


def test_record_size_matches_the_tensor():
    p = torch.rand(4, 10).softmax(-1)
    q = torch.rand(3, 10).softmax(-1)
    draft = torch.tensor([1, 2, 3])
    n, token = torch.tensor(1), torch.tensor(4)
    assert record_round(p, q, draft, n, token, p_view=p, q_view=q).numel() == record_size(3, 10, has_q=True)
    assert record_round(p, None, draft, n, token, p_view=p, q_view=None).numel() == record_size(3, 10, has_q=False)
    assert record_round(p[:1], None, draft[:0], torch.tensor(0), token, p_view=p[:1], q_view=None).numel() \
        == record_size(0, 10, has_q=False)


def test_an_inspection_survives_json():
    import json
    from dataclasses import asdict

    ins = Inspection(positions=(), token_p=0.5, token_entropy=math.log(2), token_top=((3, 0.5), (4, 0.5)),
                     residual=((3, 1.0),), shown="softmax")
    assert Inspection.from_dict(json.loads(json.dumps(asdict(ins)))) == ins


def test_a_round_ended_by_an_end_token_keeps_only_its_kept_drafts():
    """An end token among the accepted drafts drops the later drafts, and the round has no target token."""
    from generation.inspection import Position
    from generation.result import GenerationResult
    from generation.verify import _count

    def position(i):
        return Position(p=0.1 * i, q=0.5, accept=0.2 * i, entropy_p=1.0, entropy_q=2.0,
                        p_top=((i, 0.5),), q_top=((i, 0.6),))

    full = Inspection(positions=tuple(position(i) for i in range(4)), token_p=0.3, token_entropy=1.5,
                      token_top=((9, 0.3),), residual=((9, 0.7),))
    ended = GenerationResult()
    _count(ended, [4, 2, 5, 6], 2, [4, 2], gamma=4, draft_s=0.0, verify_s=0.0, inspection=full)  # 2 ends it
    ins = ended.trace[-1].inspection
    assert ins.positions == full.positions[:2] and ins.token_p is None and ins.token_top == ()
    assert ins.residual is None
    rejected = GenerationResult()
    _count(rejected, [4, 7, 5, 6], 1, [4, 9], gamma=4, draft_s=0.0, verify_s=0.0, inspection=full)
    ins = rejected.trace[-1].inspection
    assert ins.positions == full.positions and ins.token_p == 0.3 and ins.residual == ((9, 0.7),)
    bonus = GenerationResult()
    _count(bonus, [4, 7, 5, 6], 4, [4, 7, 5, 6, 9], gamma=4, draft_s=0.0, verify_s=0.0, inspection=full)
    assert bonus.trace[-1].inspection.residual is None and bonus.trace[-1].inspection.token_p == 0.3
