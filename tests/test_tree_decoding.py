"""Decoding with token trees: greedy is token-identical to the target's own
``generate`` on every family of the architecture zoo that takes trees (lookahead
decoding, whose Jacobi window rides beside the tree, included), and every
other family falls back to a chain with one line naming why
(``kvcache.cache.tree_support``); sampling reproduces the exact target
distribution for both drafters."""

import pytest
import torch

import generation.model_drafter
import generation.tree
import generation.tree_forward
import generation.tree_round
import generation.verify
import kvcache.cache
from ngram_assisted import NGramStorage, RecyclingStorage
from sampling import MultinomialProcessor, TopKProcessor
from tests.helpers import arch_zoo
from tests.helpers.decode import nasd, speculative
from tests.helpers.distribution import (
    PROMPT,
    SAMPLES,
    V,
    chi_square_excess,
    exact_distribution,
    sample_counts,
)
from tests.helpers.mutations import shifted_rows

STRATEGIES = arch_zoo.TREE_STRATEGIES


def should_take_trees(name: str) -> bool:
    """This test's own description of a model that can verify a tree, independent
    of the engine's rule: a decoder whose every layer is an attention layer
    (the zoo's kinds "attention" and "sliding"), with eager or sdpa attention."""
    fam = arch_zoo.family(name)
    return (fam.kind in ("attention", "sliding") and not fam.encoder_decoder
            and fam.attn_implementation in (None, "eager", "sdpa"))


# Every family: every strategy where a tree is expected (a broken tree mask
# shows in different strategies on different families, so none is left out);
# where a chain is, speculative (the fallback line is the same whatever drafts)
# and lookahead (whose chain fallback proposes from a pool nothing fills).
CASES = [(name, strategy) for name in arch_zoo.FAMILIES
         for strategy in (STRATEGIES if should_take_trees(name) else ("speculative", "lookahead"))]


def checked(outcome: arch_zoo.Outcome, name: str) -> arch_zoo.Outcome:
    """Skip a family this transformers lacks, or whose cache it refuses outright
    (no chain either: tests/test_architectures.py covers the refusal)."""
    if outcome.status == "skip" or (outcome.status == "refused" and not should_take_trees(name)):
        pytest.skip(outcome.detail)
    return outcome


@pytest.mark.parametrize("name, strategy", CASES)
def test_greedy_tree_equals_generate(name, strategy):
    outcome = checked(arch_zoo.guarded(lambda: arch_zoo.check_tree(name, strategy)), name)
    assert outcome.passed, outcome.detail


def tree_families() -> tuple[set[str], set[str]]:
    """(families whose target tree_support accepts, families checked), of those
    this transformers can build; a refused cache counts as no tree."""
    takes, checked_names = set(), set()
    for name in arch_zoo.FAMILIES:
        try:
            reason = arch_zoo.tree_reason(name)
        except arch_zoo.FamilyUnavailable:
            continue
        except kvcache.cache.UnsupportedCacheError:
            reason = "refused"
        checked_names.add(name)
        if reason is None:
            takes.add(name)
    return takes, checked_names


def test_the_families_taking_trees_are_the_attention_only_decoders():
    takes, names = tree_families()
    assert takes == {n for n in names if should_take_trees(n)}


def test_an_over_broad_rule_is_caught(monkeypatch):
    """Mutation: a rule refusing every model with sliding layers changes the set."""
    real = kvcache.cache.tree_support

    def no_sliding(cached):
        return "sliding layers" if "sliding_attention" in cached.attention_kinds() else real(cached)

    monkeypatch.setattr(kvcache.cache, "tree_support", no_sliding)
    takes, names = tree_families()
    assert takes != {n for n in names if should_take_trees(n)}


def expected_obstacle(name: str) -> str | None:
    """This test's own word for why a family cannot take a tree (None: it can)."""
    fam = arch_zoo.family(name)
    if fam.encoder_decoder:
        return "takes no decoder position ids"
    if fam.kind in ("recurrent", "hybrid"):
        return "a recurrent or conv state cannot hold branches"
    return None


def obstacle_mismatches() -> list[tuple[str, str]]:
    """(family, reason) where the fallback line does not name the family's obstacle.

    One allowance: where transformers' own cache for a model holds attention
    layers only (4.57 keeps RecurrentGemma's state inside its modules), the
    engine cannot see the state, and the probe's wrong cached forward is the reason."""
    wrong = []
    for name in arch_zoo.FAMILIES:
        want = expected_obstacle(name)
        if want is None:
            continue
        try:
            reason = arch_zoo.tree_reason(name)
        except (arch_zoo.FamilyUnavailable, kvcache.cache.UnsupportedCacheError):
            continue
        if reason is not None and want in reason:
            continue
        if reason is not None and not arch_zoo.family(name).encoder_decoder and "so it runs" in reason:
            layers = {type(layer).__name__ for layer in kvcache.cache.new_cache(arch_zoo.build(name)).layers}
            if layers <= {"DynamicLayer", "DynamicSlidingWindowLayer"}:
                continue
        wrong.append((name, reason))
    return wrong


def test_each_chain_family_names_its_obstacle():
    assert obstacle_mismatches() == []


def test_a_reason_that_blames_the_cache_is_caught(monkeypatch):
    """Mutation: a model the probe runs uncached reported as "the cache is off"
    (the reason before the layers were read from an empty cache)."""
    real = kvcache.cache.tree_support
    monkeypatch.setattr(kvcache.cache, "tree_support",
                        lambda cached: "the cache is off" if cached.cache is None else real(cached))
    assert obstacle_mismatches()


def test_a_cache_turned_off_is_the_reason():
    cached = kvcache.cache.CachedModel(arch_zoo.build("llama"), use_cache=False)
    cached.begin(list(arch_zoo.PROMPTS[0]))
    assert kvcache.cache.tree_support(cached) == "the cache is off"


def test_a_recurrent_model_given_a_tree_is_caught(monkeypatch):
    """Mutation: a rule letting every cached model take trees. Qwen3-Next's
    linear-attention layers then run a tree's siblings as one sequence through
    their recurrent state, and the tokens go wrong."""
    for module in (kvcache.cache, generation.verify, generation.model_drafter):
        monkeypatch.setattr(module, "tree_support", lambda cached: None)
    outcome = checked(arch_zoo.guarded(lambda: arch_zoo.check_tree("qwen3_next", "speculative")), "qwen3_next")
    assert not outcome.passed


@pytest.mark.parametrize("strategy", ["speculative", "recycling"])
def test_greedy_catches_a_wrong_row(monkeypatch, strategy):
    monkeypatch.setattr(generation.tree_round, "accept_tree", shifted_rows(generation.tree_round.accept_tree))
    assert not arch_zoo.check_tree("llama", strategy).passed


def blind_nodes(real):
    """Mutation: tree nodes see the prefix and themselves, not their ancestors."""
    def visibility(tree, past, chain, device=None, extra=generation.tree.NO_EXTRA):
        rows = real(tree, past, chain, device, extra)
        n = len(tree)
        rows[chain:chain + n, past + chain:past + chain + n] = torch.eye(n, dtype=torch.bool, device=rows.device)
        return rows
    return visibility


def no_window(real):
    """Mutation: sliding layers get their keys but no window inside the mask."""
    def layer_mask(visible, positions, *, window, dtype):
        mask = real(visible, positions, window=None, dtype=dtype)
        if window is None:
            return mask
        past = visible.shape[1] - visible.shape[0]
        return mask[..., max(past - window + 1, 0):]
    return layer_mask


@pytest.mark.parametrize("name, attribute, mutation", [
    ("deepseek_v3", "visibility", blind_nodes),      # latent attention
    ("gpt_oss", "layer_mask", no_window),            # attention sinks, sliding and full layers
    ("gemma4", "layer_mask", no_window),             # two sliding layers, then a full one
])
def test_a_broken_tree_mask_is_caught(monkeypatch, name, attribute, mutation):
    """The three strategies together (as the test above runs them) catch a broken
    mask; which one does depends on the family and on the weights of the version."""
    monkeypatch.setattr(generation.tree_forward, attribute, mutation(getattr(generation.tree_forward, attribute)))
    outcomes = [checked(arch_zoo.guarded(lambda: arch_zoo.check_tree(name, s)), name) for s in STRATEGIES]
    assert not all(o.passed for o in outcomes)


# ------------------------------------------------------------------ sampling

def tree_run(kind, target, drafter, processor):
    if kind == "speculative":
        return lambda g: speculative(PROMPT, drafter, target, processor=processor, gamma=3, max_gen_len=3,
                                     generator=g, tree=6, tree_branch=2)
    storage = (lambda: NGramStorage(2, V)) if kind == "nasd" else (lambda: RecyclingStorage(2, V, width=3))
    return lambda g: nasd(PROMPT, storage(), target, gamma=3, filler_top_k=2, processor=processor, max_gen_len=3,
                          generator=g, tree=6, tree_branch=2)


@pytest.mark.parametrize("kind, processor", [
    ("speculative", MultinomialProcessor(1.0)), ("speculative", TopKProcessor(1.0, 4)),
    ("nasd", MultinomialProcessor(1.0)), ("recycling", TopKProcessor(1.0, 4)),
], ids=str)
def test_tree_sampling_reproduces_target_distribution(target, drafter, kind, processor):
    counts = sample_counts(tree_run(kind, target, drafter, processor))
    assert chi_square_excess(counts, exact_distribution(target, processor), SAMPLES) < 5.0


MUTANT_SAMPLES = 600


@pytest.mark.parametrize("kind", ["speculative"])
def test_tree_sampling_catches_a_wrong_row(monkeypatch, target, drafter, kind):
    monkeypatch.setattr(generation.tree_round, "accept_tree", shifted_rows(generation.tree_round.accept_tree))
    processor = MultinomialProcessor(1.0)
    # A wrong row is far off (93 standard deviations at SAMPLES draws): 600 show it at over 20,
    # and a check the 2000-draw test beside it passes cannot be weaker than one with fewer.
    counts = sample_counts(tree_run(kind, target, drafter, processor), MUTANT_SAMPLES)
    assert chi_square_excess(counts, exact_distribution(target, processor), MUTANT_SAMPLES) > 5.0


def test_trees_branch_and_second_choices_get_taken(target, drafter):
    """The sampling runs above verify real trees, and a rank > 0 child is taken
    sometimes, so the branching paths are exercised."""
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for kind in ("speculative", "recycling"):
            rounds = [r for _ in range(100) for r in tree_run(kind, target, drafter, MultinomialProcessor(1.0))(g).trace]
            assert any(r.tree_size > r.gamma for r in rounds), kind
            assert any(any(rank > 0 for rank in r.ranks) for r in rounds), kind
