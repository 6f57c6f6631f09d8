"""The advisor's front half: the cost table, the ranking and its why, ``advise`` end to end, and the
REPL's ``/advise``.

The ranking runs on hand-built cost tables and replayed entries, whose predictions are worked out
here by hand from the speedup model's formula (tokens per round x one step / a round's seconds);
``advise`` runs on a tiny pair of random Llamas whose drafter is independent of the target.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace

import pytest
import torch

import analysis.ceiling
import advisor.rank
from advisor.costs import CostsError, CostTable, drafter_key
from advisor.rank import rank
from advisor.recorded import Recorded, Replayed
from engine import NGramOptions


@dataclass(frozen=True)
class M:
    """A grid point with the fields the ranking reads (``advisor.replay.Method``'s)."""

    key: str
    drafter: str
    options: object = None
    gamma: int = 4
    gamma_policy: str = "constant"
    tree: int = 0


@dataclass
class E:
    """A replayed entry (``advisor.replay.ReplayEntry``'s fields)."""

    method: M
    replayed: Replayed
    draft_steps: dict
    rates: list
    exactness: str = "exact"
    note: str = ""
    prefill_steps: dict | None = None    # None: the ranking finds the prefill's steps by their width
    firsts: list | None = None           # per prompt: (first round's tokens, its verify width or None, steps)
    timed: tuple = (0.0, 0)
    mode: str = "drafter"
    lookup_s: float = 0.0


def table(**changes) -> CostTable:
    fields = dict(target_s={1: 0.010, 2: 0.011, 5: 0.014}, draft_s={"model": {1: 0.002, 2: 0.0025}},
                  host_s=0.0, where="a test machine, 2026-11-28")
    return CostTable(**{**fields, **changes})


def ngram_entry(**changes) -> E:
    # 10 priced rounds of 4 drafts (width 5) and 2 prefill rounds; 30 tokens in 12 calls: 2.5 per call
    fields = dict(method=M("ngram[basic]@4", "ngram", NGramOptions()),
                  replayed=Replayed(calls=12, drafted=48, accepted=18, tokens=30, widths={5: 10}),
                  draft_steps={}, rates=[0.6, 0.4, 0.3, 0.2])
    return E(**{**fields, **changes})


def model_entry(**changes) -> E:
    # 10 priced rounds of 4 drafts: the first step of each feeds 2 tokens, then 3 of 1; 48 tokens in 12 calls;
    # the prefill rounds' drafter forwards fed the prompt (width 40): left out
    fields = dict(method=M("speculative@4", "model"),
                  replayed=Replayed(calls=12, drafted=48, accepted=36, tokens=48, widths={5: 10}),
                  draft_steps={2: 10, 1: 30, 40: 2}, rates=[0.9, 0.8, 0.7, 0.6])
    return E(**{**fields, **changes})


# by hand: ngram: 2.5 tokens a round for one verify of width 5: 2.5 x 10 ms / 14 ms
NGRAM = 2.5 * 0.010 / 0.014
# model: 4 tokens a round for a verify of width 5 and 3 steps of 2 ms and one of 2.5 ms
MODEL = 4.0 * 0.010 / (0.014 + 3 * 0.002 + 0.0025)


def check_ranked(ranked) -> None:
    """The order and the numbers of the two entries under :func:`table` with no host work."""
    assert [a.method for a in ranked] == ["ngram[basic]@4", "speculative@4"]
    assert ranked[0].predicted_speedup == pytest.approx(NGRAM, rel=1e-9)
    assert ranked[1].predicted_speedup == pytest.approx(MODEL, rel=1e-9)


# ------------------------------------------------------------------ ranking

def test_the_ranking_orders_by_the_predicted_speedup_worked_by_hand():
    ranked = rank([model_entry(), ngram_entry()], table())
    check_ranked(ranked)
    ngram, model = ranked
    assert ngram.why.c is None and model.why.c == pytest.approx(0.2)
    assert model.why.verify == {1: 1.0, 5: pytest.approx(1.4)}
    assert model.why.draft_steps == pytest.approx(4.0)       # the prefill's wide forward is not a round's step
    assert model.tokens_per_call == pytest.approx(4.0) and ngram.tokens_per_call == pytest.approx(2.5)
    assert model.why.yield_rates == [0.9, 0.8, 0.7, 0.6]
    assert not model.estimate and model.why.estimated == []
    assert "c 0.20" in model.why.line() and "4.00 tok/call" in model.why.line()


def test_the_prefill_rounds_drafter_steps_are_left_out_as_the_replay_counted_them():
    counted = model_entry(draft_steps={2: 12, 1: 30, 40: 2}, prefill_steps={2: 2, 40: 2})
    assert rank([counted], table())[0].predicted_speedup == pytest.approx(MODEL, rel=1e-9)
    kept = model_entry(draft_steps={2: 12, 1: 30}, prefill_steps={})       # nothing was the prefill's
    assert rank([kept], table())[0].why.draft_steps == pytest.approx(4.2)


def steady_entry() -> E:
    # the n-gram entry with its runs' rounds apart: the 2 first rounds (each with the prompt's forward) made
    # 1 token each, the 10 later rounds (width 5) the other 28: 2.8 tokens a round, not 2.5 a call
    return ngram_entry(replayed=Replayed(calls=12, drafted=48, accepted=18, tokens=30, widths={5: 10},
                                         steady={5: 10}, steady_tokens=28))


def check_steady_priced(ranked) -> None:
    [advice] = ranked
    assert advice.predicted_speedup == pytest.approx(2.8 * 0.010 / 0.014, rel=1e-9)
    assert advice.tokens_per_round == pytest.approx(2.8) and advice.tokens_per_call == pytest.approx(2.5)


def test_the_steady_state_is_priced_on_the_rounds_after_each_prompts_first():
    check_steady_priced(rank([steady_entry()], table()))


def test_mutation_pricing_a_round_at_the_tokens_per_call_fails_the_check(monkeypatch):
    from advisor.recorded import Replayed as Real

    monkeypatch.setattr(Real, "tokens_per_round", property(lambda self: self.tokens_per_call))
    with pytest.raises(AssertionError):
        check_steady_priced(rank([steady_entry()], table()))


def test_mutation_a_ranking_that_forgets_the_drafters_steps_fails_the_check(monkeypatch):
    monkeypatch.setattr(advisor.rank, "_draft_seconds", lambda *args: (0.0, 0))
    with pytest.raises(AssertionError):
        check_ranked(rank([model_entry(), ngram_entry()], table()))


def test_host_work_is_paid_every_round_in_seconds_and_the_table_is_anchored_on_the_ar_step():
    ranked = rank([ngram_entry()], table(host_s=0.001), ar_step_s=0.020)
    # the table's widths as ratios to its step (1.4 at width 5), times AR's 20 ms; host 1 ms as measured
    assert ranked[0].predicted_speedup == pytest.approx(2.5 * 0.020 / (1.4 * 0.020 + 0.001), rel=1e-9)
    assert ranked[0].why.host_ms == pytest.approx(1.0)


def test_the_end_to_end_prediction_adds_target_ars_first_token_and_the_first_rounds_work_by_hand():
    # One prompt: target AR made 21 tokens in 0.5 s, 0.3 s of it to the first token (a 10 ms step after).
    runs = [(21, 0.5, 0.3)]
    ngram = ngram_entry(firsts=[(1, None, {})])            # its first drafts rode on the prefill: 1 token
    [advice] = rank([ngram], table(), runs=runs)
    # 0.3 s, then 20 tokens at 2.5 a round of 14 ms
    assert advice.predicted_speedup == pytest.approx(0.5 / (0.3 + 20 * 0.014 / 2.5), rel=1e-9)
    assert advice.predicted_decode_speedup == pytest.approx(NGRAM, rel=1e-9)
    # The model's first round: a verify of width 5 apart from the prefill, the drafter's own prefill
    # (width 40, wider than its table: c x the time to first token) and 3 steps of 2 ms; 3 tokens.
    model = model_entry(firsts=[(3, 5, {40: 1, 1: 3})])
    [advice] = rank([model], table(), runs=runs)
    first = 0.3 + 0.014 + 0.2 * 0.3 + 3 * 0.002
    rounds = 0.014 + (10 * 0.0025 + 30 * 0.002) / 10           # a round: the verify and its 4 steps
    assert advice.predicted_speedup == pytest.approx(0.5 / (first + 18 * rounds / 4.0), rel=1e-9)
    # Two prompts: the second's decode step is 30 ms (a longer prompt), its rounds priced three times over.
    slow = [(21, 0.5, 0.3), (11, 0.5, 0.2)]
    ngram.firsts = [(1, None, {}), (1, None, {})]
    [advice] = rank([ngram], table(), runs=slow)
    seconds = (0.3 + 20 * 0.014 / 2.5) + (0.2 + 10 * 0.014 / 2.5 * 3)
    assert advice.predicted_speedup == pytest.approx(1.0 / seconds, rel=1e-9)
    assert advice.to_dict()["predicted_decode_speedup"] == pytest.approx(NGRAM, rel=1e-3)


def test_mutation_an_end_to_end_prediction_without_the_first_token_fails_by_hand(monkeypatch):
    real = advisor.rank.end_to_end

    def no_ttft(entry, runs, *args):
        return real(entry, [(n, s - t, 0.0) for n, s, t in runs], *args)

    monkeypatch.setattr(advisor.rank, "end_to_end", no_ttft)
    [advice] = rank([ngram_entry(firsts=[(1, None, {})])], table(), runs=[(21, 0.5, 0.3)])
    assert advice.predicted_speedup != pytest.approx(0.5 / (0.3 + 20 * 0.014 / 2.5), rel=1e-3)


def test_without_target_ars_runs_or_first_rounds_the_prediction_is_the_steady_state():
    assert rank([ngram_entry()], table(), runs=[(21, 0.5, 0.3)])[0].predicted_speedup == pytest.approx(NGRAM)
    assert rank([ngram_entry(firsts=[(1, None, {})])], table())[0].predicted_speedup == pytest.approx(NGRAM)
    unknown = rank([ngram_entry(firsts=[(1, None, {})])], table(), runs=[(21, 0.5, None)])[0]
    assert unknown.predicted_speedup == pytest.approx(NGRAM)


def test_a_storages_timed_look_ups_are_paid_every_round_by_hand():
    # 10 rounds whose look-ups took 1 ms each, as the replay timed them: a round costs 15 ms, not 14.
    [advice] = rank([ngram_entry(lookup_s=0.010)], table())
    assert advice.predicted_speedup == pytest.approx(2.5 * 0.010 / (0.014 + 0.001), rel=1e-9)
    assert advice.why.lookup_ms == pytest.approx(1.0) and "look-up 1.0 ms/round" in advice.why.line()


def test_the_replay_times_a_storages_look_ups_and_no_forward():
    from advisor.recorded import record
    from advisor.replay import method, replay_grid

    pair = tiny_pair()
    [entry] = replay_grid(pair, record(pair, PROMPTS, 16), [method("ngram", NGramOptions(storage="suffix"), 4)],
                          max_gen_len=16)
    assert entry.lookup_s > 0 and entry.timed == (0.0, 0) and not entry.draft_steps


def test_a_missing_width_is_interpolated_and_named_an_estimate():
    entry = ngram_entry(replayed=Replayed(calls=6, drafted=15, accepted=6, tokens=12, widths={4: 5}))
    advice = rank([entry], table())[0]
    verify4 = 0.011 + (0.014 - 0.011) * (4 - 2) / (5 - 2)        # between widths 2 and 5
    assert advice.predicted_speedup == pytest.approx(2.0 * 0.010 / verify4, rel=1e-9)
    assert advice.why.estimated == ["verify at width 4"] and advice.estimate and advice.exact
    assert "(est.) verify at width 4" in advice.why.line()
    drafted = model_entry(draft_steps={3: 10, 1: 30})
    assert "model step at width 3" in rank([drafted], table())[0].why.estimated


def test_ties_go_to_the_exact_replay_then_the_smaller_gamma():
    loose = ngram_entry(method=M("ngram[sam]@4", "ngram", NGramOptions("sam")), exactness="estimated",
                        note="a guess")
    same = ngram_entry(method=M("ngram[basic]@6", "ngram", NGramOptions(), gamma=6))
    rounded = ngram_entry(method=M("ngram[onelevel]@4", "ngram", NGramOptions("onelevel")), exactness="rounding",
                          note="a bfloat16 target")
    ranked = rank([loose, rounded, same, ngram_entry()], table())
    assert [a.method for a in ranked] == ["ngram[basic]@4", "ngram[basic]@6", "ngram[onelevel]@4", "ngram[sam]@4"]
    assert len({round(a.predicted_speedup, 12) for a in ranked}) == 1
    assert ranked[-1].estimate and ranked[-1].note == "a guess" and not ranked[0].estimate
    assert not ranked[2].estimate and not ranked[2].exact           # exact up to rounding is no estimate
    assert [a.to_dict()["exactness"] for a in ranked] == ["exact", "exact", "rounding", "estimated"]


def test_the_copy_ceiling_is_given_for_copiers_only():
    recorded = [Recorded((5, 6, 7, 8, 9, 5, 6), (7, 8, 9, 5, 6, 7, 8, 9), ((),) * 8)]
    copier = ngram_entry(method=M("ngram[suffix]@4", "ngram", NGramOptions("suffix")))
    ranked = rank([copier, ngram_entry()], table(), recorded=recorded, max_gen_len=8)
    by_name = {a.method: a for a in ranked}
    ceiling = analysis.ceiling.copy_ceiling(recorded[0].prompt, recorded[0].output, 4, 8,
                                            lambda w: table().target(w)[0])
    assert by_name["ngram[suffix]@4"].why.ceiling_tokens_per_call == pytest.approx(ceiling.tokens_per_call)
    assert by_name["ngram[suffix]@4"].why.ceiling_speedup > 1.0
    assert by_name["ngram[basic]@4"].why.ceiling_tokens_per_call is None


def test_an_entry_with_no_priced_round_sinks_as_an_estimate():
    empty = ngram_entry(replayed=Replayed(calls=1, drafted=0, accepted=0, tokens=1, widths={}))
    ranked = rank([empty, ngram_entry()], table())
    assert ranked[-1].predicted_speedup == 0.0 and ranked[-1].estimate and "no round" in ranked[-1].note


def test_advice_to_dict_has_the_contract_fields():
    advice = rank([model_entry()], table())[0]
    data = advice.to_dict()
    for name in ("method", "gamma", "gamma_policy", "tree", "predicted_speedup", "tokens_per_call",
                 "measured_speedup", "why"):
        assert name in data
    assert data["measured_speedup"] is None and data["why"]["c"] == pytest.approx(0.2)
    json.dumps(data)


def test_drafter_keys_name_the_spec():
    assert drafter_key(M("speculative@4", "model")) == "model"
    assert drafter_key(M("speculative[self:int8]@4", "self", "self:int8")) == "self self:int8"


# ------------------------------------------------------------------ the cost table

def test_costs_round_trip_through_a_file_and_a_read_table_is_labelled(tmp_path):
    path = tmp_path / "costs.json"
    measured = table(notes=["host work per round not measured"])
    assert measured.label() == "measured on a test machine, 2026-11-28, on a cache of 64 tokens"
    measured.save(path)
    read = CostTable.load(path)
    assert (read.target_s, read.draft_s, read.host_s, read.where, read.notes) == \
           (measured.target_s, measured.draft_s, measured.host_s, measured.where, measured.notes)
    assert read.label() == f"measured on a test machine, 2026-11-28, on a cache of 64 tokens (read from {path})"
    assert rank([model_entry()], read)[0].predicted_speedup == pytest.approx(MODEL, rel=1e-9)


@pytest.mark.parametrize("text, words", [
    ("not json", "is not JSON"),
    ("[1, 2]", "holds no cost table"),
    ('{"format": 1, "target_s": {"2": 0.1}, "draft_s": {}, "host_s": 0, "where": "x"}', "one-token step"),
    ('{"format": 9}', "format"),
    ('{"format": 1, "target_s": {"one": 0.1}, "draft_s": {}, "host_s": 0, "where": "x"}', "not a cost table"),
])
def test_a_bad_costs_file_is_one_line(tmp_path, text, words):
    path = tmp_path / "costs.json"
    path.write_text(text)
    with pytest.raises(CostsError) as caught:
        CostTable.load(path)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(CostsError, match="cannot read"):
        CostTable.load(tmp_path / "missing.json")


# ------------------------------------------------------------------ advise end to end

def tiny_pair():
    from tests.helpers.models import tiny_llama
    from tests.helpers.pairs import model_pair

    target = tiny_llama(1, vocab_size=48, logit_scale=8.0)        # decisive argmax
    drafter = tiny_llama(2, vocab_size=48, logit_scale=8.0)       # independent: rejections and rollbacks run
    return model_pair(target, drafter)


def tiny_grid():
    from advisor.replay import method

    return [method("ngram", NGramOptions(storage="suffix"), 4), method("model", None, 2),
            method("model", None, 3, tree=6)]


def check_report(report, prompts: int) -> None:
    """The contract's JSON, the best confirmed (its output target AR's), the others not, the costs."""
    data = report.to_dict()
    assert set(data) >= {"advice", "seconds", "costs", "unreplayable", "prompts"}
    assert data["prompts"] == prompts and data["seconds"] > 0
    advice = data["advice"]
    assert sorted(a["method"] for a in advice) == sorted(m.key for m in tiny_grid())
    assert [a["predicted_speedup"] for a in advice] == sorted((a["predicted_speedup"] for a in advice), reverse=True)
    best, rest = advice[0], advice[1:]
    assert best["measured_speedup"] is not None and best["measured_speedup"] > 0
    assert best["identical"] is True                # greedy: the confirmed run made target AR's tokens
    assert all(a["measured_speedup"] is None for a in rest)
    for a in advice:
        assert set(a) >= {"method", "gamma", "gamma_policy", "tree", "predicted_speedup", "tokens_per_call",
                          "measured_speedup", "why"}
    assert data["costs"]["where"] and data["costs"]["label"].startswith("measured on ")
    for a in report.advice:                        # every width a round ran was measured, none estimated
        assert set(a.entry.replayed.widths) <= set(report.costs.target_s) and not a.why.estimated
    assert "1" in data["costs"]["target_s"] and "model" in data["costs"]["draft_s"]
    json.dumps(data)


PROMPTS = [[3, 5, 7, 9, 3, 5], [11, 4, 4, 20]]


def test_advise_end_to_end_on_a_tiny_pair_confirms_the_best_and_times_itself():
    from advisor.advise import advise

    lines = []
    report = advise(tiny_pair(), PROMPTS, length=12, confirm=1, grid=tiny_grid(), say=lines.append)
    check_report(report, len(PROMPTS))
    assert any("confirming" in line for line in lines)


def test_mutation_a_baseline_that_is_not_target_ars_output_fails_the_check(monkeypatch):
    import advisor.advise

    real = advisor.advise.run_baseline

    def shifted(*args, **kwargs):
        baseline, recorded = real(*args, **kwargs)
        baseline.outputs = [output[1:] + output[:1] for output in baseline.outputs]
        return baseline, recorded

    monkeypatch.setattr(advisor.advise, "run_baseline", shifted)
    report = advisor.advise.advise(tiny_pair(), PROMPTS[:1], length=12, confirm=1, grid=tiny_grid())
    with pytest.raises(AssertionError):
        check_report(report, 1)
    assert report.notes and "differed" in report.notes[0]


def advise_on_paths(monkeypatch, session_compile: str | None):
    """An advice on the tiny pair and the compile path of every run it made."""
    import engine

    import advisor.advise

    paths = []
    real = engine.run_strategy

    def seen(strategy, *args, **kwargs):
        paths.append(strategy.compile)
        return real(strategy, *args, **kwargs)

    monkeypatch.setattr(engine, "run_strategy", seen)
    report = advisor.advise.advise(tiny_pair(), PROMPTS[:1], length=8, confirm=1, grid=tiny_grid(),
                                   session_compile=session_compile)
    return report, paths


def check_ranked_on(report, paths: list[str], session_compile: str | None) -> None:
    """The header (table, Markdown, JSON) names the one compile path every run of the advice took, and
    one note says so where the session's differs."""
    from bench.advise import summary_lines
    from repl.advice import advice_view
    from tests.helpers.repl import console

    assert paths and set(paths) == {report.compile}
    data = report.to_dict()
    words = f"ranked on compile {report.compile} ("
    assert data["compile"] == report.compile and data["ranked_on"].startswith(words)
    c, out = console()
    c.print(advice_view(report))
    assert data["ranked_on"] in out.getvalue().splitlines()[0]          # the table's title
    assert data["ranked_on"] in "\n".join(summary_lines({"all": report}, report.costs))
    differs = [n for n in data["notes"] if "the session runs compile" in n]
    assert len(differs) == (session_compile not in (None, report.compile))
    assert all(f"compile {session_compile}" in n and "\n" not in n for n in differs)


@pytest.mark.parametrize("session_compile", ["graphs", "off"])
def test_the_advice_names_the_compile_path_it_ranked_on(monkeypatch, session_compile):
    report, paths = advise_on_paths(monkeypatch, session_compile)
    assert report.ranked_on == "ranked on compile off (dynamic cache)"
    check_ranked_on(report, paths, session_compile)


def test_mutation_runs_on_another_compile_path_than_the_header_names_fail_the_check(monkeypatch):
    import advisor.advise

    real = advisor.advise.greedy_fields
    monkeypatch.setattr(advisor.advise, "greedy_fields", lambda fields: {**real(fields), "compile": "static"})
    report, paths = advise_on_paths(monkeypatch, "graphs")
    with pytest.raises(AssertionError):
        check_ranked_on(report, paths, "graphs")


def test_advise_keeps_a_read_table_and_its_label(tmp_path):
    from advisor.advise import advise

    path = tmp_path / "costs.json"
    table(target_s={1: 0.01, 3: 0.012, 5: 0.014, 7: 0.016}, draft_s={"model": {1: 0.002, 2: 0.0022, 3: 0.0024}}
          ).save(path)
    read = CostTable.load(path)
    report = advise(tiny_pair(), [[3, 5, 7, 9, 3, 5]], length=8, confirm=0, grid=tiny_grid(), costs=read)
    assert report.costs is read and f"read from {path}" in report.to_dict()["costs"]["label"]
    assert all(a.measured_speedup is None for a in report.advice)


# ------------------------------------------------------------------ the REPL's /advise

def test_the_advise_command_parses_and_refuses_bad_input():
    from repl.commands import execute
    from repl.settings import Settings

    settings = Settings()
    reply = execute("/advise", settings)
    assert reply.ok and reply.action == "advise" and reply.argument is None
    reply = execute("/advise   tell me   a story ", settings)
    assert reply.ok and reply.argument == "tell me a story"
    reply = execute("/advise /gamma 4", settings)
    assert not reply.ok and "\n" not in reply.message and "usage: /advise [PROMPT]" in reply.message


def repl_session(pair=None):
    from repl.runner import Runner
    from repl.session import Session
    from repl.settings import Settings
    from tests.helpers.repl import console, fake_pair

    c, out = console()
    return Session(Runner(pair or fake_pair()), Settings(length=10, chat=False), c), out


def test_advise_with_no_prompt_yet_is_one_line():
    session, out = repl_session()
    session.command("/advise")
    assert session.failures == 1 and "no prompt has run yet" in session.last_error
    session.command("/stats")               # no prompt and no costs yet: still one line
    assert session.failures == 2 and "\n" not in session.last_error


def test_advise_in_the_repl_shows_the_ranking_and_keeps_the_costs_for_stats(monkeypatch):
    import advisor.replay
    import repl.advice
    from repl.runs import PromptRun

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    reports = []
    shown = repl.advice.advice_view
    monkeypatch.setattr(repl.advice, "advice_view", lambda report: reports.append(report) or shown(report))
    session, out = repl_session(tiny_pair())
    session.last_run = PromptRun("p", PROMPTS[0], greedy=True, settings=session.settings.to_dict())
    session.command("/advise")
    text = out.getvalue()
    assert session.failures == 0, session.last_error
    assert "advice: best first" in text and "measured on " in text and "advised in " in text
    assert all(m.key in text for m in tiny_grid())
    confirmed = [a for a in reports[0].advice if a.measured_speedup is not None]
    assert confirmed and all(f"{a.tokens_per_call:.2f} / {a.measured_tokens_per_call:.2f}" in text for a in confirmed)
    flat = " ".join(text.split())
    report = reports[0]
    assert (f"baseline: target AR {report.ar_tokens_per_s:.1f} tok/s beside the confirmed runs, the measured "
            "speedups' denominator" in flat)
    assert f"{report.ar_step_s * 1e3:.1f} ms, prices the predictions" in flat
    assert report.ar_tokens_per_s == pytest.approx(report.ar_passes[-1], rel=1e-9) != report.ar_passes[0]
    costs = session.advisor_costs
    assert costs is not None
    session.command("/advise")              # the second advice prices with the kept table
    assert session.advisor_costs is costs
    session.command("/stats")
    assert "forward costs, measured on" in out.getvalue()


# ------------------------------------------------------------------ scripted --advise and bench.py --advise

def word_pair():
    """The tiny pair over the REPL tests' word tokenizer (prompts as text)."""
    from tests.helpers.pairs import model_pair
    from tests.helpers.repl import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    target = build_model(1, len(tokenizer), context=256)
    drafter = build_model(1, len(tokenizer), context=256, noise=0.5)      # agrees with the target now and then
    return model_pair(target, drafter, tokenizer=tokenizer, end_tokens=[2], context_length=256)


def test_scripted_advise_prints_the_contracts_json_object(monkeypatch):
    import io

    import advisor.replay
    from repl.advice import advise_script
    from repl.runner import Runner
    from repl.scripted import Entry
    from repl.session import Session
    from repl.settings import Settings
    from tests.helpers.repl import console

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    c, _ = console()
    session = Session(Runner(word_pair()), Settings(length=8, chat=False), c)
    stdout = io.StringIO()
    entries = [Entry("command", "/length 6", "stdin:1"), Entry("prompt", "the cat sat on the mat", "stdin:2"),
               Entry("prompt", "the dog sat on the cat", "stdin:3")]
    assert advise_script(session, entries, as_json=True, stdout=stdout) == 0, session.last_error
    data = json.loads(stdout.getvalue())
    assert data["prompts"] == 2 and data["length"] == 6 and data["seconds"] > 0
    assert data["advice"][0]["measured_speedup"] is not None and len(data["advice"]) == 3
    from advisor import CONFIRM

    measured = [a["measured_speedup"] for a in data["advice"]]
    confirmed = [m for m in measured if m is not None]
    assert len(confirmed) == CONFIRM == 2 and measured[:CONFIRM] == confirmed == sorted(confirmed, reverse=True)
    moved = [n for n in data["notes"] if n.startswith("ordered by the confirmed runs: ")]
    predicted = [a["predicted_speedup"] for a in data["advice"]]
    assert bool(moved) == (max(predicted) != predicted[0])     # the line exactly where the first pick moved
    check_miss_notes(data)


def check_miss_notes(data) -> None:
    """Every confirmed row has its runs' tokens per target call, the others none; a miss line for
    exactly the confirmed rows measured more than MISS off their prediction, and the line of target
    AR's passes exactly where there is one."""
    from advisor.rank import MISS

    missed = set()
    for a in data["advice"]:
        assert (a["measured_tokens_per_call"] is None) == (a["measured_speedup"] is None)
        if a["measured_speedup"] is not None and abs(a["measured_speedup"] / a["predicted_speedup"] - 1) > MISS:
            missed.add(a["method"])
    lines = {n.split(" measured ")[0] for n in data["notes"] if " tokens a target call against the replay's " in n}
    assert lines == missed
    rates = data["baseline"]["passes_tokens_per_s"]     # the record's pass and the one beside the confirming runs
    assert len(rates) == 2 and data["baseline"]["tokens_per_s"] == pytest.approx(rates[1], abs=1e-3)   # over the latter
    passes = [n for n in data["notes"] if n.startswith("target AR's passes over the prompts")]
    assert len(passes) == (1 if missed else 0)
    assert all(len(n.split(": ")[-1].split(", ")) == 2 for n in passes)     # the record's pass and one more


def _confirmed(method: str, predicted: float, measured: float | None, *, identical=True, error=""):
    from advisor.rank import Advice, Why

    a = Advice(method, 1, "constant", 0, predicted, 1.0, Why([0.9]))
    a.measured_speedup, a.identical, a.confirm_error = measured, identical, error
    a.predicted_rank = "abcdef".index(method) + 1       # as rank() numbers them
    return a


def test_the_confirmed_lead_in_the_order_their_runs_measured():
    from advisor.rank import confirmed_first

    ranked = [_confirmed("a", 2.5, 2.2), _confirmed("b", 2.4, 2.6), _confirmed("c", 2.3, 3.0, identical=False),
              _confirmed("d", 2.2, 2.4), _confirmed("e", 2.1, None), _confirmed("f", 2.0, None)]
    ordered, line = confirmed_first(ranked, 4)
    # b and d measured faster than a; c's output differed: after the clean ones; e, f as ranked.
    assert [a.method for a in ordered] == ["b", "d", "a", "c", "e", "f"]
    assert line == ("ordered by the confirmed runs: b first, measured 2.60x (predicted 2.40x, #2 by prediction); "
                    "a, predicted first at 2.50x, measured 2.20x")
    failed = [_confirmed("a", 2.5, None, error="RuntimeError: x"), _confirmed("b", 2.4, 2.0)]
    ordered, line = confirmed_first(failed, 2)
    assert [a.method for a in ordered] == ["b", "a"] and line.endswith("a, predicted first at 2.50x, its run failed or differed")
    same, line = confirmed_first(ranked[:1] + ranked[4:], 1)
    assert [a.method for a in same] == ["a", "e", "f"] and line is None
    assert confirmed_first(ranked, 0) == (ranked, None)


def test_mutation_ordering_the_confirmed_by_prediction_or_every_row_by_measure_is_caught(monkeypatch):
    # The check above fails on the two ways the order could go wrong: the confirmed left in
    # predicted order, and the unconfirmed (measured None) sorted in among them.
    import advisor.rank as rank_mod

    def by_prediction(advice, confirmed):
        return list(advice), None

    def every_row(advice, confirmed):
        return sorted(advice, key=lambda a: -(a.measured_speedup or 0.0)), None

    for mutant in (by_prediction, every_row):
        monkeypatch.setattr(rank_mod, "confirmed_first", mutant)
        with pytest.raises(AssertionError):
            test_the_confirmed_lead_in_the_order_their_runs_measured()
        monkeypatch.undo()


def test_infer_refuses_a_bad_costs_file_and_advise_with_selftest_before_loading(tmp_path, capsys):
    import infer

    (tmp_path / "costs.json").write_text("{}")
    for argv, words in ((["--advise", "--selftest"], "--advise advises on scripted prompts"),
                        (["--prompt", "x", "--costs", str(tmp_path / "costs.json")], "format")):
        with pytest.raises(SystemExit) as caught:
            infer.main(argv)
        assert caught.value.code == 2
        assert words in capsys.readouterr().err


def test_bench_advise_writes_the_advice_per_category_and_a_costs_file_it_reads_back(tmp_path, monkeypatch, capsys):
    import advisor.replay
    from bench.cli import main

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    prompts = tmp_path / "q.jsonl"
    prompts.write_text("\n".join(json.dumps(x) for x in [
        {"question_id": 1, "category": "summarization", "turns": ["the cat sat on the mat . the cat sat"]},
        {"question_id": 2, "category": "chat", "turns": ["how are you"]},
        {"question_id": 3, "category": "chat", "turns": ["what is the time"]}]), encoding="utf-8")
    pair, out = word_pair(), tmp_path / "out"
    argv = ["--advise", "--prompts", str(prompts), "--length", "6", "--confirm", "1", "--out", str(out), "--no-chat"]
    assert main(argv, loader=lambda args: pair) == 0
    data = json.loads((out / "advice.json").read_text())
    assert list(data["advice"]) == ["summarization", "chat"] and data["advice"]["chat"]["prompts"] == 2
    assert all(r["advice"][0]["measured_speedup"] is not None for r in data["advice"].values())
    assert "## chat" in (out / "advice.md").read_text() and "## chat" in capsys.readouterr().out
    read = CostTable.load(out / "costs.json")
    again = tmp_path / "again"
    assert main(argv[:-3] + ["--out", str(again), "--costs", str(out / "costs.json"), "--no-chat"],
                loader=lambda args: pair) == 0
    label = json.loads((again / "advice.json").read_text())["advice"]["chat"]["costs"]["label"]
    assert label == f"measured on {read.where}, on a cache of {read.context} tokens (read from {out / 'costs.json'})"


def test_bench_advise_refuses_bad_input_in_one_line_before_loading(tmp_path, capsys):
    from bench.cli import main

    (tmp_path / "costs.json").write_text("[]")
    for extra in (["--costs", str(tmp_path / "costs.json")], ["--multi-turn"]):
        assert main(["--advise", *extra, "--out", str(tmp_path / "o")], loader=lambda args: pytest.fail("loaded")) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and "\n" not in err


def test_a_self_drafter_is_timed_by_a_short_run_of_its_own_steps():
    from advisor.costs import measure_costs
    from advisor.replay import method
    from model_drafters.selfdraft.build import build_self_drafter
    from model_drafters.selfdraft.spec import parse_self_draft
    from tests.helpers.models import tiny_llama
    from tests.helpers.pairs import model_pair

    target = tiny_llama(1, vocab_size=48, logit_scale=8.0)
    pair = model_pair(target, build_self_drafter(target, parse_self_draft("self:bf16")))
    speculative = method("model", None, 2)
    costs = measure_costs(pair, {1, 3}, {"model": {1, 2}}, methods={"model": speculative})
    assert set(costs.draft_s["model"]) == {1, 2} and len(set(costs.draft_s["model"].values())) == 1
    assert costs.draft_s["model"][1] > 0 and any("timed in a short run" in n for n in costs.notes)
    with pytest.raises(ValueError, match="needs its method"):
        measure_costs(pair, {1}, {"model": {1}})


def test_a_self_drafters_step_is_timed_over_the_replays_own_drafts_without_a_run(monkeypatch):
    import advisor.costs
    from advisor.advise import needed_costs
    from advisor.recorded import record
    from advisor.replay import method, replay_grid
    from model_drafters.selfdraft.build import build_self_drafter
    from model_drafters.selfdraft.spec import parse_self_draft
    from tests.helpers.models import tiny_llama
    from tests.helpers.pairs import model_pair

    target = tiny_llama(1, vocab_size=48, logit_scale=8.0)
    pair = model_pair(target, build_self_drafter(target, parse_self_draft("self:bf16")))
    recorded = record(pair, PROMPTS, 24)
    from advisor.stored import Stores

    stores = Stores(pair)
    entries = replay_grid(pair, recorded, [method("model", None, 2), method("model", None, 4)], max_gen_len=24,
                          stores=stores)
    # The chains are computed once per position (advisor.memo) and timed there: every forward the memo
    # ran after each prompt's first round, and only those, each in the entry whose replay ran it.
    chains = stores.proposals.chains
    later = sum(len(c.drafts) for (i, _, length), c in chains.items() if length != len(recorded[i].prompt))
    assert sum(e.timed[1] for e in entries) == later and entries[0].timed[0] > 0
    assert stores.proposals.served > 0 and later > sum(entries[0].draft_steps.values()) - 2 * len(PROMPTS)
    monkeypatch.setattr(advisor.costs, "run_step_seconds", lambda *a: pytest.fail("a run timed the step"))
    costs = needed_costs(pair, entries, None, None)
    steps = sum(e.timed[1] for e in entries)
    assert costs.draft_s["model"][1] == pytest.approx(sum(e.timed[0] for e in entries) / steps)
    assert any(f"over the replay's own {steps} drafts" in n for n in costs.notes)
    # Read against target AR's step (timed just before the replay): the table keeps that ratio, c,
    # whatever the speed of the machine during the table's own turns.
    step = sum(e.timed[0] for e in entries) / steps
    anchored = needed_costs(pair, entries, None, None, anchor_s=4 * step)
    assert anchored.draft_s["model"][1] / anchored.target_s[1] == pytest.approx(0.25, rel=1e-9)
    assert any("0.250 of target AR's step" in n for n in anchored.notes)


def test_a_kept_table_is_extended_by_timing_all_its_widths_again(monkeypatch):
    import advisor.costs
    from advisor.costs import measure_costs

    timed = []

    def fake(pair, module, widths, context):
        timed.append(sorted(widths))
        return {w: 0.01 * (1 + w / 10) for w in set(widths) | {1}}

    monkeypatch.setattr(advisor.costs, "time_widths", fake)
    monkeypatch.setattr(advisor.costs, "host_seconds", lambda pair, state: (0.0005, ""))
    pair = tiny_pair()
    first = measure_costs(pair, {1, 3}, {"model": {1, 2}})
    assert timed == [[1, 3], [1, 2]] and first.host_s == 0.0005
    assert measure_costs(pair, {3}, {"model": {2}}, base=first).target_s == first.target_s
    assert len(timed) == 2                                  # nothing lacking: nothing timed
    wider = measure_costs(pair, {5}, {}, base=first)
    assert timed[-1] == [1, 3, 5] and set(wider.target_s) == {1, 3, 5} and wider.draft_s == first.draft_s


def test_the_costs_are_timed_on_a_cache_as_long_as_the_advised_runs_read(monkeypatch):
    # A verify's cost over a step's grows with the context its attention reads: the widths are
    # timed on a cache of the prompts' mean length and half the new tokens, kept while the next
    # advice's runs are near it, timed again whole when they are not.
    import generation.timing
    from advisor.advise import advise

    caches = []
    real = generation.timing.time_target

    def seen(module, ids, widths, repeats, bracketed):
        caches.append(ids.shape[1])
        assert bracketed                                # each width beside one-token steps (tests/test_timing.py)
        return real(module, ids, widths=widths, repeats=1, bracketed=bracketed)

    monkeypatch.setattr(generation.timing, "time_target", seen)
    pair = tiny_pair()
    report = advise(pair, PROMPTS, length=12, confirm=0, grid=tiny_grid())
    assert set(caches) == {11} and report.costs.context == 11                 # (6 + 4) / 2 + 12 / 2
    assert "on a cache of 11 tokens" in report.costs.label()
    caches.clear()
    near = advise(pair, PROMPTS, length=14, confirm=0, grid=tiny_grid(), costs=report.costs)
    assert near.costs is report.costs and caches == []                        # 12 is within a quarter of 11
    far = advise(pair, [p * 8 for p in PROMPTS], length=12, confirm=0, grid=tiny_grid(), costs=report.costs)
    assert far.costs.context == 46 and set(caches) == {46}                    # 40 + 6: timed again, whole


def test_a_tables_cache_goes_through_its_file_and_an_older_file_reads_as_64(tmp_path):
    path = tmp_path / "costs.json"
    table(context=300).save(path)
    assert CostTable.load(path).context == 300
    data = json.loads(path.read_text())
    del data["context"]
    path.write_text(json.dumps(data))
    assert CostTable.load(path).context == 64


def test_a_source_whose_replay_fails_is_listed_and_the_rest_advised(monkeypatch):
    import advisor.replay
    from advisor.advise import advise

    real = advisor.replay.replay_grid

    def failing(pair, recorded, methods, *, max_gen_len, state=None, stores=None):
        if methods[0].drafter == "ngram":
            raise RuntimeError("a storage that breaks\nsecond line")
        assert state is not None            # the session's: the replay shares its built drafters
        assert stores is not None           # one for every source: each output's keys and values built once
        return real(pair, recorded, methods, max_gen_len=max_gen_len, state=state, stores=stores)

    monkeypatch.setattr(advisor.replay, "replay_grid", failing)
    report = advise(tiny_pair(), PROMPTS[:1], length=8, confirm=0, grid=tiny_grid())
    assert sorted(a.method for a in report.advice) == ["speculative+tree6@3", "speculative@2"]
    assert ("ngram[suffix]@4", "its replay failed: RuntimeError: a storage that breaks") in report.unreplayable


# ------------------------------------------------------------------ under sampling (advisor.sampling)

def test_a_chains_tokens_under_sampling_by_hand():
    from advisor.sampling import chain_tokens

    # γ 2 from each of three positions of overlap 0.5: keeps 0.5 and 0.25 from the first two starts,
    # 0.5 and nothing (past the end) from the last
    tokens, rates = chain_tokens([[0.5, 0.5, 0.5]], 2)
    assert rates == pytest.approx([0.5, 0.5 / 3]) and tokens == pytest.approx(1 + 0.5 + 0.5 / 3)
    # overlap 1 on 10 positions: every draft kept but those past the end (0, 1, 2, 3 of the 4 last starts)
    assert chain_tokens([[1.0] * 10], 4)[0] == pytest.approx(1 + 4 - (0 + 1 + 2 + 3) / 10)


def sampling_pair(noise: float = 0.15):
    import copy

    from engine import pair_of
    from tests.helpers.models import tiny_llama

    target = tiny_llama(1, vocab_size=24, logit_scale=2.0)
    drafter = copy.deepcopy(target)
    torch.manual_seed(3)
    with torch.no_grad():
        drafter.lm_head.weight.add_(noise * torch.randn_like(drafter.lm_head.weight))
    return pair_of(target, drafter)


def test_the_overlap_is_the_sum_of_the_smaller_probability_by_hand():
    from advisor.sampling import overlaps
    from sampling import MultinomialProcessor

    pair = sampling_pair()
    prompt, output = [1, 5, 9, 5, 9, 3], [7, 5, 9, 11, 2, 6]
    got = overlaps(pair, MultinomialProcessor(temperature=0.7), prompt, output, None)
    ids = torch.tensor([prompt + output[:-1]])
    with torch.no_grad():
        p = torch.softmax(pair.target(input_ids=ids).logits[0, len(prompt) - 1:] / 0.7, dim=-1)
        q = torch.softmax(pair.drafter(input_ids=ids).logits[0, len(prompt) - 1:] / 0.7, dim=-1)
    want = [sum(min(a, b) for a, b in zip(pr.tolist(), qr.tolist())) for pr, qr in zip(p, q)]
    assert got == pytest.approx(want, abs=1e-5) and all(0.05 < a < 0.999 for a in got)
    same = replace(pair, drafter=pair.target)
    assert overlaps(same, MultinomialProcessor(temperature=0.7), prompt, output, None) == pytest.approx([1.0] * 6)


def test_the_estimate_under_sampling_is_near_what_sampled_runs_keep():
    # Power: the estimate (along target AR's greedy path) against speculative sampling run for real
    # with 24 runs (12 seeds, 2 prompts): tokens per verify within 10% (0.6% when written); an estimate
    # that read each overlap as all or nothing (kept where above one half) is 55% off.
    from advisor.recorded import record
    from advisor.sampling import chain_tokens, overlaps
    from engine import Strategy, run_strategy
    from sampling import MultinomialProcessor

    pair = sampling_pair()
    processor = MultinomialProcessor(temperature=1.0)
    prompts = [[1, 5, 9, 5, 9, 3, 7], [3, 11, 3, 11, 12, 13]]
    recorded = record(pair, prompts, 24)
    alphas = [overlaps(pair, processor, r.prompt, r.output, None) for r in recorded]
    estimate, _ = chain_tokens(alphas, 3)
    tokens = calls = 0
    for seed in range(12):
        for prompt in prompts:
            result = run_strategy(Strategy("speculative", drafter="model", gamma=3, processor=processor,
                                           max_gen_len=24, seed=seed), pair, prompt)
            tokens += len(result.tokens) - result.first_tokens
            calls += len(result.trace) - 1
    measured = tokens / calls
    assert estimate == pytest.approx(measured, rel=0.10)
    greedy_overlap = [[float(a > 0.5) for a in path] for path in alphas]
    assert chain_tokens(greedy_overlap, 3)[0] != pytest.approx(measured, rel=0.10)


def test_advise_under_sampling_estimates_the_drafter_models_chains_and_says_so():
    from advisor.advise import advise
    from advisor.replay import method
    from sampling import MultinomialProcessor

    grid = [method("model", None, 2), method("model", None, 4), method("ngram", NGramOptions(storage="suffix"), 4),
            method("model", None, 3, tree=6)]
    report = advise(sampling_pair(), PROMPTS, length=12, confirm=0, grid=grid,
                    processor=MultinomialProcessor(temperature=1.0))
    by_name = {a.method: a for a in report.advice}
    for name in ("speculative@2", "speculative@4"):
        estimate = by_name[name].to_dict()["sampling_estimate"]
        assert estimate["estimate"] and 0 < estimate["alpha"] < 1 and estimate["predicted_speedup"] > 0
        assert "(est.)" in by_name[name].sampling_line()
    assert by_name["speculative@4"].sampling.tokens_per_call > by_name["speculative@2"].sampling.tokens_per_call
    assert by_name["ngram[suffix]@4"].sampling is None and by_name["speculative+tree6@3"].sampling is None
    greedy = advise(sampling_pair(), PROMPTS, length=12, confirm=0, grid=grid)
    assert all(a.sampling is None for a in greedy.advice)


def test_the_confirmed_runs_are_measured_beside_target_ar_prompt_by_prompt(monkeypatch):
    # The record pass, a warm run of the best method, then on each prompt target AR's run and the
    # method's: the measured speedup is the method's tokens/s over target AR's runs beside it (worked
    # from the runs themselves), not over the record's pass, the short warm runs left out.
    from advisor.advise import CONFIRM_REPEATS, WARM_TOKENS

    report, runs = advise_keeping_runs(monkeypatch, confirm=1)
    best = report.advice[0]
    order = [(name, length) for name, length, _ in runs if name in ("target", best.method)]
    n = len(PROMPTS)
    assert CONFIRM_REPEATS == 1 and order == ([("target", WARM_TOKENS)] + [("target", 12)] * n
                                              + [(best.method, WARM_TOKENS)] + [("target", 12), (best.method, 12)] * n)
    timed = [(name, r) for name, length, r in runs if length == 12]
    ar = [r for name, r in timed if name == "target"]
    mine = [r for name, r in timed if name == best.method]

    def rate(results):
        return sum(len(r.tokens) for r in results) / sum(r.seconds for r in results)

    assert best.measured_speedup == pytest.approx(rate(mine) / rate(ar[n:]), rel=1e-9)
    assert report.ar_tokens_per_s == pytest.approx(rate(ar[n:]), rel=1e-9)
    assert report.ar_passes == pytest.approx([rate(ar[:n]), rate(ar[n:])], rel=1e-9)
    assert best.measured_speedup != pytest.approx(rate(mine) / rate(ar), rel=1e-6)      # not over every pass


def test_mutation_confirming_runs_measured_over_the_records_pass_fail_the_check(monkeypatch):
    import advisor.advise

    monkeypatch.setattr(advisor.advise.Baseline, "timing", property(lambda self: self.first))
    with pytest.raises(AssertionError):
        test_the_confirmed_runs_are_measured_beside_target_ar_prompt_by_prompt(monkeypatch)


def check_confirmed_tokens_per_call(report, runs) -> None:
    """Each confirmed row's tokens per target call are its timed runs' (tokens over target calls,
    the prefill's call in); where the replay is exact they are the replay's to the last digit."""
    from advisor.rank import EXACT

    confirmed = [a for a in report.advice if a.measured_speedup is not None]
    assert any(a.exactness == EXACT for a in confirmed)
    for a in report.advice:
        mine = [r for name, length, r in runs if name == a.method and length == 12]
        if a.measured_speedup is None:
            assert a.measured_tokens_per_call is None
            continue
        made = sum(len(r.tokens) for r in mine) / sum(r.target_calls for r in mine)
        assert a.measured_tokens_per_call == pytest.approx(made, rel=1e-12)
        if a.exactness == EXACT:        # the replay counted what the runs did
            assert a.measured_tokens_per_call == pytest.approx(a.tokens_per_call, rel=1e-12)


def advise_keeping_runs(monkeypatch, confirm: int = 2, change=None):
    """``advise`` on the tiny pair, confirming ``confirm``, and every run it made: (key, length, result);
    ``change(strategy, result)``, where given, is what each run returns instead."""
    import engine
    from advisor.advise import advise

    runs = []
    real = engine.run_strategy

    def kept(strategy, *args, **kwargs):
        result = real(strategy, *args, **kwargs)
        if change is not None:
            result = change(strategy, result)
        runs.append((strategy.key, strategy.max_gen_len, result))
        return result

    monkeypatch.setattr(engine, "run_strategy", kept)
    return advise(tiny_pair(), PROMPTS, length=12, confirm=confirm, grid=tiny_grid()), runs


def test_a_confirmed_runs_tokens_per_call_are_its_runs_and_an_exact_replays(monkeypatch):
    check_confirmed_tokens_per_call(*advise_keeping_runs(monkeypatch))


def test_mutation_runs_counted_without_their_prefill_call_fail_the_check(monkeypatch):
    import advisor.advise

    real = advisor.advise.Timing.add

    def without_prefill(self, result):
        real(self, result)
        self.calls -= 1

    monkeypatch.setattr(advisor.advise.Timing, "add", without_prefill)
    with pytest.raises(AssertionError):
        check_confirmed_tokens_per_call(*advise_keeping_runs(monkeypatch))


def test_a_confirmed_run_slowed_down_is_a_miss_of_the_time_a_call_took_not_of_the_drafts(monkeypatch):
    # Every confirming run's seconds doubled (target AR's kept): each confirmed method measures half
    # its speed, and on an exact replay its line puts all of that on the time a call took.
    import dataclasses

    from advisor.rank import EXACT

    def slowed(strategy, result):
        return result if strategy.key == "target" else dataclasses.replace(result, seconds=2 * result.seconds)

    report, _ = advise_keeping_runs(monkeypatch, change=slowed)
    check_miss_notes(report.to_dict())
    exact = [a for a in report.advice if a.measured_speedup is not None and a.exactness == EXACT]
    assert exact
    for a in exact:
        line = next(n for n in report.notes if n.startswith(f"{a.method} measured "))
        assert f"{a.tokens_per_call:.2f} tokens a target call against the replay's {a.tokens_per_call:.2f} (+0%)" in line
    assert sum(n.startswith("target AR's passes over the prompts") for n in report.notes) == 1


def _missed(predicted: float, replayed: float, measured: float | None, made: float | None, **kw):
    a = _confirmed("a", predicted, measured, **kw)
    a.tokens_per_call, a.measured_tokens_per_call = replayed, made
    return a


def check_miss_lines() -> None:
    from advisor.rank import miss_line

    # 1.20x against 1.50x (-20%): 8.1 tokens a call against 9.0 (-10%), the rest 0.8 / 0.9 (-11%).
    assert miss_line(_missed(1.50, 9.0, 1.20, 8.1)) == (
        "a measured 1.20x against 1.50x predicted (-20%): its runs made 8.10 tokens a target call against the "
        "replay's 9.00 (-10%); the rest, -11%, is the time a call took against target AR's step beside it "
        "(the costs priced)")
    over = miss_line(_missed(1.50, 9.0, 1.80, 9.0))         # +20%, all of it the time a call took
    assert "(+20%)" in over and "9.00 tokens a target call against the replay's 9.00 (+0%); the rest, +20%," in over
    assert miss_line(_missed(1.50, 9.0, 1.40, 8.1)) is None                 # -6.7%: within MISS
    assert miss_line(_missed(1.50, 9.0, None, None)) is None                # not confirmed
    assert miss_line(_missed(1.50, 9.0, 1.0, 8.1, identical=False)) is None     # its output differed
    assert miss_line(_missed(1.50, 9.0, None, None, error="RuntimeError: x")) is None


def test_a_confirmed_miss_is_split_into_what_the_drafts_made_and_what_a_call_cost_by_hand():
    check_miss_lines()


def test_mutation_an_inverted_split_or_a_looser_bound_fails_the_check(monkeypatch):
    import advisor.rank as rank_mod

    real = rank_mod.miss_line

    def inverted(advice):
        advice.tokens_per_call, advice.measured_tokens_per_call = advice.measured_tokens_per_call, advice.tokens_per_call
        return real(advice)

    monkeypatch.setattr(rank_mod, "miss_line", inverted)
    with pytest.raises(AssertionError):
        check_miss_lines()
    monkeypatch.undo()
    monkeypatch.setattr(rank_mod, "MISS", 0.25)
    with pytest.raises(AssertionError):
        check_miss_lines()


# ------------------------------------------------------------------ screening a self-drafter's trees

def self_word_pair():
    """The word-tokenizer pair with the target's own bf16 copy as its drafter (it drafts on the target's cache)."""
    from model_drafters.selfdraft.build import build_self_drafter
    from model_drafters.selfdraft.spec import parse_self_draft
    from tests.helpers.pairs import model_pair
    from tests.helpers.repl import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    target = build_model(1, len(tokenizer), context=256)
    return model_pair(target, build_self_drafter(target, parse_self_draft("self:bf16")), tokenizer=tokenizer,
                      end_tokens=[2], context_length=256)


def screen_grid():
    from advisor.replay import method

    return [method("model", None, 2)] + [method("model", None, g, p, tree=6) for g in (1, 3) for p in
                                         ("constant", "heuristic")] + [method("model", None, 5, tree=6)]


def scripted_advice(monkeypatch, pair):
    import io

    import advisor.replay
    from repl.advice import advise_script
    from repl.runner import Runner
    from repl.scripted import Entry
    from repl.session import Session
    from repl.settings import Settings
    from tests.helpers.repl import console

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: screen_grid())
    c, _ = console()
    session = Session(Runner(pair), Settings(length=8, chat=False), c)
    stdout = io.StringIO()
    entries = [Entry("command", "/length 10", "stdin:1"), Entry("prompt", "the cat sat on the mat", "stdin:2"),
               Entry("prompt", "the dog sat on the cat", "stdin:3")]
    assert advise_script(session, entries, as_json=True, stdout=stdout) == 0, session.last_error
    return json.loads(stdout.getvalue())


def check_screened(pair, data, tokens: int = 10) -> None:
    """The trees past the best three on the first prompt are screened out, named with what they
    were screened on, and absent from the ranking; the three kept are those of fewest steps per token."""
    from advisor.advise import SCREEN_KEEP, _round_cost
    from advisor.recorded import record
    from advisor.replay import replay_grid
    from utils.vocab import encode_prompt

    trees = [m for m in screen_grid() if m.tree]
    ranked = {a["method"] for a in data["advice"]}
    screened = {s["method"] for s in data["screened"]}
    assert len(screened) == len(trees) - SCREEN_KEEP and not screened & ranked
    assert ranked | screened == {m.key for m in screen_grid()}
    assert all(s["screened_on"] == f"the first {tokens} new tokens of prompt 1 of 2" for s in data["screened"])
    assert any(n.startswith("screened out, not replayed in full") for n in data["notes"])
    first = record(pair, [encode_prompt(pair.tokenizer, "the cat sat on the mat", chat=False)], tokens)
    costs = {e.method.key: _round_cost(e) for e in replay_grid(pair, first, trees, max_gen_len=tokens)}
    kept = [costs[m.key] for m in trees if m.key in ranked]
    assert max(kept) <= min(costs[k] for k in screened) and len(set(costs.values())) > 1


def test_a_self_drafters_trees_are_screened_on_the_first_prompt_and_said_so(monkeypatch):
    pair = self_word_pair()
    check_screened(pair, scripted_advice(monkeypatch, pair))


def test_the_screening_replays_the_first_prompts_first_tokens_only(monkeypatch):
    import advisor.advise

    pair = self_word_pair()
    monkeypatch.setattr(advisor.advise, "SCREEN_TOKENS", 6)
    data = scripted_advice(monkeypatch, pair)
    check_screened(pair, data, tokens=6)
    ranked = [a for a in data["advice"] if a["tree"]]
    assert all(a["exactness"] != "estimated" for a in ranked)      # the kept trees: replayed in full


def test_mutation_screening_that_keeps_the_worst_trees_fails_the_check(monkeypatch):
    import advisor.advise

    pair = self_word_pair()
    real = advisor.advise._round_cost
    monkeypatch.setattr(advisor.advise, "_round_cost", lambda entry: -real(entry))
    data = scripted_advice(monkeypatch, pair)
    monkeypatch.setattr(advisor.advise, "_round_cost", real)
    with pytest.raises(AssertionError):
        check_screened(pair, data)


def test_advise_under_the_sessions_sampling_estimates_through_the_repl_and_the_benchmark(tmp_path, monkeypatch):
    """``/processor multinomial 1`` then ``/advise PROMPT``, and ``bench.py --advise --processor
    "multinomial 1"``: the front ends hand the advice their processor spec, and the drafter model's
    chains come back estimated under it ("(est.)"), not "no estimate ... failed". Mutation (the bug
    this guards): the spec used as a processor, every front end's estimate failed with a TypeError."""
    import advisor.replay
    from bench.cli import main
    from repl.runner import Runner
    from repl.session import Session
    from repl.settings import Settings
    from tests.helpers.repl import console

    monkeypatch.setattr(advisor.replay, "default_grid", lambda pair: tiny_grid())
    c, out = console()
    session = Session(Runner(word_pair()), Settings(length=8, chat=False, live=False), c)
    session.handle("/processor multinomial 1")
    session.handle("/advise the cat sat on the mat")
    text = " ".join(out.getvalue().split())
    assert "no estimate under sampling" not in text and "failed" not in text
    assert "under the session's sampling, estimated from the target's and the drafter's distributions" in text
    assert re.search(r"speculative@2: overlap [0-9.]+, [0-9.]+ tok/call, [0-9.]+x \(est\.\)", text)

    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "chat", "turns": ["the cat sat on the mat"]}),
                       encoding="utf-8")
    argv = ["--advise", "--prompts", str(prompts), "--length", "6", "--confirm", "0", "--out", str(tmp_path / "o"),
            "--no-chat", "--processor", "multinomial 1"]
    assert main(argv, loader=lambda args: word_pair()) == 0
    advice = json.loads((tmp_path / "o" / "advice.json").read_text())["advice"]["chat"]["advice"]
    estimated = {a["method"]: a["sampling_estimate"] for a in advice if a.get("sampling_estimate")}
    assert "speculative@2" in estimated and 0 < estimated["speculative@2"]["alpha"] < 1
    assert "Under the sampling processor, estimated" in (tmp_path / "o" / "advice.md").read_text()
