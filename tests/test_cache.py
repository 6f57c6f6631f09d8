"""kvcache.cache: the version-aware crop, the per-layer rollback decision, exact
restores of recurrent state, bounded sliding-window memory, and refusals."""

import pytest
import torch
import transformers.cache_utils
from transformers import DynamicCache

import kvcache.cache

from sampling import GreedyProcessor
from tests.helpers import arch_zoo
from tests.helpers.decode import speculative
from tests.helpers.models import tiny_llama
from kvcache.probe import cached_model
from kvcache.cache import (
    CROP_ZERO_KEEPS,
    RollbackStats,
    TRANSFORMERS_RELEASE,
    UnsupportedCacheError,
    cache_length,
    drop_last,
)

PROMPT = [3, 9, 4, 17, 5, 9, 4, 17, 5, 30, 2, 8, 41, 7, 9, 4, 17, 5, 12, 6, 33, 7, 21, 9]


def built(name, role="target"):
    try:
        return arch_zoo.build(name, role)
    except arch_zoo.FamilyUnavailable as e:
        pytest.skip(str(e))


def fill(model, length):
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([PROMPT[:length]]), past_key_values=cache, use_cache=True)
    return cache


def test_drop_last_removes_exactly_n_positions():
    cache = fill(tiny_llama(0), 9)
    drop_last(cache, 3)
    assert cache_length(cache) == 6
    drop_last(cache, 0)          # never empties the cache, whatever crop(0) means in this release
    assert cache_length(cache) == 6
    with pytest.raises(ValueError):
        drop_last(cache, -1)


class _UnfilledLinearLayer:
    """A linear-attention layer no forward wrote, as transformers 5.x before 5.24 gives an MLP block
    of a hybrid model: its conv kernel size is unknown, so its own crop raises."""

    def __init__(self):
        self.conv_states, self.recurrent_states, self.conv_kernel_size = {0: None}, {0: None}, {0: None}
        self.record_past = True

    def crop(self, tokens_to_remove):
        raise TypeError("bad operand type for unary -: 'NoneType'")


class _UnfilledAttentionLayer:
    """An attention layer no forward wrote, as transformers 5.17 gives a recurrent block of
    RecurrentGemma: its keys are None, so its own crop raises."""

    is_initialized = False
    keys = values = None
    record_past = True

    def crop(self, tokens_to_remove):
        raise TypeError("'NoneType' object is not subscriptable")


class _LayeredCache:
    """A cache whose ``crop`` crops every layer, as transformers' ``Cache.crop`` does."""

    def __init__(self, layers):
        self.layers = layers

    def crop(self, tokens_to_remove):
        for layer in self.layers:
            layer.crop(tokens_to_remove)


def test_a_layer_no_forward_filled_is_left_out_of_a_crop(monkeypatch):
    filled = fill(tiny_llama(0), 9)
    cache = _LayeredCache([filled.layers[0], _UnfilledLinearLayer(), _UnfilledAttentionLayer(), filled.layers[1]])
    drop_last(cache, 3)
    assert [layer.keys.shape[-2] for layer in (cache.layers[0], cache.layers[3])] == [6, 6]
    drop_last(cache, 0)
    never_filled = kvcache.cache.never_filled
    assert [never_filled(layer) for layer in cache.layers] == [False, True, True, False]
    # Mutation check: with every layer cropped, an unfilled one raises inside the crop.
    monkeypatch.setattr(kvcache.cache, "never_filled", lambda layer: False)
    with pytest.raises(TypeError):
        drop_last(cache, 1)


def test_crop_zero_rule_follows_the_release():
    assert CROP_ZERO_KEEPS == (TRANSFORMERS_RELEASE >= (5, 14))


def next_logits(model, cached, ids):
    with torch.inference_mode():
        return cached.forward(torch.tensor([ids]), keep=1)[0]


def reference_logits(model, ids):
    with torch.inference_mode():
        kwargs = ({"decoder_input_ids": torch.tensor([ids]), "input_ids": torch.tensor([PROMPT])}
                  if model.config.is_encoder_decoder else {"input_ids": torch.tensor([ids])})
        return model(**kwargs, use_cache=False).logits[0, -1]


@pytest.mark.parametrize("name", ["llama", "mistral", "gemma3", "lfm2", "mamba2", "jamba", "qwen3_next", "xlstm",
                                  "minimax", "deepseek_v32", "t5"])
def test_rollback_then_continue_matches_a_cacheless_forward(name):
    """A round whose drafts are rejected leaves the cache a prefix of the kept
    sequence: the next forward gives the logits a cacheless forward gives."""
    model = built(name)
    cached = cached_model(model)
    if TRANSFORMERS_RELEASE < (5,) and arch_zoo.family(name).kind in ("recurrent", "hybrid"):
        with pytest.raises(UnsupportedCacheError, match="its own"):
            cached.begin(PROMPT)      # 4.57 keeps this state in a cache class of the model's own
        return
    with torch.inference_mode():
        seq = cached.begin(PROMPT)
        cached.forward(torch.tensor([seq]), keep=1)
        for round_index in range(6):                        # rounds: feed 4 drafts, keep 1 of them
            before = cached.length
            cached.checkpoint()
            drafts = [(7 * round_index + j) % 50 + 3 for j in range(4)]
            cached.forward(torch.tensor([seq + drafts]), keep=5)
            seq = seq + drafts[:1] + [11]
            cached.rollback(len(seq) - 1)
            assert cached.length <= len(seq) - 1
            assert cached.length >= before              # never further back than the checkpoint
    got, want = next_logits(model, cached, seq), reference_logits(model, seq)
    # Cached and cacheless kernels sum in different orders: equal up to float rounding.
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * float(want.abs().max()) + 1e-5)
    assert int(got.argmax()) == int(want.argmax())


@pytest.mark.parametrize("name, expected", [("llama", "crop"), ("mamba2", "restore"), ("jamba", "restore"),
                                            ("xlstm", "restore"), ("deepseek_v32", "crop")])
def test_speculative_reports_the_rollback_it_used(name, expected):
    target, drafter = built(name), built(name, "drafter")
    try:
        with torch.inference_mode():
            result = speculative(PROMPT, drafter, target, processor=GreedyProcessor(), gamma=4, max_gen_len=24)
    except UnsupportedCacheError as e:
        assert TRANSFORMERS_RELEASE < (5,), f"refused on a release that should support it: {e}"
        return
    target_stats = result.rollback["target"]
    if target_stats["path"] != "cached" and arch_zoo.BETWEEN_THE_ENDS:    # 5.2's Mamba2: its cached pass is wrong
        pytest.skip(f"{name} runs {target_stats['path']} on this release: {target_stats['reason']}")
    assert target_stats["method"] == expected
    assert set(result.rollback) == {"target", "drafter"}
    assert set(target_stats) == {"method", "snapshots", "restores", "refed_tokens", "seconds", "path", "reason", "step"}
    if expected == "restore":
        rejected_rounds = sum(1 for r in result.trace if r.accepted < len(r.drafted))
        assert target_stats["restores"] == rejected_rounds > 0
        assert target_stats["refed_tokens"] >= target_stats["restores"]
        assert target_stats["snapshots"] >= result.rounds
        assert 0 < target_stats["seconds"] < result.seconds   # the copies are timed, inside the run
    else:
        assert target_stats["restores"] == 0 and target_stats["refed_tokens"] == 0


# Sliding-window layers record their past for an exact crop from 5.15; 5.14's keep only their
# window, and the engine snapshots them (a restore).
SLIDING_RECORDS_PAST = hasattr(getattr(transformers.cache_utils, "DynamicSlidingWindowLayer", None),
                               "activate_past_recording")


def test_deepseek_v32_is_cropped_where_no_layer_says_it_can_be(monkeypatch):
    """Before 5.17 no cache layer has ``is_croppable``; the engine then knows the classes
    whose crop is exact by name, DeepSeek-V3.2's ``DynamicIndexedLayer`` among them (5.14-5.16).
    Here the attribute is taken away, as those releases ship it, and the run must crop and
    equal ``generate``. Mutation: without that name its layers are snapshotted (a restore)."""
    target, drafter = built("deepseek_v32"), built("deepseek_v32", "drafter")
    for cls in (transformers.cache_utils.CacheLayerMixin, transformers.cache_utils.DynamicLayer):
        if "is_croppable" in vars(cls):
            monkeypatch.delattr(cls, "is_croppable")

    def run():
        with torch.inference_mode():
            return speculative(list(arch_zoo.PROMPTS[0]), drafter, target, processor=GreedyProcessor(), gamma=4,
                               max_gen_len=arch_zoo.LENGTH)

    result = run()
    assert result.rollback["target"]["method"] == "crop"
    assert result.tokens == list(arch_zoo.reference("deepseek_v32", arch_zoo.PROMPTS[0]))
    assert any(r.accepted < len(r.drafted) for r in result.trace)       # rollbacks ran
    named = kvcache.cache._croppable
    monkeypatch.setattr(kvcache.cache, "_croppable",
                        lambda layer: False if type(layer).__name__ == "DynamicIndexedLayer" else named(layer))
    assert run().rollback["target"]["method"] == "restore"


@pytest.mark.skipif(not CROP_ZERO_KEEPS, reason="trimming a recorded past needs transformers >= 5.14")
def test_sliding_window_memory_stays_bounded():
    model = built("mistral")
    window = model.config.sliding_window
    cached = cached_model(model)
    with torch.inference_mode():
        seq = cached.begin(PROMPT)
        for step in range(40):
            cached.checkpoint()
            cached.forward(torch.tensor([seq + [5, 6, 7]]), keep=4)
            seq = seq + [5, (step % 40) + 3]
            cached.rollback(len(seq) - 1)
            for layer in cached.cache.layers:
                assert layer.keys.shape[-2] <= window - 1, "the sliding layer kept more than its window"
    assert cached.stats.method == ("crop" if SLIDING_RECORDS_PAST else "restore")
    assert len(seq) - 1 > 2 * window


class _AllKeysLayer:
    """A sliding-window layer as transformers 5.15-5.17 ship it: recording its past, ``update``
    returns every key it holds, though the mask covers the window only."""

    is_sliding, sliding_window = True, 4

    def __init__(self):
        self.record_past = False
        self.keys = torch.zeros(1, 1, 0, 2)

    def update(self, key_states, value_states, *args, **kwargs):
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        return self.keys, self.keys


class _AllKeysCache:
    def __init__(self):
        self.layers = [_AllKeysLayer()]

    def activate_past_recording(self):
        for layer in self.layers:
            layer.record_past = True


@pytest.mark.parametrize("fixed", [True, False], ids=["5.15-5.17", "other-releases"])
def test_a_recording_sliding_layer_hands_attention_only_what_its_mask_covers(monkeypatch, fixed):
    """On 5.15-5.17 ``record_past`` gives a sliding layer 5.18's ``update``: after two forwards with no
    crop between, attention gets the window - 1 older keys and the new ones (what the mask covers),
    while the layer keeps all it recorded for a rollback; its class keeps its name and survives a
    snapshot. On other releases the layer is left as transformers made it."""
    monkeypatch.setattr(kvcache.cache, "SLIDING_UPDATE_RETURNS_ALL", fixed)
    cache = _AllKeysCache()
    kvcache.cache.record_past(cache)
    layer = cache.layers[0]
    assert layer.record_past and type(layer).__name__ == "_AllKeysLayer"
    layer.update(torch.randn(1, 1, 6, 2), None)
    new = torch.randn(1, 1, 2, 2)
    keys, _ = layer.update(new, None)
    assert layer.keys.shape[-2] == 8                                   # all of it, for a rollback
    if fixed:
        assert keys.shape[-2] == layer.sliding_window - 1 + 2 and torch.equal(keys[:, :, -2:], new)
        assert type(kvcache.cache.snapshot(layer)) is type(layer)
        kvcache.cache.record_past(cache)                               # idempotent
        assert type(layer).__mro__[1] is _AllKeysLayer
    else:
        assert keys.shape[-2] == 8 and type(layer) is _AllKeysLayer    # what 5.17 alone would hand on


def test_a_static_cache_is_refused_with_one_line():
    from transformers import StaticCache

    from kvcache.cache import _check_rollback_support

    model = tiny_llama(0)
    cache = StaticCache(config=model.config, max_cache_len=32)
    with pytest.raises(UnsupportedCacheError) as info:
        _check_rollback_support(model, cache)
    assert "\n" not in str(info.value) and "static" in str(info.value)


@pytest.mark.skipif(TRANSFORMERS_RELEASE < (5,), reason="4.57 refuses a cache class of the model's own")
def test_a_cache_class_of_the_models_own_is_snapshotted_whole_and_takes_no_tree():
    """xLSTM keeps its state in an ``xLSTMCache``: the model makes it on its first forward,
    a checkpoint copies all of it (the live cache is not the snapshot), a rejection puts the
    copy back, and token trees fall back to chains with one line."""
    from kvcache.cache import tree_support

    cached = cached_model(built("xlstm"))
    with torch.inference_mode():
        seq = cached.begin(PROMPT)
        assert type(cached.cache).__name__ == "xLSTMCache" and cached.length == len(PROMPT) - 1
        cached.checkpoint()
        before = cached.cache
        cached.forward(torch.tensor([seq + [5, 6, 7]]), keep=4)
        cached.rollback(len(seq) + 1)
    assert cached.cache is not before and cached.length == len(PROMPT) - 1
    assert cached.stats.method == "restore" and cached.stats.restores == 1 and cached.stats.refed_tokens == 2
    line = tree_support(cached)
    assert line and "\n" not in line and "xLSTMCache" in line


class _FakeEvent:
    """A CUDA event that finishes 5 ms after the one recorded before it."""

    recorded: list = []

    def __init__(self, enable_timing=False):
        self.waited = False

    def record(self):
        _FakeEvent.recorded.append(self)

    def synchronize(self):
        self.waited = True

    def elapsed_time(self, end):
        assert end.waited, "read before the end event finished"
        return 5.0 * (_FakeEvent.recorded.index(end) - _FakeEvent.recorded.index(self))


def test_on_a_gpu_rollback_time_is_read_from_events_once_they_have_finished(monkeypatch):
    """A GPU copies after the host has moved on: the host's clock would stop before the
    kernels do. Each span is a pair of events, read (after waiting for the end) by to_dict."""
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(_FakeEvent, "recorded", [])
    stats = RollbackStats(method="restore")
    for _ in range(3):
        with stats.timing(torch.device("cuda", 0)):
            pass
    assert stats.seconds == 0.0 and len(stats.pending) == 3      # nothing read while the work may be queued
    assert stats.to_dict()["seconds"] == pytest.approx(0.015)
    assert stats.to_dict()["seconds"] == pytest.approx(0.015)    # read once, not added again
    with stats.timing(torch.device("cpu")):                      # a CPU span is counted at once
        sum(range(1000))
    assert stats.seconds > 0.015 and not stats.pending


def test_a_tree_keeps_the_sparse_indexers_keys_of_its_path(monkeypatch):
    """DeepSeek-V3.2's indexer keeps keys of its own beside the layer's keys and values:
    after a tree verify, the kept path's indexer keys are gathered with them. Mutation:
    without that gather the indexer scores the wrong keys, and the tree run gives other
    tokens than ``generate``."""
    import kvcache.cache

    built("deepseek_v32")
    reason = arch_zoo.tree_reason("deepseek_v32")
    if reason is not None and arch_zoo.BETWEEN_THE_ENDS:   # 5.14: its cached pass is inexact, so no tree
        pytest.skip(f"no tree on this release: {reason}")
    assert reason is None, reason
    assert arch_zoo.check_tree("deepseek_v32", "speculative").passed
    monkeypatch.setattr(kvcache.cache, "_keep_indexer", lambda layer, block, kept: None)
    outcome = arch_zoo.guarded(lambda: arch_zoo.check_tree("deepseek_v32", "speculative"))
    assert outcome.status == "fail" and "generate gave" in outcome.detail, outcome


def test_the_cache_argument_is_the_one_each_forward_names():
    """transformers 5.24 renamed ``past_key_values`` (``cache_params`` on Mamba-like models) to
    ``cache``, keeping the old name as an alias on some models only; a model passed a name its
    forward does not declare may run with no cache at all (Mamba, Mamba2, xLSTM on 5.24)."""
    from kvcache.cache import _forward_kwargs

    class Old:
        def forward(self, input_ids, past_key_values=None, logits_to_keep=0): ...

    class OldMamba:
        def forward(self, input_ids, cache_params=None, num_logits_to_keep=0): ...

    class New:
        def forward(self, input_ids, cache=None, logits_to_keep=0, **kwargs): ...

    assert _forward_kwargs(Old()) == ("past_key_values", "logits_to_keep")
    assert _forward_kwargs(OldMamba()) == ("cache_params", "num_logits_to_keep")
    assert _forward_kwargs(New()) == ("cache", "logits_to_keep")


def test_an_autoregressive_run_books_its_cache_under_the_model_that_ran():
    """Drafter AR's panel says ``cache path: drafter ...``: its cache is the drafter's, not the target's
    (mutation: booking every autoregressive run under ``target`` fails the first assert)."""
    from engine import Strategy, run_strategy
    from tests.helpers.models import tiny_llama
    from tests.helpers.pairs import model_pair

    pair = model_pair(tiny_llama(0), tiny_llama(1, hidden=16, layers=1))
    drafter_ar = run_strategy(Strategy("drafter", model="drafter", max_gen_len=4), pair, [0, 5, 9])
    target_ar = run_strategy(Strategy("target", max_gen_len=4), pair, [0, 5, 9])
    assert set(drafter_ar.rollback) == {"drafter"} and drafter_ar.rollback["drafter"]["path"] == "cached"
    assert set(target_ar.rollback) == {"target"}
