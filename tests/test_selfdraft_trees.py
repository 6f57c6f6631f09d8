"""Self-drafters with token trees and the inspector.

A self-drafter grows its tree on the round cache (the target's own layers, or
the cast copy): greedy decoding with trees equals transformers' ``generate``
and the tree is really used; the target's cache after a tree draft is
tensor-equal to the cache before it; sampling with trees keeps the exact target
distribution; the inspector's q under greedy is the drafter's own softmax at
the drafted position. Each guarantee has a mutation that must fail it.
"""

from __future__ import annotations

import pytest
import torch

import generation.tree_round
import model_drafters.selfdraft.drafter
from model_drafters import selfdraft
from sampling import GreedyProcessor, MultinomialProcessor, TopKProcessor
from kvcache import shared as shared_cache
from model_drafters.selfdraft.build import build_self_drafter
from model_drafters.selfdraft.drafter import SelfDrafter
from model_drafters.selfdraft.spec import parse_self_draft
from tests.helpers import arch_zoo
from tests.helpers.arch_zoo import PROMPTS, build
from tests.helpers.decode import speculative
from tests.helpers.devices import INT8_MISSING, needs_int8
from tests.helpers.distribution import PROMPT, STEPS, V, chi_square_excess, exact_distribution
from tests.helpers.mutations import shifted_rows
from tests.helpers.models import tiny_llama
from kvcache.probe import cached_model
from kvcache.cache import CachedModel, tree_support

GREEDY = GreedyProcessor()
LENGTH = arch_zoo.LENGTH
NODES, BRANCH = 10, 3
MODES = {"self:skip=1": "view", "self:int8": "view", "self:bf16": "copy"}
# self:int8 is skipped (one line) where its route's package is missing (optimum-quanto off a CPU).
KINDS = [pytest.param(k, marks=needs_int8) if k == "self:int8" else k for k in MODES]


def _generate(drafter, target, prompt, processor=GREEDY, **kw):
    options = dict(gamma=4, max_gen_len=LENGTH, tree=NODES, tree_branch=BRANCH) | kw
    return speculative(list(prompt), drafter, target, processor=processor, **options)


@pytest.fixture(scope="module")
def llama():
    return build("llama")


@pytest.fixture(scope="module")
def drafters(llama):
    return {kind: build_self_drafter(llama, parse_self_draft(kind)) for kind in MODES
            if kind != "self:int8" or not INT8_MISSING}


# ----------------------------------------------------------------- greedy

@pytest.mark.parametrize("kind", KINDS)
def test_greedy_trees_equal_generate_and_the_tree_is_used(kind, llama, drafters):
    wide = 0
    for prompt in PROMPTS:
        got = _generate(drafters[kind], llama, prompt)
        assert got.tokens == list(arch_zoo.reference("llama", prompt)), kind
        assert not got.tree_fallback, got.tree_fallback
        assert got.rollback["drafter"]["method"] == "shared"          # drafted on the target's cache
        wide += sum(r.tree_size > 1 for r in got.trace)
    assert wide > 0                                                   # real trees were verified


def test_a_skip_drafter_on_sliding_layers_takes_trees_too():
    """Qwen2 mixes full and sliding layers: the view keeps each kind's mask. (Where the
    installed transformers cannot record a sliding layer's past, the target itself verifies
    chains, and says why.)"""
    target = build("qwen2")
    drafter = build_self_drafter(target, parse_self_draft("self:skip=1"))
    probe = cached_model(target)
    probe.begin(list(PROMPTS[0]))
    target_reason = tree_support(probe)
    for prompt in PROMPTS:
        got = _generate(drafter, target, prompt)
        assert got.tokens == list(arch_zoo.reference("qwen2", prompt))
        if target_reason is None:
            assert not got.tree_fallback and any(r.tree_size > 1 for r in got.trace)
        else:
            assert target_reason in got.tree_fallback


# ------------------------------------------------------------ the cache

def _state(cached: CachedModel) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys.clone(), layer.values.clone()) for layer in shared_cache._layers(cached.cache)]


def _tree_round(kind, llama, drafters):
    """Prefill the target for PROMPTS[0], draft one tree; returns (cache before, cache after, tree, drafter)."""
    prompt = list(PROMPTS[0])
    cached = cached_model(llama)
    start = cached.begin(prompt)
    drafter = SelfDrafter(drafters[kind], GREEDY)
    drafter.attach_target(cached)
    drafter.begin(prompt)
    ids = torch.tensor([start])
    with torch.inference_mode():
        drafter.fill_target(ids)
        before = _state(cached)
        tree = drafter.propose_tree(ids, 4, NODES, BRANCH)
    assert drafter.mode == MODES[kind]
    assert cached.length == len(prompt) - 1
    return before, _state(cached), tree, drafter


def _same(before, after) -> bool:
    return len(before) == len(after) and all(
        torch.equal(k0, k1) and torch.equal(v0, v1) for (k0, v0), (k1, v1) in zip(before, after))


@pytest.mark.parametrize("kind", KINDS)
def test_a_tree_draft_leaves_the_target_cache_exactly_as_it_was(kind, llama, drafters):
    before, after, tree, drafter = _tree_round(kind, llama, drafters)
    assert _same(before, after)
    assert len(tree) == NODES and any(rank > 0 for rank in tree.ranks)   # a real tree, with branches
    assert drafter.calls == 4                                           # root, then one forward per level
    with torch.inference_mode():                                        # a sampled tree likewise
        sampled, q = drafter.propose_sampled_tree(torch.tensor([list(PROMPTS[0])]), 3, 6, 2)
    assert _same(before, _state(drafter.target)) and q.shape[0] == len(sampled) + 1 > 2
    if drafter.mode == "copy":                                          # the cast copy holds the committed only
        assert drafter.cache.get_seq_length() == len(PROMPTS[0]) - 1


def _keep_the_root(monkeypatch):
    """Mutation: the tree's nodes are dropped but its root stays in the target's layers."""
    real = selfdraft.drafter.draft_tree
    monkeypatch.setattr(selfdraft.drafter, "draft_tree", lambda *a, **kw: real(*a, **(kw | {"drop_root": False})))


def test_a_tree_root_left_in_the_target_cache_is_caught(monkeypatch, llama, drafters):
    _keep_the_root(monkeypatch)
    before, after, _, _ = _tree_round("self:skip=1", llama, drafters)
    assert not _same(before, after)
    try:
        tokens = _generate(drafters["self:skip=1"], llama, PROMPTS[0]).tokens
    except RuntimeError:  # a cache one position too long may also break the mask's shape
        tokens = None
    assert tokens != list(arch_zoo.reference("llama", PROMPTS[0]))


# --------------------------------------------------------------- sampling

@pytest.fixture(scope="module")
def small():
    return tiny_llama(10, vocab_size=V, hidden=16, logit_scale=15.0)


# Fewer runs than tests/test_distribution.py's 2000 (a self-drafter run costs more);
# the wrong row below still scores above 20 standard deviations.
RUNS = 400


def _counts(drafter, target, processor, sample: bool = False) -> tuple[dict, bool]:
    """First STEPS tokens of RUNS seeded tree runs, and whether some round verified a tree wider
    than a chain by the rule asked for (``sample``: children drawn from q, recursive rejection sampling)."""
    generator = torch.Generator().manual_seed(1234)
    counts, wide = {}, False
    with torch.inference_mode():
        for _ in range(RUNS):
            result = speculative(PROMPT, drafter, target, processor=processor, gamma=3,
                                 max_gen_len=STEPS, generator=generator, tree=6, tree_branch=2,
                                 tree_sample=sample)
            key = tuple(result.tokens[:STEPS])
            counts[key] = counts.get(key, 0) + 1
            wide = wide or (result.tree_rule == ("sampled" if sample else "top")
                            and any(r.tree_size > r.gamma for r in result.trace))
    return counts, wide


@pytest.mark.any_release
def test_tree_sampling_keeps_the_target_distribution(small):
    """On the target's own layers (self:skip, view): the drafts come from the shared cache."""
    processor = MultinomialProcessor(1.0)
    drafter = build_self_drafter(small, parse_self_draft("self:skip=1"))
    counts, wide = _counts(drafter, small, processor)
    assert wide
    assert chi_square_excess(counts, exact_distribution(small, processor), RUNS) < 5.0


@pytest.mark.any_release
def test_tree_sampling_with_a_wrong_row_is_caught(monkeypatch, small):
    """The same check has the power to see a biased rule: each node's draw from the next node's row."""
    monkeypatch.setattr(generation.tree_round, "accept_tree", shifted_rows(generation.tree_round.accept_tree))
    processor = MultinomialProcessor(1.0)
    drafter = build_self_drafter(small, parse_self_draft("self:skip=1"))
    counts, _ = _counts(drafter, small, processor)
    assert chi_square_excess(counts, exact_distribution(small, processor), RUNS) > 5.0


@pytest.mark.any_release
def test_sampled_trees_keep_the_target_distribution(small):
    """Children drawn from q on the cast copy (self:bf16), verified by recursive rejection sampling."""
    processor = TopKProcessor(1.0, 4)
    drafter = build_self_drafter(small, parse_self_draft("self:bf16"))
    counts, wide = _counts(drafter, small, processor, sample=True)
    assert wide
    assert chi_square_excess(counts, exact_distribution(small, processor), RUNS) < 5.0


@pytest.mark.any_release
def test_sampled_trees_whose_children_are_picked_not_drawn_are_caught(monkeypatch, small):
    """Mutation: each node's children are q's top tokens, not draws (the rule is then biased)."""
    import math

    import generation.tree_draft

    def picked(q, counts, generator):
        top = q.topk(max(counts, default=0), dim=-1)
        return [[(t, math.log(v)) for t, v in zip(ts[:n], vs[:n]) if v > 0]
                for ts, vs, n in zip(top.indices.tolist(), top.values.tolist(), counts)]

    monkeypatch.setattr(generation.tree_draft, "draw_children", picked)
    processor = TopKProcessor(1.0, 4)
    drafter = build_self_drafter(small, parse_self_draft("self:bf16"))
    counts, _ = _counts(drafter, small, processor, sample=True)
    assert chi_square_excess(counts, exact_distribution(small, processor), RUNS) > 5.0


# -------------------------------------------------------------- inspector

def _skip_reference(target, ids: list[int]) -> torch.Tensor:
    """Draft&Verify's first draft: the target with layer 1 passing its input through at the
    last position only (full-model keys for the committed tokens), (V,) logits."""
    from tests.helpers.selfdraft import identity_hooks

    handles = identity_hooks(target, [1], last_only=True)
    try:
        with torch.inference_mode():
            return target(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
    finally:
        for h in handles:
            h.remove()


def _prefixes(prompt, trace):
    out, seq = [], list(prompt)
    for rnd in trace:
        out.append(list(seq))
        seq += list(rnd.drafted[:rnd.accepted]) + ([rnd.token] if rnd.token is not None else [])
    return out


def check_skip_inspector(result, prompt, target) -> None:
    """Under greedy every shown q is a softmax (not one-hot) whose argmax is the draft; the
    first of each round equals the Draft&Verify reference."""
    for rnd, prefix in zip(result.trace, _prefixes(prompt, result.trace)):
        positions = rnd.inspection.positions
        assert rnd.inspection.shown == "softmax" and len(positions) == len(rnd.drafted)
        for x, pos in zip(rnd.drafted, positions):
            assert pos.q_top[0][0] == x and pos.q < 1.0 and pos.entropy_q > 0
        want = _skip_reference(target, prefix).softmax(-1)
        assert positions[0].q == pytest.approx(float(want[rnd.drafted[0]]), abs=2e-4)
        assert positions[0].entropy_q == pytest.approx(float(torch.special.entr(want).sum()), abs=1e-3)


def test_the_inspector_shows_the_self_drafters_softmax(llama, drafters):
    prompt = list(PROMPTS[0])
    result = speculative(prompt, drafters["self:skip=1"], llama, processor=GREEDY,
                         gamma=3, max_gen_len=16)
    assert result.rollback["drafter"]["method"] == "shared"
    check_skip_inspector(result, prompt, llama)


def test_draft_logits_a_row_late_is_caught(monkeypatch, llama, drafters):
    real = SelfDrafter.draft_logits

    def late(self):
        rows = real(self)
        return None if rows is None else torch.cat([rows[1:], rows[-1:]])

    monkeypatch.setattr(SelfDrafter, "draft_logits", late)
    prompt = list(PROMPTS[0])
    result = speculative(prompt, drafters["self:skip=1"], llama, processor=GREEDY,
                         gamma=3, max_gen_len=16)
    with pytest.raises(AssertionError):
        check_skip_inspector(result, prompt, llama)


def test_an_own_cache_self_drafter_hands_over_its_model_drafters_logits(llama, drafters):
    """Cache off: the self-drafter drafts as a ModelDrafter; the inspector equals a recomputation."""
    from tests.helpers.inspection import check_rounds

    prompt = list(PROMPTS[1])
    model = drafters["self:skip=1"]
    result = speculative(prompt, model, llama, processor=GREEDY, gamma=3, max_gen_len=12,
                         use_cache=False)
    assert result.rollback["drafter"]["method"] == "none"
    check_rounds(result, prompt, llama, model, GREEDY)
