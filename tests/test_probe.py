"""kvcache.probe: a model's cached forward is checked against the uncached one before it is trusted.

The probe must catch what transformers computes wrongly over a cache (Jamba and Mamba on the
PyTorch path: a multi-token pass does not continue from the cached state; Bamba: a prefill that is
not a multiple of the scan chunk leaves a wrong state; RecurrentGemma: state kept in the modules,
out of the rollback's reach) and the engine must then stay lossless through the fallback; a
model it passes must keep the fast path. Mutation checks show each test can fail.
"""

import functools

import pytest
import torch

import kvcache.cache
import kvcache.probe
from sampling import GreedyProcessor
from tests.helpers import arch_zoo, decode
from tests.helpers.models import tiny_llama
from kvcache.probe import cached_model
from kvcache.cache import TRANSFORMERS_RELEASE, UnsupportedCacheError
from kvcache.probe import probe_model, probe_of

NEW_RECURRENT = TRANSFORMERS_RELEASE >= (5,)
needs_5 = pytest.mark.skipif(not NEW_RECURRENT, reason="4.57 refuses recurrent caches outright")


def llama(seed):
    """A tiny Llama over the zoo's vocabulary with decisive logits."""
    return tiny_llama(seed, vocab_size=arch_zoo.VOCAB, logit_scale=arch_zoo.LOGIT_SCALE)


def built(name, role="target"):
    try:
        return arch_zoo.build(name, role)
    except arch_zoo.FamilyUnavailable as e:
        pytest.skip(str(e))


def speculative(target, drafter, prompt=arch_zoo.PROMPTS[0], gamma=3):
    with torch.inference_mode():
        return decode.speculative(list(prompt), drafter, target, processor=GreedyProcessor(), gamma=gamma,
                                  max_gen_len=arch_zoo.LENGTH)


def generate(model, prompt=arch_zoo.PROMPTS[0]):
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=arch_zoo.LENGTH,
                             min_new_tokens=arch_zoo.LENGTH, do_sample=False)
    return out[0, ids.shape[1]:].tolist()


# ------------------------------------------------------------- what it decides

@pytest.mark.parametrize("name", ["llama", "mistral", "gemma2", "lfm2", "mamba2", "t5"])
def test_a_model_computed_right_keeps_the_cached_path(name):
    if not NEW_RECURRENT and arch_zoo.family(name).kind in ("recurrent", "hybrid"):
        pytest.skip("4.57 keeps recurrent state in a cache class of the model's own (refused)")
    result = probe_model(built(name))
    assert result.path == "cached", result.line()
    assert result.error <= result.tolerance and result.reason == ""


@needs_5
@pytest.mark.parametrize("name", ["jamba", "mamba"])
def test_multi_token_cached_passes_that_transformers_gets_wrong_go_stepwise(name):
    result = probe_model(built(name))
    assert result.path == "stepwise", result.line()
    assert "pass over a cached prefix" in result.reason and result.rollback == "restore"


@needs_5
def test_a_wrong_state_after_an_uneven_prefill_turns_the_cache_off():
    """Bamba: a single step after a cached prefix that is not a multiple of the scan chunk is wrong."""
    result = probe_model(built("bamba"))
    assert result.path == "uncached", result.line()
    assert "stepwise: the prompt's prefill" in result.reason


@needs_5
def test_state_out_of_the_caches_reach_turns_the_cache_off():
    """RecurrentGemma keeps its recurrent state in its modules: no rollback can restore it."""
    result = probe_model(built("recurrent_gemma"))
    assert result.path == "uncached", result.line()
    assert "after a restore" in result.reason


def test_the_result_is_one_line_and_remembered_per_model():
    model = llama(0)
    first = probe_of(model)
    assert probe_of(model) is first
    assert "\n" not in first.line() and first.line().startswith("cached (crop")
    assert first.to_dict()["path"] == "cached"


@needs_5
def test_a_model_transformers_cannot_run_is_refused_with_one_line():
    """xLSTM copied to bfloat16 (its kernels then mix dtypes on a sequence as long as its
    chunk, uncached too): no path can run it, so the probe refuses it with one line and a
    generation says that line instead of a traceback."""
    from model_drafters.selfdraft.copies import precision_copy

    model = precision_copy(built("xlstm"), torch.bfloat16)
    result = probe_model(model)
    assert result.path == "refused" and "\n" not in result.line(), result.line()
    assert result.line().startswith("refused: xLSTMForCausalLM does not run in bfloat16 here (RuntimeError: ")
    with pytest.raises(UnsupportedCacheError, match="does not run in bfloat16"):
        cached_model(model).begin(list(arch_zoo.PROMPTS[0]))


# --------------------------------------------------- catching a broken model

def corrupt_multi_token_cached_passes(model):
    """Wrap ``model.forward`` so that a pass of several tokens over a non-empty cache
    returns shifted logits: single steps and uncached passes stay right, as in the
    transformers bugs the probe is for (``generate`` is then still right)."""
    original = model.forward

    @functools.wraps(original)
    def forward(*args, **kwargs):
        out = original(*args, **kwargs)
        cache = kwargs.get("past_key_values", kwargs.get("cache"))         # "cache" from transformers 5.24
        ids = kwargs.get("input_ids")
        if cache is not None and ids is not None and ids.shape[1] > 1 and cache.get_seq_length() > ids.shape[1]:
            out.logits = out.logits + 5.0 * torch.linspace(-1, 1, out.logits.shape[-1])
        return out

    model.forward = forward
    return model


def test_the_probe_catches_a_corrupt_multi_token_pass_and_the_engine_stays_lossless():
    target = corrupt_multi_token_cached_passes(llama(0))
    drafter = llama(1)
    want = generate(target)
    result = probe_model(target)
    assert result.path == "stepwise", result.line()
    out = speculative(target, drafter)
    assert out.tokens == want
    assert out.rollback["target"]["path"] == "stepwise" and out.rollback["target"]["reason"]
    rounds_with_drafts = sum(1 for r in out.trace if r.drafted)
    assert out.target_calls > out.rounds, "a stepwise verify counts one forward per token"
    assert rounds_with_drafts > 0


def test_without_the_probe_the_corruption_reaches_the_output(monkeypatch):
    """Mutation: trust the cached forward (no probe) and the same run goes wrong."""
    target = corrupt_multi_token_cached_passes(llama(0))
    want = generate(target)
    monkeypatch.setattr(kvcache.probe, "probe_of", lambda model: kvcache.probe.ProbeResult("m", "float32", "cached"))
    assert speculative(target, llama(1)).tokens != want


@needs_5
@pytest.mark.parametrize("name", ["jamba", "mamba"])
def test_the_transformers_bug_is_real_and_the_fallback_fixes_it(name, monkeypatch):
    """On the PyTorch path, speculative decoding over Jamba/Mamba's cached multi-token pass
    gives other tokens than ``generate``; through the probe's stepwise path it gives the same."""
    target, drafter = built(name), built(name, "independent")
    probe_of(drafter)
    want = list(arch_zoo.reference(name, arch_zoo.PROMPTS[0]))
    assert speculative(target, drafter).tokens == want
    monkeypatch.setattr(kvcache.probe, "probe_of", lambda model: kvcache.probe.ProbeResult("m", "float32", "cached"))
    assert speculative(target, drafter).tokens != want


# ------------------------------------------------------------ rollbacks

@needs_5
def test_a_never_used_layer_does_not_break_a_rollback(monkeypatch):
    """RecurrentGemma forced onto the cached path: transformers' ``Cache.crop(0)`` raises a
    TypeError on its never-used linear-attention layers; the engine leaves those layers out of
    the crop (``kvcache.cache.never_filled``), so the rollbacks run."""
    target, drafter = built("recurrent_gemma"), built("recurrent_gemma", "independent")
    monkeypatch.setattr(kvcache.probe, "probe_of", lambda model: kvcache.probe.ProbeResult("m", "float32", "cached"))
    result = speculative(target, drafter)
    assert result.rounds > 0 and result.accepted < result.drafted          # rejections: rollbacks ran
    # Mutation check: every layer cropped, the never-used ones raise, and the engine says so in one line.
    monkeypatch.setattr(kvcache.cache, "never_filled", lambda layer: False)
    with pytest.raises(UnsupportedCacheError) as info:
        speculative(target, drafter)
    assert "\n" not in str(info.value) and "cannot be rolled back" in str(info.value)


def test_a_crop_that_raises_becomes_one_line(monkeypatch):
    model = llama(0)
    cached = cached_model(model)

    def broken(cache, n):
        raise TypeError("bad operand type for unary -: 'NoneType'")

    monkeypatch.setattr(kvcache.cache, "drop_last", broken)
    with torch.inference_mode():
        seq = cached.begin([3, 4, 5, 6])
        cached.forward(torch.tensor([seq + [7, 8]]), keep=3)
        with pytest.raises(UnsupportedCacheError, match="cannot be rolled back here .TypeError"):
            cached.rollback(len(seq))


# ------------------------------------------------------------- mutation

@needs_5
@pytest.mark.parametrize("name", ["mamba2", "jamba", "xlstm", "minimax"])
def test_skipping_the_recurrent_restore_fails_the_logits_check(name, monkeypatch):
    """Mutation: a 'snapshot' that is the live layer itself restores nothing (for xLSTM and
    MiniMax, the live cache of the model's own class). The architecture logits check must
    fail; and a fresh probe must not trust the cache."""
    target, independent = built(name), built(name, "independent")
    probe_of(target), probe_of(independent)
    assert arch_zoo.check_logits(name).passed
    monkeypatch.setattr(kvcache.cache, "snapshot", lambda layer: layer)
    outcome = arch_zoo.check_logits(name)
    assert outcome.status == "fail" and "off by" in outcome.detail, outcome
    assert probe_model(target).path == "uncached"


def test_the_logits_check_catches_a_wrong_path():
    """Mutation on a model transformers gets right: corrupt its multi-token cached passes
    and keep the cached path; the logits check names the first wrong forward. (The zoo's
    model is shared: its own forward is put back afterwards, whatever happens.)"""
    target = arch_zoo.build("llama")
    probe_of(target), probe_of(arch_zoo.build("llama", "independent"))
    had_own = "forward" in vars(target)
    try:
        corrupt_multi_token_cached_passes(target)
        outcome = arch_zoo.check_logits("llama")
    finally:
        if not had_own:
            del target.forward
    assert outcome.status == "fail" and "target forward" in outcome.detail, outcome


# ---------------------------------------------------------- the loaded pair

def test_the_pair_carries_its_probe_to_the_banner_and_the_trace():
    from repl.trace import environment
    from utils.models import ModelPair
    from kvcache.probe import probe_pair

    target = corrupt_multi_token_cached_passes(llama(0))
    pair = ModelPair(target=target, drafter=llama(1), tokenizer=None, target_name="t", drafter_name="d",
                     end_tokens=[], device=torch.device("cpu"), vocab_size=arch_zoo.VOCAB, context_length=256,
                     self_draft_demo=False)
    pair.probe = probe_pair(pair)
    line = pair.probe.summary()
    assert line in pair.banner_lines() and "\n" not in line
    assert "target stepwise" in line and "drafter cached" in line
    probe = environment(pair)["cache_probe"]
    assert probe["target"]["path"] == "stepwise" and "pass over a cached prefix" in probe["target"]["reason"]
    assert probe["drafter"]["path"] == "cached"


def test_the_panel_line_names_each_models_path_and_why():
    from repl.render import path_text, rollback_text

    rollback = {"target": {"method": "restore", "restores": 2, "path": "stepwise", "reason": "cached: off by 0.67",
                           "seconds": 0.0},
                "drafter": {"method": "crop", "restores": 0, "path": "cached", "reason": "", "seconds": 0.0}}
    assert path_text(rollback) == "cache path: target stepwise (cached: off by 0.67) · drafter cached"
    assert "path" not in rollback_text(rollback) and "restores 2" in rollback_text(rollback)


# ------------------------------------------------------------- a forward that is not causal

def length_dependent(seed):
    """A tiny Llama whose logits at every position favour a token that depends on how many tokens
    the forward was fed: a position scores differently in a verify pass than alone (not causal)."""
    model = llama(seed)

    class LengthDependent(type(model)):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            fed = kwargs["input_ids"].shape[1]
            out.logits[..., (7 * fed) % out.logits.shape[-1]] += 4 * arch_zoo.LOGIT_SCALE
            return out

    model.__class__ = LengthDependent
    return model


def test_a_target_that_is_not_causal_is_refused_for_drafting_and_runs_alone(monkeypatch):
    from engine import Strategy, pair_of, run_strategy

    target, drafter = length_dependent(0), llama(1)
    found = probe_of(target)
    assert not found.causal and found.causal_error > found.tolerance
    assert probe_of(llama(0)).causal and probe_of(llama(0)).causal_error <= probe_of(llama(0)).tolerance
    with pytest.raises(UnsupportedCacheError) as info:
        speculative(target, drafter)
    assert "\n" not in str(info.value) and "not causal" in str(info.value)
    alone = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=arch_zoo.LENGTH),
                         pair_of(target), list(arch_zoo.PROMPTS[0]))
    assert len(alone.tokens) == arch_zoo.LENGTH                   # target AR runs: each step is its own definition
    # A model whose cache is refused outright keeps the measurement: with /cache off it is still refused.
    def refuse(*args, **kwargs):
        raise UnsupportedCacheError("a cache class of its own")

    with monkeypatch.context() as patch:
        patch.setattr(kvcache.probe, "_replay", refuse)
        refused = probe_model(length_dependent(2))
    assert refused.path == "refused" and not refused.causal
    # A drafter need not be causal: its drafts are only proposals.
    assert speculative(llama(0), length_dependent(1)).rounds > 0
    # Mutation check: without the refusal, drafting parts from the target's own decoding.
    monkeypatch.setattr(kvcache.probe, "probe_of", lambda model: kvcache.probe.ProbeResult("m", "float32", "cached"))
    assert speculative(target, drafter).tokens != alone.tokens
