"""Benchmark mode: prompt sets, planning, aggregation maths, writers, chart, and one tiny end-to-end run."""

from __future__ import annotations

import csv
import json
import types
from dataclasses import replace

import pytest
import torch
import transformers

from bench.aggregate import ALL, GROUNDED, category_groups, paired_ratio, summarize
from bench.chart import series_rows, speedup_chart
from bench.processors import hf_sampling_kwargs, parse_processor
from bench.prompts import (
    MT_BENCH_CATEGORIES, PromptFileError, builtin_prompts, chat_ids, load_prompts, read_conversations,
    read_spec_bench, select,
)
from bench.records import RunRecord
from bench.report import markdown_report
from bench.runner import (EncodedPrompt, iter_session_runs, run_count, schedule, single_sessions,
                          split_fitting_sessions)
from bench.expect import Expectation, check_expectations, parse_expectation
from bench.ours import our_call, our_strategy
from bench.variants import HF_DYNAMIC, Variant, parse_variant_name, plan_variants
from bench.writers import report_dict, write_csv, write_json
from engine import EngineState, NGramOptions
from sampling import GreedyProcessor

# Assisted generation and prompt lookup take transformers' static cache from 5.x on (4.x swaps it for a
# dynamic one): their static peers run there only (bench.peers.static_peer_refusal).
DRAFTING_STATIC_PEERS = int(transformers.__version__.split(".")[0]) >= 5
from tests.helpers.models import tiny_llama
from tests.helpers.pairs import model_pair

# ---------------------------------------------------------------- prompt sets

BUILTIN_CATEGORIES = {"code_editing", "summarization", "qa_over_text", "translation",
                      "math_reasoning", "chat"}


def test_builtin_set_covers_every_category_twice_or_more():
    prompts = builtin_prompts()
    counts = {c: sum(p.category == c for p in prompts) for c in BUILTIN_CATEGORIES}
    assert set(p.category for p in prompts) == BUILTIN_CATEGORIES
    assert min(counts.values()) >= 2
    assert len({p.id for p in prompts}) == len(prompts)
    assert all(p.text.strip() for p in prompts)


def test_grounded_prompts_carry_their_source_text():
    """Input-grounded prompts are long: the passage or the code is in the prompt."""
    for p in builtin_prompts():
        if p.category in {"code_editing", "summarization", "qa_over_text"}:
            assert len(p.text) > 300, p.id


def _spec_bench_file(tmp_path):
    items = [
        {"question_id": 1, "category": "writing", "turns": ["w1 first", "w1 second"]},
        {"question_id": 2, "category": "summarization", "turns": ["s2"]},
        {"question_id": 3, "category": "summarization", "turns": ["s3"]},
        {"question_id": 4, "category": "summarization", "turns": ["s4"], "reference": ["x"]},
        {"question_id": 5, "category": "rag", "turns": ["r5"]},
        {"question_id": 6, "category": "coding", "turns": ["c6 first", "c6 second"]},
    ]
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(i) for i in items) + "\n\n", encoding="utf-8")
    return path


def test_spec_bench_reader_uses_first_turn(tmp_path):
    prompts = read_spec_bench(_spec_bench_file(tmp_path))
    assert [p.id for p in prompts] == ["1", "2", "3", "4", "5", "6"]
    assert prompts[0].text == "w1 first" and prompts[0].category == "writing"


def test_spec_bench_second_turn_drops_single_turn_items(tmp_path):
    prompts = read_spec_bench(_spec_bench_file(tmp_path), turn=2)
    assert [(p.id, p.text) for p in prompts] == [("1", "w1 second"), ("6", "c6 second")]


def test_categories_and_limit_per_category(tmp_path):
    path = str(_spec_bench_file(tmp_path))
    chosen = load_prompts(path, categories=["summarization", "rag"], limit=2)
    assert [p.id for p in chosen] == ["2", "3", "5"]
    assert [p.id for p in load_prompts(path, limit=1)] == ["1", "2", "5", "6"]


def test_mt_bench_alias_selects_its_categories(tmp_path):
    chosen = load_prompts(str(_spec_bench_file(tmp_path)), categories=["mt_bench"])
    assert {p.category for p in chosen} == {"writing", "coding"}
    assert "coding" in MT_BENCH_CATEGORIES


def test_bad_prompt_file_gives_one_line_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "turns": ["x"]}\n', encoding="utf-8")
    with pytest.raises(PromptFileError, match="bad.jsonl:1"):
        read_spec_bench(bad)
    with pytest.raises(PromptFileError, match="cannot read"):
        read_spec_bench(tmp_path / "missing.jsonl")
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(PromptFileError, match="cannot read prompt file .*binary.jsonl: 'utf-8' codec can't decode"):
        read_spec_bench(tmp_path / "binary.jsonl")
    (tmp_path / "blank.jsonl").write_text("\n \n", encoding="utf-8")
    with pytest.raises(PromptFileError, match="blank.jsonl holds no Spec-Bench items"):
        read_spec_bench(tmp_path / "blank.jsonl")
    for line in ('{"question_id": 1, "category": "x", "turns": [3]}', '{"question_id": 1, "category": "x", "turns": "ab"}',
                 '[1, 2]'):
        bad.write_text(line + "\n", encoding="utf-8")
        for read in (read_spec_bench, read_conversations):
            with pytest.raises(PromptFileError, match="bad.jsonl:1: not a Spec-Bench item"):
                read(bad)


def test_select_on_builtin_keeps_order():
    chosen = select(builtin_prompts(), categories=["chat", "translation"], limit=1)
    assert [p.id for p in chosen] == ["translation-1", "chat-1"]


# ---------------------------------------------------------------- processors and planning

def test_processor_specs():
    assert parse_processor("greedy").is_greedy
    spec = parse_processor("nucleus 0.7 0.9")
    assert (spec.name, spec.temperature, spec.top_p, spec.top_k) == ("nucleus", 0.7, 0.9, None)
    assert spec.command_text() == "nucleus 0.7 0.9"
    assert parse_processor("multinomial 0").is_greedy          # temperature 0 means greedy, as in the REPL
    assert hf_sampling_kwargs(spec) == {"do_sample": True, "temperature": 0.7, "top_k": 0, "top_p": 0.9}
    assert parse_processor("topk 1 5").top_k == 5
    assert hf_sampling_kwargs(parse_processor("greedy")) == {"do_sample": False}
    for bad in ("beam 4", "nucleus x", "greedy 1 2", ""):
        with pytest.raises(ValueError):
            parse_processor(bad)


def test_plan_always_has_the_baseline_and_pairs_each_variant_with_its_peer():
    names = [v.name for v in plan_variants(["ngram", "speculative"], [2, 4], peers=True)]
    assert names == ["target", "hf_generate", "speculative@2", "hf_assisted@2", "speculative@4",
                     "hf_assisted@4", "ngram@2", "hf_prompt_lookup@2", "ngram@4",
                     "hf_prompt_lookup@4"]
    assert [v.name for v in plan_variants(["drafter"], [4], peers=False)] == ["target", "drafter"]
    assert parse_variant_name("ngram@4") == Variant("ngram", 4)
    assert Variant("ngram", 4).peer == Variant("hf_prompt_lookup", 4)
    with pytest.raises(ValueError):
        plan_variants(["beam"], [4], peers=False)


def test_policy_variants_names_labels_and_peers():
    policies = [("heuristic", 4), ("confidence 0.4", 20), ("model", 16)]
    names = [v.name for v in plan_variants(["speculative", "ngram"], [2], peers=True,
                                           policies=policies)]
    assert names == ["target", "hf_generate",
                     "speculative@2", "hf_assisted@2",
                     "speculative:heuristic@4", "hf_assisted:heuristic@4",
                     "speculative:confidence=0.4@20", "hf_assisted:confidence=0.4@20",
                     "speculative:model@16",          # its peer, HF dynamic, already runs
                     "ngram@2", "hf_prompt_lookup@2",
                     "ngram:heuristic@4", "ngram:confidence=0.4@20", "ngram:model@16"]
    for name in names:
        assert parse_variant_name(name).name == name
    model = parse_variant_name("speculative:model@16")
    assert (model.policy, model.gamma, model.constant) == ("model", 16, False)
    assert model.peer == HF_DYNAMIC == parse_variant_name("hf_assisted:confidence=0.4@20")
    assert parse_variant_name("ngram:model@16").peer is None       # prompt lookup is constant only
    assert parse_variant_name("speculative:confidence=0.25@8").peer.name == "hf_assisted:confidence=0.25@8"
    assert [parse_variant_name(n).gamma_text for n in ("speculative@4", "speculative:heuristic@4",
                                                       "speculative:model@16", "target")] == \
        ["4", "4→", "≤16", "—"]
    assert HF_DYNAMIC.label == "HF assisted dynamic (confidence 0.4)"
    assert model.label == "speculative model"


def test_policies_flag():
    from bench.cli import build_parser, parse_policies

    assert parse_policies("heuristic@4,confidence 0.4@20,model@16") == \
        [("heuristic", 4), ("confidence 0.4", 20), ("model", 16)]
    assert parse_policies("model, confidence") == [("model", 16), ("confidence 0.4", 20)]
    assert parse_policies("none") == []
    assert build_parser().parse_args([]).policies == [("heuristic", 4), ("confidence 0.4", 20),
                                                      ("model", 16)]
    assert build_parser().parse_args([]).gamma == [2, 4, 8]
    for bad, message in (("beam@4", "unknown gamma policy"), ("model@x", "not an integer"),
                         ("constant@4", "--gamma"), ("confidence 2", "between 0 and 1")):
        with pytest.raises(ValueError, match=message):
            parse_policies(bad)


def test_assistant_schedule_of_each_policy():
    from bench.peers import assistant_schedule

    assert assistant_schedule("constant", 0.0) == ("constant", 0.0)
    assert assistant_schedule("heuristic", 0.3) == ("heuristic", 0.0)
    assert assistant_schedule("confidence 0.4", 0.0) == ("constant", 0.4)
    with pytest.raises(ValueError):
        assistant_schedule("model", 0.0)


def test_schedule_interleaves_variants_and_alternates_their_order():
    a, b = Variant("target"), Variant("ngram", 4)
    order = [(r, p, v.name) for r, p, v in schedule(2, [a, b], 2)]
    assert order == [(0, 0, "target"), (0, 0, "ngram@4"), (0, 1, "target"), (0, 1, "ngram@4"),
                     (1, 0, "ngram@4"), (1, 0, "target"), (1, 1, "ngram@4"), (1, 1, "target")]


def test_runner_warms_up_first_and_records_every_timed_run():
    from bench.prompts import Prompt

    calls = []

    def fake_run(variant, ids, *, fresh, prompt_id, category, repeat, session, position):
        assert fresh and (session, position) == ("", 0)       # prompts alone: every run starts fresh
        calls.append((variant.name, prompt_id, repeat))
        return RunRecord(variant.name, variant.strategy, variant.gamma, variant.family,
                         prompt_id, category, repeat, len(ids), tokens=[1], seconds=1.0)

    encoded = [EncodedPrompt(Prompt("a", "chat", "x"), (1, 2)), EncodedPrompt(Prompt("b", "chat", "y"), (3,))]
    variants = [Variant("target"), Variant("hf_generate")]
    records = list(iter_session_runs(fake_run, single_sessions(encoded), variants, repeats=2, warmup=1, alone=True))
    assert calls[:2] == [("target", "a", -1), ("hf_generate", "a", -1)]
    assert len(records) == 8 and all(r.repeat >= 0 for r in records)
    assert run_count(2, 2, repeats=2, warmup=1) == len(calls) == 10


def test_runner_asks_before_each_repeat_past_the_planned_ones():
    from bench.prompts import Prompt

    def fake_run(variant, ids, *, fresh, prompt_id, category, repeat, session, position):
        return RunRecord(variant.name, variant.strategy, variant.gamma, variant.family,
                         prompt_id, category, repeat, len(ids), tokens=[1], seconds=1.0)

    encoded = [EncodedPrompt(Prompt("a", "chat", "x"), (1, 2))]
    asked = []

    def more(done):
        asked.append(done)
        return done < 4

    sessions, target = single_sessions(encoded), [Variant("target")]
    records = list(iter_session_runs(fake_run, sessions, target, repeats=2, warmup=0, alone=True, more=more))
    assert asked == [2, 3, 4]                       # never asked within the planned repeats
    assert sorted({r.repeat for r in records}) == [0, 1, 2, 3]
    assert len(list(iter_session_runs(fake_run, sessions, target, repeats=2, warmup=0, alone=True))) == 2


def test_prompts_too_long_for_the_context_are_skipped():
    from bench.prompts import Prompt

    encoded = [EncodedPrompt(Prompt("a", "chat", "x"), (1,) * 10), EncodedPrompt(Prompt("b", "chat", "y"), (1,) * 3)]
    kept, skipped = split_fitting_sessions(single_sessions(encoded), length=8, context_length=16)
    assert [k.id for k in kept] == ["b"] and skipped[0].prompt_id == "a"
    # A conversation's last turn is bounded by its template plus length (+8) per earlier answer.
    from bench.runner import conversation_sessions

    conversation = conversation_sessions([(Prompt("7/1", "chat", "x"), Prompt("7/2", "chat", "y"))], lambda t: [1] * 4)
    assert conversation[0].steps[0].ids == (1,) * 4 and conversation[0].id == "7"

    def follow_up(turns, answers):
        return [1] * 4 + sum(answers, []) + [2] * 3

    for context, fits in ((31, True), (30, False)):                # 7 + (8 + 8) + 8 new tokens = 31
        kept, skipped = split_fitting_sessions(conversation, length=8, context_length=context, follow_up=follow_up)
        assert (len(kept), len(skipped)) == ((1, 0) if fits else (0, 1)), context


def test_timer_pauses_the_garbage_collector_only_inside():
    import gc

    from bench.timing import timed

    value, seconds = timed(lambda: gc.isenabled(), "cpu")
    assert value is False and seconds >= 0 and gc.isenabled()


def test_timer_frees_the_last_runs_cyclic_garbage_before_the_clock_starts():
    """What one timed run left in reference cycles (made while the collector was paused, as it is
    during a run) is gone before the next run starts."""
    import gc
    import weakref

    from bench.timing import timed

    class Node:
        pass

    gc.disable()
    try:
        node = Node()
        node.itself = node
        left = weakref.ref(node)
        del node
        freed, _ = timed(lambda: left() is None, "cpu")
    finally:
        gc.enable()
    assert freed


# ---------------------------------------------------------------- aggregation on hand-built records

def _rec(variant, prompt, category, repeat, n_tokens, seconds, *, tokens=None, drafted=None,
         accepted=None, target_calls=None):
    v = parse_variant_name(variant)
    toks = tokens if tokens is not None else list(range(n_tokens))
    return RunRecord(variant, v.strategy, v.gamma, v.family, prompt, category, repeat, 5,
                     tokens=toks, seconds=seconds, drafted=drafted, accepted=accepted,
                     target_calls=target_calls if target_calls is not None else len(toks))


def _hand_records():
    """Two prompts (code, chat), three repeats, target, NASD and prompt lookup.

    target: 10 tokens in 1 s per prompt, except repeat 2 where the machine was slow (2 s).
    ngram@4: 10 tokens in 0.5 s (0.25 s on code), 1 s in the slow repeat; on chat its
    output differs from target's at position 3.
    """
    out = []
    for r in range(3):
        slow = 2.0 if r == 2 else 1.0
        out += [_rec("target", "c1", "code_editing", r, 10, 1.0 * slow),
                _rec("target", "h1", "chat", r, 10, 1.0 * slow)]
        out += [_rec("ngram@4", "c1", "code_editing", r, 10, 0.25 * slow, drafted=12, accepted=9,
                     target_calls=4),
                _rec("ngram@4", "h1", "chat", r, 10, 0.5 * slow, tokens=[0, 1, 2, 99, 4, 5, 6, 7, 8, 9],
                     drafted=8, accepted=2, target_calls=8)]
        out += [_rec("hf_prompt_lookup@4", "c1", "code_editing", r, 10, 0.5 * slow, target_calls=5),
                _rec("hf_prompt_lookup@4", "h1", "chat", r, 10, 1.0 * slow, target_calls=10)]
    return out


def _row(rows, variant, category):
    return next(r for r in rows if r.variant == variant and r.category == category)


def test_paired_ratio_is_the_median_of_per_repeat_ratios():
    assert paired_ratio({0: 4.0, 1: 6.0, 2: 100.0}, {0: 2.0, 1: 2.0, 2: 10.0}) == 3.0
    assert paired_ratio({0: 1.0, 1: 5.0}, {0: 1.0}) == 1.0
    assert paired_ratio({0: 1.0}, {}) is None


def test_category_groups_add_grounded_and_all():
    groups = category_groups(["chat", "code_editing", "rag", "chat"])
    assert groups[GROUNDED] == {"code_editing", "rag"}
    assert groups[ALL] == {"chat", "code_editing", "rag"}
    assert GROUNDED not in category_groups(["chat"])


def test_summary_medians_and_speedups():
    rows = summarize(_hand_records(), greedy=True)
    target_all = _row(rows, "target", ALL)
    assert target_all.tokens_per_s == pytest.approx(10.0)      # repeats: 10, 10, 5 tok/s
    assert target_all.speedup == pytest.approx(1.0)
    code = _row(rows, "ngram@4", "code_editing")
    assert code.tokens_per_s == pytest.approx(40.0)            # 40, 40, 20 -> median 40
    assert code.speedup == pytest.approx(4.0)                  # paired: 4, 4, 4
    assert code.vs_peer == pytest.approx(2.0)
    assert code.acceptance_rate == pytest.approx(0.75)
    assert code.tokens_per_target_call == pytest.approx(2.5)
    assert code.target_calls == pytest.approx(4.0)
    # Seconds per target call: ngram 1 s over 12 calls (0.25 s x 2 + 0.5 s), target 4 s over 30 calls.
    assert code.call_cost == pytest.approx((1.0 / 12) / (4.0 / 30))
    assert code.speedup == pytest.approx(code.tokens_per_target_call / code.call_cost)
    overall = _row(rows, "ngram@4", ALL)                       # 20 tokens in 0.75 s
    assert overall.speedup == pytest.approx((20 / 0.75) / 10)
    assert overall.acceptance_rate == pytest.approx(11 / 20)
    assert _row(rows, "ngram@4", GROUNDED).speedup == pytest.approx(4.0)
    peer = _row(rows, "hf_prompt_lookup@4", ALL)
    assert peer.vs_peer is None and peer.acceptance_rate is None


def test_identical_share_and_first_divergence():
    rows = summarize(_hand_records(), greedy=True)
    overall = _row(rows, "ngram@4", ALL)
    assert (overall.identical_count, overall.prompts, overall.identical) == (1, 2, 0.5)
    assert overall.divergences == [3] and overall.first_divergence == 3
    assert _row(rows, "hf_prompt_lookup@4", ALL).identical == 1.0
    assert _row(rows, "ngram@4", "code_editing").first_divergence is None
    assert _row(rows, "ngram@4", ALL).identical is not None
    assert summarize(_hand_records(), greedy=False)[0].identical is None
    # drafter AR is another model: its outputs are not counted identical or not, nor judged
    drafted = [_rec("drafter", pid, cat, r, 10, 0.3, tokens=[5] * 10) for r in range(3)
               for pid, cat in (("c1", "code_editing"), ("h1", "chat"))]
    row = _row(summarize(_hand_records() + drafted, greedy=True), "drafter", ALL)
    assert (row.identical, row.identical_count, row.divergences, row.unexplained) == (None, None, [], None)


def test_expectations_parse_and_reject_bad_text():
    assert parse_expectation("speculative@4/target=1.2") == Expectation("speculative@4", "target", 1.2)
    assert parse_expectation("ngram@4/target=1.8@grounded") == Expectation("ngram@4", "target", 1.8, GROUNDED)
    assert parse_expectation("speculative:confidence=0.4@20/best=0.95").variant == "speculative:confidence=0.4@20"
    assert parse_expectation("ngram@4/target=1.8@grounded").text == "ngram@4/target=1.8@grounded"
    for bad in ("speculative@4=1.2", "a/b", "a/b=x", "a/b=0", "/b=1"):
        with pytest.raises(ValueError):
            parse_expectation(bad)


def test_expectations_are_checked_against_the_right_records():
    records = _hand_records()
    peer, speed, missing, lower = check_expectations(records, [
        Expectation("ngram@4", "hf_prompt_lookup@4", 1.0, GROUNDED),
        Expectation("ngram@4", "target", 1.8, GROUNDED),
        Expectation("target", "hf_generate", 1.0),                 # no hf_generate here
        Expectation("ngram@4", "target", 100.0),
    ])
    assert peer.value == pytest.approx(2.0) and peer.status == "met"
    assert speed.value == pytest.approx(_row(summarize(records, greedy=True), "ngram@4", GROUNDED).speedup)
    assert speed.status == "met"
    assert missing.status == "not checked"
    assert lower.status == "missed"


def _policy_records():
    """speculative constant 2, 4, 8 and model; HF dynamic; three repeats, one prompt each.

    Seconds per 10 tokens: γ=2 1.0, γ=4 0.5 (the best), γ=8 0.8; model 0.52, except
    repeat 1 where it took 0.4; HF dynamic 0.625.
    """
    out = []
    for r in range(3):
        out.append(_rec("target", "h1", "chat", r, 10, 2.0))
        for name, seconds in (("speculative@2", 1.0), ("speculative@4", 0.5), ("speculative@8", 0.8),
                              ("speculative:model@16", 0.4 if r == 1 else 0.52),
                              ("hf_assisted:confidence=0.4@20", 0.625)):
            out.append(_rec(name, "h1", "chat", r, 10, seconds))
    return out


def test_best_is_the_fastest_constant_gamma_in_hindsight():
    expect = [Expectation("speculative:model@16", "best", 0.95)]
    verdict, = check_expectations(_policy_records(), expect)
    assert verdict.reference == "speculative@4" and verdict.description.endswith("speculative@4")
    assert verdict.value == pytest.approx(0.5 / 0.52)            # median of 0.96, 1.25, 0.96
    assert verdict.status == "within the margin"                  # the 1.25 repeat widens it past 0.95
    slow = [r for r in _policy_records() if r.variant != "speculative:model@16"]
    slow += [_rec("speculative:model@16", "h1", "chat", r, 10, 1.0) for r in range(3)]
    assert check_expectations(slow, expect)[0].status == "missed"
    no_constants = [r for r in _policy_records() if r.variant.startswith(("target", "speculative:"))]
    assert check_expectations(no_constants, expect)[0].status == "not checked"
    md = markdown_report(["header"], summarize(_policy_records(), greedy=True), [verdict])
    assert "| speculative model | ≤16 |" in md
    assert "| speculative:model@16 ≥ 0.95× speculative@4 | 0.96× ±" in md
    assert "| within the margin |" in md


def test_no_expectation_no_check():
    assert check_expectations(_policy_records(), []) == []
    md = markdown_report(["header"], summarize(_policy_records(), greedy=True), [])
    assert "Expectations" not in md


def test_the_terminal_report_prints_bracketed_names_as_they_are():
    """Variant names carry brackets (ngram[suffix]@4) that rich markup would take for tags and drop,
    and a header line may hold a path with "[/]", which markup cannot even parse."""
    import io

    from rich.console import Console

    from bench.report import print_report

    runs = []
    for r, a in enumerate((1.0, 1.1, 0.9)):
        runs += [_rec("target", "p", "chat", r, 10, 2.0), _rec("ngram[suffix]@4", "p", "chat", r, 10, a),
                 _rec("ngram[basic]@4", "p", "chat", r, 10, 1.5)]
    verdicts = check_expectations(runs, [Expectation("ngram[suffix]@4", "ngram[basic]@4", 1.1)])
    sink = io.StringIO()
    console = Console(file=sink, width=200)                   # markup on, as rich's default
    print_report(console, ["out [/] dir [bold]x"], summarize(runs, greedy=True), verdicts)
    printed = sink.getvalue()
    assert "ngram[suffix]@4 ≥ 1.1× ngram[basic]@4" in printed
    assert "out [/] dir [bold]x" in printed


# ---------------------------------------------------------------- writers and chart

def test_csv_spreads_phases_over_columns(tmp_path):
    rows = [{"variant": "ngram@4", "phases": {"draft": 0.1, "verify": 0.7, "other": 0.2}},
            {"variant": "hf_generate", "phases": None}]
    with write_csv(tmp_path / "runs.csv", rows).open() as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == ["variant", "phases.draft", "phases.verify", "phases.other", "phases"]
    assert table[0]["phases.verify"] == "0.7" and table[1]["phases.draft"] == ""


def test_json_and_csv_writers(tmp_path):
    records = _hand_records()
    rows = summarize(records, greedy=True)
    verdicts = check_expectations(records, [parse_expectation("ngram@4/target=1.8@grounded")])
    data = report_dict({"device": "cpu"}, {"length": 10}, rows, verdicts, records, [])
    path = write_json(tmp_path / "bench.json", data)
    loaded = json.loads(path.read_text())
    assert loaded["variants"] == ["target", "ngram@4", "hf_prompt_lookup@4"]
    assert loaded["outputs"]["ngram@4"]["h1"][3] == 99
    assert len(loaded["runs"]) == len(records) and "tokens" not in loaded["runs"][0]
    assert loaded["expectations"][0]["expect"] == "ngram@4/target=1.8@grounded"
    assert loaded["expectations"][0]["status"] == "met"
    from dataclasses import asdict
    csv_path = write_csv(tmp_path / "summary.csv", [asdict(r) for r in rows])
    with csv_path.open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows)
    code = next(r for r in table if r["variant"] == "ngram@4" and r["category"] == "code_editing")
    assert float(code["speedup"]) == pytest.approx(4.0) and code["first_divergence"] == ""
    md = markdown_report(["header"], rows, verdicts)
    assert "| NASD | 4 |" in md and "Expectations" in md


def test_chart_png_is_written(tmp_path):
    records = _hand_records() + [_rec("ngram@2", p, c, r, 10, 0.7) for p, c in
                                 (("c1", "code_editing"), ("h1", "chat")) for r in range(3)]
    rows = summarize(records, greedy=True)
    assert [r.gamma for r in series_rows(rows, ALL)["ngram"]] == [2, 4]
    path = speedup_chart(rows, tmp_path / "chart.png", title="test")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


# ---------------------------------------------------------------- end to end on a tiny random pair

def _tiny_tokenizer(tmp_path):
    """A byte-level tokenizer with no merges: 256 byte symbols and an end token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<eos>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<eos>").save_pretrained(tmp_path)
    return AutoTokenizer.from_pretrained(tmp_path)


def _tiny_llama(seed, vocab_size):
    """A tiny Llama whose last id ends and pads; sharp distributions: no near-ties under greedy."""
    return tiny_llama(seed, vocab_size=vocab_size, max_positions=512, logit_scale=8.0, bos_token_id=None,
                      eos_token_id=vocab_size - 1, pad_token_id=vocab_size - 1)


@pytest.fixture(scope="module")
def tiny_pair(tmp_path_factory):
    tokenizer = _tiny_tokenizer(tmp_path_factory.mktemp("tok"))
    vocab = len(tokenizer)
    return model_pair(
        _tiny_llama(0, vocab), _tiny_llama(1, vocab), tokenizer=tokenizer,
        target_name="tiny-target", drafter_name="tiny-drafter", end_tokens=[tokenizer.eos_token_id],
        device=torch.device("cpu"), vocab_size=vocab, context_length=512, self_draft_demo=False,
    )


def test_chat_ids_without_a_template_is_plain_encoding(tiny_pair):
    assert chat_ids(tiny_pair.tokenizer, "ab") == tiny_pair.tokenizer("ab")["input_ids"]


def test_our_drafting_variants_time_the_decode_without_the_inspector(tiny_pair):
    """The benchmark never shows the inspector's numbers, so its strategies do not record them;
    the same strategy with recording switched on does (the switch reaches the verify loop)."""
    ids = [3, 4, 5, 3, 4, 5, 3, 4]
    for strategy_name in ("speculative", "ngram"):
        ours = our_strategy(Variant(strategy_name, 2), processor=GreedyProcessor(), max_gen_len=8,
                            ngram=NGramOptions(n=2, confident_start=False))
        for strategy, recorded in ((ours, False), (replace(ours, inspect=True), True)):
            result = our_call(strategy, tiny_pair, ids, state=EngineState(),
                              generator=torch.Generator().manual_seed(0))()
            assert result.trace, strategy_name
            assert all((r.inspection is not None) == recorded for r in result.trace), (strategy_name, recorded)


def test_hybrid_variants_names_plan_flag_and_strategy(tiny_pair):
    from bench.cli import build_parser

    names = [v.name for v in plan_variants(["speculative", "ngram"], [4], peers=True, hybrids=[2])]
    assert names == ["target", "hf_generate", "speculative@4", "hf_assisted@4", "speculative+hybrid2@4",
                     "ngram@4", "hf_prompt_lookup@4"]                       # no peer; NASD unchanged
    variant = parse_variant_name("speculative+tree8+hybrid2@4~residual")
    assert (variant.hybrid, variant.tree, variant.verify) == (2, 8, "residual")
    assert variant.name == "speculative+tree8+hybrid2@4~residual" and variant.peer is None
    assert Variant("speculative", 4, hybrid=2).label == "speculative hybrid L2 γ=4"
    assert build_parser().parse_args(["--hybrid", "4,2"]).hybrid == [2, 4]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--hybrid", "65"])
    strategy = our_strategy(Variant("speculative", 2, hybrid=2), processor=GreedyProcessor(), max_gen_len=8,
                            ngram=NGramOptions(storage="sam"))
    result = our_call(strategy, tiny_pair, [3, 4, 5, 3, 4, 5, 3, 4], state=EngineState(),
                      generator=torch.Generator().manual_seed(0))()
    assert result.hybrid["L"] == 2 and result.hybrid["rounds"]["retrieval"] > 0


def test_end_to_end_tiny_run_with_peers(tiny_pair, tmp_path, capsys):
    from bench.cli import main

    prompts = tmp_path / "q.jsonl"
    lines = [
        {"question_id": 1, "category": "summarization", "turns": ["the cat sat on the mat. the cat sat."]},
        {"question_id": 2, "category": "chat", "turns": ["hello there, how are you?", "second"]},
        {"question_id": 3, "category": "translation", "turns": ["one two three four"]},
    ]
    prompts.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    out = tmp_path / "out"
    threads = torch.get_num_threads()
    try:   # one thread: a tiny model gains nothing from more, and a busy machine loses a lot
        code = main(["--prompts", str(prompts), "--peers", "--gamma", "2,3", "--length", "10",
                     "--repeats", "2", "--threads", "1", "--policies", "none", "--out", str(out)],
                    loader=lambda args: tiny_pair)
    finally:
        torch.set_num_threads(threads)
    assert code == 0
    printed = capsys.readouterr().out
    assert "All prompts" in printed and "HF prompt lookup" in printed

    data = json.loads((out / "bench.json").read_text())
    expected = {"target", "hf_generate", "drafter", "speculative@2", "speculative@3",
                "hf_assisted@2", "hf_assisted@3", "ngram@2", "ngram@3", "hf_prompt_lookup@2",
                "hf_prompt_lookup@3"}
    # transformers' static-cache peers, each a row of its own beside its eager twin; assisted generation
    # and prompt lookup take a static cache from transformers 5 on (4.x swaps it for a dynamic one)
    static = {"hf_generate+static"} | ({f"{p}+static@{g}" for p in ("hf_assisted", "hf_prompt_lookup") for g in (2, 3)}
                                       if DRAFTING_STATIC_PEERS else set())
    expected |= static
    assert set(data["variants"]) == expected
    assert data["settings"]["compile"] == "off"          # a CPU's default path
    assert data["environment"]["torch"] == torch.__version__
    assert data["settings"]["processor"] == "greedy"
    assert len(data["runs"]) == len(expected) * 3 * 2

    outputs = data["outputs"]
    for prompt_id, tokens in outputs["target"].items():
        assert 0 < len(tokens) <= 10
        # Greedy: ours and transformers' agree token for token.
        assert outputs["hf_generate"][prompt_id] == tokens
        for name in ("speculative@2", "speculative@3", "ngram@2", "ngram@3", *static):
            assert outputs[name][prompt_id] == tokens, name
    summary = {(r["variant"], r["category"]): r for r in data["summary"]}
    for name in ("speculative@2", "ngram@3", "hf_generate"):
        assert summary[(name, "all")]["identical"] == 1.0
    assert summary[("target", "all")]["speedup"] == pytest.approx(1.0)
    assert summary[("ngram@2", "all")]["vs_peer"] > 0
    assert summary[("speculative@2", "all")]["acceptance_rate"] is not None
    assert all(r["tokens_per_s"] > 0 for r in data["summary"])
    for name in ("summary.csv", "runs.csv", "summary.md", "speedup_vs_gamma.png"):
        assert (out / name).stat().st_size > 0
    # Target autoregressive: one target forward per generated token.
    target_runs = [r for r in data["runs"] if r["variant"] == "target"]
    assert all(r["target_calls"] == r["n_tokens"] for r in target_runs)


def test_end_to_end_tiny_run_with_gamma_policies(tiny_pair, tmp_path):
    """Every policy of both drafting strategies, and HF dynamic, on the tiny pair (greedy)."""
    from bench.cli import main

    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "summarization",
                                   "turns": ["the cat sat on the mat. the cat sat."]}), encoding="utf-8")
    out = tmp_path / "out"
    code = main(["--prompts", str(prompts), "--peers", "--strategies", "speculative,ngram",
                 "--gamma", "2", "--policies", "heuristic@2,confidence 0.4@3,model@4",
                 "--length", "8", "--repeats", "1", "--threads", "1", "--no-chart",
                 "--expect", "ngram:model@4/best=0.001", "--expect", "speculative@2/drafter=1",
                 "--out", str(out)], loader=lambda args: tiny_pair)
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    assert [e["status"] for e in data["expectations"]] == ["met", "not checked"]  # no drafter AR here
    assert data["expectations"][0]["reference"] == "ngram@2"
    assert "Expectations" in (out / "summary.md").read_text()
    ours = ["speculative@2", "speculative:heuristic@2", "speculative:confidence=0.4@3",
            "speculative:model@4", "ngram@2", "ngram:heuristic@2", "ngram:confidence=0.4@3",
            "ngram:model@4"]
    assert set(ours) | {"hf_assisted:heuristic@2", "hf_assisted:confidence=0.4@3",
                        "hf_assisted:confidence=0.4@20"} <= set(data["variants"])
    outputs = data["outputs"]
    for name in ours + ["hf_assisted:heuristic@2", "hf_assisted:confidence=0.4@20"]:
        # Greedy: no draft length changes the output.
        assert outputs[name] == outputs["target"], name
    runs = {r["variant"]: r for r in data["runs"]}
    assert runs["speculative:model@4"]["gamma_policy"] == "model"
    assert runs["ngram:confidence=0.4@3"]["gamma_policy"] == "confidence 0.4"
    assert runs["speculative@2"]["gamma_policy"] == "constant"
    assert runs["target"]["gamma_policy"] == ""
    assert set(runs["speculative:model@4"]["phases"]) == {"draft", "verify", "other"}
    assert runs["hf_assisted:confidence=0.4@20"]["phases"] is None
    assert 0 <= runs["speculative:model@4"]["mean_gamma"] <= 4
    assert data["expectations"][0]["value"] > 0
    assert "speculative model" in (out / "summary.md").read_text()


def test_until_decided_adds_repeats_while_an_expectation_is_within_its_margin(tiny_pair, tmp_path, monkeypatch,
                                                                             capsys):
    """A bound far below the measured ratio is settled by the planned repeats; one the run
    cannot settle (the decision forced open) runs to MAX; a bad combination of flags is one line."""
    import bench.session
    from bench.cli import main

    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "summarization",
                                   "turns": ["the cat sat on the mat. the cat sat."]}), encoding="utf-8")

    def run_bench(*extra):
        out = tmp_path / f"out{len(list(tmp_path.iterdir()))}"
        code = main(["--prompts", str(prompts), "--strategies", "target,ngram", "--gamma", "2", "--length", "6",
                     "--repeats", "2", "--policies", "none", "--no-chart", "--threads", "1", "--out", str(out),
                     *extra], loader=lambda args: tiny_pair)
        return code, (json.loads((out / "bench.json").read_text()) if code == 0 else None)

    threads = torch.get_num_threads()
    try:
        # A bound 1e100 times below: met at the first look, even at 98.75% on one degree of freedom and
        # repeats of a 6-token run that differ tenfold on a busy machine.
        code, data = run_bench("--expect", "ngram@2/target=1e-100", "--until-decided", "5")
        assert code == 0 and data["settings"]["repeats"] == 2 and data["expectations"][0]["status"] == "met"
        asked = []
        monkeypatch.setattr(bench.session, "undecided", lambda verdicts: asked.append(len(verdicts)) or verdicts)
        code, data = run_bench("--expect", "ngram@2/target=0.01", "--until-decided", "4")
        assert code == 0 and data["settings"]["repeats"] == 4 and asked == [1, 1]
        assert len({r["repeat"] for r in data["runs"]}) == 4 and data["settings"]["until_decided"] == 4
        assert "4 repeats (until decided, at most 4; expectations at 98.33% a look)" in capsys.readouterr().out
        code, data = run_bench("--expect", "ngram[suffix]@2/target=1")      # one storage: it is ngram@2
        assert code == 0 and data["expectations"][0]["status"] == "not checked"
        assert "this run has no variant ngram[suffix]@2" in " ".join(capsys.readouterr().err.split())
        for extra, message in ((("--until-decided", "4"), "needs an --expect"),
                               (("--expect", "ngram@2/target=1", "--until-decided", "1"), "at least 2")):
            assert run_bench(*extra)[0] == 2
            assert message in " ".join(capsys.readouterr().err.split())
    finally:
        torch.set_num_threads(threads)


def test_bad_prompt_file_exits_with_an_error(tmp_path, capsys):
    from bench.cli import main

    code = main(["--prompts", str(tmp_path / "none.jsonl")], loader=lambda args: pytest.fail("loaded"))
    assert code == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00")
    code = main(["--prompts", str(tmp_path / "binary.jsonl")], loader=lambda args: pytest.fail("loaded"))
    err = capsys.readouterr().err
    assert code == 2 and "cannot read prompt file" in err and "Traceback" not in err


def test_an_encoder_decoder_pair_runs_with_its_peers(tmp_path):
    """T5: ours and transformers' peers decode the same decoder tokens (the peers'
    output starts with the decoder start token, not the prompt)."""
    from bench.cli import main
    from tests.helpers.models import tiny_t5
    from tests.helpers.tokenizers import word_tokenizer

    tokenizer = word_tokenizer(template=None)
    target = tiny_t5(3, d_model=64)
    pair = model_pair(
        target, tiny_t5(4), tokenizer=tokenizer, target_name="t5", drafter_name="t5-small",
        end_tokens=[tokenizer.eos_token_id], device=torch.device("cpu"), vocab_size=len(tokenizer),
        context_length=512, self_draft_demo=False, is_encoder_decoder=True)
    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "chat", "turns": ["w5 w9 w14 w5 w9 w14 w22"]}),
                       encoding="utf-8")
    code = main(["--prompts", str(prompts), "--peers", "--gamma", "2", "--length", "8", "--repeats", "1",
                 "--threads", "1", "--policies", "none", "--no-chart", "--out", str(tmp_path / "out")],
                loader=lambda args: pair)
    assert code == 0
    outputs = json.loads((tmp_path / "out" / "bench.json").read_text())["outputs"]
    (prompt_id, reference), = outputs["target"].items()
    assert 0 < len(reference) <= 8
    for name in ("hf_generate", "hf_assisted@2", "hf_prompt_lookup@2", "speculative@2", "ngram@2"):
        assert outputs[name][prompt_id] == reference, name


def test_tree_variants_sit_beside_the_chains_without_a_peer():
    from bench.variants import parse_variant_name, plan_variants

    variants = plan_variants(["speculative", "ngram"], [4], peers=True, policies=[], trees=[16])
    names = [v.name for v in variants]
    assert names.index("speculative+tree16@4") == names.index("hf_assisted@4") + 1
    assert "ngram+tree16@4" in names and names.count("hf_prompt_lookup@4") == 1
    tree = parse_variant_name("speculative+tree16@4")
    assert (tree.strategy, tree.gamma, tree.tree, tree.peer) == ("speculative", 4, 16, None)


def test_end_to_end_tiny_run_with_trees(tiny_pair, tmp_path, monkeypatch):
    """--trees 8,16 runs tree variants of both drafting strategies beside the chains:
    lossless under greedy, really verifying trees (more nodes per round than the
    chain's gamma), and the report shows tokens/s and tokens per target call for each.
    A variant that falls back to chains says so in the report's header."""
    from bench.cli import main

    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "summarization",
                                   "turns": ["the cat sat on the mat. the cat sat."]}), encoding="utf-8")
    out = tmp_path / "out"
    code = main(["--prompts", str(prompts), "--strategies", "speculative,ngram", "--gamma", "3",
                 "--trees", "8,16", "--policies", "none", "--length", "10", "--repeats", "1", "--warmup", "0",
                 "--threads", "1", "--no-chart", "--out", str(out)], loader=lambda args: tiny_pair)
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    trees = ["speculative+tree8@3", "speculative+tree16@3", "ngram+tree8@3", "ngram+tree16@3"]
    assert set(trees) | {"speculative@3", "ngram@3", "target"} <= set(data["variants"])
    runs = {r["variant"]: r for r in data["runs"]}
    for name in trees:
        assert data["outputs"][name] == data["outputs"]["target"], name
        assert runs[name]["tree_fallback"] == "", name
    # With trees, drafted counts every node verified: the model drafter's trees are wider than its chain.
    for name in ("speculative+tree8@3", "speculative+tree16@3"):
        assert runs[name]["drafted"] / runs[name]["rounds"] > 3, name
    summary = (out / "summary.md").read_text()
    assert "tok/s" in summary and "tok/call" in summary
    rows = [line for line in summary.splitlines() if line.startswith("| speculative tree 16")]
    from bench.report import OVERALL_COLUMNS

    assert len(rows) >= 1 and rows[0].count("|") == len(OVERALL_COLUMNS) + 1

    # A drafter without trees: the tree variant runs chains and the report says why.
    from generation.drafter import Drafter
    from generation.model_drafter import ModelDrafter

    monkeypatch.setattr(ModelDrafter, "tree_support", Drafter.tree_support)  # the base's "chains only"
    out2 = tmp_path / "out2"
    code = main(["--prompts", str(prompts), "--strategies", "speculative", "--gamma", "3", "--trees", "8",
                 "--policies", "none", "--length", "6", "--repeats", "1", "--warmup", "0", "--threads", "1",
                 "--no-chart", "--out", str(out2)], loader=lambda args: tiny_pair)
    assert code == 0
    runs = {r["variant"]: r for r in json.loads((out2 / "bench.json").read_text())["runs"]}
    assert "proposes chains only" in runs["speculative+tree8@3"]["tree_fallback"]
    assert "speculative+tree8@3: chain instead of a tree" in (out2 / "summary.md").read_text()


# ------------------------------------------------------------- self-drafters

def test_self_drafter_specs_parse_and_plan_beside_the_pairs_drafter():
    from bench.cli import parse_self_drafters

    assert parse_self_drafters("self:bf16, self:skip=5,3,self:INT8,self:bf16") == [
        "self:bf16", "self:skip=3,5", "self:int8"]
    with pytest.raises(ValueError, match="self:skip=auto"):
        parse_self_drafters("self:int4")
    variants = plan_variants(["speculative", "ngram"], [2, 4], peers=True, policies=[], trees=[8],
                             self_drafters=["self:int8", "self:skip=3,5"])
    names = [v.name for v in variants]
    assert names.index("speculative[self:int8]@2") > names.index("speculative+tree8@4")
    assert names.index("speculative[self:skip=3,5]+tree8@4") < names.index("ngram@2")
    mine = [v for v in variants if v.drafter]
    assert len(mine) == 2 * 2 * 2 and all(v.peer is None for v in mine)      # specs x (chain, tree) x gammas
    for v in mine:
        assert parse_variant_name(v.name) == v
    assert parse_variant_name("speculative[self:skip=3,5]+tree8@4").label == "speculative self:skip=3,5 tree 8 γ=4"


def _self_bench(pair, tmp_path) -> dict:
    from bench.cli import main

    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "summarization",
                                   "turns": ["the cat sat on the mat. the cat sat."]}), encoding="utf-8")
    out = tmp_path / "out"
    code = main(["--prompts", str(prompts), "--strategies", "speculative", "--gamma", "3", "--trees", "8",
                 "--self-drafters", "self:int8,self:skip=1", "--policies", "none", "--length", "10",
                 "--repeats", "1", "--warmup", "0", "--threads", "1", "--no-chart", "--out", str(out)],
                loader=lambda args: pair)
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    data["summary_md"] = (out / "summary.md").read_text()
    return data


SELF_VARIANTS = [f"speculative[{s}]{t}@3" for s in ("self:int8", "self:skip=1") for t in ("", "+tree8")]


def check_self_runs(data: dict) -> None:
    """Lossless, trees verified, and drafted by the self-drafter: the int8 copy of the target
    agrees with it far more often than the pair's independent drafter does."""
    runs = {r["variant"]: r for r in data["runs"]}
    for name in SELF_VARIANTS:
        assert data["outputs"][name] == data["outputs"]["target"], name
        assert runs[name]["tree_fallback"] == "" and runs[name]["drafter_calls"] > 0, name
    for name in SELF_VARIANTS[1::2]:                                          # the tree variants
        assert runs[name]["drafted"] / runs[name]["rounds"] > 3, name

    def rate(name):
        return runs[name]["accepted"] / runs[name]["drafted"]

    assert rate("speculative[self:int8]@3") > 0.9 > rate("speculative@3") + 0.2


def test_end_to_end_tiny_run_with_self_drafters_and_trees(tiny_pair, tmp_path):
    """--self-drafters runs each self-drafter (chains and trees) beside the pair's drafter and target AR."""
    data = _self_bench(tiny_pair, tmp_path)
    assert {"target", "speculative@3", "speculative+tree8@3", *SELF_VARIANTS} == set(data["variants"])
    assert data["settings"]["self_drafters"] == ["self:int8", "self:skip=1"]
    check_self_runs(data)
    assert "| speculative self:int8 tree 8" in data["summary_md"]
    assert "| speculative self:skip=1 γ=3" in data["summary_md"]


def test_self_drafter_variants_that_run_the_pairs_drafter_are_caught(tiny_pair, tmp_path, monkeypatch):
    """Mutation: the variant's self-drafter spec is ignored (the pair's drafter drafts)."""
    import bench.executor

    real = bench.executor.our_strategy
    monkeypatch.setattr(bench.executor, "our_strategy", lambda variant, **kw: real(replace(variant, drafter=""), **kw))
    with pytest.raises(AssertionError):
        check_self_runs(_self_bench(tiny_pair, tmp_path))


def test_a_self_drafter_that_does_not_apply_is_one_line(tiny_pair, tmp_path, capsys):
    from bench.cli import main

    code = main(["--self-drafters", "self:skip=0,1", "--limit", "1", "--out", str(tmp_path)],
                loader=lambda args: tiny_pair)
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot skip all 2 layers" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        main(["--self-drafters", "self:int4"], loader=lambda args: pytest.fail("loaded"))
    last = capsys.readouterr().err.strip().splitlines()[-1]               # argparse: usage, then the error
    assert "--self-drafters: unknown self-drafter self:int4: use " in last and "--drafter " not in last


def test_a_skip_search_that_keeps_every_layer_is_left_out_with_a_line(tiny_pair, tmp_path):
    """self:skip=auto on a 2-layer target: the search keeps both layers, so the spec does not run."""
    from bench.cli import main

    prompts = tmp_path / "q.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "chat", "turns": ["ab ab"]}), encoding="utf-8")
    out = tmp_path / "out"
    code = main(["--prompts", str(prompts), "--strategies", "speculative", "--gamma", "2", "--policies", "none",
                 "--self-drafters", "self:skip=auto", "--length", "4", "--repeats", "1", "--warmup", "0",
                 "--no-chart", "--out", str(out)], loader=lambda args: tiny_pair)
    assert code == 0
    assert json.loads((out / "bench.json").read_text())["variants"] == ["target", "speculative@2"]
    assert "self:skip=auto: the layer search found no layer worth skipping" in (out / "summary.md").read_text()


# ------------------------------------------------------------- several n-gram storages, sessions, honest state

def test_storage_list_flag_names_and_one_shared_peer():
    """--ngram-storage takes a list; each storage is a variant of its own (ngram[suffix]@4), all
    against the same prompt-lookup peer; one storage keeps the old names; arctic_suffix sits
    right after the suffix storage at each constant gamma."""
    from bench.cli import build_parser

    assert build_parser().parse_args(["--ngram-storage", "basic, suffix,sam,suffix"]).ngram_storage == \
        ["basic", "suffix", "sam"]
    assert build_parser().parse_args([]).ngram_storage == ["basic"]
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--ngram-storage", "basic,trie"])
    names = [v.name for v in plan_variants(["ngram"], [2], peers=True, policies=[("model", 8)],
                                           storages=["basic", "suffix"], arctic=True)]
    assert names == ["target", "hf_generate", "ngram[basic]@2", "hf_prompt_lookup@2", "ngram[suffix]@2",
                     "arctic_suffix@2", "ngram[basic]:model@8", "ngram[suffix]:model@8"]
    assert [v.name for v in plan_variants(["ngram"], [2], peers=True, storages=["suffix"])] == \
        ["target", "hf_generate", "ngram@2", "hf_prompt_lookup@2"]
    suffix = parse_variant_name("ngram[suffix]:model@8")
    assert (suffix.strategy, suffix.storage, suffix.drafter, suffix.policy) == ("ngram", "suffix", "", "model")
    assert parse_variant_name("ngram[sam]@4").peer == Variant("hf_prompt_lookup", 4)
    assert parse_variant_name("ngram[sam]@4").label == "NASD sam γ=4"
    assert parse_variant_name("speculative[self:int8]@4").storage == ""
    assert Variant("arctic_suffix", 4).family == "peer"
    with pytest.raises(ValueError, match="add ngram"):
        plan_variants(["speculative"], [2], peers=False, arctic=True)


def test_best_constant_stays_within_the_storage():
    from bench.expect import _best_constant

    present = ["ngram[basic]@2", "ngram[suffix]@2", "ngram[suffix]@4", "ngram[suffix]:model@8"]
    seconds = {"ngram[basic]@2": 0.1, "ngram[suffix]@2": 1.0, "ngram[suffix]@4": 0.5}
    runs = {v: [_rec(v, "p", "chat", 0, 10, s)] for v, s in seconds.items()}
    assert _best_constant("ngram[suffix]:model@8", present, runs.get) == "ngram[suffix]@4"


def _spy_storages(monkeypatch) -> list[dict]:
    """Record every generation's start in an n-gram storage (``initialize`` with a prompt): which
    storage object, what it held before (``len``), the prompt, and for suffix the earlier outputs
    in its global trie."""
    from ngram_assisted import NGramStorage, SAMStorage, SuffixStorage

    seen = []
    for cls in (NGramStorage, SuffixStorage, SAMStorage):
        def spy(self, prompt, real=cls.initialize):
            if not len(prompt):      # SAM's reset starts an empty context: not a generation
                return real(self, prompt)
            held = len(self)
            real(self, prompt)
            seen.append(dict(kind=self.kind, storage=id(self), held=held, prompt=list(prompt),
                             outputs=[list(o) for o in getattr(self, "outputs", ())]))
        monkeypatch.setattr(cls, "initialize", spy)
    return seen


def _bench_run(pair, tmp_path, lines, flags) -> dict:
    from bench.cli import main

    prompts = tmp_path / "q.jsonl"
    prompts.write_text("\n".join(json.dumps(x) for x in lines), encoding="utf-8")
    out = tmp_path / "out"
    code = main(["--prompts", str(prompts), "--length", "8", "--threads", "1", "--policies", "none",
                 "--no-chart", "--out", str(out), *flags], loader=lambda args: pair)
    assert code == 0
    data = json.loads((out / "bench.json").read_text())
    data["summary_md"] = (out / "summary.md").read_text()
    return data


REPEATED = [{"question_id": 1, "category": "summarization", "turns": ["the cat sat on the mat. the cat sat."]}]


def check_fresh_every_run(seen: list[dict], runs: int) -> None:
    """Every generation started from an empty storage: no repeat (nor the warm-up) left anything."""
    assert len(seen) == runs
    assert all(s["held"] == 0 and s["outputs"] == [] for s in seen), \
        [(s["kind"], s["held"], len(s["outputs"])) for s in seen]


def test_every_repeat_and_the_warm_up_start_from_a_fresh_storage(tiny_pair, tmp_path, monkeypatch):
    """Three storages side by side, a warm-up and two repeats of one prompt: lossless, each storage
    fresh at every run (SuffixDecoding's global trie would otherwise hold the earlier repeat's
    output), so the repeats draft alike."""
    seen = _spy_storages(monkeypatch)
    data = _bench_run(tiny_pair, tmp_path, REPEATED, ["--strategies", "ngram", "--ngram-storage", "basic,suffix,sam",
                                                      "--peers", "--gamma", "2", "--repeats", "2", "--warmup", "1"])
    ours = ["ngram[basic]@2", "ngram[suffix]@2", "ngram[sam]@2"]
    lookup = ["hf_prompt_lookup@2"] + (["hf_prompt_lookup+static@2"] if DRAFTING_STATIC_PEERS else [])
    assert data["variants"] == ["target", "hf_generate", "hf_generate+static", ours[0], *lookup, *ours[1:]]
    assert data["settings"]["ngram_storage"] == "basic,suffix,sam"
    for name in ours + ["hf_prompt_lookup@2"]:
        assert data["outputs"][name] == data["outputs"]["target"], name
    check_fresh_every_run(seen, runs=3 * 3)                     # 3 storages x (warm-up + 2 repeats)
    assert len({s["storage"] for s in seen}) == 3               # one storage per variant, never shared
    runs = {(r["variant"], r["repeat"]): r for r in data["runs"]}
    for name in ours:
        assert runs[(name, 0)]["acceptance"] == runs[(name, 1)]["acceptance"], name
    assert "| NASD suffix | 2 |" in data["summary_md"]


def test_suffix_pattern_reaches_the_storage_and_the_header(tiny_pair, tmp_path, monkeypatch):
    """--suffix-pattern P builds the suffix storage with P (its tries keep 2P tokens) and the
    report says so; out of range is refused by the parser. Mutation check: the default P=16
    storage would have depth 32."""
    from bench.cli import build_parser
    from ngram_assisted import SuffixStorage

    built = []
    real = SuffixStorage.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        built.append(self.max_pattern)
    monkeypatch.setattr(SuffixStorage, "__init__", spy)
    data = _bench_run(tiny_pair, tmp_path, REPEATED, ["--strategies", "ngram", "--ngram-storage", "suffix",
                                                      "--gamma", "2", "--repeats", "1", "--suffix-pattern", "5"])
    assert built and set(built) == {5}
    assert data["settings"]["suffix_pattern"] == 5 and "P=5" in data["summary_md"]
    assert data["outputs"]["ngram@2"] == data["outputs"]["target"]
    for bad in ("0", "65", "x"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["--suffix-pattern", bad])


def test_a_storage_kept_from_run_to_run_is_caught(tiny_pair, tmp_path, monkeypatch):
    """Mutation: the executor never empties a variant's storage; repeat 2 sees repeat 1."""
    from bench.executor import Executor

    real = Executor._own_storage
    monkeypatch.setattr(Executor, "_own_storage", lambda self, variant, options, fresh: real(self, variant, options, False))
    seen = _spy_storages(monkeypatch)
    _bench_run(tiny_pair, tmp_path, REPEATED, ["--strategies", "ngram", "--ngram-storage", "suffix", "--gamma", "2",
                                               "--repeats", "2", "--warmup", "0"])
    with pytest.raises(AssertionError):
        check_fresh_every_run(seen, runs=2)


CONVERSATIONS = [
    {"question_id": 81, "category": "writing", "turns": ["the cat sat on the mat.", "now the cat sat again."]},
    {"question_id": 82, "category": "coding", "turns": ["def f(x): return x", "and def g(x): return f(x)"]},
    {"question_id": 83, "category": "coding", "turns": ["only one turn"]},
]


def test_conversation_ids_hold_the_earlier_turns_and_answers():
    from bench.prompts import conversation_ids
    from tests.helpers.tokenizers import word_tokenizer

    chat = word_tokenizer()
    answer = chat("w7 w8 w9", add_special_tokens=False).input_ids
    from utils.vocab import template_ids

    ids = conversation_ids(chat, ["w1 w2", "w3"], [answer + [chat.eos_token_id]])   # the end token is left out
    assert ids == template_ids(chat, [{"role": "user", "content": "w1 w2"},
                                      {"role": "assistant", "content": "w7 w8 w9"},
                                      {"role": "user", "content": "w3"}])
    assert chat.decode(ids).count("<|im_start|>") == 4
    plain = word_tokenizer(template=None)
    first = chat_ids(plain, "w1 w2", chat=False)
    assert conversation_ids(plain, ["w1 w2", "w3"], [[9, 10]], chat=False) == first + [9, 10] + \
        plain("\n\nw3", add_special_tokens=False).input_ids
    assert conversation_ids(chat, ["w1 w2"], []) == chat_ids(chat, "w1 w2")
    with pytest.raises(ValueError):
        conversation_ids(chat, ["w1", "w2"], [])


def check_conversations(data: dict, seen: list[dict], tokenizer) -> None:
    """Turn 2's prompt holds turn 1 and the variant's own answer to it; the suffix storage starts
    each conversation empty and carries exactly that variant's turn-1 output into turn 2."""
    from bench.prompts import conversation_ids

    outputs = data["outputs"]
    runs = [r for r in data["runs"]]
    assert {(r["session"], r["position"], r["prompt_id"]) for r in runs} == \
        {("81", 1, "81/1"), ("81", 2, "81/2"), ("82", 1, "82/1"), ("82", 2, "82/2")}
    turns = {str(c["question_id"]): c["turns"] for c in CONVERSATIONS[:2]}
    for r in runs:                                             # every variant, ours and the peers
        want = conversation_ids(tokenizer, turns[r["session"]][:r["position"]],
                                [outputs[r["variant"]][f"{r['session']}/1"]][:r["position"] - 1])
        assert r["prompt_tokens"] == len(want), r
    first_ids = {tuple(chat_ids(tokenizer, t[0])) for t in turns.values()}
    for s in seen:
        if tuple(s["prompt"]) in first_ids:                   # turn 1: a fresh storage
            assert s["held"] == 0 and s["outputs"] == [], s["outputs"]
        else:                                                  # turn 2: turn 1's output, and only it
            session = next(q for q, t in turns.items()
                           if s["prompt"] == conversation_ids(tokenizer, t, [outputs["ngram@2"][f"{q}/1"]]))
            assert s["outputs"] == [outputs["ngram@2"][f"{session}/1"]]


def _multi_turn(pair, tmp_path, *flags) -> dict:
    return _bench_run(pair, tmp_path, CONVERSATIONS, ["--multi-turn", "--strategies", "ngram", "--ngram-storage",
                                                      "suffix", "--gamma", "2", *flags])


def test_multi_turn_conversations_keep_state_within_and_report_each_turn(tiny_pair, tmp_path, monkeypatch):
    seen = _spy_storages(monkeypatch)
    data = _multi_turn(tiny_pair, tmp_path, "--peers", "--repeats", "2", "--warmup", "1")
    check_conversations(data, seen, tiny_pair.tokenizer)
    assert len(seen) == 2 + 2 * 2 * 2                          # warm-up: one conversation; 2 repeats x 2 x 2 turns
    for prompt_id, tokens in data["outputs"]["target"].items():
        assert data["outputs"]["ngram@2"][prompt_id] == tokens == data["outputs"]["hf_prompt_lookup@2"][prompt_id]
    rows = {(r["variant"], r["category"], r["position"]): r for r in data["summary"]}
    assert rows[("ngram@2", "all", 1)]["prompts"] == rows[("ngram@2", "all", 2)]["prompts"] == 2
    assert rows[("target", "all", 2)]["speedup"] == pytest.approx(1.0)
    assert rows[("ngram@2", "all", 2)]["acceptance_rate"] is not None
    assert rows[("ngram@2", "all", None)]["prompts"] == 4
    assert data["settings"]["multi_turn"] and data["settings"]["sessions"] == 2
    md = data["summary_md"]
    assert "per turn of the session" in md and "| Strategy | turn 1 | turn 2 |" in md
    assert "multi-turn, 2 conversations" in md


@pytest.mark.parametrize("always", [True, False])
def test_conversation_state_reset_at_every_turn_or_never_is_caught(tiny_pair, tmp_path, monkeypatch, always):
    """Mutations: every turn fresh (turn 2 forgets turn 1), or none (a conversation sees the last one)."""
    from bench.executor import Executor

    real = Executor.run
    monkeypatch.setattr(Executor, "run", lambda self, variant, ids, fresh=True, **where:
                        real(self, variant, ids, fresh=always, **where))
    seen = _spy_storages(monkeypatch)
    data = _multi_turn(tiny_pair, tmp_path, "--repeats", "1", "--warmup", "0")
    with pytest.raises(AssertionError):
        check_conversations(data, seen, tiny_pair.tokenizer)


def test_multi_turn_and_session_flags_refuse_in_one_line(tiny_pair, tmp_path, capsys):
    from bench.cli import main

    for flags, message in ((["--multi-turn"], "--multi-turn needs a prompt file"),
                           (["--multi-turn", "--session-size", "2"], "do not go together"),
                           (["--multi-turn", "--turn", "2"], "leave --turn out")):
        code = main(flags + ["--out", str(tmp_path)], loader=lambda args: tiny_pair)
        err = capsys.readouterr().err
        assert code == 2 and message in err and "Traceback" not in err, flags


def test_task_sessions_keep_state_across_prompts_and_report_each_position(tiny_pair, tmp_path, monkeypatch):
    """--session-size 2: prompts of one category run two in a row; the second finds the first's
    output in the suffix storage (the basic one keeps its counts); reported per position."""
    lines = [{"question_id": i, "category": "summarization", "turns": [f"the cat sat {i}. the cat sat."]}
             for i in range(1, 4)] + [{"question_id": 9, "category": "chat", "turns": ["hello hello there"]}]
    seen = _spy_storages(monkeypatch)
    data = _bench_run(tiny_pair, tmp_path, lines, ["--session-size", "2", "--strategies", "ngram", "--ngram-storage",
                                                   "suffix,basic", "--gamma", "2", "--repeats", "1", "--warmup", "1"])
    sessions = {(r["prompt_id"], r["session"], r["position"]) for r in data["runs"]}
    assert sessions == {("1", "summarization#1", 1), ("2", "summarization#1", 2), ("3", "summarization#2", 1),
                        ("9", "chat#1", 1)}
    outputs = data["outputs"]["ngram[suffix]@2"]
    suffix = [s for s in seen if s["kind"] == "suffix"]
    assert len(suffix) == 2 + 4                               # warm-up on the first session, then every prompt
    second = [s for s in suffix if s["held"] > 0]
    assert len(second) == 2 and all(s["outputs"] == [outputs["1"]] for s in second)
    assert all(s["outputs"] == [] for s in suffix if s["held"] == 0)
    assert sum(s["held"] > 0 for s in seen if s["kind"] == "basic") == 2
    rows = {(r["variant"], r["position"]): r for r in data["summary"] if r["category"] == "all"}
    assert rows[("ngram[suffix]@2", 1)]["prompts"] == 3 and rows[("ngram[suffix]@2", 2)]["prompts"] == 1
    assert "| Strategy | prompt 1 | prompt 2 |" in data["summary_md"]
    assert "sessions of 2 prompts (3)" in data["summary_md"]


def test_per_position_rows_pair_each_position_with_target_at_that_position():
    """Hand-built: NASD twice target AR's speed at position 1, four times at position 2."""
    records = []
    for position, seconds in ((1, 0.5), (2, 0.25)):
        for r in range(2):
            records.append(replace(_rec("target", f"p{position}", "chat", r, 10, 1.0), session="s", position=position))
            records.append(replace(_rec("ngram@4", f"p{position}", "chat", r, 10, seconds, drafted=4, accepted=position),
                                   session="s", position=position))
    rows = summarize(records, greedy=True)
    at = {(row.variant, row.position): row for row in rows if row.category == ALL}
    assert at[("ngram@4", 1)].speedup == pytest.approx(2.0) and at[("ngram@4", 2)].speedup == pytest.approx(4.0)
    assert at[("ngram@4", 1)].acceptance_rate == pytest.approx(0.25)
    assert at[("ngram@4", None)].speedup == pytest.approx(20 / 0.75 / 10)
    md = markdown_report(["header"], rows, [], "turn")
    assert "| NASD γ=4 | 20.0 (2.00×, 25%) | 40.0 (4.00×, 50%) |" in md
    assert md.count("| NASD | 4 |") == 1                       # the main table: every position once


# ------------------------------------------------------------- ArcticInference's suffix cache as a peer

class _FakeArcticCache:
    """ArcticInference's SuffixDecodingCache API, drafting by prompt lookup over the request's text."""

    made: list = []

    def __init__(self, max_tree_depth=64, max_cached_requests=-1):
        self.max_tree_depth = max_tree_depth
        self.prompts, self.responses, self.started = {}, {}, []
        _FakeArcticCache.made.append(self)

    @property
    def active_requests(self):
        return self.prompts.keys()

    def start_request(self, req_id, prompt_token_ids):
        self.started.append(len(self.responses))             # responses it knew then
        self.prompts[req_id], self.responses[req_id] = list(prompt_token_ids), []

    def stop_request(self, req_id):
        del self.prompts[req_id]

    def add_active_response(self, req_id, token_ids):
        self.responses[req_id] += list(token_ids)

    def speculate(self, req_id, context, max_spec_tokens=None, max_spec_factor=1.0, min_token_prob=0.1):
        seq = self.prompts[req_id] + self.responses[req_id]
        assert list(context) == seq[-len(context):]
        for start in range(len(seq) - 3, -1, -1):
            if seq[start:start + 2] == seq[-2:]:
                return types.SimpleNamespace(token_ids=seq[start + 2:start + 2 + max_spec_tokens])
        return types.SimpleNamespace(token_ids=[])


def test_arctic_suffix_peer_drafts_through_our_loop_fresh_each_run(tiny_pair, tmp_path, monkeypatch):
    import sys

    fake = types.ModuleType("arctic_inference.suffix_decoding")
    fake.SuffixDecodingCache = _FakeArcticCache
    monkeypatch.setitem(sys.modules, "arctic_inference", types.ModuleType("arctic_inference"))
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", fake)
    monkeypatch.setattr(_FakeArcticCache, "made", [])
    data = _bench_run(tiny_pair, tmp_path, REPEATED, ["--strategies", "ngram", "--ngram-storage", "suffix",
                                                      "--arctic-suffix", "--gamma", "2", "--repeats", "2"])
    assert data["variants"] == ["target", "ngram@2", "arctic_suffix@2"]
    assert data["outputs"]["arctic_suffix@2"] == data["outputs"]["target"]
    runs = [r for r in data["runs"] if r["variant"] == "arctic_suffix@2"]
    assert all(r["family"] == "peer" and r["drafted"] > 0 and r["accepted"] > 0 for r in runs)
    assert len(_FakeArcticCache.made) == 3                    # warm-up + 2 repeats: a new cache each
    assert all(c.started == [0] and c.max_tree_depth == 32 for c in _FakeArcticCache.made)
    assert "Arctic suffix" in data["summary_md"]


def test_arctic_suffix_peer_that_cannot_be_imported_is_one_line(tiny_pair, tmp_path, monkeypatch, capsys):
    import sys

    from bench.cli import main

    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)   # import fails
    code = main(["--arctic-suffix", "--strategies", "ngram", "--out", str(tmp_path)],
                loader=lambda args: pytest.fail("loaded"))
    err = capsys.readouterr().err
    assert code == 2 and "arctic_suffix:" in err and "docs/model_free.md" in err and "Traceback" not in err


def test_arctic_suffix_peer_with_the_real_cache_is_lossless_and_fresh(tiny_pair, tmp_path):
    """Where arctic-inference is installed: its cache drafts, our loop keeps greedy output exact,
    and each repeat drafts alike (a fresh cache each run, none of the earlier repeat's output)."""
    pytest.importorskip("arctic_inference.suffix_decoding")
    data = _bench_run(tiny_pair, tmp_path, REPEATED, ["--strategies", "ngram", "--ngram-storage", "suffix",
                                                      "--arctic-suffix", "--gamma", "3", "--repeats", "2",
                                                      "--warmup", "0"])
    assert data["outputs"]["arctic_suffix@3"] == data["outputs"]["target"]
    runs = {r["repeat"]: r for r in data["runs"] if r["variant"] == "arctic_suffix@3"}
    assert runs[0]["drafted"] > 0 and runs[0]["acceptance"] == runs[1]["acceptance"]


def test_lookahead_variants_names_plan_and_flag():
    """--strategies ...,lookahead runs one variant per --lookahead W:N:G (γ N - 1, no peer, one verify
    rule); it is opt-in, and a bad shape is one line."""
    from bench.cli import build_parser

    names = [v.name for v in plan_variants(["ngram", "lookahead"], [2], peers=True, verifies=["residual", "block"],
                                           lookaheads=[(5, 3, 5), (4, 4, 3)])]
    assert names == ["target", "hf_generate", "ngram@2~residual", "hf_prompt_lookup@2", "ngram@2",
                     "lookahead[5,3,5]@2", "lookahead[4,4,3]@3"]
    variant = parse_variant_name("lookahead[4,4,3]@3")
    assert variant == Variant("lookahead", 3, shape="4,4,3") and variant.name == "lookahead[4,4,3]@3"
    assert variant.lookahead_shape == (4, 4, 3) and variant.peer is None
    assert variant.label == "lookahead W=4 N=4 G=3"
    assert [v.name for v in plan_variants(["lookahead"], [2, 4], peers=False)] == ["target", "lookahead[5,3,5]@2"]
    parser = build_parser()
    assert "lookahead" not in parser.parse_args([]).strategies
    assert parser.parse_args(["--lookahead", "5:3:5, 7:4:7,5:3:5"]).lookahead == [(5, 3, 5), (7, 4, 7)]
    for bad in ("5:2:5", "5,3,5", "0:3:5", "5:3:x", ","):
        with pytest.raises(SystemExit):
            parser.parse_args(["--lookahead", bad])
    strategy = our_strategy(variant, processor=GreedyProcessor(), max_gen_len=8, ngram=NGramOptions())
    assert (strategy.drafter, strategy.gamma, strategy.tree) == ("lookahead", 3, 9)
    assert (strategy.drafter_options.window, strategy.drafter_options.ngram, strategy.drafter_options.guesses) == \
        (4, 4, 3)


def _spy_lookahead_pools(monkeypatch) -> list[int]:
    """How many n-grams the pool held when each lookahead generation began."""
    from ngram_assisted.lookahead import LookaheadDrafter

    held = []
    real = LookaheadDrafter.__init__

    def spy(self, window, ngram, guesses, pool, *args, **kwargs):
        held.append(len(pool))
        real(self, window, ngram, guesses, pool, *args, **kwargs)
    monkeypatch.setattr(LookaheadDrafter, "__init__", spy)
    return held


LOOPING = [{"question_id": 1, "category": "summarization",
            "turns": ["ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab ab"]}]


def test_lookahead_runs_lossless_from_an_empty_pool_every_run(tiny_pair, tmp_path, monkeypatch):
    """Greedy lookahead decoding in the benchmark: the target's tokens, drafts verified, and each run
    (warm-up and repeats) starts from an empty n-gram pool, so repeats draft alike."""
    held = _spy_lookahead_pools(monkeypatch)
    data = _bench_run(tiny_pair, tmp_path, LOOPING, ["--strategies", "lookahead", "--lookahead", "3:3:4",
                                                     "--length", "24", "--repeats", "2", "--warmup", "1"])
    name = "lookahead[3,3,4]@2"
    assert data["variants"] == ["target", name]
    assert data["outputs"][name] == data["outputs"]["target"]
    runs = [r for r in data["runs"] if r["variant"] == name]
    assert len(runs) == 2 and all(r["drafted"] > 0 for r in runs)
    assert runs[0]["acceptance"] == runs[1]["acceptance"]
    assert held == [0, 0, 0]
    assert data["settings"]["lookahead"] == ["3:3:4"]
    assert "| lookahead W=3 N=3 G=4 |" in data["summary_md"]


def test_a_lookahead_pool_kept_from_run_to_run_is_caught(tiny_pair, tmp_path, monkeypatch):
    """Mutation: the executor hands every run fresh=False; the second run's pool is not empty."""
    import bench.executor

    real = bench.executor.our_strategy
    monkeypatch.setattr(bench.executor, "our_strategy", lambda *a, **k: real(*a, **{**k, "fresh": False}))
    held = _spy_lookahead_pools(monkeypatch)
    _bench_run(tiny_pair, tmp_path, LOOPING, ["--strategies", "lookahead", "--lookahead", "3:3:4",
                                              "--length", "24", "--repeats", "2", "--warmup", "0"])
    assert held[0] == 0 and held[1] > 0


def test_the_header_says_when_greedy_identity_meets_half_precision():
    """A half-precision target under greedy gets one line on why outputs may differ; float32 and
    sampling do not."""
    from bench.meta import header_lines

    env = {"date": "d", "device": "cpu", "cpu": "c", "torch_threads": 2, "torch": "t", "transformers": "x",
           "target": "T", "drafter": "D", "drafter_dtype": "bfloat16"}
    settings = {"processor": "greedy", "length": 8, "prompt_count": 1, "prompts": "builtin", "repeats": 1,
                "warmup": 0, "seed": 0, "chat": True, "ngram_storage": "basic", "ngram_n": 3}
    for dtype, processor, noted in (("bfloat16", "greedy", True), ("float16", "greedy", True),
                                    ("float32", "greedy", False), ("bfloat16", "multinomial 1.0", False)):
        lines = header_lines({**env, "target_dtype": dtype}, {**settings, "processor": processor})
        assert any("rounds differently" in line and dtype in line for line in lines) == noted, (dtype, processor)


def test_an_output_folder_that_cannot_be_written_is_one_line_before_anything_runs(tmp_path, capsys):
    from bench.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code = main(["--limit", "1", "--out", str(blocker / "out")], loader=lambda args: pytest.fail("loaded"))
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write to --out") and err.count("\n") == 1 and "Not a directory" in err


@pytest.mark.parametrize("argv, message", [(["--ngram-n", "1"], "--ngram-n: expected an integer from 2 to 16"),
                                           (["--ngram-n", "17"], "from 2 to 16, got '17'"),
                                           (["--suffix-pattern", "65"], "from 1 to 64, got '65'")])
def test_range_flags_take_the_repl_commands_bounds(argv, message, capsys):
    from bench.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------ the copy ceiling

def _spy_ceilings(monkeypatch) -> list[tuple]:
    """Every (prompt, output, gamma, length, match) the benchmark asks the ceiling of."""
    import bench.ceiling

    asked = []
    real = bench.ceiling.copy_ceiling

    def spy(prompt, output, gamma, length, *, match):
        asked.append((list(prompt), list(output), gamma, length, match))
        return real(prompt, output, gamma, length, match=match)
    monkeypatch.setattr(bench.ceiling, "copy_ceiling", spy)
    return asked


def test_the_copy_ceiling_is_target_ars_outputs_over_the_prompts(tiny_pair, tmp_path, monkeypatch):
    from analysis.ceiling import copy_ceiling

    asked = _spy_ceilings(monkeypatch)
    lines = REPEATED + [{"question_id": 2, "category": "qa", "turns": ["a b c a b d a b c a b"]}]
    data = _bench_run(tiny_pair, tmp_path, lines, ["--strategies", "ngram,target", "--ngram-storage", "suffix",
                                                   "--gamma", "2,3", "--repeats", "2", "--peers"])
    runs = {(r["variant"], r["prompt_id"]): r for r in data["runs"] if r["repeat"] == 0}
    assert set(data["copy_ceiling"]) == {"2", "3"} and len(asked) == 2 * 2 * 2      # γ x match x prompt
    for gamma in (2, 3):
        entry = data["copy_ceiling"][str(gamma)]
        for match in (1, 2):
            # the prompts' own ids (as many as each run read) and target AR's first-repeat output
            pairs = [(prompt, output) for prompt, output, g, length, m in asked if (g, m) == (gamma, match)]
            assert sorted(map(len, (p for p, _ in pairs))) == sorted(
                runs[("target", pid)]["prompt_tokens"] for pid in data["outputs"]["target"])
            assert sorted(o for _, o in pairs) == sorted(data["outputs"]["target"].values())
            ceilings = [copy_ceiling(p, o, gamma, 8, match=match) for p, o in pairs]
            assert entry[f"after_{match}"] == pytest.approx(sum(c.tokens for c in ceilings) / sum(c.calls for c in ceilings))
        assert entry["prompts"] == 2 and entry["after_1"] >= entry["after_2"]
        ours = next(r for r in data["summary"] if r["variant"] == f"ngram@{gamma}" and r["category"] == "all")
        assert entry["after_1"] >= ours["tokens_per_target_call"]           # a bound on the suffix storage
        assert f"γ {gamma}: {entry['after_1']:.2f} after a 1-token match" in data["summary_md"]


def test_no_copy_ceiling_under_sampling(tiny_pair, tmp_path, monkeypatch):
    asked = _spy_ceilings(monkeypatch)
    data = _bench_run(tiny_pair, tmp_path, REPEATED, ["--strategies", "ngram,target", "--ngram-storage", "suffix",
                                                      "--gamma", "2", "--repeats", "1",
                                                      "--processor", "multinomial 1.0"])
    assert data["copy_ceiling"] == {} and asked == [] and "copy ceiling" not in data["summary_md"]


def test_a_later_turns_ceiling_reads_the_conversation_with_target_ars_answers(tiny_pair, tmp_path, monkeypatch):
    from analysis.ceiling import copy_ceiling
    from bench.prompts import conversation_ids

    asked = _spy_ceilings(monkeypatch)
    data = _multi_turn(tiny_pair, tmp_path, "--repeats", "1")
    outputs = data["outputs"]["target"]
    turns = {str(q["question_id"]): q["turns"] for q in CONVERSATIONS if len(q["turns"]) > 1}
    expected = []
    for question, texts in turns.items():
        expected.append((conversation_ids(tiny_pair.tokenizer, texts[:1], []), outputs[f"{question}/1"]))
        expected.append((conversation_ids(tiny_pair.tokenizer, texts, [outputs[f"{question}/1"]]),
                         outputs[f"{question}/2"]))
    assert sorted((p, o) for p, o, g, length, m in asked if m == 1) == sorted(expected)
    entry = data["copy_ceiling"]["2"]
    assert entry["prompts"] == 4 and set(entry["by_turn"]) == {"1", "2"}
    assert entry["by_turn"]["1"]["prompts"] == entry["by_turn"]["2"]["prompts"] == 2
    for turn, pairs in (("1", expected[0::2]), ("2", expected[1::2])):
        ceilings = [copy_ceiling(p, o, 2, 8, match=2) for p, o in pairs]
        assert entry["by_turn"][turn]["after_2"] == pytest.approx(
            sum(c.tokens for c in ceilings) / sum(c.calls for c in ceilings))
    assert "(turn 1: " in data["summary_md"] and ", turn 2: " in data["summary_md"]
