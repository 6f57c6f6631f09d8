"""The lean one-token step of cast self-drafters (``selfdraft.lean``).

The step must compute what the model's own forward computes (checked on logits,
not tokens, with mutations the check must see), hold no second copy of the
weights, refuse models of another shape with one line, and, inside the
self-drafter, keep its buffers in step with the target's cache: a drafter whose
buffers drift still decodes losslessly but stops being accepted, which the last
mutation shows.
"""

from __future__ import annotations

import pytest
import torch

from sampling import GreedyProcessor, MultinomialProcessor
from model_drafters.selfdraft import lean
from model_drafters.selfdraft.build import build_self_drafter
from model_drafters.selfdraft.copies import precision_copy
from model_drafters.selfdraft.lean import LEAN_ATTR, LEAN_REASON_ATTR, LeanStep, lean_step
from kvcache.shared import committed_positions
from model_drafters.selfdraft.spec import parse_self_draft
from tests.helpers.arch_zoo import PROMPTS, build
from tests.helpers.distribution import PROMPT, STEPS, V, chi_square_excess, exact_distribution
from tests.helpers.decode import autoregressive, speculative
from tests.helpers.devices import ON_CPU, needs_int8
from tests.helpers.models import tiny_llama

GREEDY = GreedyProcessor()
# The int8 weight-only copy runs on a CPU only (on another device it is refused, in one line).
COPIES = ("self:bf16", "self:fp16") + (("self:int8=weight-only",) if ON_CPU else ())


def _copy(kind: str, target=None):
    return build_self_drafter(target if target is not None else build("llama"), parse_self_draft(kind))


@torch.inference_mode()
def _own_logits(model, ids: list[int]) -> torch.Tensor:
    """The model's own uncached logits at every position, float32, (L, V)."""
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


@torch.inference_mode()
def _lean_logits(step: LeanStep, ids: list[int]) -> torch.Tensor:
    step.clear()
    return torch.cat([step.step(torch.tensor([t])).float() for t in ids])


@pytest.mark.parametrize("kind", COPIES)
def test_the_lean_step_computes_the_models_own_forward(kind):
    model = _copy(kind)
    step = getattr(model, LEAN_ATTR)
    assert step is not None, getattr(model, LEAN_REASON_ATTR)
    ids = list(PROMPTS[1]) * 3                                 # a few dozen positions, repeats included
    want, got = _own_logits(model, ids), _lean_logits(step, ids)
    scale = want.abs().max(dim=-1, keepdim=True).values
    assert ((got - want).abs() / scale).max() < lean.TOLERANCE[step.dtype]
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9


@pytest.mark.skipif(not ON_CPU, reason="the float32 cache is a CPU's choice")
def test_float16_weights_on_a_cpu_attend_over_float32_keys_and_values():
    """A CPU's float16 attention is several times slower than its float32 over long caches (docs/results.md),
    so a float16 copy's step holds its keys and values in float32 and attends there: the positions
    appended from the target's float32 cache are kept exactly, and the logits stay the model's own.
    A bfloat16 copy keeps its own dtype."""
    model = _copy("self:fp16")
    step = getattr(model, LEAN_ATTR)
    assert step.dtype == torch.float16 and step.cache_dtype == torch.float32
    ids = list(PROMPTS[1]) * 3
    want, got = _own_logits(model, ids), _lean_logits(step, ids)
    scale = want.abs().max(dim=-1, keepdim=True).values
    assert ((got - want).abs() / scale).max() < lean.TOLERANCE[torch.float16]
    assert all(k.dtype == torch.float32 for k in step.keys + step.values)
    exact = torch.randn(1, step.kv_heads, 3, step.head_dim, dtype=torch.float32)
    with torch.inference_mode():
        step.clear()
        step.append([(exact, exact)] * len(step.layers))
    assert torch.equal(step.keys[0][:, :3], exact[0])                 # float16 would round them
    assert getattr(_copy("self:bf16"), LEAN_ATTR).cache_dtype == torch.bfloat16


def test_positions_appended_from_a_cache_are_read_like_its_own():
    """Keys and values handed over from a cache (the target's, cast) and then one step
    give the logits of the model's forward over the whole sequence."""
    model = _copy("self:bf16")
    step = getattr(model, LEAN_ATTR)
    ids = list(PROMPTS[0])
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids[:-1]]), use_cache=True)
        step.clear()
        step.append(committed_positions(out.past_key_values, 0, len(ids) - 1))
        got = step.step(torch.tensor([ids[-1]])).float()
    want = _own_logits(model, ids)[-1:]
    assert step.length == len(ids)
    assert ((got - want).abs().max() / want.abs().max()) < lean.TOLERANCE[torch.bfloat16]


def test_the_fused_weights_are_views_and_leave_the_model_as_it_was():
    plain = precision_copy(build("llama"), torch.bfloat16)
    before = _own_logits(plain, list(PROMPTS[0]))
    fused = lean.LeanStep(plain)                               # rebinds the layers' weights to views
    layer = plain.model.layers[0]
    qkv = fused.layers[0].qkv.weight
    assert layer.self_attn.q_proj.weight.data_ptr() == qkv.data_ptr()
    assert layer.self_attn.v_proj.weight.untyped_storage().data_ptr() == qkv.untyped_storage().data_ptr()
    assert torch.equal(_own_logits(plain, list(PROMPTS[0])), before)


def test_a_tied_head_stays_tied_and_no_weight_is_held_twice():
    plain = precision_copy(tiny_llama(3, tie=True), torch.bfloat16)
    assert plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()

    def held(model) -> int:
        seen = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
        seen.update({b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in model.buffers()})
        return sum(seen.values())

    before = held(plain)
    step, reason = lean_step(plain)
    assert step is not None, reason
    assert plain.lm_head.weight.data_ptr() == plain.model.embed_tokens.weight.data_ptr()
    assert held(plain) == before


@pytest.mark.parametrize("break_it, why", [
    (lambda s: setattr(s, "_cos", s._cos.flip(0)), "positions rotated backwards"),
    (lambda s: [setattr(layer, "eps1", 1.0) for layer in s.layers], "the first norm's epsilon"),
    (lambda s: [setattr(layer, "scale", 1.0) for layer in s.layers], "the attention scale"),
])
def test_the_trial_refuses_a_step_that_computes_something_else(monkeypatch, break_it, why):
    """Mutations of the step: each must fail the numeric trial, so no wrong step is ever used."""
    real = LeanStep._rotation

    def rotation_then_break(self, positions):                  # runs once, before the first step
        real(self, positions)
        break_it(self)

    monkeypatch.setattr(LeanStep, "_rotation", rotation_then_break)
    model = _copy("self:fp16")
    step, reason = lean_step(model)
    assert step is None and "differs from the model's own forward" in reason, why


@pytest.mark.parametrize("family, words", [("qwen3", "attention differs from Llama's"),
                                           ("phi3", "differs from Llama")])
def test_another_shape_drafts_through_its_own_forward_and_says_why(family, words):
    model = _copy("self:bf16", build(family))
    assert getattr(model, LEAN_ATTR) is None
    reason = getattr(model, LEAN_REASON_ATTR)
    assert reason and "\n" not in reason and words in reason


def test_a_sliding_window_is_refused():
    target = tiny_llama(4, vocab_size=64, hidden=32)             # not the zoo's shared model
    target.config.sliding_window = 8
    model = _copy("self:bf16", target)
    assert getattr(model, LEAN_ATTR) is None and "sliding window" in getattr(model, LEAN_REASON_ATTR)


def test_a_rotation_that_changes_with_the_length_is_refused():
    import transformers

    dynamic = {"rope_type": "dynamic", "factor": 2.0}
    if transformers.__version__.startswith("4."):
        rotation = {"rope_scaling": dynamic}
    else:
        rotation = {"rope_parameters": {**dynamic, "rope_theta": 10000.0}}
    model = precision_copy(tiny_llama(0, **rotation), torch.bfloat16)
    step, reason = lean_step(model)
    assert step is None and "rotation (dynamic) changes with the sequence length" in reason
    model.model.rotary_emb.rope_type = "default"               # the same model, one table: accepted
    assert lean_step(model)[0] is not None


@needs_int8
def test_a_copy_of_another_kind_keeps_its_own_forward():
    model = _copy("self:int8")                                 # torch's dynamic int8 layers
    assert getattr(model, LEAN_ATTR) is None and "one kind" in getattr(model, LEAN_REASON_ATTR)


def test_a_trial_that_raises_leaves_the_own_forward_and_names_the_error():
    target = tiny_llama(4, vocab_size=64, hidden=32)
    model = build_self_drafter(target, parse_self_draft("self:bf16"))
    assert getattr(model, LEAN_ATTR) is not None                 # the shape is Llama's

    def refuse(*args, **kwargs):
        raise TypeError("rotary arguments of another kind")

    model.model.rotary_emb.forward = refuse
    step, reason = lean_step(model)
    assert step is None and "TypeError: rotary arguments of another kind" in reason and "\n" not in reason


# ------------------------------------------------------- inside the drafter

def _disagreeing(model, noise: float = 0.1):
    """``model`` with noise added to its float weights in place (the lean step's fused tensors are
    views of them, so it drafts with the same weights): a copy that agrees with its target about
    half the time, so rounds end in rejections and a stale or wrong position shows."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((torch.randn(p.shape, generator=generator) * noise * p.float().std()).to(p.dtype))
    return model


def _greedy_runs(drafter, target):
    results = [speculative(list(p), drafter, target, processor=GREEDY, gamma=4,
                           max_gen_len=24) for p in PROMPTS]
    refs = [autoregressive(list(p), target, processor=GREEDY, max_gen_len=24).tokens
            for p in PROMPTS]
    return results, refs


@pytest.mark.parametrize("kind", COPIES)
def test_a_lean_drafter_is_lossless_and_drafts_as_well_as_its_own_forward(kind):
    target = build("llama")
    model = _disagreeing(_copy(kind, target))
    results, refs = _greedy_runs(model, target)
    assert [r.tokens for r in results] == refs
    assert all(r.rollback["drafter"]["step"] == "lean" for r in results)
    accepted = sum(r.accepted for r in results)
    object.__setattr__(model, LEAN_ATTR, None)                 # the same copy through its own forward
    plain, _ = _greedy_runs(model, target)
    assert all(r.rollback["drafter"]["step"] == "" for r in plain)
    assert accepted >= 0.9 * sum(r.accepted for r in plain) > 0


def test_buffers_that_keep_a_rounds_drafts_are_caught(monkeypatch):
    """Mutation: without dropping its drafts the lean step reads stale positions; the output stays
    lossless (the target verifies) but the drafts stop being accepted."""
    target = build("llama")
    model = _disagreeing(_copy("self:bf16", target))   # a copy accepted always would self-heal
    results, refs = _greedy_runs(model, target)
    synced = sum(r.accepted for r in results) / sum(r.drafted for r in results)
    monkeypatch.setattr(LeanStep, "drop", lambda self, n: None)
    broken, _ = _greedy_runs(model, target)
    assert [r.tokens for r in broken] == refs
    assert sum(r.accepted for r in broken) / sum(r.drafted for r in broken) < synced / 2


RUNS = 800


def _sampled_excess(drafter, small, processor) -> tuple[float, set]:
    generator = torch.Generator().manual_seed(99)
    counts, steps = {}, set()
    for _ in range(RUNS):
        result = speculative(PROMPT, drafter, small, processor=processor, gamma=3,
                             max_gen_len=STEPS, generator=generator)
        key = tuple(result.tokens[:STEPS])
        counts[key] = counts.get(key, 0) + 1
        steps.add(result.rollback["drafter"]["step"])
    return chi_square_excess(counts, exact_distribution(small, processor), RUNS), steps


@pytest.mark.any_release
def test_lean_sampling_keeps_the_target_distribution(monkeypatch):
    """A lean copy that disagrees with its target (accepted about a third of the time), so the
    residual draws decide the distribution; resampling from p instead of the residual must fail."""
    small = tiny_llama(10, vocab_size=V, hidden=16, logit_scale=15.0)
    drafter = _disagreeing(build_self_drafter(small, parse_self_draft("self:bf16")), noise=1.0)
    assert getattr(drafter, LEAN_ATTR) is not None
    processor = MultinomialProcessor(1.0)
    excess, steps = _sampled_excess(drafter, small, processor)
    assert steps == {"lean"}
    assert excess < 5.0
    import generation.accept

    monkeypatch.setattr(generation.accept, "residual_distributions", lambda p, q, draft: p)
    assert _sampled_excess(drafter, small, processor)[0] > 5.0


# --------------------------------------------------------------------- many chains at once

def _held(step: LeanStep, length: int, seed: int = 5) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random keys and values for ``length`` held positions (not any model's: a chain that reads one
    it should not is decisively off)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (1, step.kv_heads, length, step.head_dim)
    return [(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)) for _ in step.layers]


@torch.inference_mode()
def _chains_one_by_one(step: LeanStep, held, starts, tokens, depth):
    """Each chain by :meth:`LeanStep.step`, from the held positions before its start: (drafts, logits)."""
    drafts, rows = [], []
    for start, token in zip(starts, tokens.tolist()):
        step.clear()
        step.append([(k[:, :, :start], v[:, :, :start]) for k, v in held])
        chain, logits = [], []
        fed = torch.tensor([token])
        for _ in range(depth):
            row = step.step(fed)
            logits.append(row[0].float())
            fed = row.argmax(-1)
            chain.append(int(fed))
        drafts.append(chain)
        rows.append(torch.stack(logits))
    return torch.tensor(drafts), torch.stack(rows)


def test_chains_batched_over_many_starts_equal_each_chain_stepped_alone():
    # float32 (the target's own dtype): the batched products and attention agree with single steps
    # to float rounding, logits compared, and so every draft; each start reads only the held
    # positions before it (random ones, so reading another is off by far more than rounding).
    model = tiny_llama(3, vocab_size=64, hidden=32, layers=2, logit_scale=4.0)
    step = LeanStep(model)
    length, depth = 40, 6
    held = _held(step, length)
    starts = list(range(3, length))
    tokens = torch.randint(0, 64, (len(starts),), generator=torch.Generator().manual_seed(1))
    step.clear()
    step.append(held)
    drafts, logits = step.branches(starts, tokens, depth, lambda rows: rows.argmax(-1), keep_logits=True)
    assert step.length == length                                # the held positions stay held
    want_drafts, want_logits = _chains_one_by_one(step, held, starts, tokens, depth)
    assert torch.equal(drafts, want_drafts)
    assert (logits.float() - want_logits).abs().max() < 1e-5 * want_logits.abs().max()


def test_a_batched_chain_reads_the_held_positions_before_its_start_and_no_others():
    # The mask itself: changing held positions at or past a chain's start changes nothing of it,
    # changing one before its start changes its logits.
    model = tiny_llama(3, vocab_size=64, hidden=32, layers=2, logit_scale=4.0)
    step = LeanStep(model)
    length, start = 30, 12
    tokens = torch.tensor([7])

    def logits_with(held):
        step.clear()
        step.append(held)
        return step.branches([start], tokens, 3, lambda rows: rows.argmax(-1), keep_logits=True)[1]

    base = _held(step, length)
    after = [(k.clone(), v.clone()) for k, v in base]
    before = [(k.clone(), v.clone()) for k, v in base]
    for (k, v), (k2, v2) in zip(after, before):
        k[:, :, start:] += 3.0
        v[:, :, start:] -= 3.0
        k2[:, :, start - 1] += 3.0
    assert torch.equal(logits_with(base), logits_with(after))
    assert (logits_with(base) - logits_with(before)).abs().max() > 1e-3


def test_timing_whether_batching_pays_leaves_the_held_positions_as_they_were():
    from advisor.memo import batching_pays

    model = tiny_llama(3, vocab_size=64, hidden=32, layers=2, logit_scale=4.0)
    step = LeanStep(model)
    held = _held(step, 30)
    step.clear()
    step.append(held)
    starts, tokens = list(range(3, 29)), torch.arange(26) % 64
    pick = lambda rows: rows.argmax(-1)                         # noqa: E731
    before = step.branches(starts, tokens, 4, pick, keep_logits=True)[1]
    assert batching_pays(step, starts, tokens, pick) in (True, False)
    assert step.length == 30
    assert torch.equal(step.branches(starts, tokens, 4, pick, keep_logits=True)[1], before)
