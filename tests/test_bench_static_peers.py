"""transformers' peers on a static cache (``bench.peers``, ``bench.variants``): the same greedy tokens
as their eager twins, a static cache really in use, the releases that refuse it said in one line,
and ours paired with the peer that matches the run's compile path."""

from __future__ import annotations

import weakref

import pytest
import torch
import transformers
from transformers.cache_utils import Cache, EncoderDecoderCache, StaticCache
from transformers.generation.utils import GenerationMixin

from bench import peers

from bench.aggregate import summarize
from bench.peers import generation_config, peer_call, quiet_transformers, static_cache_len, static_peer_refusal
from bench.processors import parse_processor
from bench.records import RunRecord
from bench.variants import STATIC, Variant, matching_peer, parse_variant_name, plan_variants
from tests.helpers.models import tiny_llama, tiny_t5
from tests.helpers.mutations import static_by_attribute

# A prompt that repeats itself, so prompt lookup finds matches and drafts (and overshoots).
PROMPT = [0, 5, 9, 3, 5, 9, 3, 7, 5, 9, 3]
LENGTH = 24


@pytest.fixture(scope="module")
def models():
    # wide logits (decisive argmax) and a drafter independent of the target: drafts get rejected
    return tiny_llama(1, logit_scale=8.0), tiny_llama(2, logit_scale=8.0)


def _decode(strategy: str, target, drafter, *, static: bool, gamma: int = 3):
    """(new tokens, the cache classes the target's forwards were given) of one greedy peer call."""
    config = generation_config(
        parse_processor("greedy"), max_new_tokens=LENGTH, end_tokens=[63], pad_token_id=63,
        prompt_lookup=gamma if strategy == "hf_prompt_lookup" else None, static=static,
        cache_len=static_cache_len(strategy, len(PROMPT), LENGTH, gamma) if static else None)
    seen: list[type] = []

    def spy(module, args, kwargs):       # an encoder-decoder's pair of caches: its decoder's
        seen.extend(type(v.self_attention_cache if isinstance(v, EncoderDecoderCache) else v)
                    for v in kwargs.values() if isinstance(v, Cache))
    hook = target.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        if strategy == "hf_assisted":
            drafter.generation_config.num_assistant_tokens = gamma
            drafter.generation_config.num_assistant_tokens_schedule = "constant"
            drafter.generation_config.assistant_confidence_threshold = 0.0
        with quiet_transformers(), torch.no_grad():
            out = peer_call(strategy, target, drafter, torch.tensor([PROMPT]), config)()
    finally:
        hook.remove()
    return out[0, len(PROMPT):].tolist()[:LENGTH], seen


@pytest.mark.parametrize("strategy", ["hf_generate", "hf_assisted", "hf_prompt_lookup"])
def test_a_static_peer_decodes_what_its_eager_twin_does_on_a_static_cache(models, strategy):
    """Greedy: the static peer's tokens equal the eager peer's, and the target's forwards are given a
    StaticCache (the eager one never is). Mutation (by hand): generation_config ignoring ``static``
    leaves the static run on a DynamicCache and fails the cache check."""
    target, drafter = models
    if static_peer_refusal(strategy, target, drafter) is not None:
        pytest.skip(static_peer_refusal(strategy, target, drafter))
    eager, eager_caches = _decode(strategy, target, drafter, static=False)
    static, static_caches = _decode(strategy, target, drafter, static=True)
    assert len(eager) == LENGTH
    assert static == eager
    assert static_caches and all(issubclass(c, StaticCache) for c in static_caches)
    assert not any(issubclass(c, StaticCache) for c in eager_caches)


def test_prompt_lookup_on_a_static_cache_needs_room_past_the_budget(models):
    """Prompt lookup verifies candidates past max_new_tokens: a static cache sized to the budget alone
    overflows on this prompt, which is why static_cache_len adds a round's drafts."""
    target, drafter = models
    if static_peer_refusal("hf_prompt_lookup", target, drafter) is not None:
        pytest.skip("this transformers runs prompt lookup on a dynamic cache only")
    assert static_cache_len("hf_prompt_lookup", 10, 20, 4) == 10 + 20 + 4 + 1
    assert static_cache_len("hf_generate", 10, 20, None) is None
    config = generation_config(parse_processor("greedy"), max_new_tokens=LENGTH, end_tokens=[63], pad_token_id=63,
                               prompt_lookup=3, static=True)
    with quiet_transformers(), torch.no_grad(), pytest.raises((IndexError, RuntimeError)):
        torch.manual_seed(0)
        target._previous_max_cache_length = -1          # no larger cache left by an earlier call
        peer_call("hf_prompt_lookup", target, drafter, torch.tensor([PROMPT * 3]), config)()


def _tried(strategy: str, target, drafter) -> bool:
    """Whether transformers runs ``strategy`` on a static cache with these models, found by a real
    greedy call: it raises nowhere and every forward of the target is given a StaticCache."""
    try:
        _, caches = _decode(strategy, target, drafter, static=True)
    except (ValueError, TypeError, RuntimeError, IndexError):
        return False
    return bool(caches) and all(issubclass(c, StaticCache) for c in caches)


def _cases(models):
    target, drafter = models
    t5, t5_drafter = tiny_t5(0), tiny_t5(1)      # an encoder-decoder: transformers crops only a dynamic cache
    return [(s, target, drafter) for s in ("hf_generate", "hf_assisted", "hf_prompt_lookup")] + \
        [(s, t5, t5_drafter) for s in ("hf_generate", "hf_assisted")]


def _refusal_faults(refusal, cases) -> list[str]:
    """Where ``refusal`` disagrees with a real call (empty: nowhere); a refusal is one line naming the
    transformers release."""
    faults = []
    for strategy, target, drafter in cases:
        reason, runs = refusal(strategy, target, drafter), _tried(strategy, target, drafter)
        if (reason is None) != runs:
            faults.append(f"{strategy} on {type(target).__name__}: said {reason!r}, runs {runs}")
        elif reason is not None and ("\n" in reason or transformers.__version__ not in reason):
            faults.append(f"{strategy}: {reason!r}")
    return faults


def test_the_peers_refused_a_static_cache_are_those_transformers_refuses(models, monkeypatch):
    """static_peer_refusal against a real static-cache call of each peer on tiny models (a decoder
    and an encoder-decoder), on this transformers."""
    monkeypatch.setattr(peers, "_STATIC_TRIALS", weakref.WeakKeyDictionary())
    assert _refusal_faults(static_peer_refusal, _cases(models)) == []


@pytest.mark.any_release      # 5.17's behaviour, planted on the newest release (4.x swaps the cache out before)
def test_a_release_that_raises_on_a_static_assisted_cache_is_refused(models, monkeypatch):
    """transformers 5.17 and 5.18, made here: ``Cache.activate_past_recording`` exists, yet assisted
    generation (and prompt lookup, which runs through it) raises on a static cache. The peers are
    refused, in one line, and the run goes on. Mutation (static_by_attribute,
    tests/helpers/mutations.py): taking the attribute as proof fails the same check."""
    real = GenerationMixin._assisted_decoding

    def refusing(self, *args, **kwargs):
        if any(isinstance(v, StaticCache) for v in kwargs.values()):      # the cache, whatever its keyword
            raise ValueError("assisted generate is not supported with Static cache classes")
        return real(self, *args, **kwargs)
    monkeypatch.setattr(GenerationMixin, "_assisted_decoding", refusing)
    monkeypatch.setattr(Cache, "activate_past_recording", lambda self: None, raising=False)
    monkeypatch.setattr(peers, "_STATIC_TRIALS", weakref.WeakKeyDictionary())
    cases = _cases(models)[:3]
    assert _refusal_faults(static_peer_refusal, cases) == []
    target, drafter = models
    assert "Static cache classes" in static_peer_refusal("hf_assisted", target, drafter)
    assert static_peer_refusal("hf_generate", target) is None
    monkeypatch.setattr(peers, "_STATIC_TRIALS", weakref.WeakKeyDictionary())
    assert len(_refusal_faults(static_by_attribute(static_peer_refusal), cases)) == 2


def test_static_peers_are_rows_of_their_own_right_after_their_eager_twins():
    static = {"hf_generate", "hf_assisted", "hf_prompt_lookup"}
    names = [v.name for v in plan_variants(["speculative", "ngram"], [4], peers=True, static_peers=static)]
    assert names == ["target", "hf_generate", "hf_generate+static", "speculative@4", "hf_assisted@4",
                     "hf_assisted+static@4", "ngram@4", "hf_prompt_lookup@4", "hf_prompt_lookup+static@4"]
    assert [v.name for v in plan_variants(["ngram"], [4], peers=True, static_peers={"hf_generate"})] == \
        ["target", "hf_generate", "hf_generate+static", "ngram@4", "hf_prompt_lookup@4"]
    assert "hf_generate+static" not in [v.name for v in plan_variants(["ngram"], [4], peers=False, static_peers=static)]
    for name in names + ["hf_assisted+static:heuristic@4"]:
        assert parse_variant_name(name).name == name
    assert parse_variant_name("hf_generate+static").label == "HF generate static"
    assert parse_variant_name("hf_assisted+static@4").label == "HF assisted static γ=4"


def _record(variant: str, prompt: str, repeat: int, seconds: float) -> RunRecord:
    v = parse_variant_name(variant)
    return RunRecord(variant=variant, strategy=v.strategy, gamma=v.gamma, family=v.family, prompt_id=prompt,
                     category="chat", repeat=repeat, prompt_tokens=4, tokens=[1] * 10, seconds=seconds,
                     target_calls=10)


def test_ours_are_paired_with_the_peer_of_the_compile_path():
    """Under static or graphs speculative@4 is compared with hf_assisted+static@4, under off with
    hf_assisted@4; where the static peer did not run, with the eager one. Mutation (by hand):
    matching_peer returning the eager peer always gives vs_peer 2.0 under graphs and fails."""
    assert matching_peer(Variant("speculative", 4), "graphs") == Variant("hf_assisted", 4, cache=STATIC)
    assert matching_peer(Variant("target"), "static").name == "hf_generate+static"
    assert matching_peer(Variant("target"), "off").name == "hf_generate"
    assert matching_peer(Variant("speculative", 4, tree=8), "graphs") is None
    times = {"target": 1.0, "speculative@4": 0.5, "hf_assisted@4": 1.0, "hf_assisted+static@4": 0.25}
    records = [_record(name, p, r, s) for name, s in times.items() for p in ("a", "b") for r in (0, 1)]

    def row(rows, name):
        return next(x for x in rows if x.variant == name and x.category == "all")
    graphs = row(summarize(records, greedy=False, compile="graphs"), "speculative@4")
    assert (graphs.peer, graphs.vs_peer) == ("hf_assisted+static@4", pytest.approx(0.5))
    off = row(summarize(records, greedy=False, compile="off"), "speculative@4")
    assert (off.peer, off.vs_peer) == ("hf_assisted@4", pytest.approx(2.0))
    eager_only = [r for r in records if r.variant != "hf_assisted+static@4"]
    fallback = row(summarize(eager_only, greedy=False, compile="graphs"), "speculative@4")
    assert (fallback.peer, fallback.vs_peer) == ("hf_assisted@4", pytest.approx(2.0))
