"""``/whatif batch``: a run's rounds priced at other batch sizes (analysis.whatif), the forwards timed
by shape (engine.shapes), and the command driven through infer.py as a user types it."""

from __future__ import annotations

import re

import pytest

from analysis.whatif import Projection, RoundFacts, facts_of, project
from generation import GenerationResult, Round
from tests.helpers.repl import build_pair, infer


def target_s(batch: int, width: int) -> float:
    """A forward that costs 10 ms plus 1 ms per token fed (B x w): flat while small, then linear."""
    return 0.010 + 0.001 * batch * width


def check_projection(project_fn) -> None:
    """Three tokens a round from a verify of 5 and four drafter steps of 2 ms + 0.5 ms per sequence:
    speedup(B) = 3 T(B, 1) / (T(B, 5) + 4 D(B)), worked by hand at B = 1 and 8."""
    facts = RoundFacts(tokens_per_round=3.0, widths={5: 1.0}, drafter_steps=4.0, draft_s=0.0)
    p = project_fn(facts, target_s, (1, 8, 32), drafter_s=lambda b: 0.002 + 0.0005 * b)
    assert p.speedups[0] == pytest.approx(3 * 0.011 / (0.015 + 4 * 0.0025))      # 1.32
    assert p.speedups[1] == pytest.approx(3 * 0.018 / (0.050 + 4 * 0.006))       # 0.73
    assert p.stops_paying == 8 and p.drafter_source == "timed by shape"


def test_the_projection_prices_each_batch_size_by_hand():
    check_projection(project)


def test_mutation_a_verify_priced_at_batch_one_fails():
    def at_batch_one(facts, target, batches, drafter_s=None, scaled_step=True):
        return project(facts, lambda b, w: target(1, w) if w > 1 else target(b, w), batches, drafter_s, scaled_step)
    with pytest.raises(AssertionError):
        check_projection(at_batch_one)


def test_a_drafter_without_its_own_costs_scales_as_the_step_or_pays_per_sequence():
    facts = RoundFacts(tokens_per_round=2.0, widths={3: 0.5, 1: 0.5}, drafter_steps=2.0, draft_s=0.004)
    scaled = project(facts, target_s, (4,))
    step = target_s(4, 1) / target_s(1, 1)
    verify = 0.5 * target_s(4, 3) + 0.5 * target_s(4, 1)
    assert scaled.speedups[0] == pytest.approx(2 * target_s(4, 1) / (verify + 0.004 * step))
    looked_up = project(facts, target_s, (4,), scaled_step=False)
    assert looked_up.speedups[0] == pytest.approx(2 * target_s(4, 1) / (verify + 0.004 * 4))
    assert Projection((1,), (1.5,), "x").stops_paying is None


def test_the_facts_are_the_rounds_after_the_first():
    rounds = [Round((5, 6), 2, 7, True, draft_s=0.5), Round((8, 9, 10), 1, 11, False, draft_s=0.03),
              Round((), 0, 12, False, draft_s=0.0), Round((1, 2, 3), 3, 4, True, draft_s=0.03)]
    result = GenerationResult(tokens=list(range(12)), seconds=1.0, target_calls=4, drafter_calls=8, trace=rounds)
    facts = facts_of(result)
    assert facts.tokens_per_round == pytest.approx((2 + 1 + 4) / 3)
    assert facts.widths == pytest.approx({4: 2 / 3, 1: 1 / 3})
    assert facts.drafter_steps == 2.0 and facts.draft_s == pytest.approx(0.02)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return build_pair(tmp_path_factory.mktemp("whatif_pair"), context=256)


def test_whatif_batch_through_the_repl(pair, tmp_path):
    target, drafter = pair
    script = "/whatif batch\n/length 12\nthe water is hot and the sun is\n/whatif batch\n/whatif size\n/quit\n"
    done = infer(["--target", str(target), "--drafter", str(drafter)], tmp_path, stdin=script, timeout=600)
    text = " ".join(done.stdout.split()) + " ".join(done.stderr.split())
    assert "Traceback" not in text
    assert "/whatif batch projects the last prompt's drafting runs" in text           # before any prompt
    assert "projected speedup over target AR by batch size" in text and "B=32" in text
    assert "/whatif: choose batch, context or machine NAME, got 'size'" in text
    table = done.stdout[done.stdout.index("projected speedup"):]
    assert "Speculative" in table and "NASD" in table


def test_whatif_machine_through_the_repl(pair, tmp_path):
    """``/whatif machine NAME`` prices the same rounds on a card's roofline; a bad name is one line and
    the session goes on."""
    target, drafter = pair
    script = ("/whatif machine H100\n/length 12\nthe water is hot and the sun is\n/whatif machine h-100\n"
              "/whatif machine TPU\n/whatif machine\n/quit\n")
    done = infer(["--target", str(target), "--drafter", str(drafter)], tmp_path, stdin=script, timeout=600)
    text = " ".join(done.stdout.split()) + " ".join(done.stderr.split())
    assert "Traceback" not in text
    assert "/whatif machine projects the last prompt's drafting runs" in text          # before any prompt
    assert "projected speedup over target AR by batch size on H100" in text and "B=32" in text
    assert "NVIDIA H100 datasheet" in text and "its shape on the profile" in text
    assert "no machine profile 'TPU' (known: H200, H100, A100, L40S, RTX3090)" in text
    assert "name one machine: /whatif machine NAME" in text
    table = done.stdout[done.stdout.index("projected speedup"):]
    assert "Speculative" in table and "NASD" in table


def test_a_roofline_is_bound_by_memory_alone_then_by_arithmetic():
    """On a profile, a decode step of one sequence costs the weights' bytes over the bandwidth (plus the
    overhead); a wide enough batch costs its FLOPs over the peak; the crossover lands where the two
    meet. Mutation: a profile that forgot the cache's bytes prices a long context like a short one."""
    from analysis.roofline import MachineProfile, ModelShape

    shape = ModelShape(parameters=1_000_000_000, weight_bytes=2, layers=16, hidden=2048, kv_bytes_per_token=32_768)
    card = MachineProfile("card", 1e12, {"bfloat16": 100e12}, 1e-3, "made up")
    assert card.forward_s(shape, 1, 1, 0) == pytest.approx(1e-3 + (2e9 + 32_768) / 1e12)
    big = card.forward_s(shape, 256, 4, 0)
    assert big == pytest.approx(1e-3 + 256 * 4 * (2e9 + 4 * 16 * 2048 * 4) / 100e12)
    long = card.forward_s(shape, 8, 1, 16_000)
    assert long > card.forward_s(shape, 8, 1, 100) * 1.5            # the caches dominate the bytes at 16k
    no_cache = ModelShape(shape.parameters, 2, 16, 2048, 0)
    assert card.forward_s(no_cache, 8, 1, 16_000) < long / 1.5


def test_a_card_profile_adds_memory_and_arithmetic_and_charges_launches_by_layer():
    """The cards' profiles: a forward costs 125 µs a layer, its bytes' time and its FLOPs' time added
    (not the larger of the two); a 2-layer drafter pays a sixteenth of a 32-layer target's launches,
    a head with no layer one layer's. Worked by hand on the H100 (3.35 TB/s, 989 TFLOP/s bf16).
    Mutations: the older form (4 ms a forward, the larger of the two) prices the 2-layer drafter over
    10x dearer and a 64-token verify without its 1 ms of arithmetic."""
    from dataclasses import replace

    from analysis.roofline import PROFILES, ModelShape

    card = PROFILES["H100"]
    assert not card.overlap and card.overhead_s == 0 and card.overhead_per_layer_s == pytest.approx(125e-6)
    target = ModelShape(parameters=8_000_000_000, weight_bytes=2, layers=32, hidden=4096, kv_bytes_per_token=131_072)
    drafter = ModelShape(parameters=100_000_000, weight_bytes=2, layers=2, hidden=1024, kv_bytes_per_token=8_192)
    head = ModelShape(parameters=50_000_000, weight_bytes=2, layers=0, hidden=4096, kv_bytes_per_token=0)

    def by_hand(shape, layers, width, context):
        seen = context + width
        return (layers * 125e-6 + (shape.parameters * 2 + seen * shape.kv_bytes_per_token) / 3.35e12
                + width * (2 * shape.parameters + 4 * shape.layers * shape.hidden * seen) / 989e12)

    verify = card.forward_s(target, 1, 64, 1000)
    assert verify == pytest.approx(by_hand(target, 32, 64, 1000), rel=1e-12)
    assert card.forward_s(drafter, 1, 1, 1000) == pytest.approx(by_hand(drafter, 2, 1, 1000), rel=1e-12)
    assert card.forward_s(head, 1, 1, 1000) == pytest.approx(by_hand(head, 1, 1, 1000), rel=1e-12)
    older = replace(card, overhead_s=4e-3, overhead_per_layer_s=0.0, overlap=True)
    assert older.forward_s(drafter, 1, 1, 1000) > 10 * card.forward_s(drafter, 1, 1, 1000)
    # the same 4 ms for 32 layers: the older form leaves out the 64-token verify's arithmetic
    assert verify - older.forward_s(target, 1, 64, 1000) == pytest.approx(
        64 * (2 * 8e9 + 4 * 32 * 4096 * 1064) / 989e12, rel=1e-9)
    assert "125 µs a layer" in card.describe(target) and "4.0 ms a forward of this 32-layer" in card.describe(target)
    assert "not overlapped" in card.describe() and card.to_dict()["overlap"] is False
    # the captured path's launches: 0.3 ms for 32 layers; a run on graphs meets them, any other path the eager ones
    from analysis.roofline import captured, for_path

    graphs = for_path(card, "graphs")
    assert graphs == captured(card) == captured(graphs) and graphs.name == "H100 (captured)"
    assert graphs.overhead_for(target) == pytest.approx(0.3e-3) and graphs.overlap is False
    assert for_path(card, "static") is card and for_path(card, "off") is card and for_path(card, None) is card


def test_a_profile_fitted_to_timed_forwards_reproduces_them():
    """Forwards timed on a machine that is a roofline (made up: 2 ms overhead, 50 GB/s, 1 TFLOP/s) are
    fitted back within a few percent at every point; a shape off by 2x in its bytes is not."""
    from analysis.roofline import MachineProfile, ModelShape, errors, fit_profile

    shape = ModelShape(parameters=135_000_000, weight_bytes=4, layers=30, hidden=576, kv_bytes_per_token=46_080,
                       dtype="float32")
    truth = MachineProfile("truth", 50e9, {"float32": 1e12}, 2e-3, "made up")
    timed = {(b, w): truth.forward_s(shape, b, w, 64) for b in (1, 2, 4, 8, 16, 32) for w in (1, 2, 4, 8)}
    fitted = fit_profile(shape, timed, 64, "here")
    assert max(errors(fitted, shape, timed, 64).values()) < 0.05
    wrong = ModelShape(shape.parameters, 8, 30, 576, 46_080, "float32")
    assert max(errors(fitted, wrong, timed, 64).values()) > 0.3


def test_whatif_context_through_the_repl(pair, tmp_path):
    """``/whatif context`` projects the same rounds at batch 1 over the contexts the window holds (the
    prompt's own and 128 on this 256-token model); nothing past the window is timed."""
    target, drafter = pair
    script = "/whatif context\n/length 12\nthe water is hot and the sun is\n/whatif context\n/quit\n"
    done = infer(["--target", str(target), "--drafter", str(drafter)], tmp_path, stdin=script, timeout=600)
    text = " ".join(done.stdout.split()) + " ".join(done.stderr.split())
    assert "Traceback" not in text
    assert "/whatif context projects the last prompt's drafting runs" in text         # before any prompt
    assert "projected speedup over target AR by context length at batch 1" in text
    table = done.stdout[done.stdout.index("projected speedup"):]
    assert "L=128" in table and "L=512" not in table and "B=" not in table
    assert re.search(r"acceptance at each L from this prompt's rounds nearest it where there were 4 or more "
                     r"\((none|.*tokens a round near L=\d+)", " ".join(table.split()))
    assert "Speculative" in table and "NASD" in table


def _self_drafter_session(monkeypatch, drafter_step):
    """A REPL session whose last prompt ran speculative decoding (3 tokens a round, verifies of 5, 4
    drafter steps and 20 ms of drafting a round) with a drafter on the target's cache, its rounds too
    few to split by context; the target's forwards cost twice from 128 cached tokens on
    (10 ms + 1 ms a token fed), the drafter's step at each context ``drafter_step(L)`` (given)."""
    from types import SimpleNamespace

    import advisor.costs
    import repl.whatif_view as view
    import engine.shapes as shapes

    facts = RoundFacts(tokens_per_round=3.0, widths={5: 1.0}, drafter_steps=4.0, draft_s=0.02)
    run = SimpleNamespace(key="speculative", drafting=True, usable=True, label="Speculative",
                          result=SimpleNamespace(tokens=[0] * 40, trace=[]))       # no rounds: the run's own held
    monkeypatch.setattr(view, "facts_of", lambda result: facts)
    monkeypatch.setattr(shapes, "time_shapes", lambda model, batches, widths, context, vocab:
                        {(1, w): (0.010 + 0.001 * w) * (2 if context >= 128 else 1) for w in widths})
    monkeypatch.setattr(shapes, "drafter_shape_costs", lambda pair, batches, context: None)
    monkeypatch.setattr(advisor.costs, "step_seconds_by_context",
                        lambda pair, method, state, contexts: {c: drafter_step(c) for c in contexts})
    pair = SimpleNamespace(context_length=256, target=None, vocab_size=10, device="cpu", drafter=object())
    session = SimpleNamespace(runner=SimpleNamespace(pair=pair), say=lambda *a: None,
                              last_run=SimpleNamespace(runs=[run], prompt_ids=[1] * 30))
    return view.projection_table(view.context_table(session))


def test_a_self_drafters_step_is_priced_by_context_as_it_was_timed_there(monkeypatch):
    """The prompt's own context is 50 tokens (30 + 40 / 2), priced as run: 3 x 11 ms / (15 ms + 20 ms).
    At 128 the target's forwards cost twice; the drafter's step timed there three times its step at 50:
    3 x 22 ms / (30 ms + 60 ms). Mutation: its step scaled as the target's (twice) reads 3 x 22 /
    (30 + 40) at 128, the projection of the test below."""
    table = _self_drafter_session(monkeypatch, lambda c: 0.003 if c >= 128 else 0.001)
    cells = [c.rstrip("x") for c in table.columns[1]._cells + table.columns[2]._cells]
    assert cells == [f"{3 * 0.011 / (0.015 + 0.02):.2f}", f"{3 * 0.022 / (0.030 + 0.06):.2f}"]
    assert table.columns[-1]._cells == ["its step timed at each context"]
    assert f"{3 * 0.022 / (0.030 + 0.04):.2f}" != cells[1]


def test_a_longer_context_prices_a_self_drafters_step_as_the_targets(monkeypatch):
    """At a context where the target's forwards cost twice, a drafter on the target's weights whose step
    was timed at twice its seconds there too: the projection is the same, where a fixed draft would
    gain. Mutation: the draft left at its own context's seconds projects a higher speedup at the long
    context."""
    table = _self_drafter_session(monkeypatch, lambda c: 0.002 if c >= 128 else 0.001)
    cells = [c for c in table.columns[1]._cells + table.columns[2]._cells]
    assert [c.rstrip("x") for c in cells] == [f"{3 * 0.011 / (0.015 + 0.02):.2f}"] * 2
    # mutation: the draft at its own context's seconds gains at 128: 3 x 22 / (30 + 20)
    assert _self_drafter_session(monkeypatch, lambda c: 0.001).columns[2]._cells[0] == \
        f"{3 * 0.022 / (0.030 + 0.02):.2f}x"


def chart_points(html: str) -> dict[str, list[tuple[int, float, float, float]]]:
    """Per projected line of a saved report: (x, speedup, cx, cy) of each point, in order."""
    import re

    lines = {}
    for label, body in re.findall(r'<polyline class="projected" data-label="([^"]*)"[^>]*/>(.*?)(?=<polyline|</svg>)',
                                  html, flags=re.S):
        lines[label] = [(int(x), float(s), float(cx), float(cy)) for cx, cy, x, s in re.findall(
            r'<circle cx="([\d.]+)" cy="([\d.]+)" r="3" fill="[^"]*" data-x="(\d+)" data-speedup="([^"]+)">', body)]
    return lines


def rings(html: str) -> dict[str, tuple[int, float, float]]:
    import re

    return {label: (int(x), float(cx), float(cy)) for label, x, cx, cy in re.findall(
        r'<circle class="stops-paying" data-label="([^"]*)" data-x="(\d+)" cx="([\d.]+)" cy="([\d.]+)"', html)}


def check_chart(chart) -> None:
    """Two hand-made projections: one falls below 1.0x at B=8 (and stays), one never does. Every
    point is drawn at its own value, higher speedups higher up, and the ring sits on the first
    batch below 1.0x, on that point; the line that always pays has none."""
    from repl.whatif_view import WhatIf

    view = WhatIf("projected by hand", [("falls", Projection((1, 2, 8, 32), (1.6, 1.2, 0.9, 0.7), "x")),
                                        ("holds", Projection((1, 2, 8, 32), (2.0, 1.9, 1.5, 1.1), "x"))], "a caption")
    html = chart(view)
    points = chart_points(html)
    assert [(x, s) for x, s, _, _ in points["falls"]] == [(1, 1.6), (2, 1.2), (8, 0.9), (32, 0.7)]
    assert [(x, s) for x, s, _, _ in points["holds"]] == [(1, 2.0), (2, 1.9), (8, 1.5), (32, 1.1)]
    ys = {(label, x): cy for label, pts in points.items() for x, _, _, cy in pts}
    # 2.0 > 1.6 > 1.5 > 1.2 > 0.9: the higher the speedup, the higher the point (SVG: a smaller y)
    assert ys[("holds", 1)] < ys[("falls", 1)] < ys[("holds", 8)] < ys[("falls", 2)] < ys[("falls", 8)]
    xs = [cx for _, _, cx, _ in points["falls"]]
    assert xs == sorted(xs) and xs[1] - xs[0] == pytest.approx((xs[2] - xs[1]) / 2, abs=0.2)   # log2 axis
    found = rings(html)
    assert set(found) == {"falls"}
    x, cx, cy = found["falls"]
    assert x == 8 and (cx, cy) == next((px, py) for bx, _, px, py in points["falls"] if bx == 8)
    assert "falls: stops paying at B=8" in html and "holds: pays up to B=32" in html


def test_the_report_charts_each_projection_and_rings_where_it_stops_paying():
    from repl.report import whatif_chart

    check_chart(whatif_chart)


def test_mutation_a_ring_on_the_last_batch_below_one_fails(monkeypatch):
    from repl import report

    monkeypatch.setattr(Projection, "stops_paying", property(
        lambda self: next((b for b, s in reversed(list(zip(self.batches, self.speedups))) if s < 1.0), None)))
    with pytest.raises(AssertionError):
        check_chart(report.whatif_chart)


def test_mutation_points_drawn_on_a_flat_axis_fail(monkeypatch):
    from repl import report
    from utils import projection_chart

    monkeypatch.setattr(projection_chart, "PLOT_H", 0)
    with pytest.raises(AssertionError):
        check_chart(report.whatif_chart)


def test_whatif_then_save_draws_the_projection_in_the_report(pair, tmp_path):
    """Through the REPL: a prompt, ``/whatif batch`` and ``/whatif context``, then ``/save NAME.html``: the
    page charts both projections with the values the tables printed."""
    import re

    target, drafter = pair
    page = tmp_path / "report.html"
    script = f"/length 12\nthe water is hot and the sun is\n/whatif batch\n/whatif context\n/save {page}\n/quit\n"
    done = infer(["--target", str(target), "--drafter", str(drafter)], tmp_path, stdin=script, timeout=600)
    assert "Traceback" not in done.stdout + done.stderr
    html = page.read_text()
    assert "What if: batch (projected, not run)" in html and "What if: context (projected, not run)" in html
    charts = html.split('<svg class="whatif"')[1:]
    assert len(charts) == 2
    batch = chart_points('<svg class="whatif"' + charts[0])
    assert {"Speculative", "NASD"} <= {label.split(" ")[0] for label in batch}
    printed = " ".join(done.stdout.split())
    for label, points in batch.items():
        assert [x for x, _, _, _ in points] == [1, 2, 4, 8, 16, 32]
        cells = r"[ │┃]+".join(re.escape(f"{s:.2f}x") for _, s, _, _ in points)
        assert re.search(re.escape(label) + r".{0,40}?" + cells, printed), (label, cells)
        below = next((x for x, s, _, _ in points if s < 1.0), None)
        assert rings('<svg class="whatif"' + charts[0]).get(label, (None,))[0] == below
    context = chart_points('<svg class="whatif"' + charts[1])
    assert all(points[0][0] < 128 and points[-1][0] == 128 for points in context.values())



def check_split(split_fn) -> None:
    """A prompt of 100 tokens and a first round of 3: the later rounds start at position 103. Twenty
    rounds of 4 tokens start at 103 ... 179; forty of 5 at 183 ... 378. On a log scale 128 and 512
    part at 256: rounds starting at 183 ... 253 (15 of them) are nearer 128, those at 258 ... 378 (25)
    nearer 512, none near 2048."""
    from analysis.whatif import MIN_ROUNDS

    trace = [Round((1, 2), 2, 3, True)] + [Round((1, 2, 3), 3, 4, True, draft_s=0.01)] * 20 \
        + [Round((1, 2, 3, 5), 4, 6, True, draft_s=0.02)] * 40
    result = GenerationResult(tokens=list(range(283)), seconds=1.0, target_calls=61, drafter_calls=180, trace=trace)
    split = split_fn(result, 100, (128, 512, 2048))
    assert split[128].tokens_per_round == pytest.approx((20 * 4 + 15 * 5) / 35)
    assert split[128].widths == pytest.approx({4: 20 / 35, 5: 15 / 35})
    assert split[512].tokens_per_round == pytest.approx(5.0) and split[512].widths == pytest.approx({5: 1.0})
    assert split[512].draft_s == pytest.approx(0.02)
    assert split[2048] is None and MIN_ROUNDS <= 15


def test_rounds_are_split_by_the_context_they_ran_at():
    from analysis.whatif import facts_by_context

    check_split(facts_by_context)


def test_mutation_rounds_placed_without_the_prompt_fail():
    from analysis.whatif import facts_by_context

    with pytest.raises(AssertionError):
        check_split(lambda result, prompt, contexts: facts_by_context(result, 0, contexts))


def test_batches_above_one_are_timed_at_coarse_widths_and_read_between(monkeypatch):
    """Batch 1 is timed at every width the rounds verify; above it, at 1-4, 6, 8, 12, 16, ... and the
    widest, the widths between read linearly between those (here exact: the made-up cost is affine
    in w above batch 1), so a projection prices every width either way."""
    from types import SimpleNamespace

    import engine.shapes as shapes

    calls = []

    def time_shapes(model, batches, widths, context, vocab):
        calls.append((tuple(batches), tuple(widths)))
        return {(b, w): 0.01 + 0.001 * b * w + (0.005 if b == 1 and w == 3 else 0.0) for b in batches for w in widths}

    monkeypatch.setattr(shapes, "time_shapes", time_shapes)
    monkeypatch.setattr(shapes, "drafter_shape_costs", lambda pair, batches, context: None)
    pair = SimpleNamespace(target=None, vocab_size=10)
    out = shapes.time_pair_shapes(pair, range(2, 19), 64)
    assert calls == [((1,), tuple(range(1, 19))), ((2, 4, 8, 16, 32), (1, 2, 3, 4, 6, 8, 12, 16, 18))]
    assert out.target_s(1, 3) == pytest.approx(0.018)             # batch 1's own jump, timed, not read between
    assert all(out.target_s(b, w) == pytest.approx(0.01 + 0.001 * b * w) for b in (2, 8, 32) for w in range(1, 19))
    assert shapes.coarse_widths([1, 5]) == [1, 5] and shapes.coarse_widths(range(1, 40)) == \
        [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 39]


def test_whatif_batch_reads_between_the_coarse_widths_above_batch_one():
    """A prompt, then ``/whatif batch`` on a run whose rounds verified every width from 1 to 10 (its
    rounds set so: a tiny pair's own runs verify a few widths only). Above batch 1 only 1-4, 6, 8 and
    10 are timed (``engine.shapes.coarse_widths``), so 5, 7 and 9 are read between them and the
    caption says so. Mutation: the timed table looked up directly (as before) fails the command."""
    from repl.runner import Runner
    from repl.session import Session
    from repl.settings import Settings
    from tests.helpers.pairs import model_pair
    from tests.helpers.repl import build_model, build_tokenizer, console

    tokenizer = build_tokenizer()
    pair = model_pair(build_model(1, len(tokenizer), context=256), build_model(2, len(tokenizer), context=256),
                      tokenizer=tokenizer, end_tokens=[2], context_length=256)
    c, out = console()
    session = Session(Runner(pair), Settings(length=8, chat=False, live=False, gamma=9), c)
    session.handle("the cat sat on the mat")
    run = next(r for r in session.last_run.runs if r.key == "ngram")
    run.result.trace = [Round(tuple(range(3, 3 + k)), k, 7, True, draft_s=1e-4) for k in (0, *range(10))]
    session.handle("/whatif batch")
    text = " ".join(out.getvalue().split())
    assert "/whatif failed" not in text and "Traceback" not in text
    assert "width (1, 2, 3, 4, 5, 6, 7, 8, 9, 10)" in text
    assert "above batch 1 widths 5, 7, 9 read between those timed" in text
    view = session.last_run.whatifs["batch"]
    assert all(s > 0 for _, p in view.rows for s in p.speedups)
