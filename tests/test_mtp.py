"""``--drafter mtp``: drafting with the target's own MTP layers (``mtp/``).

Targets are tiny random DeepSeek-V3 and GLM-4.5 models. The loading tests save one
with the real checkpoint's number of main layers (61, 46: transformers finds MTP
weights by those layer numbers) and its MTP layers right after them, and load it back
through ``engine.load_pair(DIR, "mtp")``, the path ``--target DIR --drafter mtp``
takes. The MTP layers are initialised independently of the target and wide, so
drafts are often rejected. Every drafted chain's logits are held against a
recomputation from nothing (``tests.helpers.mtp.reference_logits``); a cache that is
not rolled back, or hidden states from the wrong layer, must fail that check.
"""

from __future__ import annotations

import pytest
import torch

import model_drafters.mtp.kind
import kvcache.cache
from engine import Strategy, load_pair, pair_of, run_strategy
from model_drafters.mtp import MtpDrafter, MtpRefused
from model_drafters.mtp.model import has_mtp_model, mtp_layers
from sampling import GreedyProcessor
from sampling.spec import ProcessorSpec
from tests.helpers.decode import autoregressive
from tests.helpers.models import tiny_llama
from tests.helpers.tokenizers import word_tokenizer
from tests.helpers.recording import record_chains
from utils.errors import ModelLoadError

HAS_MTP = has_mtp_model()

needs_mtp = pytest.mark.skipif(not HAS_MTP, reason="transformers < 5.24 has no MtpModel (refusal tested below)")
PROMPT = [1, 5, 3, 7, 2, 4]


@pytest.fixture
def recorded(monkeypatch):
    """Chains the engine's MTP drafter proposes during the test (it is looked up where the engine builds it)."""
    return record_chains(monkeypatch, "MtpDrafter")


def speculative(pair, prompt, *, gamma, processor=None, max_gen_len=24, **options):
    strategy = Strategy("speculative", drafter="model", gamma=gamma, max_gen_len=max_gen_len,
                        processor=processor or GreedyProcessor(), **options)
    return run_strategy(strategy, pair, prompt)


def worst_logit_error(target, mtp_model, chains) -> float:
    """The largest |drafter logit - recomputed logit| over every chain, relative to the chain's largest logit."""
    from tests.helpers.mtp import reference_logits

    assert chains, "no chain was recorded: nothing to compare"
    worst = 0.0
    for committed, drafts, logits in chains:
        want = reference_logits(target, mtp_model, committed, drafts)
        worst = max(worst, ((logits - want).abs().max() / want.abs().max()).item())
    return worst


# ------------------------------------------------------------------ loading through --drafter mtp


@pytest.fixture(scope="module", params=["deepseek_v3", "glm4_moe"])
def checkpoint(request, tmp_path_factory):
    """(directory, family): a tiny target with the real layer count and one MTP layer saved after them."""
    if not HAS_MTP:
        pytest.skip("transformers < 5.24 has no MtpModel")
    from tests.helpers.mtp import mtp_layers_for, save_with_mtp, tiny_target

    target = tiny_target(request.param, vocab_size=64)
    folder = save_with_mtp(target, mtp_layers_for(target, 1), tmp_path_factory.mktemp(request.param))
    word_tokenizer(words=[f"w{i}" for i in range(59)]).save_pretrained(folder)
    return folder, request.param


@needs_mtp
def test_load_pair_reads_the_mtp_layers_from_the_checkpoint_and_stays_lossless(checkpoint, recorded):
    folder, family = checkpoint
    pair = load_pair(str(folder), "mtp", device="cpu", dtype="float32")
    layers = pair.drafter
    assert type(layers).__name__ == "MtpModel" and len(layers.layers) == 1
    assert layers.shared_head is pair.target.lm_head                 # the target's head, not a copy
    assert "mtp (1 MTP layer" in pair.drafter_name and "MTP layers" in pair.probe.summary()
    want = autoregressive(PROMPT, pair.target, processor=GreedyProcessor(), max_gen_len=12).tokens
    for gamma in (1, 3):                                            # 3: past the one MTP layer
        result = speculative(pair, PROMPT, gamma=gamma, max_gen_len=12)
        assert result.tokens == want, (family, gamma)
        assert result.drafted > result.accepted                     # rejections happened
    assert worst_logit_error(pair.target, layers, recorded) < 1e-4


@needs_mtp
def test_a_checkpoint_without_the_mtp_weights_is_refused_in_one_line(tmp_path):
    from tests.helpers.mtp import tiny_target

    target = tiny_target("glm4_moe", vocab_size=64)                 # declares one MTP layer
    target.save_pretrained(tmp_path)                                 # ... but saves none
    word_tokenizer(words=[f"w{i}" for i in range(59)]).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        load_pair(str(tmp_path), "mtp", device="cpu")
    message = str(info.value)
    assert "\n" not in message and "holds no weights" in message and "layers\\.46" in message


def test_a_model_without_mtp_layers_is_refused_in_one_line(tmp_path):
    """A Llama: no num_mtp_layers; on transformers older than 5.24, no MtpModel at all."""
    tiny_llama(0, vocab_size=64).save_pretrained(tmp_path)
    word_tokenizer(words=[f"w{i}" for i in range(59)]).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        load_pair(str(tmp_path), "mtp", device="cpu")
    message = str(info.value)
    assert "\n" not in message and message.startswith("--drafter mtp: ")
    assert ("declares no num_mtp_layers" in message) if HAS_MTP else ("needs transformers >= 5.24" in message)


def test_layers_marked_on_a_release_the_drafter_does_not_run_are_refused_in_one_line(monkeypatch):
    """Built by hand (``mark_mtp``) where ``MtpModel`` is the earlier one (5.17 to 5.19): refused
    at the marking, not a traceback in the first draft (5.17's ``MtpModel`` has no ``forward_layer``).
    Mutation: without the check the marking passes and this fails."""
    from model_drafters.mtp import mark_mtp
    import model_drafters.mtp.model

    monkeypatch.setattr(model_drafters.mtp.model, "has_mtp_model", lambda: False)
    with pytest.raises(MtpRefused, match="need transformers >= 5.24") as info:
        mark_mtp(torch.nn.Linear(2, 2), tiny_llama(0))
    assert "\n" not in str(info.value)


@needs_mtp
def test_num_mtp_layers_zero_is_refused():
    from tests.helpers.mtp import tiny_target

    with pytest.raises(MtpRefused, match="num_mtp_layers = 0"):
        mtp_layers(tiny_target("deepseek_v3", layers=2, mtp_layers=0))


# ------------------------------------------------------------------ drafting (in memory: two main layers)


# (target seed, MTP seed) per family: pairs whose drafts are sometimes accepted, mostly not
SEEDS = {"deepseek_v3": (0, 1), "glm4_moe": (4, 14)}


def small(family="deepseek_v3", *, count=2, vocab_size=8):
    """A two-layer target (fast) with ``count`` MTP layers built in memory, and its pair."""
    from tests.helpers.mtp import mtp_layers_for, tiny_target

    target_seed, seed = SEEDS[family]
    target = tiny_target(family, layers=2, mtp_layers=count, vocab_size=vocab_size, seed=target_seed)
    layers = mtp_layers_for(target, count, seed=seed)
    return target, layers, pair_of(target, layers)


@needs_mtp
@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_greedy_chains_of_any_gamma_equal_target_ar_and_the_logits_are_exact(family, recorded):
    target, layers, pair = small(family)
    want = autoregressive(PROMPT, target, processor=GreedyProcessor(), max_gen_len=32).tokens
    partial = 0
    for gamma in (1, 2, 3, 5):                                      # 3, 5: past the two MTP layers
        result = speculative(pair, PROMPT, gamma=gamma, max_gen_len=32)
        assert result.tokens == want, gamma
        assert result.drafted > result.accepted > 0
        partial += sum(1 for r in result.trace if 0 < r.accepted < len(r.drafted))
    assert partial > 0                                              # some depths kept part of a chain
    assert worst_logit_error(target, layers, recorded) < 1e-4


@needs_mtp
def test_each_depth_cache_holds_the_kept_slots_after_every_round(monkeypatch):
    """After each round depth d holds at most n-1-d+(drafts kept) slots and its outputs as many."""
    seen = []

    class Checked(MtpDrafter):
        def update(self, new_tokens, top_k):
            super().update(new_tokens, top_k)
            for depth in self.depths:
                cached = depth.cache.layers[depth.layer].get_seq_length()
                seen.append((cached, depth.length, self.committed))

    monkeypatch.setattr(model_drafters.mtp.kind, "MtpDrafter", Checked)
    _, _, pair = small()
    speculative(pair, PROMPT, gamma=4)
    assert seen and all(cached == slots <= committed - 1 for cached, slots, committed in seen)


@needs_mtp
def test_mutation_a_depth_cache_not_rolled_back_fails_the_logits_check(monkeypatch, recorded):
    import model_drafters.mtp.drafter
    from model_drafters import mtp

    monkeypatch.setattr(mtp.drafter._Depth, "keep", lambda self, slots: 0)
    target, layers, pair = small()
    for gamma in (2, 4):
        speculative(pair, PROMPT, gamma=gamma, max_gen_len=32)
    assert worst_logit_error(target, layers, recorded) > 1e-2


@needs_mtp
def test_mutation_hidden_states_from_the_wrong_layer_fail_the_logits_check(monkeypatch, recorded):
    monkeypatch.setattr(kvcache.cache, "HIDDEN_STATE", -2)         # the last layer's input, not its normed output
    target, layers, pair = small()
    speculative(pair, PROMPT, gamma=3)
    assert worst_logit_error(target, layers, recorded) > 1e-2


@needs_mtp
def test_cache_off_and_drafter_ar():
    target, _, pair = small()
    want = autoregressive(PROMPT, target, processor=GreedyProcessor(), max_gen_len=16).tokens
    assert speculative(pair, PROMPT, gamma=3, max_gen_len=16, use_cache=False).tokens == want
    with pytest.raises(ValueError, match="cannot decode on their own"):
        run_strategy(Strategy("drafter", model="drafter", max_gen_len=4, processor=GreedyProcessor()), pair, PROMPT)


# ------------------------------------------------------------------ token trees from the MTP logits


class TreeRecorded(MtpDrafter):
    """The engine's MTP drafter, keeping every tree node's logits: (committed ids, path, logits)."""

    nodes: list = []

    def propose_tree(self, ids, depth, nodes, branch):
        tree = super().propose_tree(ids, depth, nodes, branch)
        TreeRecorded.nodes += [(ids[0].tolist(), list(path), logits) for path, logits in self.tree_logits]
        return tree


@pytest.fixture
def tree_nodes(monkeypatch):
    TreeRecorded.nodes = []
    monkeypatch.setattr(model_drafters.mtp.kind, "MtpDrafter", TreeRecorded)
    return TreeRecorded.nodes


def worst_node_error(target, mtp_model, nodes) -> float:
    """As :func:`worst_logit_error`, for tree nodes: the logits a node's children were ranked by
    are the chain's row after its path (``reference_logits`` of the path and one more token)."""
    from tests.helpers.mtp import reference_logits

    assert nodes
    worst = 0.0
    for committed, path, logits in nodes:
        want = reference_logits(target, mtp_model, committed, path + [0])[-1:]
        worst = max(worst, ((logits - want).abs().max() / want.abs().max()).item())
    return worst


@needs_mtp
@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_greedy_trees_equal_target_ar_and_every_node_logit_is_exact(family, tree_nodes):
    target, layers, pair = small(family)
    want = autoregressive(PROMPT, target, processor=GreedyProcessor(), max_gen_len=32).tokens
    ranks = []
    for gamma, tree in ((3, 8), (5, 8)):                            # 5: levels past the two MTP layers
        result = speculative(pair, PROMPT, gamma=gamma, max_gen_len=32, tree=tree)
        assert result.tokens == want and result.tree_fallback == "", (gamma, tree)
        assert result.drafted > result.accepted > 0
        ranks += [rank for r in result.trace for rank in (r.ranks or ())]
    assert any(rank > 0 for rank in ranks)                          # a second choice was accepted
    assert max(len(path) for _, path, _ in tree_nodes) >= 3          # nodes expanded past the MTP layers
    assert worst_node_error(target, layers, tree_nodes) < 1e-4


@needs_mtp
def test_mutation_a_depth_cache_not_cropped_after_a_node_fails_the_node_check(monkeypatch, tree_nodes):
    import model_drafters.mtp.drafter
    from model_drafters import mtp

    monkeypatch.setattr(mtp.drafter, "drop_last", lambda layer, n: None)
    target, layers, pair = small()
    speculative(pair, PROMPT, gamma=3, max_gen_len=32, tree=8)
    assert worst_node_error(target, layers, tree_nodes) > 1e-2


@needs_mtp
def test_mutation_hidden_states_left_in_tree_order_fail_the_node_check(monkeypatch, tree_nodes):
    """The target's hidden states of the verify kept in the order the tree was fed, not the kept path's."""
    monkeypatch.setattr(kvcache.cache.CachedModel, "_keep_hidden_block", lambda self, block, kept: None)
    target, layers, pair = small()
    speculative(pair, PROMPT, gamma=3, max_gen_len=32, tree=8)
    assert worst_node_error(target, layers, tree_nodes) > 1e-2


# ------------------------------------------------------------------ sampling


@needs_mtp
def test_sampling_keeps_the_target_distribution():
    """600 draws (not the usual 2000: each draw runs a MoE target and two MTP depths). Measured: the
    correct rule sits at -0.7 standard deviations, a resample from p instead of the residual at 33."""
    from tests.helpers.distribution import BOUND, PROMPT as DIST_PROMPT, STEPS, chi_square_excess, \
        exact_distribution, sample_counts

    target, _, pair = small(vocab_size=8)
    spec = ProcessorSpec("topk", 1.0, top_k=5)
    exact = exact_distribution(target, spec.build())
    strategy = Strategy("speculative", drafter="model", gamma=3, max_gen_len=STEPS, processor=spec, inspect=False)
    counts = sample_counts(lambda generator: run_strategy(strategy, pair, DIST_PROMPT, generator=generator), 600)
    assert chi_square_excess(counts, exact, sum(counts.values())) < BOUND


@needs_mtp
def test_sampling_with_trees_keeps_the_target_distribution():
    """Trees of 6 nodes, 400 draws: the tree does not depend on a random draw, so the accept rule
    that follows the target's draw is exact for it. Measured: 1.3 standard deviations; each node's
    draw taken from the next node's row (``tests.helpers.mutations.shifted_rows``) draws an outcome
    of probability 0."""
    from tests.helpers.distribution import BOUND, PROMPT as DIST_PROMPT, STEPS, chi_square_excess, \
        exact_distribution, sample_counts

    target, _, pair = small(vocab_size=8)
    spec = ProcessorSpec("topk", 1.0, top_k=5)
    exact = exact_distribution(target, spec.build())
    strategy = Strategy("speculative", drafter="model", gamma=3, max_gen_len=STEPS, processor=spec, inspect=False,
                        tree=6)
    results = []

    def run(generator):
        results.append(run_strategy(strategy, pair, DIST_PROMPT, generator=generator))
        return results[-1]

    counts = sample_counts(run, 400)
    assert chi_square_excess(counts, exact, sum(counts.values())) < BOUND
    assert all(r.tree_fallback == "" for r in results)
    assert sum(len(r.trace[0].tree_tokens or ()) > 1 for r in results) > len(results) // 2   # trees were verified


# ------------------------------------------------------------------ transformers' own MTP decoding, the bench peer


@needs_mtp
def test_transformers_use_mtp_is_greedy_identical_to_plain_generate(checkpoint):
    """The benchmark's ``hf_mtp`` peer (``generate(use_mtp=True)``) on the loaded checkpoint,
    against transformers' plain greedy ``generate`` and our ``--drafter mtp``."""
    from bench.peers import generation_config, peer_call
    from bench.processors import ProcessorSpec as BenchSpec
    from bench.variants import HF_MTP, plan_variants

    folder, _ = checkpoint
    pair = load_pair(str(folder), "mtp", device="cpu", dtype="float32")
    config = generation_config(BenchSpec("greedy"), max_new_tokens=12, end_tokens=[63], pad_token_id=63)
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        plain = peer_call("hf_generate", pair.target, None, ids, config)()[0, len(PROMPT):].tolist()
        mtp = peer_call("hf_mtp", pair.target, None, ids, config)()[0, len(PROMPT):].tolist()
    assert mtp == plain
    ours = speculative(pair, PROMPT, gamma=2, max_gen_len=12).tokens      # no end token: it runs on past 63
    assert ours[:len(plain)] == plain
    planned = plan_variants(["speculative"], [2], peers=True, model_peer="hf_mtp")
    assert HF_MTP in planned and not any(v.strategy == "hf_assisted" for v in planned)
