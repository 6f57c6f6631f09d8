"""The GPU figures' bookkeeping (``scripts/gpu_figures.py``): one entry that fails is recorded with
its one line and every other entry still runs; a part's share of the time leaves entries out, said;
an output that differs gets its verdict. The whole check runs in ``test.sh``'s rehearsal
(``scripts/gpu_check.sh --rehearse``)."""

from __future__ import annotations

import time

from analysis.divergence import Divergence
from scripts import gpu_figures


def entry(tokens, calls):
    def go():
        calls.append(tokens[0])
        return list(tokens), 0.5, None
    return go


def broken(calls):
    def go():
        calls.append("broken")
        raise RuntimeError("CUDA error: an illegal memory access\nsecond line")
    return go


def test_a_failing_entry_is_recorded_and_the_rest_go_on():
    calls: list = []
    entries = {"a": entry([1, 2], calls), "b": broken(calls), "c": entry([1, 3], calls)}
    rows = gpu_figures.alternate(entries, rounds=2)
    assert rows["b"]["error"] == "RuntimeError: CUDA error: an illegal memory access"
    assert rows["b"]["tok_s"] is None and calls.count("broken") == 1       # not tried again in the rounds
    assert rows["a"]["tok_s_runs"] == [4.0, 4.0] and rows["c"]["tok_s"] == 4.0
    figures, reference = gpu_figures.describe("t", rows, 2, "float32", None)
    assert reference == [1, 2] and figures["c"]["first_difference"] == 1 and figures["a"]["identical"]
    assert figures["b"]["identical"] is None and "illegal memory access" in figures["b"]["error"]
    assert gpu_figures._tally("float32", figures)["failed"] == 1


def test_a_spent_share_leaves_the_rest_out_and_says_so():
    calls: list = []
    rows = gpu_figures.alternate({"a": entry([1], calls), "b": entry([2], calls)}, 3,
                                 deadline=time.perf_counter() - 1)
    assert calls == [] and all(r["error"].startswith("left out") for r in rows.values())


def test_a_difference_gets_its_verdict(capsys):
    calls: list = []
    rows = gpu_figures.warm_once({"a": entry([1, 2], calls), "b": entry([1, 3], calls)})
    verdict = Divergence(1, 2, 3, "near-tie", "both rows within bfloat16 rounding")
    figures, _ = gpu_figures.describe("t", rows, 0, "bfloat16", None, judge=lambda tokens, result: verdict)
    assert figures["b"]["verdict"] == "near-tie" and "verdict" not in figures["a"]
    assert "verdict near-tie (both rows within bfloat16 rounding)" in capsys.readouterr().out


def test_the_identity_models_keep_their_layer_shapes_with_fewer_layers():
    import torch

    full = gpu_figures.build("llama-3.2-3b", True, "cpu", torch.float32, seed=0)
    fewer = gpu_figures.build("llama-3.2-3b", True, "cpu", torch.float32, seed=0, layers=1)
    assert fewer.config.num_hidden_layers == 1 < full.config.num_hidden_layers
    shapes = {n: p.shape for n, p in full.named_parameters() if ".layers.0." in n or ".layers." not in n}
    assert shapes == {n: p.shape for n, p in fewer.named_parameters()}
