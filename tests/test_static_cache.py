"""The static-cache path (``kvcache.static``): token-identical to the dynamic path and to
transformers' ``generate``, with logits compared and the cache length pinned after every round;
captured forwards (``graphs``, on a cheap backend) equal to ``static`` with no recompiles, and a
second run capturing nothing. Each guarantee has its mutation check beside it."""

from __future__ import annotations

import time
import weakref
from dataclasses import replace

import pytest
import torch
import transformers

import generation.verify as verify_module
from engine import HybridOptions, LookaheadOptions, NGramOptions, Strategy, lookahead_strategy, run_strategy
from kvcache import static
from kvcache.cache import CachedModel
from kvcache.static import StaticCachedModel, static_refusal
from sampling import GreedyProcessor
from sampling.spec import ProcessorSpec
from tests.helpers import arch_zoo
from tests.helpers.pairs import model_pair
from tests.helpers.static import fresh_captures

PROMPT = list(arch_zoo.PROMPTS[0])
LENGTH = arch_zoo.LENGTH


@pytest.fixture(autouse=True)
def cheap_backend(monkeypatch):
    """Compile with dynamo's eager backend: the capture machinery runs, no code is generated."""
    monkeypatch.setattr(static, "BACKEND", "eager")


@pytest.fixture(scope="module")
def pair():
    """Llama, and a drafter initialised independently of it (most drafts rejected: every rollback runs)."""
    return model_pair(arch_zoo.build("llama"), arch_zoo.build("llama", "independent"))


@pytest.fixture(scope="module")
def blended():
    """Llama and its blended drafter: trees whose kept paths hold accepted nodes."""
    return model_pair(arch_zoo.build("llama"), arch_zoo.build("llama", "drafter"))


def run(pair, compile: str, **fields):
    fields.setdefault("processor", GreedyProcessor())
    fields.setdefault("max_gen_len", LENGTH)
    return run_strategy(Strategy("s", compile=compile, **fields), pair, PROMPT)


class Recorder:
    """Every logits row a cached model returns (target and drafter), and the target's length after
    each round checked against the sequence (``ids`` less its last token) and the cache itself."""

    def __init__(self, monkeypatch):
        self.logits: list[torch.Tensor] = []
        self.rounds = 0
        forward = CachedModel.forward
        recorder = self

        def recorded(self, ids, keep):
            out = forward(self, ids, keep)
            recorder.logits.append(out.clone())
            return out

        monkeypatch.setattr(CachedModel, "forward", recorded)
        for name in ("_round", "tree_round"):
            monkeypatch.setattr(verify_module, name, self.pinned(getattr(verify_module, name)))

    def pinned(self, round_fn):
        def checked(loop, ids, *args, **kwargs):
            ids, new, stop = round_fn(loop, ids, *args, **kwargs)
            target = loop.target
            assert target.length == ids.shape[1] - 1, (target.length, ids.shape[1])
            if isinstance(target, StaticCachedModel) and static.LENGTH_IN_CACHE:
                assert int(target.cache.get_seq_length()) == target.length
            self.rounds += 1
            return ids, new, stop
        return checked


def same_run(pair, monkeypatch, compile: str = "static", **fields):
    """Run ``fields`` on the dynamic path and on ``compile``: equal tokens, and equal logits row for
    row (both models' forwards), the length pinned after every round. Returns the compiled result."""
    for model in (pair.target, pair.drafter):       # each model's trial runs here, not inside a recorded run
        if model is not None:
            static_refusal(model)
    with monkeypatch.context() as m:
        off = Recorder(m)
        want = run(pair, "off", **fields)
    with monkeypatch.context() as m:
        got_rec = Recorder(m)
        got = run(pair, compile, **fields)
    assert got.compile["path"] == compile and got.compile["reason"] == ""
    assert got.tokens == want.tokens, (got.tokens, want.tokens)
    assert len(got_rec.logits) == len(off.logits) and got_rec.rounds == off.rounds
    for a, b in zip(got_rec.logits, off.logits):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), float((a - b).abs().max())
    return got


# ------------------------------------------------------------- the families

def test_every_family_static_ar_equals_generate_or_is_refused_in_one_line():
    accepted, refused = [], {}
    for name in arch_zoo.FAMILIES:
        try:
            model = arch_zoo.build(name)
        except arch_zoo.FamilyUnavailable:
            continue
        reason = static_refusal(model)
        if reason is not None:
            assert reason.strip() and "\n" not in reason, (name, reason)
            refused[name] = reason
            continue
        accepted.append(name)
        want = list(arch_zoo.reference(name, tuple(PROMPT)))
        both = model_pair(model, arch_zoo.build(name, "independent"))
        for fields in ({}, {"drafter": "model", "gamma": 3}):       # trees: on llama below
            result = run_strategy(Strategy("t", processor=GreedyProcessor(), max_gen_len=LENGTH, compile="static",
                                           **fields), both, PROMPT)
            assert result.compile["path"] == "static", (name, fields, result.compile)
            assert result.tokens == want, (name, fields)
    assert "llama" in accepted and "gpt2" in accepted
    assert "sliding" in refused["mistral"]
    assert "encoder-decoder" in refused["t5"]
    assert "mamba" in refused


def test_a_refused_model_runs_the_dynamic_path_and_says_why():
    model = arch_zoo.build("mistral")
    result = run_strategy(Strategy("t", processor=GreedyProcessor(), max_gen_len=8, compile="static"),
                          model_pair(model), PROMPT)
    assert result.compile["path"] == "off" and "sliding" in result.compile["reason"]
    assert result.tokens == list(arch_zoo.reference("mistral", tuple(PROMPT)))[:8]


# ------------------------------------------------------- static == dynamic

@pytest.mark.parametrize("gamma", arch_zoo.GAMMAS)
def test_speculative_static_equals_dynamic_and_generate(pair, monkeypatch, gamma):
    result = same_run(pair, monkeypatch, drafter="model", gamma=gamma)
    assert result.drafted > result.accepted          # rejections ran, so rollbacks did
    assert result.tokens == list(arch_zoo.reference("llama", tuple(PROMPT)))
    assert result.compile["drafter_path"] == "static"


def same_decisions(pair, compile: str = "static", **fields):
    """Run ``fields`` on the dynamic path and on ``compile``: equal tokens, and the target logits that
    decided each token (the top-8 of every deciding row, ``GenerationResult.decisions``) equal."""
    want, got = run(pair, "off", **fields), run(pair, compile, **fields)
    assert got.compile["path"] == compile and got.compile["reason"] == ""
    assert got.tokens == want.tokens, (got.tokens, want.tokens)
    assert len(got.decisions) == len(want.decisions) == len(got.tokens)
    for a, b in zip(got.decisions, want.decisions):
        assert a.indices == b.indices and torch.allclose(torch.tensor(a.values), torch.tensor(b.values), atol=1e-4)
    return got


@pytest.mark.parametrize("which", ["independent", "blended"])
def test_tree_static_equals_dynamic(pair, blended, which):
    """Trees on the static path: the kept nodes gathered at their absolute positions. The deciding
    rows are compared here (read by the loop itself), the lengths pinned by the chain tests above."""
    result = same_decisions(pair if which == "independent" else blended, drafter="model", gamma=3, tree=6)
    assert result.tree_fallback == "" and any(r.tree_size for r in result.trace)
    if which == "blended":
        assert any(len(r.path) > 1 for r in result.trace)       # gathers moved kept nodes
    assert result.tokens == list(arch_zoo.reference("llama", tuple(PROMPT)))


def test_nasd_static_equals_dynamic(pair, monkeypatch):
    result = same_run(pair, monkeypatch, drafter="ngram", gamma=3, drafter_options=NGramOptions())
    assert result.drafted > 0 and result.compile["drafter_path"] is None


def test_lookahead_and_the_hybrid_static_equal_dynamic(blended, monkeypatch):
    """Lookahead's window rows ride in the tree pass (the capacity covers them); the hybrid's model
    side drafts on a static cache."""
    look = lookahead_strategy(LookaheadOptions(), processor=GreedyProcessor(), max_gen_len=LENGTH)
    fields = {name: getattr(look, name) for name in ("drafter", "drafter_options", "gamma", "gamma_policy", "tree")}
    assert same_run(blended, monkeypatch, **fields).tree_fallback == ""
    hybrid = same_run(blended, monkeypatch, drafter="model", drafter_options=HybridOptions(2), gamma=3)
    assert hybrid.compile["drafter_path"] == "static"


def test_drafter_ar_static_equals_dynamic(pair, monkeypatch):
    same_run(pair, monkeypatch, model="drafter")


def test_sampling_static_draws_the_same_stream(pair, monkeypatch):
    spec = ProcessorSpec("multinomial", temperature=1.0)
    for fields in ({}, {"drafter": "model", "gamma": 3}):
        same_run(pair, monkeypatch, processor=spec, seed=7, **fields)


DISTRIBUTION_SAMPLES = 400


def test_sampling_static_follows_the_target_distribution():
    """A small chi-square check on an 8-token vocabulary (the seeded check above is the strong one):
    speculative decoding on the static path against the target's enumerated distribution."""
    from tests.helpers import distribution as dist
    from sampling import MultinomialProcessor

    target, drafter = dist.sharp_target(), dist.sharp_drafter()
    tiny = model_pair(target, drafter)
    strategy = Strategy("s", drafter="model", gamma=3, processor=MultinomialProcessor(1.0),
                        max_gen_len=dist.STEPS, compile="static", inspect=False)
    counts = dist.sample_counts(lambda g: run_strategy(strategy, tiny, dist.PROMPT, generator=g),
                                DISTRIBUTION_SAMPLES)
    exact = dist.exact_distribution(target, MultinomialProcessor(1.0))
    assert run_strategy(strategy, tiny, dist.PROMPT).compile["path"] == "static"
    assert dist.chi_square_excess(counts, exact, DISTRIBUTION_SAMPLES) < dist.BOUND


def test_mutation_stale_length_after_rollback_fails(pair, monkeypatch):
    assert static_refusal(pair.target) is None and static_refusal(pair.drafter) is None   # tried unbroken
    monkeypatch.setattr(StaticCachedModel, "rollback", lambda self, length: None)
    with pytest.raises(AssertionError):
        same_run(pair, monkeypatch, drafter="model", gamma=3)


needs_length_in_cache = pytest.mark.skipif(not static.LENGTH_IN_CACHE,
                                           reason="this transformers' static layer keeps no length of its own")


@needs_length_in_cache
@pytest.mark.parametrize("compile", ["static", "graphs"])
def test_a_layer_without_crop_rolls_back_by_its_own_length(pair, monkeypatch, compile):
    """5.17 and 5.18: a ``StaticLayer`` keeps ``cumulative_length`` but has no ``crop``; the length is
    lowered in place, and every round equals the dynamic path (here with ``crop`` made to raise)."""
    from transformers.cache_utils import StaticLayer

    def no_crop(self, n):
        raise AttributeError("'StaticLayer' object has no attribute 'crop'")

    monkeypatch.setattr(StaticLayer, "crop", no_crop, raising=False)
    monkeypatch.setattr(static, "_KEPT", weakref.WeakKeyDictionary())   # tried, built and captured here, dropped after
    assert static_refusal(pair.target) is None and static_refusal(pair.drafter) is None   # tried without crop
    got = same_run(pair, monkeypatch, compile, drafter="model", gamma=3)
    assert got.compile["drafter_path"] == compile


@needs_length_in_cache
def test_mutation_a_length_not_lowered_is_refused_in_one_line_naming_the_release(monkeypatch):
    """A rollback that leaves the layers' length where it was: the once-per-model trial catches it,
    the model is refused in one line that names the release, and its runs say why they ran ``off``."""
    import transformers

    monkeypatch.setattr(static, "lower_length", lambda cache, n: None)
    monkeypatch.setattr(static, "_KEPT", weakref.WeakKeyDictionary())     # tried here, dropped after
    model = arch_zoo.build("llama")
    reason = static_refusal(model)
    assert reason and "\n" not in reason and f"transformers {transformers.__version__}" in reason, reason
    result = run_strategy(Strategy("t", processor=GreedyProcessor(), max_gen_len=8, compile="static"),
                          model_pair(model), PROMPT)
    assert result.compile["path"] == "off" and result.compile["reason"] == reason


def test_mutation_a_gather_at_the_tensors_end_fails(blended, monkeypatch):
    """keep_block must gather at [length - block, length), not at the preallocated tensors' end."""
    def at_the_end(self, block, kept):
        for layer in static._layers(self.cache):
            for tensor in (layer.keys, layer.values):
                start = tensor.shape[-2] - block
                index = torch.tensor(kept, dtype=torch.long) + start
                tensor.narrow(-2, start, len(kept)).copy_(tensor.index_select(-2, index))
        self._set_length(self._length - block + len(kept))

    monkeypatch.setattr(StaticCachedModel, "keep_block", at_the_end)
    with pytest.raises(AssertionError):
        same_decisions(blended, drafter="model", gamma=3, tree=6)


# ----------------------------------------------------------------- graphs

def test_graphs_equal_static_with_no_recompiles_and_a_second_run_captures_nothing(pair, monkeypatch):
    first = same_run(pair, monkeypatch, "graphs", drafter="model", gamma=1)     # widths 1 and 2 (each traced)
    report = first.compile
    assert report["drafter_path"] == "graphs" and report["recompiles"] == 0
    assert report["captures"] >= len(report["widths"]) > 1 and report["capture_s"] > 0
    assert first.seconds > 0
    again = run(pair, "graphs", drafter="model", gamma=1)
    assert again.tokens == first.tokens
    assert again.compile["captures"] == 0 and again.compile["capture_s"] == 0.0
    assert again.compile["recompiles"] == 0 and again.compile["widths"] == report["widths"]


def test_graphs_a_new_width_is_captured_and_counted(pair, monkeypatch):
    before = run(pair, "graphs", drafter="model", gamma=1).compile
    wider = same_run(pair, monkeypatch, "graphs", drafter="model", gamma=2).compile
    new = set(wider["widths"]) - set(before["widths"])
    assert new and wider["captures"] >= len(new) and wider["recompiles"] == 0


def test_mutation_inputs_not_copied_before_replay_fails(pair, monkeypatch):
    monkeypatch.setattr(StaticCachedModel, "_fill", lambda self, entry, tokens, positions, mask: None)
    with pytest.raises(AssertionError):
        same_run(pair, monkeypatch, "graphs")


def test_mutation_a_capture_reused_across_widths_fails(pair, monkeypatch):
    keys = StaticCachedModel._capture_key
    monkeypatch.setattr(StaticCachedModel, "_capture_key",
                        lambda self, width, masked, layers: keys(self, 1, masked, layers))
    with pytest.raises((AssertionError, RuntimeError)):
        same_run(pair, monkeypatch, "graphs", drafter="model", gamma=5)


def test_capture_time_is_kept_out_of_the_run(pair, monkeypatch):
    """A backend that takes 2 s a compile: the first run's seconds, capture left out, stay near a
    second run's (which captures nothing), and the backend is never asked again on that run."""
    compiles = []

    def slow_eager(graph, example_inputs):
        compiles.append(len(example_inputs))
        time.sleep(2.0)
        return graph.forward

    monkeypatch.setattr(static, "BACKEND", slow_eager)
    fresh_captures(monkeypatch)                                               # nothing captured yet
    first = run(pair, "graphs", max_gen_len=8)
    report = first.compile
    assert report["captures"] == 1 and report["widths"] == [1] and len(compiles) >= 1
    assert report["capture_s"] >= 2.0 * len(compiles)
    assert first.phases["verify"] >= 0 and abs(sum(first.phases.values()) - first.seconds) < 1e-6
    asked = len(compiles)
    again = run(pair, "graphs", max_gen_len=8)
    assert again.tokens == first.tokens and len(compiles) == asked and again.compile["captures"] == 0
    assert first.seconds < again.seconds + report["capture_s"] / 2
    # no step books the capture as its own cost (the cost tables and the speedup model read them)
    assert max(r.verify_s for r in first.trace) < 1.0


def test_capture_time_is_kept_out_of_every_round(pair, monkeypatch):
    """The same 2 s backend under speculative decoding: each new width is captured inside a round,
    and no round's verify or draft time carries it (mutation: the per-round booking removed)."""
    def slow_eager(graph, example_inputs):
        time.sleep(2.0)
        return graph.forward

    monkeypatch.setattr(static, "BACKEND", slow_eager)
    fresh_captures(monkeypatch)
    result = run(pair, "graphs", drafter="model", gamma=3, max_gen_len=10)
    assert result.compile["captures"] >= 2 and result.compile["capture_s"] >= 4.0
    assert max(r.verify_s for r in result.trace) < 1.0 and max(r.draft_s for r in result.trace) < 1.0
    assert result.phases["verify"] < 1.0 + 0.1 * result.rounds


def test_keep_hidden_runs_on_the_static_path(monkeypatch):
    """The target's MTP layers draft from the hidden states every target forward keeps."""
    mtp = pytest.importorskip("tests.helpers.mtp")
    from model_drafters.mtp.model import has_mtp_model
    if not has_mtp_model():
        pytest.skip("this transformers has no MtpModel")
    target = mtp.tiny_target("deepseek_v3", layers=2, mtp_layers=2, vocab_size=8, seed=0)
    mtp_pair = model_pair(target, mtp.mtp_layers_for(target, 2, seed=1))
    prompt = [1, 5, 3, 7, 2, 4]
    for compile, fields in [("static", {"gamma": 3}), ("static", {"gamma": 3, "tree": 8})]:
        strategy = Strategy("s", drafter="model", processor=GreedyProcessor(), max_gen_len=LENGTH, **fields)
        want = run_strategy(strategy, mtp_pair, prompt)
        got = run_strategy(replace(strategy, compile=compile), mtp_pair, prompt)
        assert got.compile["path"] == compile and got.compile["drafter_path"] == "off"
        assert got.tokens == want.tokens and got.accepted == want.accepted > 0, (compile, fields)


# --------------------------------------------- a self-drafter on the target's static cache

def self_draft(spec: str = "self:skip=1") -> dict:
    """A layer-skipping self-drafter of the pair's target (most of its drafts rejected: every rollback runs)."""
    return {"drafter": "self", "drafter_options": spec, "gamma": 3}


@pytest.mark.parametrize("spec", ["self:skip=1", "self:skip=0"])
@pytest.mark.parametrize("compile", ["static", "graphs"])
def test_a_self_drafter_drafts_on_the_targets_static_cache(pair, monkeypatch, spec, compile):
    """Fed over the target's own static layers at its slots, its drafts rolled back each round: every
    logits row of both models equals the dynamic path's, the lengths pinned after every round, the
    tokens ``generate``'s. Its forwards run eager: on ``graphs`` its record says so in one line."""
    result = same_run(pair, monkeypatch, compile, **self_draft(spec))
    assert result.drafted > result.accepted > 0 and result.rollback["drafter"]["method"] == "shared"
    assert result.tokens == list(arch_zoo.reference("llama", tuple(PROMPT)))
    report = result.compile
    assert report["drafter_path"] == "static"
    assert report["drafter_reason"] == ("a self-drafter's forwards on the target's cache run eager"
                                        if compile == "graphs" else "")


def test_a_self_drafter_samples_the_same_stream_and_drafts_inside_the_hybrid(pair, monkeypatch):
    """Seeded sampling draws the same tokens on the static path; a pair whose drafter is the self-drafter
    (as the default pair's is) drafts on the target's static cache inside the hybrid too."""
    same_run(pair, monkeypatch, processor=ProcessorSpec("multinomial", temperature=1.0), seed=7, **self_draft())
    from model_drafters.selfdraft import build_self_drafter, parse_self_draft

    own = model_pair(pair.target, build_self_drafter(pair.target, parse_self_draft("self:skip=1")))
    hybrid = same_run(own, monkeypatch, drafter="model", drafter_options=HybridOptions(2), gamma=3)
    assert hybrid.compile["drafter_path"] == "static" and hybrid.drafted > hybrid.accepted


@pytest.mark.parametrize("compile", ["static", "graphs"])
def test_a_self_drafters_trees_on_the_targets_static_cache(pair, compile):
    """Its trees grow on the target's static layers (a masked forward padded to the capacity) and
    are dropped again: the rows that decided each token equal the dynamic path's."""
    result = same_decisions(pair, compile, **self_draft(), tree=6)
    assert result.tree_fallback == "" and any(r.tree_size for r in result.trace)
    assert result.tokens == list(arch_zoo.reference("llama", tuple(PROMPT)))


@pytest.mark.parametrize("mutation", ["drafts left in", "one slot early"])
def test_mutation_a_self_drafter_that_leaves_its_drafts_or_writes_a_slot_early_fails(pair, monkeypatch, mutation):
    """Its drafts not rolled back (from 5.17 the target would write after them), or its rows written
    from one slot before the target's length (over the last committed keys): the same check fails."""
    if mutation == "drafts left in" and not static.LENGTH_IN_CACHE:
        pytest.skip("on 4.57 a forward writes at the slots it names: drafts past the length are overwritten")
    beside = StaticCachedModel.beside

    def broken(self, model, layers=None):
        cached = beside(self, model, layers)
        if mutation == "drafts left in":
            cached.rollback = lambda length: None
        else:
            cached._set_length(cached.length - 1)
        return cached

    monkeypatch.setattr(StaticCachedModel, "beside", broken)
    with pytest.raises(AssertionError):
        same_run(pair, monkeypatch, **self_draft("self:skip=0"))     # its kept layer's keys differ from the target's


def test_self_drafters_that_cannot_share_fall_back_in_one_line():
    """A cast copy drafts on a cache of its own (the target static); a target the static path refuses
    (sliding windows, the cache off; recurrent state from 5.x) keeps its self-drafter on its dynamic
    cache or the drafter's own. Each record says why in one line, and the tokens stay ``generate``'s."""
    cases = [("llama", "self:bf16", {}, "static", "", "copy drafts on a cache of its own"),
             ("qwen2", "self:skip=1", {}, "off", "sliding", ""),     # the target's reason; 4.57: its own cache
             ("llama", "self:skip=1", {"use_cache": False}, "off", "the cache is off", "cannot be shared")]
    if static.LENGTH_IN_CACHE:                           # 4.57 refuses Mamba2's own cache class on every path
        cases.append(("mamba2", "self:bf16", {}, "off", "recurrent", "cannot be shared"))
    for family, spec, fields, path, why, drafter_why in cases:
        target = arch_zoo.build(family)
        strategy = Strategy("s", processor=GreedyProcessor(), max_gen_len=LENGTH, compile="static",
                            **self_draft(spec), **fields)
        result = run_strategy(strategy, model_pair(target, vocab_size=arch_zoo.VOCAB), PROMPT)
        report = result.compile
        assert (report["path"], report["drafter_path"]) == (path, "off"), (family, spec, report)
        assert why in report["reason"] and (why or not report["reason"]), (family, spec, report)
        assert report["drafter_reason"] and drafter_why in report["drafter_reason"], (family, spec, report)
        assert "\n" not in report["reason"] + report["drafter_reason"]
        assert result.tokens == list(arch_zoo.reference(family, tuple(PROMPT))), (family, spec)


def test_a_third_capacity_drops_the_least_recently_used_cache_and_its_captures(pair, monkeypatch):
    monkeypatch.setattr(static, "CAPACITY_STEP", 32)
    target = pair.target
    for length in (10, LENGTH, 60):                     # capacities 32, 64 and 96
        assert run(pair, "graphs", max_gen_len=length).compile["path"] == "graphs"
    kept = sorted(c for c, slot in static.kept(target).caches if slot == "target")
    assert kept == [64, 96]
    assert {key[1] for key in static.kept(target).captures if key[0] == "target"}.isdisjoint({32})
    again = run(pair, "graphs", max_gen_len=10)         # 32 again: made and captured anew, counted
    assert again.compile["captures"] == 1 and again.compile["recompiles"] == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_cuda_graphs_equal_the_dynamic_path(monkeypatch):
    """The default backend on a GPU: inductor, mode reduce-overhead (CUDA graphs)."""
    monkeypatch.setattr(static, "BACKEND", "inductor")
    cuda = model_pair(arch_zoo.build("llama").cuda(), arch_zoo.build("llama", "independent").cuda())
    assert static.default_compile(torch.device("cuda")) == "graphs"
    for fields in ({}, {"drafter": "model", "gamma": 1}, {"drafter": "model", "gamma": 1, "tree": 3}):
        want = run(cuda, "off", **fields)
        first, again = run(cuda, "graphs", **fields), run(cuda, "graphs", **fields)
        assert first.tokens == again.tokens == want.tokens, fields
        assert first.compile["path"] == "graphs" and first.compile["recompiles"] == 0
        assert again.compile["captures"] == 0 and again.compile["recompiles"] == 0


def test_a_backend_that_cannot_compile_falls_back_to_static_in_one_line(pair, monkeypatch):
    """A backend that fails (no compiler on this machine): the run goes on eager over the static cache,
    with the same tokens, keeps nothing half-made, says why in one line, and later runs do not try again."""
    asked = []

    def broken(graph, example_inputs):
        asked.append(1)
        raise RuntimeError("no compiler here\nsecond line")

    monkeypatch.setattr(static, "BACKEND", broken)
    fresh_captures(monkeypatch)
    for model in (pair.target, pair.drafter):                   # no model refused graphs yet
        monkeypatch.setattr(static.kept(model), "graphs_refusal", "")
    result = run(pair, "graphs", drafter="model", gamma=3, max_gen_len=8)
    report = result.compile
    assert report["path"] == "static" and report["requested"] == "graphs"
    assert "cannot capture LlamaForCausalLM's forward" in report["reason"] and "\n" not in report["reason"]
    assert result.tokens == run(pair, "off", drafter="model", gamma=3, max_gen_len=8).tokens
    assert not static.kept(pair.target).captures      # nothing half-made is kept
    tried = len(asked)
    again = run(pair, "graphs", max_gen_len=4)
    assert again.compile["path"] == "static" and again.compile["reason"] and len(asked) == tried


def test_default_compile():
    assert static.default_compile("cpu") == "off"
    assert static.default_compile(torch.device("cuda", 0)) == "graphs"


def test_unknown_compile_path_is_one_line():
    with pytest.raises(ValueError, match="compile must be one of off, static, graphs"):
        Strategy("s", compile="fast")


def tree_at_the_end(pair, monkeypatch):
    """A tree run whose drafter's growth would pass the end of its static cache: the capacity step
    cut to 8, so the capacity is the prompt, the budget and the tree's 2 nodes with little slack,
    while a tree of depth 8 and branch 4 grows up to 1 + 7 x 4 rows a round. The tokens equal the
    dynamic path's and ``generate``'s, and the run says it ran static."""
    monkeypatch.setattr(static, "CAPACITY_STEP", 8)
    fields = dict(drafter="model", gamma=8, tree=2, tree_branch=4)
    want, got = run(pair, "off", **fields), run(pair, "static", **fields)
    assert got.compile["path"] == "static" and got.compile["reason"] == ""
    assert got.tokens == want.tokens == list(arch_zoo.reference("llama", tuple(PROMPT)))
    return got


@pytest.mark.parametrize("which", ["model", "self"])
def test_a_tree_near_the_end_of_a_static_cache_grows_within_it(pair, monkeypatch, which):
    if which == "self":
        from model_drafters.selfdraft import build_self_drafter, parse_self_draft

        pair = model_pair(pair.target, build_self_drafter(pair.target, parse_self_draft("self:skip=1")))
    result = tree_at_the_end(pair, monkeypatch)
    assert any(r.tree_size for r in result.trace)
    capacity = static.static_capacity(len(PROMPT), LENGTH, 2)
    # a round begun with 8 tokens left to make grows to the last committed one, a root and 7 x 4 nodes
    assert capacity < len(PROMPT) + (LENGTH - 9) + 1 + 7 * 4, capacity


def test_mutation_a_tree_grown_past_the_room_fails(pair, monkeypatch):
    """Without the room check the drafter's growth passes the end: the run fails."""
    import generation.tree_draft as tree_draft

    monkeypatch.setattr(tree_draft, "_fitting", lambda cached, expand: expand)
    with pytest.raises(Exception, match="positions of a static cache of"):
        tree_at_the_end(pair, monkeypatch)


def layer_forwards_set_on_the_instance(model):
    """Each decoder layer's ``forward`` set on the instance, bound to that layer (as transformers 4.57
    leaves it once a caller asked for hidden states)."""
    import functools

    for layer in model.model.layers:
        layer.forward = functools.partial(type(layer).forward, layer)
    return model


@pytest.mark.parametrize("compile", ["off", "static"])
def test_a_skip_drafter_runs_its_own_layers_when_the_target_wraps_their_forward(pair, compile):
    """A layer-skipping self-drafter of a target whose layers carry an instance ``forward`` (bound to
    the target's own layer): the skip view's renumbered layers run, not the target's, so skipping the
    first layer still drafts over its one-layer view and decodes target AR's tokens."""
    import copy

    target = layer_forwards_set_on_the_instance(copy.deepcopy(pair.target))
    wrapped = model_pair(target, pair.drafter)
    result = run(wrapped, compile, **self_draft("self:skip=0"))
    assert result.compile["path"] == compile and result.drafted > result.accepted
    assert result.tokens == list(arch_zoo.reference("llama", tuple(PROMPT)))


def test_mutation_a_skip_view_that_keeps_the_instance_forward_fails(pair, monkeypatch):
    import copy

    from model_drafters.selfdraft import skip

    def keeps(module):
        clone = copy.copy(module)
        clone._modules = dict(module._modules)
        return clone
    monkeypatch.setattr(skip, "_shallow", keeps)
    target = layer_forwards_set_on_the_instance(copy.deepcopy(pair.target))
    with pytest.raises(Exception):
        run(model_pair(target, pair.drafter), "off", **self_draft("self:skip=0"))


# ------------------------------------------------------------------ host work a step

# positions, three copies in (tokens, positions, mask), the kept rows out, argmax, the growing ids, the
# host sync; and where a forward takes the slots it writes (4.57's cache_position), their arange. (Keeping
# each deciding row for the verdicts, the engine's default, adds its top-k and a cat.)
DECODE_STEP_OPS = 7 if static.LENGTH_IN_CACHE else 8


def _ar_ops(monkeypatch, dtype=torch.float32, decisions: bool = False) -> dict[int, float]:
    """Ops a token of target AR on ``graphs`` outside the replay (``scripts/host_ops.py``), by depth."""
    from scripts.host_ops import target_ar_per_token
    from tests.helpers.models import tiny_llama

    fresh_captures(monkeypatch)
    return {layers: target_ar_per_token(tiny_llama(3, layers=layers, dtype=dtype), GreedyProcessor(),
                                        decisions=decisions) for layers in (2, 6)}


def _round_ops(monkeypatch) -> dict[int, float]:
    """Ops a round of speculative decoding (γ 4, rejections, padded verifies) outside the replays, by depth."""
    from scripts.host_ops import speculative_per_round
    from tests.helpers.models import tiny_llama

    fresh_captures(monkeypatch)
    drafter = tiny_llama(4, layers=1)
    return {layers: speculative_per_round(target, drafter, 4, inspect=False)
            for layers, target in _same_logits_by_depth(tiny_llama(3, layers=6), 2).items()}


def _same_logits_by_depth(deep, shallow_layers: int) -> dict:
    """``deep`` and a copy of its first ``shallow_layers`` layers, where every later layer of ``deep`` adds
    nothing (its attention and MLP outputs zeroed): the same logits, so the same rounds, at two depths."""
    import copy

    for layer in deep.model.layers[shallow_layers:]:
        layer.self_attn.o_proj.weight.data.zero_()
        layer.mlp.down_proj.weight.data.zero_()
    shallow = copy.deepcopy(deep)
    shallow.model.layers = shallow.model.layers[:shallow_layers]
    shallow.config.num_hidden_layers = shallow_layers
    if getattr(shallow.config, "layer_types", None):
        shallow.config.layer_types = shallow.config.layer_types[:shallow_layers]
    return {shallow_layers: shallow, len(deep.model.layers): deep}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_graphs_decode_step_launches_a_few_kernels_outside_its_capture_at_any_depth(monkeypatch, dtype):
    """Target AR on ``graphs`` under greedy: a fixed handful of ops a token outside the replay (each a
    launch or a sync on the host's clock on a GPU), the same for 2 and 6 layers and for bfloat16. A
    rollback of nothing is nothing (a static layer's crop(0) is a kernel a layer), a chain's causal mask
    is one copy, its positions one arange, and greedy reads the argmax off the logits."""
    counts = _ar_ops(monkeypatch, dtype)
    assert counts[2] == counts[6] <= DECODE_STEP_OPS, counts
    kept = _ar_ops(monkeypatch, dtype, decisions=True)      # the deciding rows: one top-k a step, joined at the end
    assert kept[2] == kept[6] == counts[2] + 1, (kept, counts)


def test_a_speculative_rounds_host_work_does_not_grow_with_depth(monkeypatch):
    """A round on ``graphs`` rolls both models back (rejected drafts, padded rows): one foreach
    subtraction a rollback whatever the depth, not a crop a layer."""
    rounds = _round_ops(monkeypatch)
    assert rounds[2] == rounds[6], rounds


@pytest.mark.parametrize("mutation", ["crop nothing", "crop a layer at a time", "mask anew", "one-hot greedy"])
def test_mutation_host_work_a_step_put_back_is_caught(monkeypatch, mutation):
    if mutation.startswith("crop") and not static.LENGTH_IN_CACHE:
        pytest.skip(f"transformers {transformers.__version__}'s static layers keep no length to lower")
    if mutation == "crop nothing":       # what a static layer's crop(0) does, a layer each step
        monkeypatch.setattr(static, "lower_length", lambda cache, n: [layer.cumulative_length.sub_(n)
                                                                     for layer in static._layers(cache)])
    elif mutation == "crop a layer at a time":
        monkeypatch.setattr(static, "lower_length", lambda cache, n: [static.lower_layer(layer, n)
                                                                     for layer in static._layers(cache)])
        rounds = _round_ops(monkeypatch)          # a decode step rolls nothing back: a round does
        assert rounds[2] != rounds[6], rounds
        return
    elif mutation == "mask anew":
        def anew(self, entry):
            b = entry.mask.shape[2]
            columns = torch.arange(self.capacity, device=entry.mask.device).view(1, -1)
            rows = torch.arange(self._length, self._length + b, device=entry.mask.device)
            entry.mask[0, 0].zero_().masked_fill_(columns > rows.view(-1, 1), torch.finfo(entry.mask.dtype).min)
        monkeypatch.setattr(StaticCachedModel, "_causal", anew)
    else:
        monkeypatch.setattr(GreedyProcessor, "greedy_ids", lambda self, logits: self.sample(self(logits)))
    counts = _ar_ops(monkeypatch)
    assert not counts[2] == counts[6] <= DECODE_STEP_OPS, counts


@pytest.mark.parametrize("length", [0, 1, 37, 256 - 8])
def test_a_chains_mask_from_the_strip_is_causal_over_the_slots(length):
    """Row i of a chain's mask at ``length`` sees the slots up to ``length + i``, at every length."""
    capacity, b = 256, 8
    strip = static.causal_strip(b, capacity, torch.float32, "cpu")
    mask = strip[:, capacity - length:2 * capacity - length]
    visible = mask == 0
    expected = torch.arange(capacity).view(1, -1) <= (length + torch.arange(b)).view(-1, 1)
    assert torch.equal(visible, expected)
    assert (mask[~visible] == torch.finfo(torch.float32).min).all()
