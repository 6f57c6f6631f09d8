"""The per-token inspector's numbers equal a recomputation from the two models' logits.

Tiny random models, the drafter initialised independently of the target (so
drafts get rejected), the models re-run *uncached* on each round's prefix.
"""

from __future__ import annotations

import math

import pytest
import torch

import generation.inspection as inspection
import generation.verify as verify
from engine import NGramOptions, Strategy, run_strategy
from generation.accept import residual_distributions
from generation.inspection import TOP, Inspection, Position, decode, record_round
from generation.verify_rules import block_details
from ngram_assisted import NGramStorage
from sampling import GreedyProcessor, MultinomialProcessor, TopKProcessor
from tests.helpers.decode import nasd, speculative
from tests.helpers.inspection import check_rounds
from tests.helpers.models import tiny_llama
from tests.helpers.pairs import model_pair

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


# ------------------------------------------------------------- the chain verify rules

@pytest.mark.parametrize("rule, processor", [("block", PROCESSORS[0]), ("block", PROCESSORS[1]),
                                             ("block", PROCESSORS[2]), ("strict", PROCESSORS[1])],
                         ids=lambda v: v if isinstance(v, str) else repr(v))
def test_each_rule_records_what_it_compared(models, rule, processor):
    """Block's ratios and thresholds equal block_details on the uncached p and q and its residual
    is the scaled one; strict's accept is p(x) and it has no residual."""
    target, drafter = models
    result = speculative(PROMPT, drafter, target, processor=processor, gamma=4, max_gen_len=24,
                         generator=torch.Generator().manual_seed(3), verify=rule)
    assert check_rounds(result, PROMPT, target, drafter, processor, rule) >= 2
    if rule == "block":
        assert any(pos.ratio < 1.0 for r in result.trace for pos in r.inspection.positions)


@pytest.mark.parametrize("rule", ["block", "strict"])
def test_each_rule_records_what_it_compared_for_ngram_drafts(models, rule):
    target, _ = models
    processor = MultinomialProcessor(1.0)
    result = nasd(PROMPT, NGramStorage(2, V), target, processor=processor, gamma=3, max_gen_len=24,
                  generator=torch.Generator().manual_seed(4), confident_start=False, verify=rule)
    assert any(r.drafted for r in result.trace)
    check_rounds(result, PROMPT, target, None, processor, rule)


def _block_run(models):
    """A sampled block run whose stops include one after a kept draft with b_n < 1 (where the
    scaled residual differs from the token rule's)."""
    target, drafter = models
    processor = MultinomialProcessor(1.0)
    result = speculative(PROMPT, drafter, target, processor=processor, gamma=4, max_gen_len=24,
                         generator=torch.Generator().manual_seed(3), verify="block")
    return result, processor


def test_ratios_recorded_one_row_late_are_caught(models, monkeypatch):
    target, drafter = models

    def late(p, q, draft):
        ratios, thresholds = block_details(p, q, draft)
        return torch.cat([ratios[1:], ratios[-1:]]), thresholds

    monkeypatch.setattr(verify, "block_details", late)
    result, processor = _block_run(models)
    with pytest.raises(AssertionError):
        check_rounds(result, PROMPT, target, drafter, processor, "block")


def test_an_unscaled_residual_under_block_is_caught(models, monkeypatch):
    target, drafter = models
    result, processor = _block_run(models)
    assert any(r.token is not None and 0 < r.accepted < len(r.drafted)
               and r.inspection.positions[r.accepted - 1].ratio < 0.99 for r in result.trace)
    monkeypatch.setattr(inspection, "residual_at_stop",
                        lambda p_row, q_row, draft_x, scale: residual_distributions(p_row, q_row, draft_x))
    mutated, _ = _block_run(models)
    assert [r.drafted for r in mutated.trace] == [r.drafted for r in result.trace]
    with pytest.raises(AssertionError):
        check_rounds(mutated, PROMPT, target, drafter, processor, "block")


def test_the_recorder_refuses_an_unknown_rule_and_block_without_its_numbers():
    p, draft = torch.rand(2, 10).softmax(-1), torch.tensor([1])
    for rule, block in [("typical", None), ("block", None), ("residual", block_details(p, None, draft))]:
        with pytest.raises(ValueError) as error:
            record_round(p, None, draft, torch.tensor(0), torch.tensor(2), p_view=p, q_view=None,
                         rule=rule, block=block)
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("drafter_kind", ["model", "ngram"])
def test_recording_changes_no_output_and_the_strategy_switches_it_off(models, drafter_kind):
    """``Strategy.inspect`` reaches the verify loop through the engine; recording
    changes neither the tokens nor the rounds."""
    target, drafter = models
    pair = model_pair(target, drafter, vocab_size=V)
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


def record_size(k: int, vocab: int, *, has_q: bool, rule: str = "residual", top: int = TOP) -> int:
    """How many ints ``record_round`` returns for ``k`` drafts: its layout, counted apart from it."""
    t = min(top, vocab)
    size = (k + 1) * t + (k + 1) * t + (k + 1) + 1
    if k:
        size += k + k
        if rule != "strict":
            size += t + t
        if has_q:
            size += k * t + k + k + k * t
        if rule == "block":
            size += k + k
    return size


def test_record_size_matches_the_tensor():
    p = torch.rand(4, 10).softmax(-1)
    q = torch.rand(3, 10).softmax(-1)
    draft = torch.tensor([1, 2, 3])
    n, token = torch.tensor(1), torch.tensor(4)
    assert record_round(p, q, draft, n, token, p_view=p, q_view=q).numel() == record_size(3, 10, has_q=True)
    assert record_round(p, None, draft, n, token, p_view=p, q_view=None).numel() == record_size(3, 10, has_q=False)
    assert record_round(p[:1], None, draft[:0], torch.tensor(0), token, p_view=p[:1], q_view=None).numel() \
        == record_size(0, 10, has_q=False)
    block = block_details(p, q, draft)
    assert record_round(p, q, draft, n, token, p_view=p, q_view=q, rule="block", block=block).numel() \
        == record_size(3, 10, has_q=True, rule="block")
    assert record_round(p, None, draft, n, token, p_view=p, q_view=None, rule="strict").numel() \
        == record_size(3, 10, has_q=False, rule="strict")


@pytest.mark.parametrize("rule", ["residual", "block", "strict"])
@pytest.mark.parametrize("k", [0, 3])
def test_the_recorder_reads_nothing_back(rule, k):
    """The round keeps its one host sync: recording (block_details included) runs on the meta
    device, where any read-back (.item(), indexing with a 0-d tensor) raises."""
    meta = dict(device="meta")
    p, q = torch.empty(k + 1, 10, **meta), torch.empty(k, 10, **meta)
    draft, n = torch.empty(k, dtype=torch.long, **meta), torch.empty((), dtype=torch.long, **meta)
    for q_rule in (q, None):
        block = block_details(p, q_rule, draft) if rule == "block" else None
        flat = record_round(p, q_rule, draft, n, n, p_view=p, q_view=q_rule, rule=rule, block=block)
        assert flat.numel() == record_size(k, 10, has_q=q_rule is not None, rule=rule)


@pytest.mark.parametrize("rule", ["residual", "block", "strict"])
def test_decode_reads_back_what_the_recorder_packed(rule):
    """Hand-built p and q: every number comes back in its place under each rule's layout."""
    p = torch.tensor([[.5, .3, .2, 0.], [.1, .6, .2, .1], [.25, .25, .25, .25]])   # (k+1, V)
    q = torch.tensor([[.2, .6, .1, .1], [.7, .1, .1, .1]])                           # (k, V)
    draft, n, token = torch.tensor([1, 0]), torch.tensor(1), torch.tensor(1)
    block = block_details(p, q, draft) if rule == "block" else None
    flat = record_round(p, q, draft, n, token, p_view=p, q_view=q, rule=rule, block=block).tolist()
    ins = decode(flat, [1, 0], 1, vocab=4, has_q=True, shown="rule", rule=rule)
    assert ins.rule == rule and ins.token_p == pytest.approx(.6)
    assert [pos.p for pos in ins.positions] == pytest.approx([.3, .1])
    assert [pos.q for pos in ins.positions] == pytest.approx([.6, .7])
    accept = [.3, .1] if rule == "strict" else [.5, 1 / 7]
    assert [pos.accept for pos in ins.positions] == pytest.approx(accept)
    if rule == "block":
        # b_1 = .3/.6 = .5, b_2 = min(1, .5 * .1/.7) = 1/14;
        # m_1 = sum max(0, .5 p_1 - q_1) = .3 - .1 = .2, h_1 = m_1 / (m_1 + 1 - b_1) = 2/7, h_2 = b_2
        assert [pos.ratio for pos in ins.positions] == pytest.approx([.5, 1 / 14])
        assert [pos.threshold for pos in ins.positions] == pytest.approx([2 / 7, 1 / 14])
        # the stop after one draft: norm(max(0, .5 p_1 - q_1)) = one-hot(1)
        assert ins.residual == ((1, pytest.approx(1.0)),)
    else:
        assert all(pos.ratio is None and pos.threshold is None for pos in ins.positions)
        # the token rule's residual norm(max(0, p_1 - q_1)) = (0, .5, .1, 0) / .6; none under strict
        want = None if rule == "strict" else ((1, pytest.approx(5 / 6)), (2, pytest.approx(1 / 6)))
        assert ins.residual == want


def test_an_inspection_survives_json():
    import json
    from dataclasses import asdict

    ins = Inspection(positions=(), token_p=0.5, token_entropy=math.log(2), token_top=((3, 0.5), (4, 0.5)),
                     residual=((3, 1.0),), shown="softmax")
    assert Inspection.from_dict(json.loads(json.dumps(asdict(ins)))) == ins
    block = Inspection(positions=(Position(p=.3, q=.6, accept=.5, entropy_p=1.0, entropy_q=.9,
                                           p_top=((0, .5),), q_top=((1, .6),), ratio=.5, threshold=.23),),
                       residual=((1, 1.0),), rule="block")
    assert Inspection.from_dict(json.loads(json.dumps(asdict(block)))) == block


def test_an_inspection_from_before_the_rules_reads_as_the_token_rule():
    """A trace written before ratio, threshold and rule existed still reads: no block numbers."""
    old = {"positions": [{"p": .3, "q": .6, "accept": .5, "entropy_p": 1.0, "entropy_q": .9,
                          "p_top": [[0, .5]], "q_top": [[1, .6]]}],
           "token_p": .6, "token_entropy": 1.1, "token_top": [[1, .6]], "residual": [[1, 1.0]],
           "shown": "rule", "one_hot_q": False}
    ins = Inspection.from_dict(old)
    assert ins.rule == "residual" and ins.positions[0].ratio is None and ins.positions[0].threshold is None
    assert ins.positions[0].accept == .5 and ins.residual == ((1, 1.0),)


def test_a_round_ended_by_an_end_token_keeps_only_its_kept_drafts():
    """An end token among the accepted drafts drops the later drafts, and the round has no target token."""
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
