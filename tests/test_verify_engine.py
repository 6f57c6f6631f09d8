"""The chain verify rules (generation/verify_rules.py) through the engine's one way in.

tests/test_verify_rules.py proves each rule exact on hand-built distributions; here the rules run
inside the verify loop on tiny random models: greedy output equals target AR for every rule, drafter
and γ, and under sampling block and strict reproduce the target's exact distribution of the first
tokens (multinomial, top-k, nucleus; a model drafter and an n-gram one). A block rule that draws
its correction from p instead of its scaled residual must fail the same χ² check.
"""

from __future__ import annotations

import pytest
import torch

import generation.verify_rules
from ngram_assisted import NGramStorage
from sampling import GreedyProcessor, MultinomialProcessor, NucleusProcessor, TopKProcessor
from tests.helpers.decode import autoregressive, nasd, speculative
from tests.helpers.distribution import (BOUND, PROMPT, SAMPLES, STEPS, V, chi_square_excess, exact_distribution,
                                        sample_counts)
from tests.helpers.models import tiny_llama

RULES = ("residual", "block", "strict")
PROCESSORS = [MultinomialProcessor(1.0), TopKProcessor(1.0, 4), NucleusProcessor(1.0, 0.8)]


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_every_rule_is_target_ar(rule, gamma):
    target, drafter = tiny_llama(0, logit_scale=8.0), tiny_llama(1, logit_scale=8.0)
    prompt = [3, 9, 4, 3, 9, 4, 3, 9]
    want = autoregressive(prompt, target, processor=GreedyProcessor(), max_gen_len=40).tokens
    spec = speculative(prompt, drafter, target, processor=GreedyProcessor(), gamma=gamma, max_gen_len=40,
                       verify=rule)
    ngram = nasd(prompt, NGramStorage(2, 64), target, processor=GreedyProcessor(), gamma=gamma, max_gen_len=40,
                 verify=rule)
    assert spec.tokens == want and ngram.tokens == want
    assert spec.verify_rule == ngram.verify_rule == rule
    assert 0 < spec.accepted < spec.drafted          # drafts were judged both ways


@pytest.mark.parametrize("rule, processor", [("block", p) for p in PROCESSORS] + [("strict", PROCESSORS[0])],
                         ids=lambda v: v if isinstance(v, str) else repr(v))
def test_speculative_keeps_the_distribution(target, drafter, processor, rule):
    run = lambda g: speculative(PROMPT, drafter, target, processor=processor, gamma=3, max_gen_len=STEPS,
                                generator=g, verify=rule, inspect=False)
    assert chi_square_excess(sample_counts(run), exact_distribution(target, processor), SAMPLES) < BOUND


@pytest.mark.parametrize("rule", ["block"])
def test_nasd_keeps_the_distribution(target, rule):
    processor = MultinomialProcessor(1.0)
    run = lambda g: nasd(PROMPT, NGramStorage(2, V), target, processor=processor, gamma=3, max_gen_len=STEPS,
                         generator=g, verify=rule, inspect=False)
    assert chi_square_excess(sample_counts(run), exact_distribution(target, processor), SAMPLES) < BOUND


def _plain_p(p: torch.Tensor, residuals: torch.Tensor) -> torch.Tensor:
    """Block's correction drawn from p itself instead of the scaled residual (the classic mistake)."""
    return p


def test_block_resampling_from_p_is_caught(target, drafter, monkeypatch):
    # The subtler mutations (first failure, unscaled residual, threshold without the residual
    # mass) are caught by the exact laws of tests/test_verify_rules.py; 2000 draws on this pair
    # do not reliably separate them.
    monkeypatch.setattr(generation.verify_rules, "_corrections", _plain_p)
    processor = MultinomialProcessor(1.0)
    run = lambda g: speculative(PROMPT, drafter, target, processor=processor, gamma=3, max_gen_len=STEPS,
                                generator=g, verify="block", inspect=False)
    assert chi_square_excess(sample_counts(run), exact_distribution(target, processor), SAMPLES) > BOUND
