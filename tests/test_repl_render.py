"""Rendering and the runner's bookkeeping, on hand-built results (no models)."""

from __future__ import annotations

import io
import json

import pytest
import torch
from rich.console import Console

import analysis.report
from generation import Round
from repl import render
from repl import runs
from repl.help_view import help_table, toolbar_text
from repl.runner import PromptRefused, PromptRun, Runner, StrategyRun, strategy_for
from repl.runs import round_pieces
from repl.session import Session, unescape
from repl.settings import ProcessorSpec, Settings
from repl.stats_view import bar, stats_view
from tests.helpers.repl import WordTokenizer, console, fake_pair, match_prompt_run, result, why_prompt_run


# ---------------------------------------------------------------- debug view

def test_rounds_view_colours_each_kind_of_token():
    trace = [
        Round(drafted=(5, 6, 7), accepted=2, token=8, bonus=False),   # 5 6 ok, 7 rejected, 8 resampled
        Round(drafted=(9,), accepted=1, token=10, bonus=True),        # all accepted, bonus 10
        Round(drafted=(), accepted=0, token=11, bonus=False),         # nothing drafted
        Round(drafted=(12, 13), accepted=1, token=None, bonus=False), # ended inside the drafts
    ]
    r = result([5, 6, 8, 9, 10, 11, 12], trace=trace)
    text = render.rounds_view(r, [2, 3], WordTokenizer())
    styled = [(text.plain[s.start:s.end], str(s.style)) for s in text.spans]
    assert styled == [
        (" w5", render.ACCEPTED), (" w6", render.ACCEPTED), (" w7", render.REJECTED), (" w8", render.TARGET),
        (" w9", render.ACCEPTED), (" w10", render.BONUS), (" w11", render.TARGET),
        (" w12", render.ACCEPTED), (" w13", render.REJECTED),
    ]
    assert len({render.ACCEPTED, render.REJECTED, render.TARGET, render.BONUS}) == 4
    assert "strike" in render.REJECTED


def test_legend_names_every_colour():
    plain = render.legend().plain
    for words in ("accepted draft", "rejected draft", "target token", "bonus token"):
        assert words in plain


def test_token_pieces_use_left_context():
    class Merging(WordTokenizer):  # decodes "a" + "b" to "ab" only in context
        def decode(self, ids, skip_special_tokens=False):
            return "".join(chr(96 + i) for i in ids)

    assert runs.token_pieces(Merging(), [1, 2], [3, 4]) == ["c", "d"]


# ------------------------------------------------------------ model text is text

def test_model_text_is_never_markup():
    run = StrategyRun("target", result(list(range(3))), text="[bold red]x[/bold red] :smile: [link=y]z[/link]")
    c, out = console()
    c.print(render.strategy_panel(run, [], WordTokenizer(), debug=False))
    assert "[bold red]x[/bold red] :smile: [link=y]z[/link]" in out.getvalue()


def test_strategy_panel_shows_the_metrics():
    r = result([1] * 12, seconds=2.0, drafted=10, accepted=7, target_calls=4, drafter_calls=10)
    c, out = console()
    c.print(render.strategy_panel(StrategyRun("speculative", r, text="hello"), [], WordTokenizer(), debug=False))
    text = out.getvalue()
    for part in ("12 tokens", "2.00 s", "6.0 tokens/s", "acceptance 70.0% (7/10 drafts)",
                 "3.00 tokens/target call", "4 target forward passes", "10 drafter forward passes"):
        assert part in text


def test_interrupted_and_failed_panels():
    c, out = console()
    r = result([1, 2, 3], stop_reason="interrupted")
    c.print(render.strategy_panel(StrategyRun("target", r, text="abc"), [], WordTokenizer(), debug=False))
    c.print(render.strategy_panel(StrategyRun("ngram", error="out of memory on cuda:0"), [], WordTokenizer(),
                                  debug=False))
    text = out.getvalue()
    assert "interrupted after 3 tokens" in text and "out of memory on cuda:0" in text


# ------------------------------------------------------------ comparisons

def prompt_run(greedy=True, target_tokens=(1, 2, 3, 4), target_seconds=2.0) -> PromptRun:
    pr = PromptRun("p", [1], greedy=greedy)
    pr.runs = [
        StrategyRun("speculative", result([1, 2, 3, 4], seconds=1.0)),
        StrategyRun("ngram", result([1, 2, 9, 4], seconds=4.0)),
        StrategyRun("target", result(target_tokens, seconds=target_seconds)),
        StrategyRun("drafter", error="failed: boom"),
    ]
    return pr


def test_speedup_is_a_ratio_of_tokens_per_second():
    pr = prompt_run()
    spec, ngram, target, drafter = pr.runs
    assert pr.speedup(spec) == pytest.approx(2.0)
    assert pr.speedup(ngram) == pytest.approx(0.5)
    assert pr.speedup(target) == pytest.approx(1.0)
    assert pr.speedup(drafter) is None


def test_identity_and_first_divergence_under_greedy():
    pr = prompt_run()
    spec, ngram, _, drafter = pr.runs
    assert pr.divergence(spec) == (True, None)
    assert pr.divergence(ngram) == (False, 2)
    assert pr.divergence(drafter) == (None, None)


def test_identity_is_not_claimed_under_sampling():
    pr = prompt_run(greedy=False)
    assert pr.divergence(pr.runs[0]) == (None, None)
    assert pr.speedup(pr.runs[0]) == pytest.approx(2.0)


def test_no_baseline_means_no_speedup():
    pr = prompt_run()
    pr.runs = [r for r in pr.runs if r.key != "target"]
    assert pr.speedup(pr.runs[0]) is None and pr.divergence(pr.runs[0]) == (None, None)
    pr = prompt_run()
    pr.runs[2].result.stop_reason = "interrupted"
    assert pr.speedup(pr.runs[0]) is None


def test_comparison_table_cells():
    c, out = console()
    c.print(render.comparison_table(prompt_run()))
    rows = {line.split("│")[0].strip(): [cell.strip() for cell in line.split("│")]
            for line in out.getvalue().splitlines() if "│" in line}
    # no rounds and no phase times recorded: the model has nothing to price
    # no time to first token recorded (TTFT, decode tok/s): "-"
    assert rows["Speculative"][1:] == ["4", "4.0", "-", "-", "2.00x", "1.00", "0.50x", "n/a", "n/a", "-", "yes"]
    assert rows["NASD"][1:] == ["4", "1.0", "-", "-", "0.50x", "1.00", "2.00x", "n/a", "n/a", "-", "no@2"]
    assert rows["Target AR"][1:] == ["4", "2.0", "-", "-", "1.00x", "1.00", "1.00x", "-", "-", "-", "baseline"]
    assert rows["Drafter AR"][1:] == ["-", "-", "-", "-", "n/a", "-", "-", "-", "-", "-", "n/a"]


def test_the_speedup_is_tokens_per_call_over_call_cost():
    """The comparison splits each speedup into what a target call made and what it cost:
    12 tokens in 4 calls and 1.5 s against target AR's 12 in 12 calls and 3 s is 2x = 3.00 tokens
    a call at 1.50x the cost of a call. Mutation: the cost per token instead of per call gives
    0.75x, and the identity breaks."""
    pr = PromptRun("p", [1], greedy=True)
    pr.runs = [StrategyRun("speculative", result([1] * 12, seconds=1.5, target_calls=4)),
               StrategyRun("ngram", result([1] * 12, seconds=2.0, target_calls=6)),
               StrategyRun("target", result([1] * 12, seconds=3.0)),
               StrategyRun("drafter", result([1] * 12, seconds=0.5, target_calls=0))]
    spec, ngram, target, drafter = pr.runs
    assert pr.call_cost(spec) == pytest.approx(1.5) and pr.call_cost(ngram) == pytest.approx(4 / 3)
    for run in (spec, ngram, target):
        assert pr.speedup(run) == pytest.approx(run.result.tokens_per_target_call / pr.call_cost(run))
    assert pr.call_cost(target) == pytest.approx(1.0) and pr.call_cost(drafter) is None
    c, out = console()
    c.print(render.comparison_table(pr))
    rows = {line.split("│")[0].strip(): [cell.strip() for cell in line.split("│")]
            for line in out.getvalue().splitlines() if "│" in line}
    assert rows["Speculative"][5:8] == ["2.00x", "3.00", "1.50x"]
    assert rows["Drafter AR"][6:8] == ["-", "n/a"]
    assert pr.to_dict()["strategies"]["speculative"]["call_cost"] == pytest.approx(1.5)
    # An 80-column terminal keeps the rest of the table whole and gets the split as a sentence.
    narrow = io.StringIO()
    Console(file=narrow, width=80, color_system=None).print(render.comparison_table(pr, 80))
    lines = narrow.getvalue().splitlines()
    assert all(len(line.rstrip()) <= 80 for line in lines) and "call cost ┃" not in narrow.getvalue()
    assert any(line.split("│")[-1].strip() == "baseline" for line in lines)          # the last column whole
    assert "Speculative 3.00 / 1.50x, NASD 2.00 / 1.33x" in " ".join(narrow.getvalue().split())
    pr.runs = [spec]                                                   # no target AR: nothing to divide by
    assert pr.call_cost(spec) is None


@pytest.mark.parametrize("dtype, parts, says", [
    ("bfloat16", True, True), ("float16", True, True), ("float32", True, False), ("bfloat16", False, False)])
def test_a_half_precision_target_says_why_greedy_outputs_part(dtype, parts, says):
    """Under greedy, a bfloat16 or float16 target whose strategies part from target AR gets the
    reason in the comparison's caption (a verify rounds differently from a one-token step); a
    float32 target, or one whose outputs all agree, does not."""
    pr = prompt_run()
    pr.target_dtype = dtype
    if not parts:
        pr.runs = [r for r in pr.runs if r.key != "ngram"]             # the one that differs
    c, out = console()
    c.print(render.comparison_table(pr))
    text = " ".join(out.getvalue().split())
    assert (f"the target runs in {dtype}: a verify forward of k tokens rounds differently" in text) == says
    assert "identical: token ids compared with target AR" in text


def test_json_dict_has_every_metric():
    obj = prompt_run().to_dict()
    spec = obj["strategies"]["speculative"]
    assert spec["speedup"] == pytest.approx(2.0) and spec["identical_to_target"] is True
    assert obj["strategies"]["ngram"]["first_divergence"] == 2
    assert obj["strategies"]["drafter"] == {"label": "Drafter AR", "error": "failed: boom"}


def test_toolbar_shows_the_settings():
    s = Settings(gamma=6, processor=ProcessorSpec("nucleus", 0.7, top_p=0.9), drafter=True)
    text = toolbar_text(s)
    assert "gamma 6" in text and "nucleus(temperature=0.7, top_p=0.9)" in text and "+drafter" in text


def test_unescape():
    assert unescape("a\\nb\\tc") == "a\nb\tc"


# ------------------------------------------------------------ runner failures

@pytest.mark.parametrize("oom", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                 MemoryError(), RuntimeError("wrapped")])
def test_out_of_memory_is_reported_and_the_rest_still_run(monkeypatch, oom):
    """A GPU's out-of-memory error, a CPU's MemoryError, or either as the cause of another error: the
    run says so in one line with what to lower, and the other strategies still run."""
    runner = Runner(fake_pair())
    if isinstance(oom, RuntimeError):
        oom.__cause__ = MemoryError()

    def generate(key, ids, settings, **kw):
        if key == "speculative":
            raise oom
        if key == "ngram":
            raise RuntimeError("something else broke")
        return result([4, 5])

    monkeypatch.setattr(runner, "_generate", generate)
    pr = runner.run(runner.prepare("w3 w4", Settings(chat=False)), Settings(chat=False))
    spec, ngram, target = pr.runs
    assert spec.error.startswith("out of memory on cuda:0")
    assert ngram.error == "failed: RuntimeError: something else broke"
    assert target.text == " w4 w5" and not pr.interrupted


def test_ctrl_c_outside_the_engine_stops_the_prompt(monkeypatch):
    runner = Runner(fake_pair())
    seen = []

    def generate(key, ids, settings, **kw):
        seen.append(key)
        if key == "ngram":
            raise KeyboardInterrupt
        return result([4])

    monkeypatch.setattr(runner, "_generate", generate)
    pr = runner.run(runner.prepare("w3", Settings(chat=False)), Settings(chat=False))
    assert pr.interrupted and seen == ["speculative", "ngram"] and len(pr.runs) == 1


def test_interrupted_strategy_skips_the_rest(monkeypatch):
    runner = Runner(fake_pair())
    monkeypatch.setattr(runner, "_generate",
                        lambda key, *a, **k: result([4], stop_reason="interrupted"))
    pr = runner.run(runner.prepare("w3", Settings(chat=False)), Settings(chat=False))
    assert pr.interrupted and [r.key for r in pr.runs] == ["speculative"]


def test_prompt_that_does_not_fit_is_refused_with_counts():
    runner = Runner(fake_pair(context=10))
    with pytest.raises(PromptRefused, match=r"3 prompt tokens \+ 8 new tokens = 11, more than the context of 10"):
        runner.prepare("w3 w4 w5", Settings(chat=False, length=8))
    runner.prepare("w3 w4", Settings(chat=False, length=8))  # fits exactly


def test_missing_chat_template_is_said_once():
    said = []
    runner = Runner(fake_pair(), notify=said.append)
    runner.encode("w3", Settings(chat=True))
    runner.encode("w4", Settings(chat=True))
    assert len(said) == 1 and "no chat template" in said[0]


def test_session_survives_bad_input_and_empty_lines():
    c, out = console()
    session = Session(Runner(fake_pair()), Settings(), c)
    assert session.handle("") and session.handle("   ")
    assert out.getvalue() == ""
    assert session.handle("/gamma abc") and session.failures == 1
    assert session.handle("/speculative off") and session.handle("/ngram off") and session.handle("/target off")
    assert session.handle("w3") and "every strategy is off" in out.getvalue()
    assert not session.handle("/quit")


# ------------------------------------------------ phases, the speedup model, /stats

def test_why_numbers_by_hand():
    pr = why_prompt_run()
    why = pr.why(pr.runs[0])
    assert pr.ar_step_s() == pytest.approx(0.06)
    a = why.acceptance
    assert a.conditional_acceptance_per_position == pytest.approx([2 / 3, 1.0]) and why.counts == [(2, 3), (2, 2)]
    assert a.acceptance_rate_per_position == pytest.approx([2 / 3, 2 / 3])
    assert a.histogram == [1, 0, 2] and a.mean_acceptance_length == pytest.approx(1 + 4 / 3)
    assert why.predicted_steady == pytest.approx(0.14 / 0.13)
    # This run: the first round (0.52 s, 3 tokens) as measured, 4 tokens at 0.13 s per 7/3 tokens,
    # against target AR's measured 7 tokens in 0.72 s.
    assert why.first_round_s == pytest.approx(0.52)
    assert why.predicted == pytest.approx((7 / (0.52 + 4 * 0.13 / (7 / 3))) / (7 / 0.72))
    # E(g) = 1 + 2g/3, cost 0.07 + 0.03g: rising in g, so the largest gamma searched wins
    assert why.best_gamma == 16 and why.best_speedup == pytest.approx(0.70 / 0.55)
    assert why.cost_source == "target AR"
    assert pr.why(pr.runs[1]) is None  # target AR drafts nothing


def test_panel_shows_phases_and_the_model():
    pr = why_prompt_run()
    c, out = console()
    c.print(render.strategy_panel(pr.runs[0], pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    c.print(render.strategy_panel(pr.runs[1], pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    text = out.getvalue()
    assert "phases: draft 0.06 s (8%) · verify 0.70 s (89%) · other 0.03 s (4%)" in text
    assert "predicted 0.97x vs measured 0.90x" in text and "best gamma 16 (1.27x)" in text
    assert "plain step: from target AR this prompt, 60 ms" in " ".join(line.strip("│ ") for line in text.splitlines())
    assert "mean acceptance length 2.33 · per position 67% 67% · conditional 67% 100%" in text
    assert "phases: draft 0.00 s (0%) · verify 0.60 s (90%) · other 0.07 s (10%)" in text


def test_comparison_shows_predicted_best_gamma_and_phase_split():
    c, out = console()
    c.print(render.comparison_table(why_prompt_run()))
    rows = {line.split("│")[0].strip(): [cell.strip() for cell in line.split("│")]
            for line in out.getvalue().splitlines() if "│" in line}
    assert rows["Speculative"][1:] == ["7", "8.8", "-", "-", "0.90x", "2.33", "2.59x", "0.97x", "16", "8/89/4%", "yes"]
    assert rows["Target AR"][1:] == ["7", "9.7", "-", "-", "1.00x", "1.00", "1.00x", "-", "-", "0/90/10%", "baseline"]


def test_json_carries_the_why_numbers():
    entry = why_prompt_run().to_dict()["strategies"]["speculative"]
    assert entry["phases"] == {"draft": 0.06, "verify": 0.7, "other": 0.03}
    assert entry["conditional_acceptance_per_position"] == pytest.approx([2 / 3, 1.0])
    assert entry["acceptance_rate_per_position"] == pytest.approx([2 / 3, 2 / 3])
    assert entry["acceptance_histogram"] == [1, 0, 2]
    assert entry["acceptance_histogram_by_draft_length"] == {"2": [1, 0, 2]}
    assert entry["mean_acceptance_length"] == pytest.approx(1 + 4 / 3)
    assert entry["acceptance_rate"] == pytest.approx(4 / 6) and entry["drafting_rounds"] == 3
    assert entry["predicted_speedup"] == pytest.approx(0.9692307)
    assert entry["predicted_speedup_steady"] == pytest.approx(0.14 / 0.13)
    assert entry["first_round_s"] == pytest.approx(0.52)
    assert entry["best_gamma"] == 16 and entry["draft_share"] == 1.0
    assert entry["rollback"]["target"]["restores"] == 3 and entry["gamma_policy"] == "constant"
    target = why_prompt_run().to_dict()["strategies"]["target"]
    assert target["predicted_speedup"] is None and target["phases"]["verify"] == 0.6
    json.dumps(why_prompt_run().to_dict())  # all JSON-ready


def test_bar_uses_eighth_blocks():
    assert bar(1.0, 4) == "████"
    assert bar(0.0, 4) == "    "
    assert bar(0.5, 3) == "█▌ "
    assert bar(1 / 32, 4) == "▏   "
    assert bar(7.0, 2) == "██"  # clamped


def test_stats_view():
    c, out = console()
    c.print(stats_view(why_prompt_run()))
    text = out.getvalue()
    lines = text.splitlines()
    assert any("mean acceptance length" in line and "2.33" in line for line in lines)
    assert any("accepted / drafted" in line and "4/6 (67%)" in line for line in lines)
    assert any("predicted speedup (this run)" in line and "0.97x at γ 2" in line for line in lines)
    assert any("predicted, decode part" in line and "1.08x" in line for line in lines)
    assert any("best γ (predicted)" in line and "16 (1.27x)" in line for line in lines)
    assert any("measured speedup" in line and "0.90x" in line for line in lines)
    # position 0: 2 of 3 judged drafts accepted; 1 round accepted 0 drafts, 2 rounds accepted 2
    chart = [line.split() for line in lines if line.strip()[:2] in ("0 ", "1 ", "2 ")]
    assert chart[0][:4] == ["0", "2/3", "67%", bar(2 / 3).strip()]
    assert chart[0][4:6] == ["67%", "1"]  # unconditional: 2 of 3 drafting rounds; 1 round accepted 0
    assert chart[1][:4] == ["1", "2/2", "100%", bar(1.0).strip()]
    assert chart[2] == ["2", "2", bar(1.0).strip()]
    assert "cost model: drafter step 10.0 ms · verify by width {1: 60.0 ms, 3: 100.0 ms}" in text
    assert "cache rollback: target crop: restores 3, refed_tokens 0, 2.0 ms" in text


def test_stats_without_a_drafting_run():
    pr = why_prompt_run()
    pr.runs = pr.runs[1:]
    c, out = console()
    c.print(stats_view(pr))
    assert "no drafting strategy finished" in out.getvalue()


def test_rounds_view_marks_each_rounds_gamma_and_reads_stored_pieces():
    trace = [Round((5, 6), 1, 8, False, gamma=2), Round((), 0, 9, False, gamma=12)]
    r = result([5, 8, 9], trace=trace)
    live = render.rounds_view(r, [2], WordTokenizer())
    assert live.plain == "² w5 w6 w8¹² w9"
    styled = [(live.plain[s.start:s.end], str(s.style)) for s in live.spans]
    assert styled[0] == ("²", render.GAMMA_MARK) and ("¹²", render.GAMMA_MARK) in styled
    pieces = [{"drafted": ["A", "B"], "token": "C"}, {"drafted": [], "token": "D"}]
    stored = render.rounds_view(r, [2], None, pieces)  # a replay: no tokenizer
    assert stored.plain == "²ABC¹²D"
    assert "a round's γ" in render.legend().plain


def test_round_pieces_match_the_live_view():
    trace = [Round((5, 6, 7), 2, 8, False, gamma=3), Round((9,), 1, 10, True, gamma=3),
             Round((12, 13), 1, None, False, gamma=3)]
    pieces = round_pieces(WordTokenizer(), [2, 3], trace)
    assert pieces == [{"drafted": [" w5", " w6", " w7"], "token": " w8"},
                      {"drafted": [" w9"], "token": " w10"},
                      {"drafted": [" w12", " w13"], "token": None}]
    r = result([5, 6, 8, 9, 10, 12], trace=trace)
    assert render.rounds_view(r, [2, 3], None, pieces).plain == render.rounds_view(r, [2, 3], WordTokenizer()).plain


# ------------------------------------------------ gamma policy wiring

def _policy(runner, settings, key="speculative"):
    return runner.state.gamma_policy(strategy_for(key, settings))


def test_the_model_policy_may_ask_for_more_than_gamma():
    runner = Runner(fake_pair())
    policy = _policy(runner, Settings(gamma=4, gamma_policy="model"))
    assert policy.name == "model" and policy.max_gamma == 16
    assert _policy(runner, Settings(gamma=20, gamma_policy="model"), "ngram").max_gamma == 20


def test_a_policy_is_kept_across_prompts_until_its_settings_change():
    runner = Runner(fake_pair())
    heuristic = Settings(gamma_policy="heuristic", gamma=4)
    first = _policy(runner, heuristic, "speculative")
    assert _policy(runner, heuristic, "speculative") is first
    assert _policy(runner, heuristic, "ngram") is not first  # one per strategy
    assert _policy(runner, Settings(gamma_policy="heuristic", gamma=6), "speculative") is not first
    confident = _policy(runner, Settings(gamma_policy="confidence", gamma_threshold=0.3), "speculative")
    assert confident.threshold == 0.3


# ------------------------------------------------ /stats and /save in a session

def test_stats_and_save_need_a_prompt_first(tmp_path):
    c, out = console()
    session = Session(Runner(fake_pair()), Settings(), c)
    assert session.handle("/stats") and session.handle(f"/save {tmp_path / 't.json'}")
    assert "no prompt has run yet: /stats" in out.getvalue() and "no prompt has run yet: /save" in out.getvalue()
    assert session.failures == 2 and not (tmp_path / "t.json").exists()


def test_stats_and_save_after_a_prompt(tmp_path, monkeypatch):
    from repl.trace import read_trace

    c, out = console()
    session = Session(Runner(fake_pair()), Settings(chat=False), c)
    pr = why_prompt_run()
    monkeypatch.setattr(session.runner, "prepare", lambda text, settings: pr)
    monkeypatch.setattr(session.runner, "run", lambda prompt_run, settings, on_run, watch=None: prompt_run)
    monkeypatch.setattr(session, "environment", lambda: {"target": "t", "drafter": "d"})
    assert session.handle("w3 w4") and session.last_run is pr
    assert session.handle("/stats") and "Why (last prompt)" in out.getvalue()
    for bad in (tmp_path / "no" / "such" / "dir.json", tmp_path):
        assert session.handle(f"/save {bad}")
        assert f"cannot write trace to '{bad}'" in out.getvalue()
    assert session.failures == 2
    path = tmp_path / "ok.json"
    assert session.handle(f"/save {path}") and "trace saved to" in out.getvalue()
    back = read_trace(str(path)).prompts[0]
    assert back.runs[0].pieces[0] == {"drafted": [" w5", " w6"], "token": " w7"}
    assert back.to_dict() == pr.to_dict()


def test_a_live_panel_waits_for_target_ar_before_predicting():
    pr = why_prompt_run()
    spec, target = pr.runs
    pr.runs = [spec]  # target AR is on but has not run yet
    c, out = console()
    c.print(render.strategy_panel(spec, pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    assert "in the comparison, once target AR has run" in out.getvalue() and "predicted 1" not in out.getvalue()
    pr.settings["target"] = False  # target AR off: the run's own rounds price the plain step
    c, out = console()
    c.print(render.strategy_panel(spec, pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    text = " ".join(line.strip("│ ") for line in out.getvalue().splitlines())
    low, high = pr.why(spec).predicted_interval          # priced without target AR: its range shown
    assert f"predicted 1.79x (est.) [{low:.2f}-{high:.2f}x] (decode part; first round 0.52 s left out)" in text
    assert "plain step: estimated, not measured" in text


# ------------------------------------------------ the network what-if (/rtt)

def test_panel_and_stats_show_the_round_trip_what_if():
    """At 20 ms per target call: E(2) = 7/3 tokens for 2 * 0.01 + (0.1 + 0.02) + 0.01 s,
    against 0.06 + 0.02 s per plain step: (7/3) * 0.08 / 0.15 = 1.24x for long outputs."""
    pr = why_prompt_run()
    spec = pr.runs[0]
    c, out = console()
    c.print(render.strategy_panel(spec, pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    assert "round trip" not in out.getvalue()  # /rtt 0: nothing added
    pr.settings["rtt"] = 20.0
    c.print(render.strategy_panel(spec, pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    assert "at a 20 ms round trip per target call (/rtt): predicted" in out.getvalue()
    assert "long outputs 1.24x)" in out.getvalue()
    c2, out2 = console()
    c2.print(stats_view(pr, rtt_ms=50))  # /stats reads the session's current /rtt
    assert "at a 50 ms round trip (/rtt): predicted" in out2.getvalue()
    assert "at a 50 ms round trip: best γ" in out2.getvalue()


def test_session_stats_use_the_current_rtt(monkeypatch):
    c, out = console()
    session = Session(Runner(fake_pair()), Settings(chat=False), c)
    session.last_run = why_prompt_run()
    assert session.handle("/stats") and "round trip" not in out.getvalue()
    assert session.handle("/rtt 20") and "rtt: 20 ms" in out.getvalue()
    assert session.handle("/stats") and "at a 20 ms round trip (/rtt): predicted" in out.getvalue()


def test_a_drafter_with_another_tokenizer_shows_its_shared_vocabulary_and_retokenisation_cost():
    crossing = {"method": "slem", "shared_tokens": 76, "shared_of_drafter": 0.21, "shared_of_target": 0.24,
                "retokenize_s": 0.05, "sync_misses": 0}
    r = result([1] * 12, seconds=2.0, drafted=10, accepted=7, target_calls=4, drafter_calls=10,
               phases={"draft": 0.5, "verify": 1.4, "other": 0.1}, cross_tokenizer=crossing)
    line = ("another tokenizer (slem): shared vocabulary 21% of the drafter's, 24% of the target's "
            "(76 tokens) · re-tokenisation 0.050 s (10% of draft time)")
    c, out = console()
    c.print(render.strategy_panel(StrategyRun("speculative", r, text="hello"), [], WordTokenizer(), debug=False))
    assert render.cross_tokenizer_text(r) == line
    assert "another tokenizer (slem): shared vocabulary 21%" in out.getvalue()
    pr = why_prompt_run()
    pr.runs[0].result.cross_tokenizer = crossing
    c, out = console()
    c.print(stats_view(pr))
    assert "another tokenizer (slem): shared vocabulary 21% of the drafter's" in out.getvalue()
    # Any other run shows nothing of it.
    assert render.cross_tokenizer_text(result([1])) is None


# ------------------------------------------------ a drafter that chooses its draft lengths (suffix, sam)

MATCH_ROUND_S = 0.35 / 3 + 0.01                  # seconds per round, priced as measured (match_prompt_run)
MATCH_STEADY = 2.5 * 0.1 / MATCH_ROUND_S
MATCH_PREDICTED = (10 / (0.5 + 7 * MATCH_ROUND_S / 2.5)) / (10 / 1.2)


def test_a_match_drafters_json_says_where_its_drafts_came_from_and_prices_its_lengths(monkeypatch):
    entry = match_prompt_run().to_dict()["strategies"]["ngram"]
    assert entry["draft_sources"] == {
        "prompt": dict(rounds=2, drafting_rounds=2, drafted=6, accepted=6, acceptance_rate=1.0,
                       mean_acceptance_length=4.0, mean_match_length=5.0),
        "global": dict(rounds=1, drafting_rounds=1, drafted=1, accepted=0, acceptance_rate=0.0,
                       mean_acceptance_length=1.0, mean_match_length=1.0),
        "none": dict(rounds=1, drafting_rounds=0, drafted=0, accepted=0, acceptance_rate=0.0,
                     mean_acceptance_length=1.0, mean_match_length=0.0)}
    assert entry["mean_match_length"] == pytest.approx(11 / 3)
    assert entry["draft_lengths"] == {"rounds_by_length": {"0": 1, "1": 1, "2": 1, "4": 1}, "mean": 1.75,
                                      "p10": 0, "p50": 1, "p90": 4, "max": 4}
    assert entry["acceptance_by_match"] == {
        "1": dict(rounds=1, drafted=1, accepted=0, acceptance=0.0, first_taken=0.0),
        "4": dict(rounds=1, drafted=2, accepted=2, acceptance=1.0, first_taken=1.0),
        "5-8": dict(rounds=1, drafted=4, accepted=4, acceptance=1.0, first_taken=1.0)}
    assert entry["prediction_draft_lengths"] == "measured"
    assert entry["predicted_speedup_steady"] == pytest.approx(MATCH_STEADY)
    assert entry["predicted_speedup"] == pytest.approx(MATCH_PREDICTED)
    assert entry["best_gamma"] == 4 and entry["best_gamma_speedup"] == pytest.approx(MATCH_STEADY)
    json.dumps(entry)
    assert why_prompt_run().to_dict()["strategies"]["speculative"]["prediction_draft_lengths"] == "gamma"
    assert "draft_sources" not in why_prompt_run().to_dict()["strategies"]["speculative"]
    # Mutation check: the model fed the mean draft length (2) instead of the distribution is wrong.
    from analysis.speedup import RoundMix, measured_mix

    def mean_length(rounds, cap=None):
        mix = measured_mix(rounds, cap)
        return RoundMix({round(mix.mean_length): 1.0}, {round(mix.mean_length): 2.5})

    monkeypatch.setattr(analysis.report, "measured_mix", mean_length)
    mutated = match_prompt_run().to_dict()["strategies"]["ngram"]["predicted_speedup_steady"]
    assert mutated == pytest.approx(2.5 * 0.1 / (0.32 / 3 + 0.01)) and mutated != pytest.approx(MATCH_STEADY, rel=0.05)


def test_a_match_drafters_what_if_prices_its_lengths_with_the_round_trip():
    pr = match_prompt_run()
    why = pr.why(pr.runs[0], rtt_ms=100)
    # every round makes one target call: 0.1 s more a round, and a plain step costs 0.2 s
    round_s = MATCH_ROUND_S + 0.1
    assert why.what_if.predicted_steady == pytest.approx(2.5 * 0.2 / round_s)
    # the run: its first round and one round trip as measured; target AR's 10 calls paid 1 s more
    assert why.what_if.predicted == pytest.approx((10 / (0.5 + 0.1 + 7 * round_s / 2.5)) / (10 / 2.2))


def test_a_match_drafters_panel_and_stats_show_sources_lengths_and_the_measured_prediction():
    pr = match_prompt_run()
    c, out = console()
    c.print(render.strategy_panel(pr.runs[0], pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    text = out.getvalue()
    assert ("drafts from: prompt 2 rounds (6/6 accepted, 100%; match 5.0) · global 1 round (0/1 accepted, 0%; "
            "match 1.0) · no match 1 round · mean match 3.7") in text
    assert "draft lengths (length:rounds) 0:1 1:1 2:1 4:1 · mean 1.75 · p10/p50/p90 0/1/4 · max 4" in text
    assert "mean accepted 2.00 per drafting round at draft lengths up to 4 (mean 1.75)" in text
    assert "predicted 1.40x (est.) vs measured 1.33x (priced at the measured draft lengths)" in text
    c, out = console()
    c.print(stats_view(pr))
    lines = out.getvalue().splitlines()
    assert any("predicted speedup (this run)" in line and "1.40x (est.) at measured draft lengths" in line for line in lines)
    assert any("draft length: mean, p50/p90, max" in line and "1.75, 1/4, 4" in line for line in lines)
    assert any("mean match length" in line and "3.7" in line for line in lines)
    assert any(line.split() == ["prompt", "2", "2", "6/6", "100%", "4.00", "5.0"] for line in lines)
    assert any(line.split() == ["no", "match", "1", "0", "0/0", "0%", "1.00", "0.0"] for line in lines)
    # the draft-length chart: k, rounds, a bar, the tokens such a round yielded
    assert any(line.split() == ["4", "1", bar(1.0).strip(), "5.00"] for line in lines)
    assert any(line.split() == ["0", "1", bar(1.0).strip(), "1.00"] for line in lines)
    # acceptance by match length: the rounds after each match, their acceptance, the first draft taken
    assert any("acceptance by match length" in line for line in lines)
    assert any(line.split() == ["5-8", "1", "4/4", bar(1.0).strip(), "100%", "100%"] for line in lines)
    assert any(line.split() == ["1", "1", "0/1", "0%", "0%"] for line in lines)
    # a speculative run shows none of it
    c, out = console()
    c.print(stats_view(why_prompt_run()))
    assert "where the drafts came from" not in out.getvalue() and "0.97x at γ 2" in out.getvalue()

# ------------------------------------------------------------------ the hybrid drafter

HYBRID = {"L": 4, "rounds": {"model": 12, "retrieval": 11}, "drafted": {"model": 48, "retrieval": 15},
          "accepted": {"model": 7, "retrieval": 10}, "acceptance": {"model": 7 / 48, "retrieval": 10 / 15}}


def test_the_hybrid_panel_counts_rounds_and_acceptance_of_each_kind():
    r = result([1] * 12, seconds=2.0, drafted=63, accepted=17, target_calls=4, drafter_calls=48, hybrid=HYBRID)
    line = ("hybrid L 4: retrieval 11 rounds, accepted 10/15 drafts (67%) · "
            "model 12 rounds, accepted 7/48 drafts (15%)")
    assert render.hybrid_text(r).plain == line
    c, out = console()
    c.print(render.strategy_panel(StrategyRun("speculative", r, text="hello"), [], WordTokenizer(), debug=False))
    assert line in out.getvalue()
    pr = why_prompt_run()
    pr.runs[0].result.hybrid = HYBRID
    c, out = console()
    c.print(stats_view(pr))
    assert line in out.getvalue()
    # A kind that drafted nothing shows no share; a run without the hybrid shows no line.
    none = {**HYBRID, "rounds": {"model": 0, "retrieval": 3}, "drafted": {"model": 0, "retrieval": 3},
            "accepted": {"model": 0, "retrieval": 3}}
    assert render.hybrid_text(result([1], hybrid=none)).plain.endswith("model 0 rounds, accepted 0/0 drafts")
    assert render.hybrid_text(result([1])) is None


def test_the_hybrid_counts_travel_in_the_json_and_the_strategy_asks_for_it():
    pr = prompt_run()
    pr.runs[0].result.hybrid = HYBRID
    obj = json.loads(json.dumps(pr.to_dict()))
    assert obj["strategies"]["speculative"]["hybrid"] == HYBRID
    assert "hybrid" not in obj["strategies"]["ngram"]
    from engine import CrossTokenizerOptions, HybridOptions, NGramOptions

    off = strategy_for("speculative", Settings())
    assert off.drafter_options == CrossTokenizerOptions("slem")
    on = strategy_for("speculative", Settings(hybrid=4, ngram_storage="suffix", suffix_pattern=8, match_factor=2.0,
                                              reset_in_between=False, uag="tli"))
    assert on.drafter == "model" and isinstance(on.drafter_options, HybridOptions)
    assert on.drafter_options.min_match == 4 and on.drafter_options.model == CrossTokenizerOptions("tli")
    storage = on.drafter_options.retrieval
    assert isinstance(storage, NGramOptions) and (storage.storage, storage.max_pattern, storage.factor,
                                                  storage.reset) == ("suffix", 8, 2.0, False)
    assert strategy_for("ngram", Settings(hybrid=4)) == strategy_for("ngram", Settings())   # NASD unchanged


def test_the_repl_takes_ctrl_c_back_when_it_starts_with_sigint_ignored():
    """A background job starts with SIGINT ignored; the interactive loop installs Python's handler
    so that Ctrl-C interrupts a generation, and leaves a handler it finds alone."""
    import signal

    from repl.session import ctrl_c_interrupts

    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        ctrl_c_interrupts()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        own = lambda signum, frame: None  # noqa: E731
        signal.signal(signal.SIGINT, own)
        ctrl_c_interrupts()
        assert signal.getsignal(signal.SIGINT) is own
    finally:
        signal.signal(signal.SIGINT, before)


# ------------------------------------------------ small wording

def test_a_run_that_drafted_nothing_shows_no_acceptance_rate():
    """0 of 0 drafts is no rate: the panel and /stats say n/a. Mutation: the old "0.0% (0/0 drafts)"."""
    r = result([1] * 4, seconds=1.0, drafted=0, accepted=0, trace=[Round((), 0, 1, False, gamma=4)] * 4)
    c, out = console()
    c.print(render.strategy_panel(StrategyRun("ngram", r, text="x"), [], WordTokenizer(), debug=False))
    assert "acceptance n/a (nothing drafted)" in out.getvalue() and "0/0" not in out.getvalue()
    pr = PromptRun("p", [1], greedy=True, settings=Settings().to_dict())
    pr.runs = [StrategyRun("ngram", r, text="x")]
    c, out = console()
    c.print(stats_view(pr))
    assert any("accepted / drafted" in line and "n/a (nothing drafted)" in line for line in out.getvalue().splitlines())
    c, out = console()
    c.print(render.strategy_panel(StrategyRun("ngram", result([1] * 4, drafted=4, accepted=1), text="x"), [],
                                  WordTokenizer(), debug=False))
    assert "acceptance 25.0% (1/4 drafts)" in out.getvalue()


def test_under_the_model_policy_the_panel_states_its_real_maximum_draft_length():
    """/gamma 4 with /gamma_policy model asks for up to 16 drafts (strategy_for): the panel says 16,
    for a match drafter (with its mean) and for the drafter model. Mutation: /gamma's 4."""
    pr = match_prompt_run()
    pr.runs[0].result.gamma_policy = "model"
    c, out = console()
    c.print(render.strategy_panel(pr.runs[0], pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    cap = strategy_for("ngram", Settings(gamma=4, gamma_policy="model")).gamma
    assert cap == 16 and f"at draft lengths up to {cap} (mean 1.75) (model)" in out.getvalue()
    assert "up to 4" not in out.getvalue()
    pr = why_prompt_run()
    pr.runs[0].result.gamma_policy = "model"
    c, out = console()
    c.print(render.strategy_panel(pr.runs[0], pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    assert "per drafting round at draft lengths up to 16 (model)" in out.getvalue()
    pr.runs[0].result.gamma_policy = "constant"                       # any other policy: /gamma itself
    c, out = console()
    c.print(render.strategy_panel(pr.runs[0], pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    assert "per drafting round at gamma 2" in out.getvalue()


@pytest.mark.parametrize("width", [80, 100, 200])
def test_help_keeps_each_grammar_on_one_line(width):
    """Every command's grammar is one line of /help where the terminal is wide enough; a longer one
    (/processor at 80 columns) breaks only between its alternatives. Mutation: the old two-column
    table folds /processor's grammar inside "topknucleus T K P"."""
    from repl.commands import COMMANDS

    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(help_table())
    lines = [line.rstrip() for line in out.getvalue().splitlines()]
    assert all(len(line) <= width for line in lines)
    for command in COMMANDS.values():
        if len(command.usage) <= width:
            assert any(line.startswith(command.usage) for line in lines), command.usage
        else:
            for alternative in command.usage.split(" | "):
                assert any(alternative in line for line in lines), alternative
    if width >= 100:
        assert any(line == COMMANDS["processor"].usage for line in lines)
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(help_table("processor"))
    assert COMMANDS["processor"].flag_usage.split(" | ")[-1] in out.getvalue()
