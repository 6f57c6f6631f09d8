"""Under sampling, speculative decoding and NASD reproduce the target's exact
distribution. On a tiny vocabulary the distribution of the first three tokens is
enumerated from the target and compared with sampled frequencies (chi-square).

The same test, run with the classic mistakes patched in (resampling from p
instead of the residual; a fresh draw from p on an n-gram mismatch), must fail:
that shows the test has the power to catch them.
"""

import itertools

import pytest
import torch

import generation.accept
from ngram_assisted import NGramStorage
from sampling import MultinomialProcessor, NucleusProcessor, TopKProcessor
from tests.helpers.decode import nasd, speculative
from tests.helpers.distribution import (
    BOUND,
    PROMPT,
    SAMPLES,
    STEPS,
    V,
    chi_square_excess,
    exact_distribution,
    sample_counts,
)

PROCESSORS = [MultinomialProcessor(1.0), TopKProcessor(1.0, 4), NucleusProcessor(1.0, 0.8)]


def speculative_run(drafter, target, processor):
    return lambda g: speculative(PROMPT, drafter, target, processor=processor, gamma=3, max_gen_len=STEPS,
                                 generator=g)


def nasd_run(target, processor):
    return lambda g: nasd(PROMPT, NGramStorage(2, V), target, gamma=3, filler_top_k=1, processor=processor,
                          max_gen_len=STEPS, generator=g)


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
