"""Every self-drafter on every family of the architecture matrix: lossless, or refused with one line.

A self-drafter is made from the target (``selfdraft``): a copy in bfloat16 or
float16, an int8 copy, or the target with a layer skipped. Each runs here
through the engine (``Strategy(drafter="self")``, the path the REPL and the
benchmark take: on the target's own cache where it can be shared) with greedy
decoding, and must give ``generate``'s tokens on the matrix prompts, or be
refused with a one-line message (an ``UnsupportedCacheError`` or ``ValueError``,
what the front ends print as one line). The skip drafter must be rejected
somewhere on each family where it runs, so the rollback paths are taken.
"""

from __future__ import annotations

import pytest

from engine import Strategy, run_strategy
from kvcache.cache import TRANSFORMERS_RELEASE
from utils.hf_load import text_config
from tests.helpers.arch_zoo import (
    FAMILIES,
    LENGTH,
    PROMPTS,
    VOCAB,
    FamilyUnavailable,
    _greedy,
    _pair,
    build,
    reference,
    refusal_allowed,
)
from tests.helpers.devices import INT8_MISSING, ON_CPU, needs_int8

# Where self:int8's route is missing (optimum-quanto off a CPU) that kind is left out of the matrix,
# and test_self_int8_is_lossless_on_llama says so in one skip line.
KINDS = tuple(k for k in ("self:bf16", "self:fp16", "self:int8", "self:int8=weight-only", "self:skip")
              if k != "self:int8" or not INT8_MISSING)
# Where a self-drafter is refused, and the words its one line must hold: a
# layer-skipping view needs a decoder-only model whose layer list it can find and
# whose layer types it can give the kept layers.
REFUSED = {
    ("bart", "self:skip"): "decoder-only",
    ("t5", "self:skip"): "decoder-only",
    ("bamba", "self:skip"): "derives its layer types from their positions",
    ("jamba", "self:skip"): "derives its layer types from their positions",
    ("recurrent_gemma", "self:skip"): "cannot find the decoder layers",
    # two attention blocks per layer, each with its own cache index
    ("longcat_flash", "self:skip"): "cannot find the decoder layers",
    ("xlstm", "self:skip"): "cannot find the decoder layers",      # its blocks are no layer list
}
if TRANSFORMERS_RELEASE >= (5,):
    # its kernels mix the copy's dtype with float32 on a sequence as long as its chunk
    REFUSED |= {("xlstm", "self:bf16"): "does not run in bfloat16", ("xlstm", "self:fp16"): "does not run in float16",
                ("xlstm", "self:int8=weight-only"): "does not run in bfloat16"}   # it computes in bfloat16 too


def _layer_to_skip(model) -> int:
    """Layer 1, or the first other layer whose skipping leaves an attention layer
    (a hybrid's cache reads its length from one: skipping its only one is refused,
    see ``test_skipping_a_hybrid_s_only_attention_layer_is_refused_with_one_line``)."""
    config = text_config(model.config)
    n = config.num_hidden_layers
    types = next((t for key in ("layer_types", "layers_block_type")
                  if isinstance(t := getattr(config, key, None), (list, tuple)) and len(t) == n), None)
    for i in (1, *range(n)):
        if types is None or not any("attention" in str(t) for t in types) or any(
                "attention" in str(t) for j, t in enumerate(types) if j != i):
            return i
    return 1


def _outcome(name: str, kind: str) -> tuple[str, str, int]:
    """("pass" | "refused" | "differs", detail, drafts rejected) for one kind on one family."""
    target = build(name)
    pair = _pair(target, vocab_size=VOCAB)
    spec = f"self:skip={_layer_to_skip(target)}" if kind == "self:skip" else kind
    strategy = Strategy(kind, drafter="self", drafter_options=spec, gamma=3, processor=_greedy(),
                        max_gen_len=LENGTH)
    rejected = 0
    for i, prompt in enumerate(PROMPTS):
        try:
            result = run_strategy(strategy, pair, list(prompt))
        except ValueError as e:                     # UnsupportedCacheError and SkipRefused are ValueErrors
            return "refused", str(e), rejected
        want = list(reference(name, tuple(prompt)))
        if result.tokens != want:
            return "differs", f"prompt {i}: {result.tokens} != {want}", rejected
        rejected += result.drafted - result.accepted
    return "pass", "", rejected


@pytest.mark.parametrize("name", list(FAMILIES))
def test_every_self_drafter_is_lossless_or_refused_with_one_line(name):
    try:
        build(name)
    except FamilyUnavailable as e:
        pytest.skip(str(e))
    for kind in KINDS:
        status, detail, rejected = _outcome(name, kind)
        expected = REFUSED.get((name, kind))
        if kind == "self:int8=weight-only" and not ON_CPU:
            expected = expected or "runs on a CPU only"         # the route is a CPU kernel: refused elsewhere
        if status == "refused" and refusal_allowed(name, detail):
            assert "\n" not in detail
            continue
        if expected is not None:
            assert status == "refused" and expected in detail and "\n" not in detail, (kind, status, detail)
            continue
        assert status == "pass", f"{name} {kind}: {status}: {detail}"
        if kind.startswith("self:skip"):
            assert rejected > 0, f"{name} {kind}: no draft was rejected, so no rollback was tried"


@needs_int8
def test_self_int8_is_lossless_on_llama():
    """self:int8 through this device's route (the matrix above leaves it out where that is missing)."""
    status, detail, _ = _outcome("llama", "self:int8")
    assert status == "pass", detail


def test_skipping_a_hybrid_s_only_attention_layer_is_refused_with_one_line():
    from model_drafters.selfdraft.skip import SkipRefused, skip_view

    target = build("lfm2")                                  # layers: conv, attention, conv
    with pytest.raises(SkipRefused, match=r"^self:skip: Lfm2Config needs an attention layer .*keep one of layers 1\)$"):
        skip_view(target, [1])
