"""A drafter model's source left out by its ceiling (``advisor.bound``), through the scripted
``--advise`` the way a user runs it, on the tiny pair whose drafter is the target's own bf16 copy.

The guarantee: a source left out could not have ranked first. It is checked against the source's
own replay (every one of its methods, priced by the same table, predicts no more than the ceiling),
with a cost table read from a file so that what is left out does not hang on this machine's timings.
"""

from __future__ import annotations

import io
import json

import pytest

from advisor.costs import CostTable
from engine import NGramOptions
from tests.test_advisor import self_word_pair

PROMPTS = ("the cat sat on the mat the cat sat on the mat", "the dog sat on the cat the dog sat on the cat")
LENGTH = 12


def grid():
    """Two n-gram chains and a source of the self-drafter larger than ``advisor.bound.MIN_METHODS``."""
    from advisor.replay import method

    ngram = [method("ngram", NGramOptions(storage="suffix"), g) for g in (2, 4)]
    model = [method("model", None, g, p) for g in (1, 2, 3, 4, 5) for p in ("constant", "heuristic")]
    return ngram + model


def table(step_ratio: float) -> CostTable:
    """A table as if read from a file: verifies cost a little more with width, the self-drafter's
    step ``step_ratio`` of the target's, no host work."""
    target = {w: 0.010 * (1 + 0.02 * (w - 1)) for w in range(1, 18)}
    return CostTable(target, {"model": {1: 0.010 * step_ratio}}, 0.0, "a hand-made table", source="costs.json")


def scripted(monkeypatch, pair, costs: CostTable, *, as_json: bool = True, bound: bool = True):
    """``infer.py --advise`` over :data:`PROMPTS` with :func:`grid` and ``costs`` as ``--costs`` gives
    them: the JSON object (or the printed view)."""
    import advisor.advise
    import advisor.replay
    from repl.advice import advise_script
    from repl.runner import Runner
    from repl.scripted import Entry
    from repl.session import Session
    from repl.settings import Settings
    from tests.helpers.repl import console

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: grid())
    if not bound:
        real = advisor.advise.advise
        monkeypatch.setattr(advisor.advise, "advise", lambda *a, **k: real(*a, **{**k, "bound": False}))
    c, shown = console()
    session = Session(Runner(pair), Settings(length=8, chat=False), c)
    session.advisor_costs = costs
    stdout = io.StringIO()
    entries = [Entry("command", f"/length {LENGTH}", "stdin:1")] + [
        Entry("prompt", p, f"stdin:{i + 2}") for i, p in enumerate(PROMPTS)]
    assert advise_script(session, entries, as_json=as_json, stdout=stdout) == 0, session.last_error
    return json.loads(stdout.getvalue()) if as_json else shown.getvalue()


def model_keys() -> set[str]:
    return {m.key for m in grid() if m.drafter == "model"}


def check_bounded(data) -> None:
    """The self-drafter's source is left out whole, named with a ceiling under the best prediction
    (the confirmed runs may order another method first), and none of its methods is ranked."""
    ranked = [a["method"] for a in data["advice"]]
    assert len(data["bounded"]) == 1, data["bounded"]
    b = data["bounded"][0]
    assert set(b["methods"]) == model_keys() and not model_keys() & set(ranked)
    best = next(a for a in data["advice"] if a["predicted_rank"] == 1)     # the confirmed runs may lead
    assert b["under"] == best["method"] and b["under_speedup"] == pytest.approx(best["predicted_speedup"], abs=1e-3)
    assert max(1.0, b["ceiling_speedup"]) < b["under_speedup"]
    assert b["drafter_step_ratio"] == pytest.approx(2.0)
    assert any(n.startswith("not replayed, under the best by their ceiling") for n in data["notes"])


def test_a_source_whose_ceiling_is_under_the_best_is_not_replayed_and_said_so(monkeypatch):
    data = scripted(monkeypatch, self_word_pair(), table(2.0))
    assert data["advice"][0]["predicted_speedup"] > 1.0     # the n-gram chains pay on these repeating prompts
    check_bounded(data)
    text = scripted(monkeypatch, self_word_pair(), table(2.0), as_json=False)
    assert "not replayed, under the best by their ceiling" in " ".join(text.split())


def test_mutation_bounding_against_the_worst_ranked_fails_the_check(monkeypatch):
    import advisor.bound

    real = advisor.bound.bound
    monkeypatch.setattr(advisor.bound, "bound", lambda pair, group, ranked, *a, **k: real(
        pair, group, ranked[::-1], *a, **k) or real(pair, group, ranked, *a, **k))
    data = scripted(monkeypatch, self_word_pair(), table(2.0))
    with pytest.raises(AssertionError):
        check_bounded(data)


def check_sound(data, costs: CostTable) -> None:
    """Each of the source's methods, replayed and priced by ``costs``, predicts no more than the
    ceiling of its own rounds (and so of the source), and a chain of constant γ comes near its own
    (the bound is tight where every draft is kept)."""
    from advisor.bound import ceiling, widest

    group = {m.key: m for m in grid() if m.drafter == "model"}
    assert set(a["method"] for a in data["advice"]) >= set(group) and not data["bounded"]
    step = data["baseline"]["decode_step_s"]
    top = ceiling(costs, "model", widest(list(group.values()), LENGTH), costs.host_s, step)[0]
    near = []
    for a in data["advice"]:
        if a["method"] not in group:
            continue
        own = ceiling(costs, "model", widest([group[a["method"]]], LENGTH), costs.host_s, step)[0]
        assert a["predicted_decode_speedup"] <= min(own, top) + 1e-4, (a["method"], own, a)   # JSON: 4 decimals
        assert a["predicted_speedup"] <= max(1.0, own) + 1e-4
        if a["gamma_policy"] == "constant":
            near.append(a["predicted_decode_speedup"] / own)
    assert max(near) > 0.75, near


def test_the_ceiling_bounds_every_method_of_the_source_replayed(monkeypatch):
    costs = table(0.05)             # a cheap drafter: its ceiling is over the n-gram chains, so it is replayed
    check_sound(scripted(monkeypatch, self_word_pair(), costs), costs)


def test_mutation_a_ceiling_that_counts_no_bonus_token_fails_the_soundness_check(monkeypatch):
    import advisor.bound

    costs = table(0.05)
    data = scripted(monkeypatch, self_word_pair(), costs)

    def mutated(costs, key, drafts, host_s, ar_step_s):
        own = costs.target(1)[0]
        c = costs.draft(key, 1)[0] / own
        return max(k / (k * c + costs.target(k + 1)[0] / own) for k in range(1, drafts + 1)), c

    monkeypatch.setattr(advisor.bound, "ceiling", mutated)
    with pytest.raises(AssertionError):
        check_sound(data, costs)


def test_advise_with_bounding_off_replays_the_source_it_would_leave_out(monkeypatch):
    data = scripted(monkeypatch, self_word_pair(), table(2.0), bound=False)
    assert not data["bounded"] and model_keys() <= {a["method"] for a in data["advice"]}


def test_bench_advise_leaves_the_source_out_per_category_and_says_so(tmp_path, monkeypatch):
    import advisor.replay
    from bench.cli import main

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: grid())
    costs = tmp_path / "costs.json"
    table(2.0).save(costs)
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("\n".join(json.dumps({"question_id": i, "category": "summarization", "turns": [p]})
                                 for i, p in enumerate(PROMPTS)), encoding="utf-8")
    out = tmp_path / "out"
    argv = ["--advise", "--prompts", str(prompts), "--length", str(LENGTH), "--confirm", "1", "--out", str(out),
            "--no-chat", "--costs", str(costs)]
    assert main(argv, loader=lambda args: self_word_pair()) == 0
    check_bounded(json.loads((out / "advice.json").read_text())["advice"]["summarization"])
    assert "not replayed, under the best by their ceiling" in " ".join((out / "advice.md").read_text().split())


def test_a_bound_that_cannot_be_worked_out_leaves_the_source_to_its_replay(monkeypatch):
    import advisor.bound

    def fails(*args, **kwargs):
        raise ValueError("the short run drafted nothing")

    monkeypatch.setattr(advisor.bound, "bound", fails)
    data = scripted(monkeypatch, self_word_pair(), table(2.0))
    assert not data["bounded"] and model_keys() <= {a["method"] for a in data["advice"]}
    assert not data["unreplayable"] or all("replay failed" not in u["reason"] for u in data["unreplayable"])


def test_no_source_is_left_out_under_an_estimate(monkeypatch):
    import advisor.replay

    real = advisor.replay._estimate_note
    monkeypatch.setattr(advisor.replay, "_estimate_note",
                        lambda pair, m: "an estimate, for the test" if m.drafter == "ngram" else real(pair, m))
    data = scripted(monkeypatch, self_word_pair(), table(2.0))
    assert not data["bounded"] and model_keys() <= {a["method"] for a in data["advice"]}
    assert all(a["estimate"] for a in data["advice"] if a["method"] not in model_keys())
