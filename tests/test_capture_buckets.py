"""Bounded captures (``kvcache.static.BUCKETS``): a ``graphs`` forward of width w runs in the
smallest bucket >= w, padded, and its padded rows are rolled back. Padding changes no token and no
float32 logits row (held to the static path's eager forwards, row for row, chains and trees); a
session of tree runs under the heuristic γ policy stays within the buckets (at most 8 captures per
model, counted from the compile records) and a second pass captures nothing. Each guarantee has
its mutation check beside it. Dynamo's "eager" backend: the capture machinery runs, no code is
generated."""

from __future__ import annotations

import pytest
import torch

from engine import Strategy, run_strategy
from kvcache import static
from kvcache.cache import CachedModel
from kvcache.static import StaticCachedModel
from sampling import GreedyProcessor
from tests.helpers import arch_zoo
from tests.helpers.pairs import model_pair
from tests.helpers.static import fresh_captures

PROMPT = list(arch_zoo.PROMPTS[0])
LENGTH = arch_zoo.LENGTH
MOST_CAPTURES = 8               # per model, over a session of every width trees and γ ask for
# float32, as the static tests hold the paths to each other: a graphs forward no padding touches
# already differs from the eager one by about 2e-5 on these logits (|row| up to ~40)
ROW_TOLERANCE = 1e-4


@pytest.fixture(autouse=True)
def cheap_backend(monkeypatch):
    """The eager backend, and captures of this test's own: the zoo's models are shared with other
    files, which count their captures from none."""
    monkeypatch.setattr(static, "BACKEND", "eager")
    fresh_captures(monkeypatch)


def probed(target, drafter):
    """The pair, its models' static probes run (their forwards are no run's rows)."""
    for model in (target, drafter):
        assert static.static_refusal(model) is None
    return model_pair(target, drafter)


@pytest.fixture(scope="module")
def pair():
    """Llama, and a drafter initialised independently of it (most drafts rejected: rollbacks run)."""
    return probed(arch_zoo.build("llama"), arch_zoo.build("llama", "independent"))


@pytest.fixture(scope="module")
def blended():
    """Llama and its blended drafter: drafts accepted, so the heuristic γ grows and trees deepen."""
    return probed(arch_zoo.build("llama"), arch_zoo.build("llama", "drafter"))


def run(pair, compile: str, **fields):
    fields.setdefault("processor", GreedyProcessor())
    fields.setdefault("max_gen_len", LENGTH)
    return run_strategy(Strategy("s", compile=compile, **fields), pair, PROMPT)


def recorded_run(pair, monkeypatch, compile: str, **fields):
    """The result and every logits row both models' forwards returned, chains and trees alike."""
    rows: list[torch.Tensor] = []
    with monkeypatch.context() as m:
        for cls, name in ((CachedModel, "forward"), (StaticCachedModel, "forward_masked")):
            real = getattr(cls, name)

            def kept(self, *args, _real=real, **kwargs):
                out = _real(self, *args, **kwargs)
                rows.append(out.clone())
                return out
            m.setattr(cls, name, kept)
        return run(pair, compile, **fields), rows


def same_rows(pair, monkeypatch, **fields):
    """``fields`` on the static path (every forward eager) and on ``graphs`` (bucketed): equal tokens
    and every float32 logits row equal. Returns the graphs result."""
    want, want_rows = recorded_run(pair, monkeypatch, "static", **fields)
    got, got_rows = recorded_run(pair, monkeypatch, "graphs", **fields)
    assert got.compile["path"] == "graphs" and got.compile["reason"] == "" and got.compile["eager"] == 0
    assert got.tokens == want.tokens, (got.tokens, want.tokens)
    assert len(got_rows) == len(want_rows)
    for a, b in zip(got_rows, want_rows):
        assert a.dtype == torch.float32 and a.shape == b.shape
        assert torch.allclose(a, b, atol=ROW_TOLERANCE, rtol=ROW_TOLERANCE), float((a - b).abs().max())
    return got


PADDED = [{"drafter": "model", "gamma": 2},                     # verify width 3: bucket 4
          {"drafter": "model", "gamma": 4},                     # verify width 5: bucket 8
          {"drafter": "model", "gamma": 3, "tree": 6}]          # tree width 7: bucket 8, its mask padded


# ------------------------------------------------------- padding changes nothing

@pytest.mark.parametrize("fields", PADDED, ids=["gamma2", "gamma4", "tree6"])
def test_padding_changes_no_token_and_no_logits_row(pair, monkeypatch, fields):
    result = same_rows(pair, monkeypatch, **fields)
    report = result.compile
    assert set(report["buckets"]) <= set(static.BUCKETS)
    assert set(report["widths"]) - set(static.BUCKETS)           # some forward ran padded
    assert result.drafted > result.accepted                       # rejections ran, so rollbacks did


def test_padding_under_the_models_own_causal_mask(pair, monkeypatch):
    """A model that takes no 4D mask keeps a chain capture apart: its own causal mask (over the
    slots) hides the padded rows from the real ones."""
    monkeypatch.setattr(static, "tree_support", lambda cached: "no custom mask here")
    same_rows(pair, monkeypatch, **PADDED[1])
    assert all(not key[3] for key in static.kept(pair.target).captures)      # chain captures, no mask


def test_mutation_padded_rows_not_rolled_back_fails(pair, monkeypatch):
    """The length goes to the real rows' end, but the cache keeps the padded rows."""
    monkeypatch.setattr(StaticCachedModel, "_unpad",
                        lambda self, seen, bucket, width: setattr(self, "_length", seen + width))
    with pytest.raises(AssertionError):
        same_rows(pair, monkeypatch, **PADDED[0])


def test_mutation_a_tree_seeing_the_padded_slots_fails(pair, monkeypatch):
    """A tree's real rows shown the padded rows' slots: the mask must hide them."""
    fill = StaticCachedModel._fill

    def seen_padding(self, entry, tokens, positions, mask):
        fill(self, entry, tokens, positions, mask)
        w, b = tokens.shape[1], entry.tokens.shape[1]
        if mask is not None and b > w:
            entry.mask[:, :, :w, self._length + w:self._length + b] = 0
    monkeypatch.setattr(StaticCachedModel, "_fill", seen_padding)
    with pytest.raises(AssertionError):
        same_rows(pair, monkeypatch, **PADDED[2])


# ------------------------------------------------------- captures stay bounded

SESSION = [{"tree": 40, "tree_branch": 2, "gamma": 1, "max_gen_len": 40},
           {"tree": 30, "tree_branch": 3, "gamma": 1, "max_gen_len": 40}]


def session_captures(blended) -> tuple[dict, set, list]:
    """Tree runs under the heuristic γ policy from no capture: each model's captures summed over
    the runs' compile records, the widths run captured, and the tokens."""
    per_model, widths, tokens = {"target": 0, "drafter": 0}, set(), []
    for fields in SESSION:
        result = run(blended, "graphs", drafter="model", gamma_policy="heuristic", **fields)
        report = result.compile
        assert report["path"] == report["drafter_path"] == "graphs" and report["recompiles"] == 0
        assert report["captures"] == sum(report["model_captures"].values())
        for name, n in report["model_captures"].items():
            per_model[name] += n
        widths |= set(report["widths"])
        tokens.append(result.tokens)
    return per_model, widths, tokens


def test_trees_and_the_heuristic_policy_stay_within_the_buckets(blended, monkeypatch):
    per_model, widths, tokens = session_captures(blended)
    assert len(widths) > MOST_CAPTURES                  # a capture per width would pass the bound
    assert 0 < per_model["target"] <= MOST_CAPTURES and 0 < per_model["drafter"] <= MOST_CAPTURES, per_model
    for model in (blended.target, blended.drafter):     # what is kept: buckets only, one capture each
        assert {key[2] for key in static.kept(model).captures} <= set(static.BUCKETS)
        assert one_capture_per_bucket(model)
    again, _, tokens_again = session_captures(blended)
    assert again == {"target": 0, "drafter": 0} and tokens_again == tokens
    want = [run(blended, "static", drafter="model", gamma_policy="heuristic", **f).tokens for f in SESSION]
    assert tokens == want


def one_capture_per_bucket(model) -> bool:
    """Whether ``model`` keeps one capture per bucket: its chains run in the trees' captures."""
    buckets = [key[2] for key in static.kept(model).captures]
    return len(buckets) == len(set(buckets))


def test_mutation_a_capture_per_width_fails_the_count(blended, monkeypatch):
    monkeypatch.setattr(static, "bucket_of", lambda width, capacity: width)
    per_model, _, _ = session_captures(blended)
    assert max(per_model.values()) > MOST_CAPTURES, per_model


def test_mutation_chains_captured_apart_from_trees_fails(blended, monkeypatch):
    """Chains kept out of the trees' captures: the drafter's chain and tree levels share bucket 2."""
    monkeypatch.setattr(static, "tree_support", lambda cached: "chains apart")
    run(blended, "graphs", drafter="model", gamma_policy="heuristic", **SESSION[0])
    assert not one_capture_per_bucket(blended.drafter)


# ------------------------------------------------------- buckets and their edges

def test_buckets_are_the_smallest_that_hold_the_width_up_to_the_capacity():
    assert [static.bucket_of(w, 256) for w in (1, 2, 3, 5, 8, 9, 33, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    assert static.bucket_of(65, 256) is None                 # wider than every bucket: eager
    assert static.bucket_of(20, 16) is None and static.bucket_of(9, 16) == 16


def test_a_forward_no_bucket_holds_runs_eager_and_is_counted(pair, monkeypatch):
    """Buckets 1 and 2 only: a verify of 4 rows runs eager over the static cache, said in ``eager``."""
    monkeypatch.setattr(static, "BUCKETS", (1, 2))
    got = run(pair, "graphs", drafter="model", gamma=3)
    assert got.tokens == run(pair, "static", drafter="model", gamma=3).tokens
    report = got.compile
    assert report["eager"] > 0 and report["buckets"] == [1, 2] and 4 not in report["widths"]


def test_padding_past_the_capacity_runs_eager(pair, monkeypatch):
    """A forward whose padded rows would pass the capacity runs eager: none is written past it."""
    model = StaticCachedModel(pair.target, capacity=16, graphs=True, slot="edge")
    try:
        model.begin(PROMPT[:10])
        ids = torch.tensor([PROMPT[:15]])
        model.forward(ids[:, :10], keep=1)                   # the prefill (eager)
        model.forward(ids, keep=5)                           # 5 rows at 10: bucket 8 would reach 18
        assert model.record.eager == 1 and model.record.captures == 0 and model.length == 15
    finally:
        static.kept(pair.target).caches.pop((16, "edge"), None)
