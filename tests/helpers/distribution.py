"""The exact-distribution check the sampling tests share: a tiny pair over an 8-token
vocabulary, the target's exact distribution of the first ``STEPS`` tokens (enumerated),
sampled frequencies, and a chi-square distance in standard deviations."""

from __future__ import annotations

import math

import pytest
import torch

from sampling import MultinomialProcessor
from tests.helpers.models import tiny_llama

V = 8
STEPS = 3
SAMPLES = 2000
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]
# 5 standard deviations: a false alarm is rarer than one in a million runs.
BOUND = 5.0
# A goodness-of-fit p-value floor: a correct sampler fails it once in 10,000 runs.
P_FLOOR = 1e-4


def sharp_target():
    """The sampling tests' target: sharp enough that drafts are often accepted and often not."""
    return tiny_llama(10, vocab_size=V, hidden=16, logit_scale=15.0)


def sharp_drafter():
    """The sampling tests' drafter, initialised independently of :func:`sharp_target`."""
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


@pytest.fixture(scope="module")
def target():
    """The sharp target, once per test module that imports this fixture (with :func:`exact`)."""
    return sharp_target()


@pytest.fixture(scope="module")
def exact(target):
    """P(first STEPS tokens) under ``target`` sampled at temperature 1, by enumeration."""
    return exact_distribution(target, MultinomialProcessor(1.0))


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


def sample_counts(run, samples: int = SAMPLES) -> dict:
    """How often each first-``STEPS``-tokens outcome came out of ``samples`` runs of
    ``run(generator)``, all drawing from one seeded generator."""
    generator = torch.Generator().manual_seed(1234)
    counts: dict = {}
    with torch.inference_mode():
        for _ in range(samples):
            tokens = tuple(run(generator).tokens[:STEPS])
            counts[tokens] = counts.get(tokens, 0) + 1
    return counts
