"""A run's report (why, what-if, copy ceiling, the JSON record) is computed once, below the front
ends (``analysis.report``), when a prompt's runs end, and kept with each run; the views render it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import analysis.report
from analysis.report import PromptFacts, run_report, strategy_record, why_of
from repl import render
from repl.settings import Settings
from repl.stats_view import stats_view, summary_table
from tests.helpers.repl import console, match_prompt_run, why_prompt_run

ROOT = Path(__file__).resolve().parent.parent


def test_the_report_is_torch_free():
    code = "import analysis.report, sys; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_finish_keeps_one_report_per_run_and_every_view_reads_it(monkeypatch):
    pr = why_prompt_run()
    before = pr.to_dict()
    pr.finish()
    assert all(run.report is not None for run in pr.runs)
    spec = pr.runs[0]
    assert pr.why(spec) is spec.report.why is pr.why(spec)      # the kept one, not a new one per view
    assert pr.runs[1].report.why is None                         # target AR has no why
    assert pr.to_dict() == before                                # the JSON is the same either way

    # Mutation check: once finished, no view computes the why again.
    def again(*args, **kwargs):
        raise AssertionError("the why was computed again")

    monkeypatch.setattr(analysis.report, "why_of", again)
    monkeypatch.setattr("repl.runs.run_report", again)
    c, out = console()
    c.print(stats_view(pr))
    c.print(summary_table(pr))
    c.print(render.comparison_table(pr))
    assert pr.to_dict() == before
    assert "speculative" in out.getvalue().lower()


def test_an_unfinished_prompt_computes_the_report_each_time():
    """A live panel is drawn before the prompt's last strategy (target AR) ran: nothing is kept."""
    pr = why_prompt_run()
    assert pr.runs[0].report is None
    assert pr.why(pr.runs[0]) is not pr.why(pr.runs[0])
    assert pr.runs[0].report is None


def test_another_round_trip_is_computed_for_it_and_the_kept_report_stays():
    pr = match_prompt_run()
    pr.finish()
    kept = pr.runs[0].report.why
    assert kept.what_if is None                                  # the prompt ran without /rtt
    other = pr.why(pr.runs[0], rtt_ms=100)
    assert other.what_if is not None and other.what_if.rtt_ms == 100
    assert pr.why(pr.runs[0]) is kept


def test_the_record_is_built_from_the_report_alone():
    pr = match_prompt_run()
    ngram, target = pr.runs
    facts = PromptFacts(pr.prompt_ids, pr.greedy, pr.settings, target.result, pr.plain_step())
    report = run_report("ngram", ngram.result, facts, pr.divergence(ngram))
    entry = strategy_record(ngram.label, None, ngram.result, ngram.text, None, report)
    assert entry == pr.strategy_dict(ngram)
    assert entry["copy_ceiling"] == report.why.ceiling and entry["speedup"] == report.speedup
    assert strategy_record("Target AR", "failed: x", None, "", None, None) == {"label": "Target AR",
                                                                               "error": "failed: x"}


def test_a_why_needs_a_drafting_run():
    pr = why_prompt_run()
    facts = PromptFacts(pr.prompt_ids, pr.greedy, Settings(gamma=2).to_dict())
    assert why_of("target", pr.runs[1].result, facts) is None
    assert why_of("speculative", None, facts) is None
    assert why_of("speculative", pr.runs[0].result, facts).gamma == 2


@pytest.mark.parametrize("builder", [why_prompt_run, match_prompt_run])
def test_the_report_equals_the_one_computed_on_demand(builder):
    finished, live = builder(), builder()
    finished.finish()
    for a, b in zip(finished.runs, live.runs):
        assert finished.strategy_dict(a) == live.strategy_dict(b)
