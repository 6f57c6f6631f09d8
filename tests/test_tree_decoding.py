"""Decoding with token trees: greedy is token-identical to the target's own
``generate`` on the families that take trees (recurrent ones fall back to a
chain with one line), and sampling reproduces the exact target distribution
for both drafters."""

import pytest
import torch

import generation.tree_round
from generation import speculative_generate
from ngram_assisted import NGramStorage, RecyclingStorage, ngram_assisted_speculative_generate
from sampling import MultinomialProcessor, TopKProcessor
from tests import arch_zoo
from tests.test_distribution import PROMPT, SAMPLES, V, chi_square_excess, exact_distribution, sample_counts
from tests.tiny_models import tiny_llama

STRATEGIES = ("speculative", "nasd", "recycling")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("name", arch_zoo.TREE_FAMILIES + arch_zoo.TREE_FALLBACK_FAMILIES[:1])
def test_greedy_tree_equals_generate(name, strategy):
    outcome = arch_zoo.check_tree(name, strategy)
    assert outcome.passed, outcome.detail


def shifted_rows(real):
    """Mutation: each node's draw taken from the row of the node after it (an off-by-one)."""
    def accept(p, *args, **kwargs):
        return real(torch.cat([p[1:], p[-1:]]), *args, **kwargs)
    return accept


@pytest.mark.parametrize("strategy", ["speculative", "recycling"])
def test_greedy_catches_a_wrong_row(monkeypatch, strategy):
    monkeypatch.setattr(generation.tree_round, "accept_tree", shifted_rows(generation.tree_round.accept_tree))
    assert not arch_zoo.check_tree("llama", strategy).passed


# ------------------------------------------------------------------ sampling

@pytest.fixture(scope="module")
def target():
    return tiny_llama(10, vocab_size=V, hidden=16, logit_scale=15.0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_llama(11, vocab_size=V, hidden=16, logit_scale=15.0)


def tree_run(kind, target, drafter, processor):
    if kind == "speculative":
        return lambda g: speculative_generate(PROMPT, drafter, target, logits_processor=processor, gamma=3,
                                              max_gen_len=3, generator=g, tree=6, tree_branch=2)
    storage = (lambda: NGramStorage(2, V)) if kind == "nasd" else (lambda: RecyclingStorage(2, V, width=3))
    return lambda g: ngram_assisted_speculative_generate(
        PROMPT, storage(), target, gamma=3, filler_top_k=2, logits_processor=processor, max_gen_len=3,
        generator=g, tree=6, tree_branch=2)


@pytest.mark.parametrize("kind, processor", [
    ("speculative", MultinomialProcessor(1.0)), ("speculative", TopKProcessor(1.0, 4)),
    ("nasd", MultinomialProcessor(1.0)), ("recycling", TopKProcessor(1.0, 4)),
], ids=str)
def test_tree_sampling_reproduces_target_distribution(target, drafter, kind, processor):
    counts = sample_counts(tree_run(kind, target, drafter, processor))
    assert chi_square_excess(counts, exact_distribution(target, processor), SAMPLES) < 5.0


@pytest.mark.parametrize("kind", ["speculative"])
def test_tree_sampling_catches_a_wrong_row(monkeypatch, target, drafter, kind):
    monkeypatch.setattr(generation.tree_round, "accept_tree", shifted_rows(generation.tree_round.accept_tree))
    processor = MultinomialProcessor(1.0)
    counts = sample_counts(tree_run(kind, target, drafter, processor))
    assert chi_square_excess(counts, exact_distribution(target, processor), SAMPLES) > 5.0


def test_trees_branch_and_second_choices_get_taken(target, drafter):
    """The sampling runs above verify real trees, and a rank > 0 child is taken
    sometimes, so the branching paths are exercised."""
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for kind in ("speculative", "recycling"):
            rounds = [r for _ in range(100) for r in tree_run(kind, target, drafter, MultinomialProcessor(1.0))(g).trace]
            assert any(r.tree_size > r.gamma for r in rounds), kind
            assert any(any(rank > 0 for rank in r.ranks) for r in rounds), kind
