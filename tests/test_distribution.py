"""Under sampling, speculative decoding and NASD reproduce the target's exact
distribution. On a tiny vocabulary the distribution of the first three tokens is
enumerated from the target and compared with sampled frequencies (chi-square).

The same test, run with the classic mistakes patched in (resampling from p
instead of the residual; a fresh draw from p on an n-gram mismatch), must fail:
that shows the test has the power to catch them.
"""

import itertools
import math

import pytest
import torch

import generation.accept
from generation import speculative_generate
from ngram_assisted import NGramStorage, ngram_assisted_speculative_generate
from sampling import MultinomialProcessor, NucleusProcessor, TopKProcessor
from tests.tiny_models import tiny_llama

V = 8
STEPS = 3
SAMPLES = 2000
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]
PROCESSORS = [MultinomialProcessor(1.0), TopKProcessor(1.0, 4), NucleusProcessor(1.0, 0.8)]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(10, vocab_size=V, hidden=16, logit_scale=15.0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_llama(11, vocab_size=V, hidden=16, logit_scale=15.0)


def exact_distribution(model, processor) -> dict[tuple[int, ...], float]:
    """P(first STEPS tokens) = product of the processed target distributions."""
    probs = {(): 1.0}
    with torch.inference_mode():
        for _ in range(STEPS):
            prefixes = [p for p, mass in probs.items() if mass > 0]
            batch = torch.tensor([PROMPT + list(p) for p in prefixes])
            step = processor(model(batch).logits[:, -1, :])
            probs = {p + (t,): probs[p] * step[i, t].item()
                     for i, p in enumerate(prefixes) for t in range(V)}
    return probs


def chi_square_excess(counts: dict, exact: dict, n: int) -> float:
    """Chi-square statistic in units of its standard deviation above its mean.

    Outcomes expected fewer than 5 times are pooled into one bin. Sampling an
    outcome of probability 0 is reported as infinitely far off.
    """
    if any(exact.get(k, 0.0) == 0.0 for k in counts):
        return math.inf
    stat, bins, pooled_obs, pooled_exp = 0.0, 0, 0, 0.0
    for outcome, prob in exact.items():
        expected = prob * n
        observed = counts.get(outcome, 0)
        if expected < 5:
            pooled_obs += observed
            pooled_exp += expected
            continue
        stat += (observed - expected) ** 2 / expected
        bins += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        bins += 1
    dof = bins - 1
    return (stat - dof) / math.sqrt(2 * dof)


def sample_counts(run) -> dict:
    generator = torch.Generator().manual_seed(1234)
    counts: dict = {}
    with torch.inference_mode():
        for _ in range(SAMPLES):
            tokens = tuple(run(generator).tokens[:STEPS])
            counts[tokens] = counts.get(tokens, 0) + 1
    return counts


def speculative_run(drafter, target, processor):
    return lambda g: speculative_generate(PROMPT, drafter, target, logits_processor=processor,
                                          gamma=3, max_gen_len=STEPS, generator=g)


def nasd_run(target, processor):
    return lambda g: ngram_assisted_speculative_generate(
        PROMPT, NGramStorage(2, V), target, gamma=3, filler_top_k=1,
        logits_processor=processor, max_gen_len=STEPS, generator=g)


# 5 standard deviations: a false alarm is rarer than one in a million runs.
BOUND = 5.0


@pytest.mark.parametrize("processor", PROCESSORS, ids=repr)
def test_speculative_reproduces_target_distribution(target, drafter, processor):
    counts = sample_counts(speculative_run(drafter, target, processor))
    assert chi_square_excess(counts, exact_distribution(target, processor), SAMPLES) < BOUND


@pytest.mark.parametrize("processor", PROCESSORS, ids=repr)
def test_nasd_reproduces_target_distribution(target, processor):
    counts = sample_counts(nasd_run(target, processor))
    assert chi_square_excess(counts, exact_distribution(target, processor), SAMPLES) < BOUND


def resample_from_p(p, q, draft):
    """The classic mistake: on rejection, draw from p (for n-grams: a fresh
    sample) instead of the residual norm(max(0, p - q))."""
    return p


@pytest.mark.parametrize("make_run", [
    lambda t, d, proc: speculative_run(d, t, proc),
    lambda t, d, proc: nasd_run(t, proc),
], ids=["speculative", "nasd"])
def test_the_classic_mistake_is_caught(monkeypatch, target, drafter, make_run):
    processor = MultinomialProcessor(1.0)
    monkeypatch.setattr(generation.accept, "residual_distributions", resample_from_p)
    counts = sample_counts(make_run(target, drafter, processor))
    assert chi_square_excess(counts, exact_distribution(target, processor), SAMPLES) > BOUND


def test_drafts_are_actually_exercised(target, drafter):
    """Both strategies draft and both accept and reject under sampling here,
    so the distribution tests above cover the accept and the resample paths."""
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for run in (speculative_run(drafter, target, MultinomialProcessor(1.0)),
                    nasd_run(target, MultinomialProcessor(1.0))):
            results = [run(g) for _ in range(200)]
            drafted = sum(r.drafted for r in results)
            accepted = sum(r.accepted for r in results)
            assert 0 < accepted < drafted


def test_exact_distribution_sums_to_one(target):
    total = sum(exact_distribution(target, MultinomialProcessor(1.0)).values())
    assert total == pytest.approx(1.0, abs=1e-5)
    assert len(list(itertools.product(range(V), repeat=STEPS))) == V ** STEPS
