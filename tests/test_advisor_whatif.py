"""``--whatif batch`` on the advice (``advisor.whatif``): each method's replayed rounds priced by shape.

The projection's arithmetic is checked against the formula written out by hand on forward costs
that are given (compute-bound and memory-bound), with mutations (a drafter step left out, the
widths' shares not summing to one) that the same checks catch; the front ends (``infer.py
--advise --whatif batch`` through its script, ``bench.py --advise --whatif batch``) on the tiny
word pair, whose projection and files are read back.
"""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest

import advisor.costs
import advisor.replay
import advisor.whatif
from advisor.whatif import facts_of_advice, project_advice
from analysis.whatif import Projection
from engine.shapes import BATCHES, PairShapes
from tests.test_advisor import tiny_grid, word_pair


def _advice(widths: dict[int, int], tokens_per_call: float, c: float | None, steps: float, lookup_ms: float = 0.0,
            drafter: str = "self"):
    method = SimpleNamespace(drafter=drafter)
    entry = SimpleNamespace(replayed=SimpleNamespace(widths=widths, steady_widths=widths), method=method)
    why = SimpleNamespace(c=c, draft_steps=steps, lookup_ms=lookup_ms)
    return SimpleNamespace(method=f"m{drafter}", entry=entry, why=why, tokens_per_call=tokens_per_call,
                           tokens_per_round=tokens_per_call)


def _shapes(cost, drafter=None) -> PairShapes:
    widths = range(1, 10)
    return PairShapes({(b, w): cost(b, w) for b in BATCHES for w in widths}, drafter, 64, 0.0)


def _projected(monkeypatch, advice, shapes):
    monkeypatch.setattr(advisor.whatif, "time_pair_shapes", lambda pair, widths, context, batches: shapes)
    return project_advice(None, advice, 64, "here").rows


def test_a_self_drafters_rounds_are_priced_as_its_steps_scale_with_the_target(monkeypatch):
    """3 tokens a round, verifies of 3 (three rounds in four) and 5, two drafter steps of a tenth of a
    target step: speedup(B) = 3 T(B,1) / (0.75 T(B,3) + 0.25 T(B,5) + 2 x 0.1 T(B,1))."""
    cost = lambda b, w: 0.01 * (1 + 0.1 * b * w)        # noqa: E731  (memory-bound at B=1, compute-bound later)
    advice = _advice({3: 30, 5: 10}, 3.0, 0.1, 2.0)
    [(_, projection)] = _projected(monkeypatch, [advice], _shapes(cost))
    want = [3 * cost(b, 1) / (0.75 * cost(b, 3) + 0.25 * cost(b, 5) + 0.2 * cost(b, 1)) for b in BATCHES]
    assert projection.speedups == pytest.approx(want)
    assert projection.speedups[0] > 1 > projection.speedups[-1]           # it pays alone, not at 32
    stops = projection.stops_paying
    assert stops is not None and projection.speedups[BATCHES.index(stops)] < 1
    assert all(s >= 1 for b, s in zip(BATCHES, projection.speedups) if b < stops)
    # Mutation: the drafter's steps left out price the same rounds higher at every batch size.
    free = _projected(monkeypatch, [_advice({3: 30, 5: 10}, 3.0, 0.0, 2.0)], _shapes(cost))[0][1]
    assert all(f > s * 1.05 for f, s in zip(free.speedups, projection.speedups))


def test_a_storage_pays_its_look_ups_per_sequence_and_a_drafter_model_its_own_forwards(monkeypatch):
    flat = lambda b, w: 0.01                               # noqa: E731  (memory-bound: a forward costs the same)
    storage = _advice({4: 10}, 1.5, None, 0.0, lookup_ms=1.0, drafter="ngram")
    [(_, p)] = _projected(monkeypatch, [storage], _shapes(flat))
    assert p.speedups == pytest.approx([1.5 * 0.01 / (0.01 + 0.001 * b) for b in BATCHES])
    assert "once per sequence" in p.drafter_source
    own = {(b, 1): 0.002 * b for b in BATCHES}
    model = _advice({3: 10}, 2.0, 0.2, 2.0, drafter="model")
    [(_, p)] = _projected(monkeypatch, [model], _shapes(flat, own))
    assert p.speedups == pytest.approx([2 * 0.01 / (0.01 + 2 * 0.002 * b) for b in BATCHES])
    assert p.drafter_source == "timed by shape"


def test_the_rounds_shares_of_widths_sum_to_one():
    facts = facts_of_advice(_advice({2: 3, 5: 1, 9: 4}, 1.8, 0.3, 1.0), 0.01)
    assert sum(facts.widths.values()) == pytest.approx(1.0) and facts.widths[9] == pytest.approx(0.5)
    assert facts.draft_s == pytest.approx(1.0 * 0.3 * 0.01)
    assert facts_of_advice(_advice({}, 1.0, None, 0.0), 0.01) is None


def test_scripted_advise_with_whatif_batch_prints_and_writes_the_projection(monkeypatch):
    from repl.advice import advise_script
    from repl.runner import Runner
    from repl.scripted import Entry
    from repl.session import Session
    from repl.settings import Settings
    from tests.helpers.repl import console

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    entries = [Entry("command", "/length 6", "stdin:1"), Entry("prompt", "the cat sat on the mat", "stdin:2")]
    c, out = console()
    session = Session(Runner(word_pair()), Settings(length=8, chat=False), c)
    assert advise_script(session, entries, as_json=False, stdout=io.StringIO(), whatif="batch") == 0, session.last_error
    text = out.getvalue()
    assert "projected speedup over target AR by batch size" in text and "stops paying at" in text
    assert all(f"B={b}" in text for b in BATCHES)
    c, _ = console()
    session = Session(Runner(word_pair()), Settings(length=8, chat=False), c)
    stdout = io.StringIO()
    assert advise_script(session, entries, as_json=True, stdout=stdout, whatif="batch") == 0, session.last_error
    batch = json.loads(stdout.getvalue())["whatif"]["batch"]
    assert batch["projected"] is True and batch["from"].startswith("forwards timed by shape on ")
    assert batch["methods"] and all(m["batches"] == list(BATCHES) and len(m["speedups"]) == len(BATCHES)
                                    and all(s > 0 for s in m["speedups"]) for m in batch["methods"])
    advised = {a["method"] for a in json.loads(stdout.getvalue())["advice"]}
    assert {m["method"] for m in batch["methods"]} <= advised


def test_infer_and_bench_refuse_whatif_without_advise_before_loading(tmp_path, capsys):
    import infer
    from bench.cli import main

    with pytest.raises(SystemExit) as caught:
        infer.main(["--prompt", "x", "--whatif", "batch"])
    assert caught.value.code == 2 and "--whatif projects the advice" in capsys.readouterr().err
    assert main(["--whatif", "batch", "--out", str(tmp_path / "o")], loader=lambda args: pytest.fail("loaded")) == 2
    err = capsys.readouterr().err.strip()
    assert "--whatif projects the advice" in err and "\n" not in err


def bench_whatif(tmp_path, whatif: str, *more: str) -> tuple[dict, str]:
    """``bench.py --advise --whatif WHATIF`` on one prompt of the tiny word pair (its grid patched by the
    caller): the chat category's ``whatif`` object of advice.json, and advice.md (advice.html is left
    in ``tmp_path / "out"``)."""
    from bench.cli import main

    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "chat", "turns": ["the cat sat on the mat"]}),
                       encoding="utf-8")
    out = tmp_path / "out"
    argv = ["--advise", "--whatif", whatif, "--prompts", str(prompts), "--length", "6", "--confirm", "1",
            "--out", str(out), "--no-chat", *more]
    pair = word_pair()
    assert main(argv, loader=lambda args: pair) == 0
    return (json.loads((out / "advice.json").read_text())["advice"]["chat"]["whatif"],
            (out / "advice.md").read_text())


def test_bench_advise_with_whatif_batch_writes_the_projection_per_category(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    whatif, summary = bench_whatif(tmp_path, "batch")
    batch = whatif["batch"]
    assert batch["projected"] and len(batch["methods"][0]["speedups"]) == len(BATCHES)
    assert "Projected, not run:" in summary and "| stops paying at |" in summary
    check_page((tmp_path / "out" / "advice.html").read_text(), {"chat": batch}, "B", "batches")


def check_page(html: str, projections: dict[str, dict], axis: str, points: str) -> None:
    """An advice page (``bench.advice_page``) against the JSON beside it: one section per group, each
    charting every projected method of its JSON at that JSON's points and speedups (to the last digit),
    ringed where the JSON says it stops paying, and naming the best at each point."""
    import re

    from tests.test_whatif import chart_points, rings

    sections = re.findall(r'<section class="advice" data-group="([^"]*)">(.*?)</section>', html, flags=re.S)
    assert [name for name, _ in sections] == list(projections)
    for (name, body), projection in zip(sections, projections.values()):
        assert "What if (projected, not run)" in body and '<table class="advice">' in body
        drawn = chart_points(body)
        assert set(drawn) == {m["method"] for m in projection["methods"]}
        for m in projection["methods"]:
            assert [(x, s) for x, s, _, _ in drawn[m["method"]]] == list(zip(m[points], m["speedups"]))
            stops = next((x for x, s in zip(m[points], m["speedups"]) if s < 1.0), None)
            assert rings(body).get(m["method"], (None,))[0] == stops
        best = re.search(r'<p class="best" data-axis="([^"]*)">Best at each [BL]: (.*?)\.</p>', body)
        assert best and best.group(1) == axis and best.group(2).count(f"{axis}=") == len(projection["best"])


def test_mutation_a_page_charting_only_the_first_method_fails(tmp_path, monkeypatch):
    import bench.advice_page

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    drawn = bench.advice_page.projection_chart
    monkeypatch.setattr(bench.advice_page, "projection_chart", lambda title, rows, *rest: drawn(title, rows[:1], *rest))
    whatif, _ = bench_whatif(tmp_path, "batch")
    assert len(whatif["batch"]["methods"]) > 1
    with pytest.raises(AssertionError):
        check_page((tmp_path / "out" / "advice.html").read_text(), {"chat": whatif["batch"]}, "B", "batches")


def test_infer_advise_with_whatif_and_html_writes_the_advice_charted(tmp_path, monkeypatch, capsys):
    """``infer.py --advise --json --whatif context --html PAGE`` through its main on the tiny word pair: the
    JSON on stdout, and the page charting the same projection (the prompts' own context among its points)."""
    import infer

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    monkeypatch.setattr(infer, "_load", lambda args, messages: word_pair())
    page = tmp_path / "advice.html"
    assert infer.main(["--advise", "--json", "--prompt", "the cat sat on the mat", "--length", "6", "--no-chat",
                       "--whatif", "context", "--html", str(page)]) == 0
    out = capsys.readouterr()
    report = json.loads(out.out.strip().splitlines()[-1])
    context = report["whatif"]["context"]
    assert f"advice written to {page} (one self-contained page)\n" in out.err          # the path unbroken
    check_page(page.read_text(), {"1 prompts": context}, "L", "contexts")
    assert context["context"] in context["methods"][0]["contexts"]


def test_html_without_replay_or_advise_and_an_unwritable_page_are_refused_before_loading(tmp_path, capsys):
    import infer

    for argv, says in ((["--prompt", "x", "--html", str(tmp_path / "p.html")], "--html needs --replay FILE or --advise"),
                       (["--advise", "--prompt", "x", "--html", str(tmp_path)], "cannot write report to")):
        with pytest.raises(SystemExit) as caught:
            infer.main(argv)
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert caught.value.code == 2 and says in err


def check_reading_between(read) -> None:
    """Four forwards timed at B in (1, 4) and w in (1, 4), read elsewhere linearly in B and w, worked
    by hand: at (2, 2) each batch's width 2 (1 + 2/3 = 5/3 at B = 1, 2 + 4/3 = 10/3 at B = 4), then a
    third of the way between them (20/9); past the shapes timed the last segment goes on (w = 8 at
    B = 1: 1 + 7/3 x 2; B = 16 at w = 1: 1 + 15/3 x 1). An affine cost is read exactly."""
    table = {(1, 1): 1.0, (1, 4): 3.0, (4, 1): 2.0, (4, 4): 6.0}
    assert read(table, 1, 4) == 3.0
    assert read(table, 1, 2) == pytest.approx(5 / 3) and read(table, 4, 2) == pytest.approx(10 / 3)
    assert read(table, 2, 2) == pytest.approx(20 / 9)
    assert read(table, 1, 8) == pytest.approx(1 + 14 / 3) and read(table, 16, 1) == pytest.approx(6.0)
    affine = {(b, w): 0.01 + 0.001 * b * w for b in (1, 8, 32) for w in (1, 8)}
    assert read(affine, 32, 4) == pytest.approx(0.01 + 0.001 * 32 * 4)


def test_forwards_are_read_between_the_shapes_timed():
    from engine.shapes import read_between

    check_reading_between(read_between)


def test_mutation_reading_in_log2_fails(monkeypatch):
    import math

    import engine.shapes as shapes

    def in_log2(points, x):
        xs = sorted(points)
        if x in points or len(xs) == 1:
            return points.get(x, points[xs[0]])
        i = min(max(1, sum(1 for k in xs if k < x)), len(xs) - 1)
        x0, x1 = xs[i - 1], xs[i]
        t = (math.log2(x) - math.log2(x0)) / (math.log2(x1) - math.log2(x0))
        return points[x0] + t * (points[x1] - points[x0])
    monkeypatch.setattr(shapes, "_between", in_log2)
    with pytest.raises(AssertionError):
        check_reading_between(shapes.read_between)


def test_a_costs_file_projects_with_the_shapes_it_holds(tmp_path, monkeypatch):
    """``bench.py --advise --whatif batch`` keeps the forwards it timed by shape in costs.json; ``infer.py
    --advise --whatif batch --costs costs.json`` then projects with them (edited here by hand, so the
    speedups are checked against those numbers) and times nothing; the projection says where they came
    from. A file whose shapes were timed on another context is timed afresh, and says so."""
    from advisor.costs import CostTable
    from bench.cli import main
    from repl.advice import advise_script
    from repl.runner import Runner
    from repl.scripted import Entry
    from repl.session import Session
    from repl.settings import Settings
    from tests.helpers.repl import console

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "chat", "turns": ["the cat sat on the mat"]}),
                       encoding="utf-8")
    out = tmp_path / "out"
    pair = word_pair()
    assert main(["--advise", "--whatif", "batch", "--prompts", str(prompts), "--length", "6", "--confirm", "1",
                 "--out", str(out), "--no-chat"], loader=lambda args: pair) == 0
    saved = json.loads((out / "costs.json").read_text())
    timed = {(b, w) for b, w, _ in saved["shapes"]["target"]}
    assert {(b, 1) for b in BATCHES} <= timed and saved["shapes"]["context"] > 0
    # By hand: a forward of 10 ms plus 1 ms per token fed, and no drafter model of its own.
    saved["shapes"]["target"] = [[b, w, 0.010 + 0.001 * b * w] for b, w in sorted(timed)]
    saved["shapes"]["drafter"] = None
    (out / "costs.json").write_text(json.dumps(saved), encoding="utf-8")

    def no_timing(*args, **kwargs):
        raise AssertionError("timed although the costs file holds the shapes")
    monkeypatch.setattr(advisor.whatif, "time_pair_shapes", no_timing)
    seen = []
    real = advisor.whatif.project_advice
    monkeypatch.setattr(advisor.whatif, "project_advice",
                        lambda *args, **kwargs: seen.append((args, real(*args, **kwargs))) or seen[-1][1])
    entries = [Entry("command", "/length 6", "stdin:1"), Entry("prompt", "the cat sat on the mat", "stdin:2")]
    c, _ = console()
    session = Session(Runner(word_pair()), Settings(length=8, chat=False), c,
                      advisor_costs=CostTable.load(out / "costs.json"))
    stdout = io.StringIO()
    assert advise_script(session, entries, as_json=True, stdout=stdout, whatif="batch") == 0, session.last_error
    batch = json.loads(stdout.getvalue())["whatif"]["batch"]
    assert f"(read from {out / 'costs.json'})" in batch["from"]
    [(args, whatif)] = seen
    cost = lambda b, w: 0.010 + 0.001 * b * w        # noqa: E731
    rows = dict(whatif.rows)
    assert [m["method"] for m in batch["methods"]] == list(rows)
    checked = 0
    for a in args[1]:
        if a.method not in rows:
            continue
        checked += 1
        widths = a.entry.replayed.widths
        rounds = sum(widths.values())
        draft_s = a.why.draft_steps * (a.why.c or 0.0) * cost(1, 1) + a.why.lookup_ms / 1e3
        scaled = a.entry.method.drafter in ("model", "self")
        want = [a.tokens_per_call * cost(b, 1)
                / (sum(n / rounds * cost(b, w) for w, n in widths.items())
                   + draft_s * (cost(b, 1) / cost(1, 1) if scaled else b)) for b in BATCHES]
        assert rows[a.method].speedups == pytest.approx(want), a.method
    assert checked == len(rows) > 0
    monkeypatch.setattr(advisor.whatif, "project_advice", real)
    # Shapes timed over another context are not used: the projection times here (and says where).
    saved["shapes"]["context"] = 10 * saved["shapes"]["context"]
    (out / "costs.json").write_text(json.dumps(saved), encoding="utf-8")
    monkeypatch.undo()
    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    c, text = console()
    session = Session(Runner(word_pair()), Settings(length=8, chat=False), c,
                      advisor_costs=CostTable.load(out / "costs.json"))
    assert advise_script(session, entries, as_json=False, stdout=io.StringIO(), whatif="batch") == 0
    assert "timing the target by batch" in text.getvalue()


# ---------------------------------------------------------------------------------------------
# --whatif machine:NAME: the same rounds priced on a card's roofline
# ---------------------------------------------------------------------------------------------


def _machine(monkeypatch, advice, drafter_shape):
    """The advice projected on a made-up card (2 ms a forward, 100 GB/s, 2 TFLOP/s bfloat16) with a
    target of a billion bfloat16 weights (2 GB: 20 ms of bytes) and ``drafter_shape`` for its drafter."""
    from analysis.roofline import MachineProfile, ModelShape

    target = ModelShape(1_000_000_000, 2.0, 16, 2048, 65_536.0)
    monkeypatch.setattr("engine.shapes.model_shape", lambda model: target)
    monkeypatch.setattr(advisor.whatif, "_drafter_shape", lambda pair, method, state: drafter_shape)
    card = MachineProfile("X", 100e9, {"bfloat16": 2e12}, 2e-3, "made up")
    out = advisor.whatif.project_machine(SimpleNamespace(target=None), advice, 100, card, state=object())
    return out, target, card


def test_machine_prices_a_drafter_model_by_its_own_shape_and_a_storage_by_its_look_ups(monkeypatch):
    """Worked by hand on the card: a forward costs 2 ms + max(bytes / 100 GB/s, FLOPs / 2 TFLOP/s).
    The target at (B, w) over 100 cached tokens reads 2e9 + B (100 + w) 65,536 bytes and does
    B w (2e9 + 4 x 16 x 2048 (100 + w)) FLOPs; the drafter (50 million weights, 0.1 GB) the same way."""
    from analysis.roofline import ModelShape

    small = ModelShape(50_000_000, 2.0, 4, 512, 8_192.0)

    def forward(shape, b, w):
        moved = shape.parameters * shape.weight_bytes + b * (100 + w) * shape.kv_bytes_per_token
        flops = b * w * (2.0 * shape.parameters + 4.0 * shape.layers * shape.hidden * (100 + w))
        return 2e-3 + max(moved / 100e9, flops / 2e12)

    model = _advice({3: 30, 5: 10}, 3.0, 0.1, 2.0, drafter="model")
    storage = _advice({4: 10}, 1.5, None, 0.0, lookup_ms=1.0, drafter="ngram")
    out, target, card = _machine(monkeypatch, [model, storage], small)
    rows = dict(out.rows)
    want = [3 * forward(target, b, 1) / (0.75 * forward(target, b, 3) + 0.25 * forward(target, b, 5)
                                         + 2 * forward(small, b, 1)) for b in BATCHES]
    assert rows["mmodel"].speedups == pytest.approx(want)
    assert rows["mmodel"].drafter_source == "its shape on the profile"
    assert rows["mngram"].speedups == pytest.approx(
        [1.5 * forward(target, b, 1) / (forward(target, b, 4) + 0.001 * b) for b in BATCHES])
    # decisive: the big target turns compute-bound with the batch, so the model's speedup falls
    assert rows["mmodel"].speedups[0] > 1.4 and rows["mmodel"].speedups[-1] < rows["mmodel"].speedups[0] * 0.8
    # mutation: the drafter priced as the target (its shape ignored) projects far less
    wrong, _, _ = _machine(monkeypatch, [model], target)
    assert all(w < s * 0.7 for w, s in zip(dict(wrong.rows)["mmodel"].speedups, want))
    d = out.to_dict()
    assert d["projected"] is True and d["profile"]["name"] == "X" and d["from"].startswith("X's roofline: made up")
    assert [m["method"] for m in d["methods"]] == ["mmodel", "mngram"] and d["left_out"] == []


def test_machine_leaves_out_a_drafter_whose_shape_cannot_be_read_and_says_so(monkeypatch):
    model = _advice({3: 10}, 2.0, 0.2, 2.0, drafter="self")
    storage = _advice({4: 10}, 1.5, None, 0.0, lookup_ms=1.0, drafter="ngram")
    out, _, _ = _machine(monkeypatch, [model, storage], None)
    assert [label for label, _ in out.rows] == ["mngram"]
    assert out.left_out == [("mself", "its drafter's shape cannot be read to price it")]
    assert "left out, its drafter's shape cannot be read to price it: mself" in out.caption()
    assert out.to_dict()["left_out"] == [{"method": "mself", "reason": "its drafter's shape cannot be read to price it"}]


def test_whatif_values_are_checked_in_one_line():
    from analysis.whatif import whatif_choice

    assert whatif_choice("batch") == "batch" and whatif_choice("Context") == "context"
    assert whatif_choice("machine:h-100") == "machine:H100" and whatif_choice("Machine=rtx3090") == "machine:RTX3090"
    for bad, says in (("size", "--whatif takes batch, context or machine:NAME"), ("machine", "name one machine"),
                      ("machine:", "name one machine"), ("machine:TPU", "no machine profile 'TPU'"),
                      ("batch:H100", "--whatif takes batch, context or machine:NAME"), ("context:2", "--whatif takes batch, context")):
        with pytest.raises(ValueError) as caught:
            whatif_choice(bad)
        assert says in str(caught.value) and "\n" not in str(caught.value)


def test_infer_and_bench_refuse_an_unknown_machine_before_loading(tmp_path, capsys):
    import infer
    from bench.cli import main

    with pytest.raises(SystemExit) as caught:
        infer.main(["--advise", "--prompt", "x", "--whatif", "machine:TPU"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert caught.value.code == 2 and "no machine profile 'TPU' (known: H200, H100, A100, L40S, RTX3090)" in err
    with pytest.raises(SystemExit) as caught:
        main(["--advise", "--whatif", "machine", "--out", str(tmp_path / "o")], loader=lambda args: pytest.fail("loaded"))
    assert caught.value.code == 2 and "name one machine" in capsys.readouterr().err


def scripted_whatif(monkeypatch, whatif: str, grid=tiny_grid, compile: str = "off") -> tuple[dict, str]:
    """``infer.py --advise --whatif WHATIF`` through its script on the tiny word pair (its grid patched;
    ``compile``: the session's path, ``--compile``): the JSON answer, and the text the same advice
    prints without ``--json``."""
    from repl.advice import advise_script
    from repl.runner import Runner
    from repl.scripted import Entry
    from repl.session import Session
    from repl.settings import Settings
    from tests.helpers.repl import console

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: grid())
    entries = [Entry("command", "/length 6", "stdin:1"), Entry("prompt", "the cat sat on the mat", "stdin:2")]
    c, _ = console()
    session = Session(Runner(word_pair()), Settings(length=8, chat=False, compile=compile), c)
    stdout = io.StringIO()
    assert advise_script(session, entries, as_json=True, stdout=stdout, whatif=whatif) == 0, session.last_error
    c, out = console()
    session = Session(Runner(word_pair()), Settings(length=8, chat=False, compile=compile), c)
    assert advise_script(session, entries, as_json=False, stdout=io.StringIO(), whatif=whatif) == 0, session.last_error
    return json.loads(stdout.getvalue()), out.getvalue()


def test_scripted_advise_and_bench_project_on_a_machine(tmp_path, monkeypatch):
    """``infer.py --advise --whatif machine:H100`` through its script, and ``bench.py --advise --whatif
    machine:A100``, on the tiny word pair: each projection named after its card, priced by its profile
    (the word pair's models read as shapes), every row a speedup at every batch size."""
    from analysis.roofline import PROFILES

    report, text = scripted_whatif(monkeypatch, "machine:H100")
    machine = report["whatif"]["machine"]
    assert machine["profile"] == PROFILES["H100"].to_dict() and machine["from"].startswith("H100's roofline: NVIDIA")
    assert machine["methods"] and all(len(m["speedups"]) == len(BATCHES) and all(s > 0 for s in m["speedups"])
                                      for m in machine["methods"])
    assert {m["method"] for m in machine["methods"]} | {m["method"] for m in machine["left_out"]} <= \
        {a["method"] for a in report["advice"]}
    assert "projected speedup over target AR by batch size on H100" in text and "roofline" in text
    assert "best at each B: B=1 " in text and len(machine["best"]) == len(BATCHES)

    whatif, summary = bench_whatif(tmp_path, "machine:a100")
    machine = whatif["machine"]
    assert machine["profile"]["name"] == "A100" and len(machine["methods"][0]["speedups"]) == len(BATCHES)
    assert "Projected, not run: projected speedup over target AR by batch size on A100" in summary
    assert "| stops paying at |" in summary and "Best at each B: B=1 " in summary


def test_a_session_on_captured_forwards_is_projected_on_the_cards_captured_path(tmp_path, monkeypatch):
    """``infer.py --compile graphs --advise --whatif machine:H100`` (and ``bench.py``'s): the advice ranks
    on ``off`` as ever, but the user runs captured forwards, so the card is priced with the captured
    path's launches: the profile is ``captured(H100)``, the title says so, and the look-up methods'
    rows move (their look-ups are a larger share of a cheaper forward). Mutation: the session's path
    ignored gives the eager profile and the eager rows."""
    from analysis.roofline import PROFILES, captured

    eager, _ = scripted_whatif(monkeypatch, "machine:H100")
    report, text = scripted_whatif(monkeypatch, "machine:H100", compile="graphs")
    machine = report["whatif"]["machine"]
    assert report["session_compile"] == "graphs" and report["compile"] == "off"
    assert machine["profile"] == captured(PROFILES["H100"]).to_dict() and machine["profile"]["overhead_per_layer_us"] == 9.375
    assert machine["from"].startswith("H100 (captured)'s roofline")
    assert "by batch size on H100 (captured)" in text and "overhead 9 µs a layer" in " ".join(text.split())
    before = {m["method"]: m["speedups"] for m in eager["whatif"]["machine"]["methods"]}
    moved = [m["method"] for m in machine["methods"] if m["method"] in before and any(
        abs(a / b - 1) > 0.05 for a, b in zip(m["speedups"], before[m["method"]]))]
    assert moved
    whatif, summary = bench_whatif(tmp_path, "machine:h100", "--compile", "graphs")
    assert whatif["machine"]["profile"]["name"] == "H100 (captured)" and "on H100 (captured)" in summary


# ---------------------------------------------------------------------------------------------
# --whatif context: at batch 1 over context lengths, acceptance from the rounds near each
# ---------------------------------------------------------------------------------------------


def _context_advice(rounds, c: float | None, steps: float, drafter: str = "self", lookup_ms: float = 0.0):
    """An advice whose replay's steady rounds are ``rounds`` ((position, width, tokens made) each)."""
    widths: dict[int, int] = {}
    for _, w, _ in rounds:
        widths[w] = widths.get(w, 0) + 1
    replayed = SimpleNamespace(widths=widths, steady_widths=widths, steady_rounds=list(rounds))
    entry = SimpleNamespace(replayed=replayed, method=SimpleNamespace(drafter=drafter))
    why = SimpleNamespace(c=c, draft_steps=steps, lookup_ms=lookup_ms)
    made = sum(t for _, _, t in rounds) / len(rounds)
    return SimpleNamespace(method=f"m{drafter}", entry=entry, why=why, tokens_per_call=made, tokens_per_round=made)


# four rounds near 128 tokens that make 3 tokens each (verifies of 4), four near 2,048 that make 1.5
# (verifies of 4 and 2), and two near 512 (too few to speak for it: the method's own there)
ROUNDS = [(100, 4, 3), (110, 4, 3), (120, 4, 3), (130, 4, 3), (400, 4, 3), (600, 2, 1),
          (1900, 4, 2), (2000, 2, 1), (2100, 4, 2), (2200, 2, 1)]


def test_the_rounds_are_split_by_the_context_nearest_where_they_ran():
    near = advisor.whatif.facts_near(_context_advice(ROUNDS, 0.2, 2.0), (128, 512, 2048), 0.01)
    assert near[512] is None
    assert near[128].tokens_per_round == 3.0 and near[128].widths == {4: 1.0}
    assert near[2048].tokens_per_round == 1.5 and near[2048].widths == pytest.approx({4: 0.5, 2: 0.5})
    assert near[2048].drafter_steps == 2.0


def test_context_prices_each_length_with_its_own_forwards_and_the_acceptance_near_it(monkeypatch):
    """T(L, w) = 10 ms x (1 + L / 1000) x (1 + 0.1 (w - 1)), timed (here: given) at each context; a
    self-drafter with c = 0.2 and 2 steps a round: speedup(L) = t(L) T(L,1) / (sum share(w) T(L,w) + 2 x 0.2
    T(L,1)), with t and the shares those of the rounds near L, or over all rounds where too few ran near it."""
    cost = lambda c, w: 0.01 * (1 + c / 1000) * (1 + 0.1 * (w - 1))      # noqa: E731

    def time_shapes(model, batches, widths, context, vocab_size):
        return {(b, w): cost(context, w) for b in batches for w in widths}

    monkeypatch.setattr("engine.shapes.time_shapes", time_shapes)
    monkeypatch.setattr("engine.shapes.drafter_shape_costs", lambda pair, batches, context: None)
    # the self-drafter's own step, timed by context (here: given), scales as the target's step here
    monkeypatch.setattr("advisor.costs.step_seconds_by_context",
                        lambda pair, method, state, contexts: {c: 0.002 * cost(c, 1) for c in contexts})
    pair = SimpleNamespace(context_length=4096, target=None, vocab_size=10)
    advice = _context_advice(ROUNDS, 0.2, 2.0)
    out = advisor.whatif.project_context(pair, [advice], 300, "here")
    [(label, p)] = out.rows
    assert p.batches == (128, 300, 512, 2048)             # 8,192 and up are past the window
    overall = sum(t for _, _, t in ROUNDS) / len(ROUNDS)
    shares_all = {4: 7 / 10, 2: 3 / 10}

    def want(c, tokens, shares):
        return tokens * cost(c, 1) / (sum(s * cost(c, w) for w, s in shares.items()) + 2 * 0.2 * cost(c, 1))

    assert p.speedups == pytest.approx([want(128, 3.0, {4: 1.0}), want(300, overall, shares_all),
                                        want(512, overall, shares_all), want(2048, 1.5, {4: 0.5, 2: 0.5})])
    # decisive: the rounds near 2,048 accept half as much, and the speedup there falls under 1
    assert p.speedups[0] > 1.5 and p.speedups[-1] < 1.0 and p.stops_paying == 2048
    d = out.to_dict()
    assert d["projected"] is True and d["context"] == 300 and d["methods"][0]["contexts"] == [128, 300, 512, 2048]
    assert "mself 1.50 tokens a round near L=2048" in out.caption()
    # mutation: one acceptance for every context (the rounds' positions ignored) keeps paying at 2,048
    flat = _context_advice([(300, w, t) for _, w, t in ROUNDS], 0.2, 2.0)
    [(_, q)] = advisor.whatif.project_context(pair, [flat], 300, "here").rows
    assert q.speedups[-1] > 1.0 > p.speedups[-1]


def test_scripted_advise_and_bench_project_over_context(tmp_path, monkeypatch):
    """``infer.py --advise --whatif context`` through its script and ``bench.py --advise --whatif context`` on
    the tiny word pair: a speedup at every context, the prompts' own among them, the table headed by L."""
    report, text = scripted_whatif(monkeypatch, "context")
    context = report["whatif"]["context"]
    assert context["projected"] is True and context["methods"]
    assert all(context["context"] in m["contexts"] and len(m["speedups"]) == len(m["contexts"])
               and all(s > 0 for s in m["speedups"]) for m in context["methods"])
    assert "projected speedup over target AR by context length at batch 1" in text and f"L={context['context']}" in text
    whatif, summary = bench_whatif(tmp_path, "context")
    assert whatif["context"]["methods"] and "| method | L=" in summary and "Best at each L: L=" in summary
    assert f"best at each L: L={min(context['methods'][0]['contexts'])} " in text


def test_a_method_best_at_some_batch_size_is_shown_wherever_it_ranked(monkeypatch):
    """Thirteen long chains (γ 8: 6 tokens a round, 8 drafter steps of a tenth of a target step) rank
    above one short chain (γ 1: 1.6 tokens a round); on forwards that turn compute-bound past 16 tokens
    (T(B, w) = 10 ms x max(1, B w / 16)), by hand: at B=1 a long chain 6 / (1 + 0.8) = 3.33x and the short
    one 1.6 / 1.1 = 1.45x; at B=8 the long 0.06 / (0.045 + 0.008) = 1.13x and the short 0.016 / 0.011 =
    1.45x; from B=16 on neither pays. The short chain ranks 14th, past the 12 rows shown, and is shown."""
    cost = lambda b, w: 0.01 * max(1.0, b * w / 16)      # noqa: E731
    advice = []
    for i in range(13):
        a = _advice({9: 10}, 6.0, 0.1, 8.0)
        a.method = f"long{i}"
        advice.append(a)
    short = _advice({2: 10}, 1.6, 0.1, 1.0)
    short.method = "short"
    monkeypatch.setattr(advisor.whatif, "time_pair_shapes", lambda pair, widths, context, batches: _shapes(cost))
    whatif = project_advice(None, advice + [short], 64, "here")
    labels = [label for label, _ in whatif.rows]
    assert labels == [f"long{i}" for i in range(12)] + ["short"]        # long12 is best nowhere: not shown
    best = {point: (label, s) for point, label, s in whatif.best}
    assert best[1][0] == "long0" and best[1][1] == pytest.approx(6 / 1.8)
    assert best[8][0] == "short" and best[8][1] == pytest.approx(0.016 / 0.011)
    assert best[16][0] is None and best[32][0] is None and best[32][1] < 1.0
    line = whatif.best_line()
    assert line.startswith("best at each B: B=1 long0 3.33x") and "B=8 short 1.45x" in line
    assert "B=32 target AR (none over 1.0x" in line
    assert whatif.to_dict()["best"][3] == {"at": 8, "method": "short", "speedup": pytest.approx(0.016 / 0.011)}
    # mutation: only the first 12 projected, the short chain is lost and B=8 goes to a long one
    cut = project_advice(None, (advice + [short])[:12], 64, "here")
    assert dict((p, m) for p, m, _ in cut.best)[8] == "long0"


# ---------------------------------------------------------------------------------------------
# the best draft length of each drafter at each point
# ---------------------------------------------------------------------------------------------


def _gamma_rows():
    """speculative at γ 2, 4 and 8 (8 best at B=1; at B=8 γ 8's 1.71x within a percent of γ 4's 1.70x, a
    near-tie the shorter wins; 2 at B=32, where none pays), its γ 2 not among the rows shown; a hybrid at
    γ 4 only; a tree at γ 3 and 5, tied at B=32 (the shorter wins)."""
    P = lambda *s: Projection((1, 8, 32), s, "x")      # noqa: E731
    every = [("speculative@8", P(3.0, 1.71, 0.6)), ("speculative+hybrid4@4", P(2.5, 1.4, 0.9)),
             ("speculative@4", P(2.6, 1.7, 0.8)), ("speculative+tree6@5", P(1.9, 1.2, 1.1)),
             ("speculative+tree6@3", P(1.8, 1.3, 1.1)), ("speculative@2", P(1.5, 1.2, 0.95))]
    return every[:5], every


def test_each_drafter_shown_gets_its_best_gamma_at_each_point_among_every_length_projected():
    rows, every = _gamma_rows()
    projected = advisor.whatif.Projected(rows, every=every)
    assert projected.best_gammas() == [
        ("speculative", [(1, 8, 3.0), (8, 4, 1.7), (32, 2, 0.95)]),
        ("speculative+tree6", [(1, 5, 1.9), (8, 3, 1.3), (32, 3, 1.1)]),
    ]
    assert projected.best_gamma_lines()[0] == "speculative: B=1 γ 8 3.00x · B=8 γ 4 1.70x · B=32 γ 2 0.95x (none pays)"
    assert projected.best_gamma_dict()[1] == {"drafter": "speculative+tree6", "best": [
        {"at": 1, "gamma": 5, "speedup": 1.9}, {"at": 8, "gamma": 3, "speedup": 1.3}, {"at": 32, "gamma": 3, "speedup": 1.1}]}
    assert projected.best_gammas()[0][1][1] != (8, 8, 1.71)      # mutation: the fastest, however near a shorter
    assert advisor.whatif.family_of("speculative+hybrid4:heuristic@8") == ("speculative+hybrid4:heuristic", 8)
    assert advisor.whatif.family_of("speculative[self:int8]+tree16@4~strict") == ("speculative[self:int8]+tree16~strict", 4)


def test_mutation_best_gammas_among_the_rows_shown_only_fail():
    # γ 2 is projected but not shown: read among the rows alone, B=32 would name γ 4 (0.8x)
    rows, every = _gamma_rows()
    assert advisor.whatif.Projected(rows).best_gammas()[0][1][2] == (32, 4, 0.8)
    assert advisor.whatif.Projected(rows, every=every).best_gammas()[0][1][2] != (32, 4, 0.8)


def gamma_grid():
    from advisor.replay import method
    from engine import NGramOptions

    return [method("ngram", NGramOptions(storage="suffix"), 2), method("ngram", NGramOptions(storage="suffix"), 4),
            method("model", None, 2), method("model", None, 4)]


def test_the_front_ends_give_the_best_gamma_of_each_drafter(tmp_path, monkeypatch):
    """``infer.py --advise --whatif batch`` (JSON and text) and ``bench.py --advise --whatif batch`` (advice.md,
    advice.html) on the tiny word pair with two draft lengths of each drafter: each drafter's best γ at each
    batch size is the faster of its two projected rows there, to the last digit, in every output."""
    import re

    report, text = scripted_whatif(monkeypatch, "batch", gamma_grid)
    batch = report["whatif"]["batch"]
    assert {family for family in (m["method"].split("@")[0] for m in batch["methods"])} == {"ngram[suffix]", "speculative"}

    def expected(methods):
        """By hand: the shortest γ within 1% of the family's fastest at each batch size."""
        families: dict[str, list] = {}
        for m in methods:
            family, gamma = m["method"].split("@")
            families.setdefault(family, []).append((int(gamma), m["speedups"]))
        out = {}
        for family, rows in families.items():
            best = []
            for i, b in enumerate(BATCHES):
                top = max(s[i] for _, s in rows)
                g, s = min(((g, s) for g, s in rows if s[i] >= 0.99 * top), key=lambda r: r[0])
                best.append({"at": b, "gamma": g, "speedup": s[i]})
            out[family] = best
        return out

    assert {d["drafter"]: d["best"] for d in batch["best_gamma"]} == expected(batch["methods"])
    flat = " ".join(text.split())          # the text is another advice's (its own timings): its form
    assert "best γ at each B, per drafter shown (projected, not run):" in flat
    point = r"B=(\d+) γ [24] \d+\.\d\dx(?: \(none pays\))?"
    for d in batch["best_gamma"]:
        line = re.search(re.escape(d["drafter"]) + ": " + " · ".join([point] * len(BATCHES)), flat)
        assert line and [int(b) for b in line.groups()] == list(BATCHES)
    whatif, summary = bench_whatif(tmp_path, "batch")
    gammas = {d["drafter"]: d["best"] for d in whatif["batch"]["best_gamma"]}
    assert gammas == expected(whatif["batch"]["methods"])
    assert "Best γ at each B, per drafter shown (projected, not run):" in summary
    for family, best in gammas.items():
        assert f"| {family} | " + " | ".join(f"γ {p['gamma']}: {p['speedup']:.2f}x"
                                              + (" (none pays)" if p["speedup"] < 1.0 else "") for p in best) in summary
    html = (tmp_path / "out" / "advice.html").read_text()
    assert "per drafter shown (projected, not run):" in html
    for family, best in gammas.items():
        row = re.search(rf'<tr data-drafter="{re.escape(family)}">(.*?)</tr>', html).group(1)
        assert [(int(g), float(s)) for g, s in re.findall(r'data-gamma="(\d+)" data-speedup="([^"]+)"', row)] == \
            [(p["gamma"], p["speedup"]) for p in best]


# ---------------------------------------------------------------------------------------------
# the forwards by context kept in the cost table, and read from it
# ---------------------------------------------------------------------------------------------


def _surface(lengths, drafter=True):
    """Forwards at batch 1 affine in the cache's length and the width: 10 ms + 0.01 ms a cached token
    + 2 ms a token fed (the drafter: 1 ms + 0.001 ms a cached token), timed at widths 1, 2 and 4."""
    from engine.shapes import PairShapes

    return [PairShapes({(1, w): 0.010 + 1e-5 * L + 0.002 * (w - 1) for w in (1, 2, 4)},
                       {(1, 1): 0.001 + 1e-6 * L} if drafter else None, L, None, "there") for L in lengths]


def check_read_by_context(read) -> None:
    """An affine surface read anywhere is the affine cost, to the last digit: a length between two
    timed (512, 1000), beyond them (4096), a width between two timed (3); a drafter missing at one
    length is missing at all."""
    target, drafter = read(_surface((128, 2048)), (128, 512, 1000, 4096), (1, 3, 4))
    for L in (128, 512, 1000, 4096):
        for w in (1, 3, 4):
            assert target[L][(1, w)] == pytest.approx(0.010 + 1e-5 * L + 0.002 * (w - 1), rel=1e-12)
        assert drafter[L][(1, 1)] == pytest.approx(0.001 + 1e-6 * L, rel=1e-12)
    surface = _surface((128, 2048))
    surface[1] = _surface((2048,), drafter=False)[0]
    assert set(read(surface, (512,), (1,))[1].values()) == {None}


def test_forwards_by_context_are_read_between_the_lengths_timed():
    from engine.shapes import read_by_context

    check_read_by_context(read_by_context)


def test_mutation_reading_the_nearest_length_timed_fails():
    from engine.shapes import read_by_context

    def nearest(surface, contexts, widths):
        pick = lambda c: min(surface, key=lambda s: abs(s.context - c))      # noqa: E731
        return ({c: {(1, w): pick(c).target_s(1, w) for w in widths} for c in contexts},
                {c: ({(1, 1): pick(c).drafter_s(1)} if all(s.drafter for s in surface) else None) for c in contexts})

    assert read_by_context(_surface((128, 2048)), (128,), (1,))[0] == nearest(_surface((128, 2048)), (128,), (1,))[0]
    with pytest.raises(AssertionError):
        check_read_by_context(nearest)


def test_a_costs_file_projects_over_context_with_the_forwards_it_holds(tmp_path, monkeypatch):
    """``bench.py --advise --whatif context`` keeps the forwards it timed by context in costs.json; the same
    run with ``--costs costs.json`` times nothing by context, prices the same lengths off the file, labels
    the projection as read from it, and projects every method as the first run did, to the last digit
    (the same replay, the same forwards)."""
    import engine.shapes
    from bench.cli import main

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    first, _ = bench_whatif(tmp_path, "context")
    costs = json.loads((tmp_path / "out" / "costs.json").read_text())
    timed = [entry["context"] for entry in costs["by_context"]]
    assert timed == first["context"]["timed_at"] and len(timed) >= 2
    assert all({b for b, _, _ in entry["target"]} == {1} for entry in costs["by_context"])

    def refuse(*args, **kwargs):
        raise AssertionError("timed by context although the costs file holds the forwards")

    monkeypatch.setattr(engine.shapes, "time_by_context", refuse)
    (tmp_path / "out" / "costs.json").rename(tmp_path / "costs.json")
    out = tmp_path / "again"
    argv = ["--advise", "--whatif", "context", "--prompts", str(tmp_path / "q.jsonl"), "--length", "6",
            "--confirm", "1", "--out", str(out), "--no-chat", "--costs", str(tmp_path / "costs.json")]
    pair = word_pair()
    assert main(argv, loader=lambda args: pair) == 0
    again = json.loads((out / "advice.json").read_text())["advice"]["chat"]["whatif"]["context"]
    assert f"(read from {tmp_path / 'costs.json'})" in again["from"] and again["timed_at"] == timed
    # a drafter model's rows to the last digit; a storage's look-ups are timed by each replay afresh
    rows = lambda whatif: {m["method"]: (m["contexts"], m["speedups"]) for m in whatif["methods"]}   # noqa: E731
    before, after = rows(first["context"]), rows(again)
    assert set(after) == set(before) and any(m.startswith("speculative") for m in after)
    for method, (contexts, speedups) in after.items():
        assert contexts == before[method][0]
        assert speedups == (before[method][1] if method.startswith("speculative") else
                            pytest.approx(before[method][1], rel=0.05))
    assert "read between" in (out / "advice.md").read_text()


def test_a_costs_file_with_unreadable_forwards_by_context_is_refused_in_one_line(tmp_path):
    from advisor.costs import CostsError, CostTable

    good = CostTable({1: 0.01, 2: 0.012}, {}, 0.0, "here", by_context=[s.to_dict() for s in _surface((128, 512))])
    path = tmp_path / "costs.json"
    good.save(path)
    read = CostTable.load(path)
    assert [s.context for s in read.context_shapes()] == [128, 512] and "(read from" in read.context_shapes()[0].where
    for bad in ({"128": []}, [{"context": 128, "target": [[1, 1, -1.0]]}], [{"target": []}]):
        data = good.to_dict() | {"by_context": bad}
        path.write_text(json.dumps(data))
        with pytest.raises(CostsError) as caught:
            CostTable.load(path)
        assert str(caught.value).startswith("not a cost table") and "\n" not in str(caught.value)


def test_a_self_drafters_step_is_priced_by_context_as_it_was_timed_there(monkeypatch):
    """The target's step flat at 10 ms at every context (widths 4 and 2 at 12 and 11 ms); the
    self-drafter's own step timed at 2 ms over 300 cached tokens and growing 1 ms every 500 tokens
    (a lean step reading the target's cache): c = 0.2 at 300, 2 steps a round, so at L its drafting is
    2 x 0.2 x 10 ms x d(L) / d(300). By hand at 2,048: d = 2 + 3.496 = 5.496 ms, 2 x 2 ms x 2.748 =
    10.99 ms a round's drafting, speedup = 1.5 x 10 / (11.5 + 10.99) = 0.667x; priced as the target's
    step (flat) it would read 1.5 x 10 / (11.5 + 4) = 0.968x."""
    verify = {1: 0.010, 2: 0.011, 4: 0.012}

    def time_shapes(model, batches, widths, context, vocab_size):
        return {(b, w): verify.get(w, 0.012) for b in batches for w in widths}

    step = lambda c: 0.002 + 0.001 * (c - 300) / 500      # noqa: E731
    monkeypatch.setattr("engine.shapes.time_shapes", time_shapes)
    monkeypatch.setattr("engine.shapes.drafter_shape_costs", lambda pair, batches, context: None)
    monkeypatch.setattr("advisor.costs.step_seconds_by_context",
                        lambda pair, method, state, contexts: {c: step(c) for c in contexts})
    pair = SimpleNamespace(context_length=4096, target=None, vocab_size=10)
    out = advisor.whatif.project_context(pair, [_context_advice(ROUNDS, 0.2, 2.0)], 300, "here")
    [(_, p)] = out.rows
    at = dict(zip(p.batches, p.speedups))
    drafting = 2 * 0.2 * 0.010 * step(2048) / step(300)
    assert at[2048] == pytest.approx(1.5 * 0.010 / (0.5 * 0.012 + 0.5 * 0.011 + drafting))
    assert at[2048] == pytest.approx(0.667, abs=1e-3) and p.drafter_source == "its step timed at each context"
    assert out.to_dict()["methods"][0]["drafter_cost"] == "its step timed at each context"
    # mutation: the drafter's step scaled as the target's (flat here) reads 0.968x at 2,048
    monkeypatch.setattr("advisor.costs.step_seconds_by_context",
                        lambda pair, method, state, contexts: {c: 0.002 for c in contexts})
    [(_, q)] = advisor.whatif.project_context(pair, [_context_advice(ROUNDS, 0.2, 2.0)], 300, "here").rows
    assert dict(zip(q.batches, q.speedups))[2048] == pytest.approx(0.968, abs=1e-3)


def test_a_drafter_that_cannot_be_timed_by_context_is_scaled_as_the_target_with_a_line(monkeypatch):
    def fails(pair, method, state, contexts):
        raise ValueError("no step")

    monkeypatch.setattr("engine.shapes.time_shapes", lambda model, batches, widths, context, vocab_size:
                        {(b, w): 0.01 for b in batches for w in widths})
    monkeypatch.setattr("engine.shapes.drafter_shape_costs", lambda pair, batches, context: None)
    monkeypatch.setattr("advisor.costs.step_seconds_by_context", fails)
    said = []
    pair = SimpleNamespace(context_length=4096, target=None, vocab_size=10)
    out = advisor.whatif.project_context(pair, [_context_advice(ROUNDS, 0.2, 2.0)], 300, "here", say=said.append)
    assert out.rows[0][1].drafter_source == "c target steps at each context"
    assert any("step not timed by context (ValueError: no step): scaled as the target's step" in line for line in said)


def test_scripted_advise_times_a_self_drafters_step_by_context(monkeypatch):
    """``infer.py --advise --whatif context`` through its script on the tiny word pair with a self-drafter
    in the grid: its rows priced on its own step timed at each context (said in the JSON), a storage's
    on its look-ups, and every speedup a number."""
    from advisor.replay import method
    from engine import NGramOptions

    calls = []
    real = advisor.costs.step_seconds_by_context

    def counted(pair, m, state, contexts):
        calls.append((m.key, tuple(contexts)))
        out = real(pair, m, state, contexts)
        assert set(out) == set(contexts) and all(s > 0 for s in out.values())
        return out

    monkeypatch.setattr(advisor.costs, "step_seconds_by_context", counted)
    grid = lambda: [method("self", "self:skip=1", 2), method("self", "self:skip=1", 4),      # noqa: E731
                    method("ngram", NGramOptions(storage="suffix"), 4)]
    report, _ = scripted_whatif(monkeypatch, "context", grid)
    context = report["whatif"]["context"]
    sources = {m["method"]: m["drafter_cost"] for m in context["methods"]}
    assert {s for m, s in sources.items() if m.startswith("speculative")} == {"its step timed at each context"}
    assert len(calls) == 2 and calls[0][1] == tuple(context["methods"][0]["contexts"])     # once per drafter, per advice
