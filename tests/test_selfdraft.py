"""Self-drafters: layer-skipping views, lower-precision and int8 copies, the shared cache,
and the choice of the default by measuring (the selection logic on hand-built numbers).

Tiny random models from ``tests.helpers.arch_zoo`` (wide output layer, so the argmax is
decisive): llama (full attention), qwen2 (sliding window) and mamba2 (recurrent).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
import torch

from generation.result import Round
from sampling import GreedyProcessor
from kvcache import shared as shared_cache
from model_drafters.selfdraft.build import build_self_drafter
from model_drafters.selfdraft.choose import choice_lines, choose
from model_drafters.selfdraft.drafter import SelfDrafter
from model_drafters.selfdraft.skip import SkipRefused, skip_view
from model_drafters.selfdraft.spec import SelfDraftSpec, SelfDraftSpecError, parse_self_draft
from tests.helpers.arch_zoo import PROMPTS, build
from tests.helpers.decode import autoregressive, speculative
from tests.helpers.selfdraft import identity_hooks
from kvcache.probe import cached_model
from kvcache.cache import CachedModel

GREEDY = GreedyProcessor()
LENGTH = 24
FAMILIES = ("llama", "qwen2", "mamba2")
KINDS = ("self:bf16", "self:int8", "self:int8=weight-only", "self:skip=1", "self:skip=0")


# ------------------------------------------------------------------ spec

@pytest.mark.parametrize("text, want", [
    ("self:bf16", SelfDraftSpec("bf16")), ("self:FP16", SelfDraftSpec("fp16")), ("self:int8", SelfDraftSpec("int8")),
    ("self:skip=5,3,3", SelfDraftSpec("skip", (3, 5))), ("self:skip=auto", SelfDraftSpec("skip", auto=True)),
    ("self:int8=weight-only", SelfDraftSpec("int8", route="weight-only")),
    ("self:INT8=Torch", SelfDraftSpec("int8", route="torch")),
])
def test_spec_parses(text, want):
    assert parse_self_draft(text) == want
    assert parse_self_draft(want.label) == want


@pytest.mark.parametrize("text", ["self:int4", "self:skip=", "self:skip=a,b", "self:skip=-1", "self:bf16=2",
                                  "self:int8=int4"])
def test_spec_refuses_with_one_line(text):
    with pytest.raises(SelfDraftSpecError) as info:
        parse_self_draft(text)
    assert "\n" not in str(info.value) and "self:skip=auto" in str(info.value)


# ------------------------------------------------------------ skip view

@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("skipped", [(0,), (1,), (0, 2)])
def test_skip_view_equals_the_target_with_those_layers_as_identity(family, skipped):
    target = build(family)
    if max(skipped) >= target.config.num_hidden_layers:
        pytest.skip("not that many layers")
    ids = torch.tensor([PROMPTS[0]])
    view = skip_view(target, skipped)
    with torch.inference_mode():
        got = view(input_ids=ids, use_cache=False).logits
        handles = identity_hooks(target, skipped, last_only=False)
        try:
            want = target(input_ids=ids, use_cache=False).logits
        finally:
            for h in handles:
                h.remove()
        full = target(input_ids=ids, use_cache=False).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert (got - full).abs().max() > 0.1                      # the skip changed something
    own = {id(p) for p in target.parameters()}
    assert all(id(p) in own for p in view.parameters())      # weights shared, none copied


@pytest.mark.parametrize("family", FAMILIES)
def test_skip_view_cache_keeps_its_length_when_layer_0_is_skipped(family):
    """Fed token by token on its own cache, the view gives its uncached logits:
    the renumbered layers keep the sequence length even without target layer 0."""
    target = build(family)
    view = skip_view(target, [0])
    ids = torch.tensor([PROMPTS[1]])
    cached = cached_model(view)
    cached.begin(ids[0, :10].tolist())
    with torch.inference_mode():
        steps = [cached.forward(ids[:, :10], keep=1)]
        for end in range(11, ids.shape[1] + 1):
            steps.append(cached.forward(ids[:, :end], keep=1))
        want = view(input_ids=ids, use_cache=False).logits[0, 9:]
    torch.testing.assert_close(torch.cat(steps), want, rtol=1e-4, atol=1e-4)
    assert cached.length == ids.shape[1]


def test_skip_refuses_what_it_cannot_do_with_one_line():
    for family, layers in (("t5", [0]), ("jamba", [0]), ("llama", [7]), ("llama", [0, 1])):
        with pytest.raises(SkipRefused) as info:
            skip_view(build(family), layers)
        assert "\n" not in str(info.value)


# --------------------------------------------------------------- lossless

@pytest.fixture(scope="module")
def references():
    return {f: [autoregressive(list(p), build(f), processor=GREEDY, max_gen_len=LENGTH).tokens
                for p in PROMPTS] for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", ["constant", "heuristic", "confidence", "model"])
def test_self_drafters_are_lossless(family, kind, policy, references):
    target = build(family)
    drafter = build_self_drafter(target, parse_self_draft(kind))
    rejected = 0
    for prompt, want in zip(PROMPTS, references[family]):
        got = speculative(list(prompt), drafter, target, processor=GREEDY, gamma=3,
                          max_gen_len=LENGTH, gamma_policy=policy)
        assert got.tokens == want, f"{family} {kind} {policy}"
        rejected += got.drafted - got.accepted
    if kind.startswith("self:skip") and policy == "constant":
        assert rejected > 0                                    # the rollback paths ran


def test_a_drafter_that_keeps_its_draft_positions_in_the_target_cache_is_caught(monkeypatch, references):
    """Mutation: without rolling the drafts back out of the shared cache the output breaks."""
    beside = CachedModel.beside

    def keeping_its_drafts(self, model, layers=None):
        cached = beside(self, model, layers)
        cached.rollback = lambda length: None
        return cached

    monkeypatch.setattr(CachedModel, "beside", keeping_its_drafts)
    target = build("llama")
    drafter = build_self_drafter(target, parse_self_draft("self:skip=1"))
    outputs = []
    for prompt in PROMPTS:
        try:
            outputs.append(speculative(list(prompt), drafter, target, processor=GREEDY,
                                       gamma=3, max_gen_len=LENGTH).tokens)
        except Exception:  # noqa: BLE001  (a broken cache may also raise)
            outputs.append(None)
    assert outputs != references["llama"]


# ------------------------------------------------------------ shared cache

def _round(drafter, target, prompt, k=3):
    """Begin a generation and draft one round; returns (drafts, q) and the target's CachedModel."""
    cached = cached_model(target)
    start = cached.begin(prompt)
    drafter.attach_target(cached)
    drafter.begin(prompt)
    with torch.inference_mode():
        drafts, q = drafter.propose(torch.tensor([start]), k)
    return drafts, q, cached


@pytest.mark.parametrize("tree", [0, 4])
def test_the_targets_prefill_counts_as_verify_not_as_drafting(monkeypatch, tree):
    """A self-drafter drafts on the target's cache, so the target must be fed the prompt
    before the first draft. That is target work: the first round's phases must count it
    as verify. (A prefill run inside ``propose`` made the draft phase look slow.)"""
    target = build("llama")
    drafter = build_self_drafter(target, parse_self_draft("self:bf16"))
    real, pause = CachedModel.forward, 0.3

    def slow_prefill(self, ids, keep):
        if self.model is target and self.length == 0:            # the prompt
            time.sleep(pause)
        return real(self, ids, keep)

    monkeypatch.setattr(CachedModel, "forward", slow_prefill)
    result = speculative(list(PROMPTS[0]), drafter, target, processor=GreedyProcessor(),
                         gamma=3, max_gen_len=8, tree=tree)
    first = result.trace[0]
    assert first.verify_s >= pause and first.draft_s < pause
    assert result.phases["verify"] >= pause and result.phases["draft"] < pause


@pytest.mark.parametrize("kind, mode", [("self:skip=1", "view"), ("self:int8", "view"), ("self:bf16", "copy"),
                                        ("self:int8=weight-only", "copy")])
def test_self_drafter_shares_the_target_cache_and_leaves_it_as_it_was(kind, mode):
    target = build("llama")
    model = build_self_drafter(target, parse_self_draft(kind))
    drafter = SelfDrafter(model, GREEDY)
    prompt = list(PROMPTS[0])
    drafts, q, cached = _round(drafter, target, prompt)
    assert drafter.mode == mode
    assert cached.length == len(prompt) - 1                    # the prefill, done once, by the target
    layers = shared_cache._layers(cached.cache)
    assert all(layer.get_seq_length() == len(prompt) - 1 for layer in layers)   # drafts dropped
    # The target's cache equals a fresh prefill of the committed tokens.
    fresh = cached_model(target)
    fresh.begin(prompt)
    with torch.inference_mode():
        fresh.forward(torch.tensor([prompt[:-1]]), keep=1)
    for mine, theirs in zip(layers, shared_cache._layers(fresh.cache)):
        torch.testing.assert_close(mine.keys, theirs.keys)
        torch.testing.assert_close(mine.values, theirs.values)


def test_shared_skip_drafts_equal_the_target_skipping_layers_at_the_draft_position_only():
    """Draft&Verify's draft: full-model keys for the committed tokens, the skip path for the new one."""
    target = build("llama")
    drafter = SelfDrafter(build_self_drafter(target, parse_self_draft("self:skip=1")), GREEDY)
    prompt = list(PROMPTS[0])
    drafts, q, _ = _round(drafter, target, prompt, k=1)
    handles = identity_hooks(target, [1], last_only=True)
    try:
        with torch.inference_mode():
            want = target(input_ids=torch.tensor([prompt]), use_cache=False).logits[0, -1]
    finally:
        for h in handles:
            h.remove()
    torch.testing.assert_close(q[0], GREEDY(want[None])[0])
    assert drafts.tolist() == [int(want.argmax())]


def test_shared_bf16_copy_logits_match_its_own_cache_within_bfloat16_tolerance():
    target = build("llama")
    model = build_self_drafter(target, parse_self_draft("self:bf16"))
    prompt = list(PROMPTS[1])
    shared = SelfDrafter(model, GREEDY)
    cached = cached_model(target)
    cached.begin(prompt)
    shared.attach_target(cached)
    shared.begin(prompt)
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        shared.fill_target(ids)
        got = shared._round_model(len(prompt) - 1).forward(ids, keep=1).float()
        want = model(input_ids=ids, use_cache=False).logits[0, -1:].float()
    scale = want.abs().max()
    assert shared.mode == "copy"
    assert (got - want).abs().max() / scale < 0.05             # bfloat16 keys vs keys cast from float32
    assert got.argmax() == want.argmax()


# ------------------------------------------------------------ int8 routes

def test_weight_only_int8_layer_multiplies_by_per_row_int8_weights():
    """Checked against the quantisation written out here: one symmetric scale per output row,
    weights rounded to the nearest of -127..127, activations and output in bfloat16."""
    from model_drafters.selfdraft.copies import WeightOnlyInt8Linear

    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 48)
    linear.weight.data[3] *= 50                      # one row far wider than the others
    layer = WeightOnlyInt8Linear(linear)
    weight = linear.weight.detach()
    scale = weight.abs().amax(dim=1) / 127
    ints = torch.round(weight / scale[:, None])
    assert torch.equal(layer.qweight.float(), ints) and layer.qweight.dtype == torch.int8
    x = torch.randn(2, 5, 64)
    want = x.bfloat16().float() @ (ints * scale.bfloat16().float()[:, None]).T + linear.bias.detach().bfloat16().float()
    got = layer(x)
    assert got.shape == (2, 5, 48) and got.dtype == torch.float32

    def close(a, b):  # within 2% of each output's own scale (the wide row's would hide the others)
        return bool(((a - b).abs() <= 2e-2 * b.abs().amax(dim=(0, 1), keepdim=True)).all())

    assert close(got, want)
    # One scale for the whole tensor (the wide row's) would lose the narrow rows: the check tells.
    coarse = torch.round(weight / scale.max()) * scale.max()
    assert not close(x @ coarse.T + linear.bias.detach(), want)


def test_weight_only_int8_keeps_layers_the_kernel_cannot_take_in_bfloat16():
    """torch's weight-only kernel needs an inner width that is a multiple of 16 (another width
    gave wrong sums or ended the process): such layers are never handed to it."""
    from model_drafters.selfdraft.copies import WeightOnlyInt8Linear, _weight_only

    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.Linear(32, 48), torch.nn.Linear(48, 8))
    copy = _weight_only(model, keep_float={"2"})
    assert type(copy[0]) is torch.nn.Linear and copy[0].weight.dtype == torch.bfloat16
    assert isinstance(copy[1], WeightOnlyInt8Linear)
    assert type(copy[2]) is torch.nn.Linear                     # kept in float as asked
    assert type(model[1]) is torch.nn.Linear and model[1].weight.dtype == torch.float32   # the target untouched
    assert copy(torch.randn(3, 24).bfloat16()).shape == (3, 8)


def test_weight_only_int8_is_refused_off_a_cpu_with_one_line():
    import copy

    from model_drafters.selfdraft.copies import int8_copy

    elsewhere = copy.deepcopy(build("llama")).to("meta")     # build's models are shared: move a copy
    with pytest.raises(ValueError, match=r"^int8 route 'weight-only' runs on a CPU only; this model is on meta$"):
        int8_copy(elsewhere, "weight-only")


@pytest.mark.parametrize("native", [True, False])
def test_the_default_measures_weight_only_int8_where_bfloat16_is_native(monkeypatch, native):
    import model_drafters.selfdraft.default as default

    monkeypatch.setattr(default, "native_bfloat16", lambda: native)
    here = default.candidates_here(torch.device("cpu"))
    assert set(default.CANDIDATES) <= set(here)
    assert ("self:int8=weight-only" in here) is native
    assert "self:int8=weight-only" not in default.candidates_here(torch.device("meta"))


# ------------------------------------------------------------ the choice

VERIFY = {1: 0.025, 2: 0.030, 3: 0.032, 5: 0.036, 9: 0.050}


def test_choice_picks_the_highest_predicted_speedup():
    candidates = [
        {"label": "self:bf16", "rates": [0.95], "draft_step_s": 0.012, "other_s": 0.001},
        {"label": "self:int8", "rates": [0.85], "draft_step_s": 0.005, "other_s": 0.001},
        {"label": "self:skip=3,4", "rates": [0.40], "draft_step_s": 0.018, "other_s": 0.001},
        {"label": "self:fp16", "skipped": "a draft step takes 90 ms, a target step 25 ms"},
    ]
    choice = choose(candidates, VERIFY, gamma=4)
    assert choice.pick == "self:int8" and choice.beats_ar and choice.reason == ""
    scores = {s.label: s.speedup for s in choice.scores}
    assert scores["self:int8"] > scores["self:bf16"] > 1.0 > scores["self:skip=3,4"]
    lines = choice_lines(choice)
    assert lines[0].startswith("drafter chosen by measuring this machine: self:int8, predicted ")
    assert "self:fp16 not run (a draft step takes 90 ms" in lines[1]


def test_choice_gives_the_reason_in_numbers_when_nothing_beats_target_ar():
    candidates = [{"label": "self:bf16", "rates": [0.9], "draft_step_s": 0.030, "other_s": 0.0},
                  {"label": "self:int8", "rates": [0.8], "draft_step_s": 0.024, "other_s": 0.0}]
    choice = choose(candidates, {1: 0.025, 2: 0.045, 9: 0.060}, gamma=4)
    assert not choice.beats_ar
    assert choice.best.speedup < 1.0
    reason = choice.reason
    assert reason.startswith(f"no self-drafter is predicted to beat target AR here: the best, {choice.pick}, ")
    assert f"{choice.best.draft_step_s * 1e3:.1f} ms" in reason and "target step" in reason and "accepted" in reason
    assert reason in choice_lines(choice)


def _fake_measurement(monkeypatch, default) -> list:
    """Replace the measurement by one that picks self:skip=1; returns the list its calls land in."""
    calls = []

    def fake_measure(decode, target, tokenizer, **kwargs):
        calls.append(1)
        return ({"target": {}, "candidates": [], "pick": "self:skip=1", "lines": ["picked"], "gamma": 4,
                 "measured_s": 0.5, "date": "today"}, {})

    monkeypatch.setattr(default, "measure_all", fake_measure)
    return calls


def _readings(*others: float, cores: int = 2):
    """A fake load reader (``default_drafter(reader=...)``): each pair of calls brackets a 10 s
    calibration during which other processes used ``others[i]`` cores' worth of CPU."""
    from utils.machine_load import LoadReading

    readings = []
    for i, load in enumerate(others):
        t0 = 100.0 * i
        readings += [LoadReading(t0, 1000.0 * i, 5.0 * i, (0.5, 0.5, 0.5), cores),
                     LoadReading(t0 + 10.0, 1000.0 * i + 10.0 * load + 8.0, 5.0 * i + 8.0, (load, 0.5, 0.5), cores)]
    return iter(readings).__next__


def test_default_drafter_is_measured_once_and_read_back(tmp_path, monkeypatch):
    from model_drafters.selfdraft import default

    target = build("llama")
    calls = _fake_measurement(monkeypatch, default)
    reader = _readings(0.1, 0.2)
    model, label, lines = default.default_drafter(None, target, None, "tiny", tmp_path, reader=reader)
    assert label == "self:skip=1" and calls == [1] and lines[0] == "picked"
    assert "machine quiet (other load 0.1 of 2 cores)" in lines[-1] and "kept in" in lines[-1]
    again, label2, lines2 = default.default_drafter(None, target, None, "tiny", tmp_path, reader=reader)
    assert calls == [1] and label2 == "self:skip=1"
    assert lines2[-1].startswith("(cached choice measured today, machine quiet (other load 0.1 of 2 cores); kept in")
    stored = json.loads(next((tmp_path / "selfdraft").glob("*.json")).read_text())
    assert stored["key"]["model"] == "tiny" and stored["key"]["threads"] == torch.get_num_threads()
    assert stored["other_load"] == pytest.approx(0.1) and stored["busy"] is False
    monkeypatch.setattr(default, "machine_key", lambda *a: {"cpu": "another"})
    default.default_drafter(None, target, None, "tiny", tmp_path, reader=reader)
    assert calls == [1, 1]                                     # another machine measures again


def test_a_calibration_on_a_busy_machine_warns_and_is_not_reused(tmp_path, monkeypatch):
    """Other processes took 1.8 of 2 cores during the calibration: one warning line, and the next
    start measures again (mutation: keeping the busy pick, or reading a busy record back, fails)."""
    from model_drafters.selfdraft import default
    from utils.machine_load import BUSY_CORES

    target = build("llama")
    calls = _fake_measurement(monkeypatch, default)
    reader = _readings(1.8, BUSY_CORES - 0.2, 0.3)
    _, label, lines = default.default_drafter(None, target, None, "tiny", tmp_path, reader=reader)
    warnings = [line for line in lines if line.startswith("busy machine:")]
    assert label == "self:skip=1" and len(warnings) == 1
    assert "1.8 of 2 cores during the self-drafter calibration" in warnings[0]
    assert "used for this start only" in lines[-1]
    assert not list(tmp_path.rglob("*.json"))                 # nothing kept
    _, _, lines = default.default_drafter(None, target, None, "tiny", tmp_path, reader=reader)
    assert calls == [1, 1]                                     # measured again: nothing was kept
    assert not any(line.startswith("busy machine:") for line in lines) and "machine quiet" in lines[-1]
    default.default_drafter(None, target, None, "tiny", tmp_path, reader=reader)
    assert calls == [1, 1]                                     # the quiet one (0.8 cores) is kept and read back


def test_a_busy_record_in_the_cache_is_measured_again(tmp_path, monkeypatch):
    from model_drafters.selfdraft import default

    target = build("llama")
    calls = _fake_measurement(monkeypatch, default)
    key = default.machine_key("tiny", torch.device("cpu"))
    path = default.cache_file(tmp_path, key)
    busy = {"key": key, "pick": "self:skip=1", "lines": ["picked"], "date": "then", "other_load": 1.5,
            "cores": 2, "busy": True}
    default.write_cached(path, busy)
    assert default.read_cached(path, key) is None
    default.default_drafter(None, target, None, "tiny", tmp_path, reader=_readings(0.0))
    assert calls == [1] and json.loads(path.read_text())["busy"] is False


class _Machine:
    """A fake machine for ``model_drafters.selfdraft.default.measure_all``: every candidate's step
    costs ``ratios[label]`` target steps and its acceptance is ``rates[label]``."""

    def __init__(self, monkeypatch, ratios: dict, rates: dict):
        from generation import timing
        from model_drafters.selfdraft import calibrate, default

        self.run = []
        step = VERIFY[1]
        monkeypatch.setattr(default, "calibration_ids", lambda tokenizer: torch.tensor([[1, 2, 3]]))
        monkeypatch.setattr(default, "greedy_continuation", lambda decode, target, ids: ids)
        monkeypatch.setattr(default, "time_target",
                            lambda target, ids: timing.TargetTiming(dict(VERIFY), 0.1, 3))
        monkeypatch.setattr(default, "_candidate", lambda label, *a: (label, label, ""))
        monkeypatch.setattr(default, "paired_step_s", lambda model, target, ids: (ratios[model] * step, step))

        def measure(decode, label, model, target, ids, gamma, reference):
            assert reference == VERIFY                      # scaled to the target's timing
            self.run.append(label)
            return calibrate.DrafterMeasure(label, rates=[rates[label]] * gamma,
                                            draft_step_s=ratios[label] * step, other_s=0.0005)

        monkeypatch.setattr(default, "measure_drafter", measure)


def test_a_drafter_whose_step_costs_a_target_step_is_not_run_while_a_cheaper_one_is(monkeypatch):
    from model_drafters.selfdraft import default

    machine = _Machine(monkeypatch, {"a": 0.4, "b": 1.1, "c": 0.6}, {"a": 0.8, "b": 0.99, "c": 0.7})
    record, models = default.measure_all(None, None, None, candidates=("a", "b", "c"))
    assert machine.run == ["a", "c"] and set(models) == {"a", "c"} and record["pick"] == "a"
    skipped = next(c for c in record["candidates"] if c["label"] == "b")
    assert skipped["skipped"] == "a draft step costs 1.10 target steps"


def test_when_no_drafter_is_cheaper_than_a_target_step_every_one_is_run_and_the_least_bad_picked(monkeypatch):
    """No candidate can pay: all are measured, the pick loses least, and every prediction is a real number."""
    from model_drafters.selfdraft import default

    machine = _Machine(monkeypatch, {"a": 1.2, "b": 1.0, "c": 1.6}, {"a": 0.9, "b": 0.9, "c": 0.9})
    record, _ = default.measure_all(None, None, None, candidates=("a", "b", "c"))
    assert machine.run == ["a", "b", "c"] and record["pick"] == "b"
    first = record["lines"][0]
    assert first.startswith("drafter chosen by measuring this machine: b, predicted 0.") and "0.00x" not in first and "acceptance 90%" in first
    assert record["lines"][-1].startswith("no self-drafter is predicted to beat target AR here: the best, b,")


def _timed_round(width: int, verify_s: float, draft_s: float):
    from generation.result import Round

    return Round(drafted=tuple(range(width - 1)), accepted=width - 1, token=0, bonus=True, gamma=width - 1,
                 draft_s=draft_s, verify_s=verify_s)


def test_load_scale_compares_each_round_verify_with_the_target_timing_of_its_width():
    from model_drafters.selfdraft.calibrate import load_scale

    rounds = [_timed_round(5, 3 * VERIFY[5], 0.1), _timed_round(3, 3 * VERIFY[3], 0.1),
              _timed_round(9, 3 * VERIFY[9], 0.1), _timed_round(4, 1.0, 0.1)]   # width 4 was not timed
    assert load_scale(rounds, VERIFY) == pytest.approx(1 / 3)
    assert load_scale([_timed_round(5, VERIFY[5], 0.1)], VERIFY) == pytest.approx(1.0)
    assert load_scale([_timed_round(4, 1.0, 0.1)], VERIFY) == 1.0 and load_scale([], VERIFY) == 1.0


def test_a_drafter_run_under_load_is_priced_as_if_the_machine_were_as_quiet_as_at_the_start(monkeypatch):
    """The run's rounds took three times the target's timed verify (another job
    ran meanwhile): its draft step and host time come back a third as large.
    Mutation: with no scale the loaded run's costs stay three times too large."""
    from generation.result import GenerationResult
    from model_drafters.selfdraft import calibrate

    def loaded_run(*args, **kwargs):
        result = GenerationResult(tokens=[0] * 8)
        result.trace = [_timed_round(5, 3 * VERIFY[5], 4 * 0.036) for _ in range(3)]
        result.phases = {"draft": 3 * 4 * 0.036, "verify": 9 * VERIFY[5], "other": 3 * 0.003}
        return result

    ids = torch.tensor([[1, 2, 3]])
    scaled = calibrate.measure_drafter(loaded_run, "d", None, None, ids, reference=dict(VERIFY))
    assert scaled.load_scale == pytest.approx(1 / 3, abs=1e-4)
    assert scaled.draft_step_s == pytest.approx(0.012) and scaled.other_s == pytest.approx(0.001)
    assert scaled.rates == [0.75] * 4   # all accepted in the 2 rounds after the first: (2 + 1) / (2 + 2)
    raw = calibrate.measure_drafter(loaded_run, "d", None, None, ids)
    assert raw.draft_step_s == pytest.approx(0.036) and raw.load_scale == 1.0


def test_calibration_rates_follow_the_rule_of_succession():
    """(accepted + 1) / (judged + 2) per position: a drafter never rejected in a short run is not
    priced as one never rejected at all, and a position no round reached is left out."""
    from model_drafters.selfdraft.calibrate import smoothed_rates

    rounds = [_timed_round(4, 0.1, 0.1)] * 10 + [
        Round(drafted=(1, 2, 3), accepted=1, token=0, bonus=False, gamma=3, draft_s=0.1, verify_s=0.1)]
    # Position 0: 11 judged, 11 accepted; 1: 11 judged, 10 accepted; 2: 10 judged, 10 accepted.
    assert smoothed_rates(rounds) == pytest.approx([12 / 13, 11 / 13, 11 / 12])
    assert smoothed_rates([]) == []


def test_skip_search_finds_a_layer_that_does_nothing():
    """A layer whose output projections are zero passes its input through: the search skips it."""
    from model_drafters.selfdraft.search import block_influence, search_skip
    from tests.helpers.models import tiny_llama

    target = tiny_llama(3, vocab_size=96, layers=4, logit_scale=20.0)
    with torch.no_grad():
        target.model.layers[2].self_attn.o_proj.weight.zero_()
        target.model.layers[2].mlp.down_proj.weight.zero_()
    ids = torch.tensor([PROMPTS[0] + PROMPTS[1]])
    influence = block_influence(target, ids, 10)
    assert set(influence) == {1, 2} and influence[2] < 1e-6 < influence[1]
    found = search_skip(target, ids, 10, {1: 0.010, 2: 0.0105, 5: 0.011})
    assert 2 in found.layers and found.tried >= 1
    assert "self:skip=auto searched" in found.line(4)


@pytest.mark.parametrize("drafter, options", [("self", "self:skip=1"), ("self", "self:int8"), ("model", None)])
def test_the_engine_runs_self_drafters_on_the_shared_cache(drafter, options, references):
    """Registered as kind "self" (a spec in drafter_options), and a self-draft model as kind "model"."""
    from engine import Strategy, run_strategy
    from tests.helpers.pairs import model_pair

    target = build("llama")
    model = build_self_drafter(target, parse_self_draft("self:skip=1"))
    pair = model_pair(target, model)
    strategy = Strategy("speculative", drafter=drafter, drafter_options=options, gamma=3, max_gen_len=LENGTH,
                        processor=GREEDY)
    result = run_strategy(strategy, pair, list(PROMPTS[0]))
    assert result.tokens == references["llama"][0]
    assert result.rollback["drafter"]["method"] == "shared"


def test_a_drafter_step_is_timed_on_a_cache_even_where_its_own_cache_runs_uncached(monkeypatch):
    """A dynamic int8 copy's own cached forward is inexact, so the probe runs it
    uncached; as a self-drafter it drafts on the target's cache, one token a step.
    The timing must be of that step, not of a forward over the whole prompt
    (which made self:int8 look 1.65 target steps dear and left it unmeasured)."""
    from model_drafters.selfdraft import calibrate
    from kvcache import probe

    target = build("llama")
    drafter = build_self_drafter(target, parse_self_draft("self:skip=1"))
    real = probe.probe_of
    monkeypatch.setattr(probe, "probe_of", lambda model: replace(real(model), path="uncached")
                        if model is drafter else real(model))
    fed = []
    forward = drafter.forward

    def recording(*args, **kwargs):
        fed.append(kwargs["input_ids"].shape[1])
        return forward(*args, **kwargs)

    monkeypatch.setattr(drafter, "forward", recording)
    ids = torch.tensor([PROMPTS[0]])
    calibrate.paired_step_s(drafter, target, ids, repeats=2)
    assert fed[0] == ids.shape[1] and fed[1:] == [1, 1, 1]      # the prompt once, then one token a step
    fed.clear()
    calibrate.step_s(drafter, ids, repeats=2)
    assert fed[1:] == [1, 1, 1]


def test_forward_timings_wait_for_the_device_to_finish(monkeypatch):
    """A CUDA forward returns once its kernels are queued; the calibration's clocks must
    read after the device finished them, or the target's steps and widths (and every
    drafter's step, whose ratio picks the default drafter) time the launch only. A fake
    device here queues 30 ms of work per forward and does it at ``synchronize``."""
    from model_drafters.selfdraft import calibrate
    from generation.timing import time_target
    import generation.common as common

    target = build("llama")
    drafter = build_self_drafter(target, parse_self_draft("self:skip=1"))
    queued = [0.0]

    def launching(model):
        forward = model.forward

        def queue(*args, **kwargs):
            out = forward(*args, **kwargs)
            queued[0] += 0.03
            return out
        return queue

    def synchronize(device):
        time.sleep(queued[0])
        queued[0] = 0.0

    monkeypatch.setattr(target, "forward", launching(target))
    monkeypatch.setattr(drafter, "forward", launching(drafter))
    monkeypatch.setattr(common, "synchronize", synchronize)
    ids = torch.tensor([PROMPTS[0]])
    timing = time_target(target, ids, widths=(1, 2), repeats=2)
    assert timing.prefill_s >= 0.03 and min(timing.verify_s.values()) >= 0.03
    assert min(calibrate.paired_step_s(drafter, target, ids, repeats=2)) >= 0.03
    assert calibrate.step_s(drafter, ids, repeats=2) >= 0.03
