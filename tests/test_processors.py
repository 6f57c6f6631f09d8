"""Logits processors: exact distributions on hand-built logits, purity, validation."""

import math

import pytest
import torch

from sampling import (
    GreedyProcessor,
    MultinomialProcessor,
    NucleusProcessor,
    TopKNucleusProcessor,
    TopKProcessor,
)

LOGITS = torch.tensor([2.0, 1.0, 0.0, -1.0, 3.0])   # ranks: 4, 0, 1, 2, 3


def softmax_of(values):
    e = [math.exp(v) for v in values]
    return [x / sum(e) for x in e]


ALL = [
    GreedyProcessor(),
    MultinomialProcessor(0.7),
    TopKProcessor(0.7, 2),
    NucleusProcessor(0.7, 0.8),
    TopKNucleusProcessor(0.7, 3, 0.8),
]


@pytest.mark.parametrize("processor", ALL, ids=repr)
def test_does_not_modify_logits_and_keeps_shape(processor):
    logits = torch.randn(2, 3, 11)
    before = logits.clone()
    probs = processor(logits)
    assert torch.equal(logits, before)
    assert probs.shape == logits.shape
    assert torch.allclose(probs.sum(-1), torch.ones(2, 3))
    assert processor.sample(probs).shape == (2, 3)


def test_greedy_is_one_hot_argmax():
    probs = GreedyProcessor()(LOGITS)
    assert probs.tolist() == [0, 0, 0, 0, 1]
    assert GreedyProcessor().sample(probs).item() == 4


def test_multinomial_applies_temperature():
    probs = MultinomialProcessor(2.0)(LOGITS)
    assert probs.tolist() == pytest.approx(softmax_of([v / 2 for v in LOGITS.tolist()]))


def test_top_k_keeps_exactly_k():
    probs = TopKProcessor(1.0, 2)(LOGITS)
    expected = softmax_of([2.0, 3.0])
    assert probs.tolist() == pytest.approx([expected[0], 0, 0, 0, expected[1]])


def test_top_k_larger_than_vocabulary_keeps_all():
    assert TopKProcessor(1.0, 100)(LOGITS).tolist() == pytest.approx(softmax_of(LOGITS.tolist()))


def test_nucleus_keeps_smallest_set_reaching_p():
    full = softmax_of(LOGITS.tolist())               # ~[0.237, 0.087, 0.032, 0.012, 0.644]
    probs = NucleusProcessor(1.0, 0.8)(LOGITS)       # 0.644 < 0.8, 0.644 + 0.237 >= 0.8
    kept = full[0] + full[4]
    assert probs.tolist() == pytest.approx([full[0] / kept, 0, 0, 0, full[4] / kept])
    assert NucleusProcessor(1.0, 0.5)(LOGITS).tolist() == pytest.approx([0, 0, 0, 0, 1])


def test_temperature_is_applied_before_nucleus_filtering():
    # At t=0.25 the top token alone holds > 0.9 of the mass; at t=1 it does not.
    assert (NucleusProcessor(0.25, 0.9)(LOGITS) > 0).sum().item() == 1
    assert (NucleusProcessor(1.0, 0.9)(LOGITS) > 0).sum().item() == 3


def test_top_k_then_nucleus():
    probs = TopKNucleusProcessor(1.0, 3, 0.95)(LOGITS)
    top3 = softmax_of([2.0, 1.0, 3.0])                # 0.245, 0.090, 0.665: all needed for 0.95
    assert probs.tolist() == pytest.approx([top3[0], top3[1], 0, 0, top3[2]])


@pytest.mark.parametrize("make", [
    lambda: MultinomialProcessor(0),
    lambda: MultinomialProcessor(-1.0),
    lambda: MultinomialProcessor(float("nan")),
    lambda: TopKProcessor(1.0, 0),
    lambda: TopKProcessor(1.0, 2.5),
    lambda: NucleusProcessor(1.0, 0.0),
    lambda: NucleusProcessor(1.0, 1.5),
    lambda: TopKNucleusProcessor(1.0, 0, 0.9),
    lambda: TopKNucleusProcessor(1.0, 5, -0.1),
])
def test_invalid_settings_raise_value_error(make):
    with pytest.raises(ValueError):
        make()


def test_sampling_uses_the_given_generator():
    probs = MultinomialProcessor(1.0)(torch.zeros(1000, 7))
    a = MultinomialProcessor(1.0).sample(probs, torch.Generator().manual_seed(3))
    b = MultinomialProcessor(1.0).sample(probs, torch.Generator().manual_seed(3))
    c = MultinomialProcessor(1.0).sample(probs, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_sampling_frequencies_match_probabilities():
    probs = TopKProcessor(1.0, 3)(LOGITS)
    draws = TopKProcessor(1.0, 3).sample(probs.expand(20000, -1), torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=5).float() / 20000
    assert freq[2].item() == 0 and freq[3].item() == 0
    assert torch.allclose(freq, probs, atol=0.015)


def test_half_precision_logits_give_float32_probabilities():
    probs = MultinomialProcessor(1.0)(LOGITS.to(torch.bfloat16))
    assert probs.dtype == torch.float32
