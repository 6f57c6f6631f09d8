"""The speedup model prices a run by what was measured (docs/why.md, "Where the inputs come from").

Each test builds runs by hand whose every round cost is known, so the speedup the runs really had
(decode part against decode part) is known too, and checks that the prediction lands on it where
the old pricing did not:

- with target AR off, the plain step is the one timed at load, not the run's one verify width
  (a verify of 5 tokens taken for a plain step made 2.84x of a 1.6x run);
- lookahead's rounds that verify no candidate still feed the Jacobi window, and cost that;
- a prediction that rests on an input nobody measured says so (``estimated``);
- target AR's plain step is its decode part, not its seconds over its tokens (prefill included).

Mutation checks (each run by hand, each made a test fail): ``PromptRun.plain_step`` without its
load branch; ``RoundMix.width`` without ``rows``; ``verify_width`` without the window rows;
``ar_step_from_result`` without the decode branch; ``estimated_inputs`` returning [] always;
lookahead searched for a γ (``no_gamma`` False); lookahead priced at a constant γ.
"""

from __future__ import annotations

import pytest

from analysis.speedup import RoundMix, ar_step_from_result, estimated_inputs, CostModel
from generation.result import GenerationResult, Round
from repl import render
from repl.runs import PromptRun, StrategyRun
from repl.settings import Settings

STEP = 0.037          # the target's plain step (s): what target AR pays per token after its first
VERIFY_5 = 0.070      # a verify of 4 drafts + 1
DRAFT = 0.005         # one drafter step
OTHER = 0.001         # host work per round
ACCEPTED = [4, 2, 0, 3, 1, 4, 2, 2, 0, 4]  # a round's accepted drafts, repeated


def run_of(rounds: list[Round], other: float = OTHER, tree: int = 0) -> GenerationResult:
    """A result whose seconds, phases and time to first token are its rounds' (``other`` per round)."""
    tokens = [7] * sum(r.accepted + (r.token is not None) for r in rounds)
    draft = sum(r.draft_s for r in rounds)
    verify = sum(r.verify_s for r in rounds)
    first = rounds[0]
    return GenerationResult(
        tokens=tokens, drafted=sum(len(r.drafted) for r in rounds), accepted=sum(r.accepted for r in rounds),
        target_calls=len(rounds), rounds=len(rounds), seconds=draft + verify + other * len(rounds),
        trace=rounds, phases={"draft": draft, "verify": verify, "other": other * len(rounds)}, tree=tree,
        first_token_s=first.draft_s + first.verify_s + other, first_tokens=first.accepted + 1,
        gamma_policy="constant")


def target_ar(tokens: int, prefill_s: float = 0.15) -> GenerationResult:
    """Target AR: a prefill round, then one plain step of ``STEP`` per token."""
    return run_of([Round((), 0, 7, False, verify_s=prefill_s)] + [Round((), 0, 7, False, verify_s=STEP)] * (tokens - 1),
                  other=0.0)


def speculative(rounds: int = 40) -> GenerationResult:
    """γ 4 every round, each verify 5 wide at ``VERIFY_5``; the first round carries the prefill."""
    trace = [Round((1, 2, 3, 4), 4, 7, True, gamma=4, draft_s=0.05, verify_s=0.2)]
    for i in range(rounds - 1):
        a = ACCEPTED[i % len(ACCEPTED)]
        trace.append(Round((1, 2, 3, 4), a, 7, a == 4, gamma=4, draft_s=4 * DRAFT, verify_s=VERIFY_5))
    return run_of(trace)


def decode_speedup(run: GenerationResult, base: GenerationResult) -> float:
    """What the runs really did: decode tokens/s over decode tokens/s."""
    return run.decode_tokens_per_second / base.decode_tokens_per_second


def prompt_run(*runs: StrategyRun, load_step_s: float | None = None, **settings) -> PromptRun:
    pr = PromptRun("p", [1, 2], greedy=True, settings=Settings(gamma=4, **settings).to_dict(),
                   load_step_s=load_step_s)
    pr.runs = list(runs)
    return pr


# ------------------------------------------------------------ target AR off

def test_with_target_ar_off_the_plain_step_timed_at_load_prices_the_prediction():
    spec = speculative()
    truth = decode_speedup(spec, target_ar(200))
    pr = prompt_run(StrategyRun("speculative", spec), load_step_s=STEP, target=False)
    why = pr.why(pr.runs[0])
    assert why.cost_source == "load" and why.plain_step_s == STEP
    assert why.estimated == []                        # widths 1 (load) and 5 (the run): both measured
    assert why.predicted == pytest.approx(truth, rel=0.03)
    # The old pricing, the run's one verify width for every width: verify(1) = verify(5).
    unpriced = prompt_run(StrategyRun("speculative", spec), target=False).why(pr.runs[0])
    assert unpriced.predicted / truth == pytest.approx(VERIFY_5 / STEP, rel=0.03)   # 1.9 times too high
    assert unpriced.cost_source == "estimated" and unpriced.estimated == ["plain step"]


def test_target_ar_this_prompt_is_preferred_to_the_load_time_step():
    spec, base = speculative(), target_ar(150)
    pr = prompt_run(StrategyRun("speculative", spec), StrategyRun("target", base), load_step_s=0.5)
    why = pr.why(pr.runs[0])
    assert why.cost_source == "target AR" and why.plain_step_s == pytest.approx(STEP)
    assert why.predicted_steady == pytest.approx(decode_speedup(spec, base), rel=0.03)
    assert pr.decode_speedup(pr.runs[0]) == pytest.approx(decode_speedup(spec, base))


def test_the_panel_and_the_json_say_where_the_plain_step_came_from_and_what_was_estimated():
    from tests.helpers.repl import WordTokenizer, console

    spec = speculative()
    for load, source, words, estimated in ((STEP, "load", "plain step: measured at load, 37 ms", []),
                                           (None, "estimated", "plain step: estimated", ["plain step"])):
        pr = prompt_run(StrategyRun("speculative", spec, text="x"), load_step_s=load, target=False)
        entry = pr.to_dict()["strategies"]["speculative"]
        assert entry["prediction_cost_source"] == source and entry["prediction_estimated"] == estimated
        assert pr.to_dict()["plain_step_at_load_s"] == load
        c, out = console()
        c.print(render.strategy_panel(pr.runs[0], pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
        text = " ".join(line.strip("│ ") for line in out.getvalue().splitlines())
        assert words in text
        assert (f"{render.ratio_text(pr.why(pr.runs[0]).predicted_steady)} (est.)" in text) == bool(estimated)
        cells = render.comparison_cells(pr, pr.runs[0])
        assert any("(est.)" in cell for cell in cells) == bool(estimated)


# ------------------------------------------------------------ the interval of a prediction without target AR

VERIFY_SPREAD = (0.060, 0.070, 0.066, 0.090, 0.064)     # a round's verify of 5 (s), cycled
DRAFT_SPREAD = (0.004, 0.005, 0.007)                   # a round's drafter step (s), cycled
STEP_SAMPLES = (0.033, 0.037, 0.046)                   # the load-time step's turns (median STEP)


def spread_run(rounds: int = 41) -> GenerationResult:
    """γ 4 every round; the verify and drafter costs vary from round to round by a known spread."""
    trace = [Round((1, 2, 3, 4), 4, 7, True, gamma=4, draft_s=0.05, verify_s=0.2)]
    for i in range(rounds - 1):
        a = ACCEPTED[i % len(ACCEPTED)]
        trace.append(Round((1, 2, 3, 4), a, 7, a == 4, gamma=4, draft_s=4 * DRAFT_SPREAD[i % 3],
                           verify_s=VERIFY_SPREAD[i % 5]))
    return run_of(trace)


def quartiles(values) -> tuple[float, float]:
    import statistics
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def test_a_prediction_without_target_ar_carries_the_spread_of_what_it_priced():
    spec = spread_run()
    pr = prompt_run(StrategyRun("speculative", spec), load_step_s=STEP, target=False)
    pr.load_step_samples = STEP_SAMPLES
    why = pr.why(pr.runs[0])
    assert why.cost_source == "load" and why.plain_step_s == STEP
    # By hand: predicted = E * step / (4 d + v + other), the means of d and v priced; E read back from it.
    steady = spec.trace[1:]
    mean_v = sum(r.verify_s for r in steady) / len(steady)
    mean_d = sum(r.draft_s for r in steady) / (4 * len(steady))
    tokens = why.predicted * (4 * mean_d + mean_v + OTHER) / STEP
    v_low, v_high = quartiles([r.verify_s for r in steady])
    d_low, d_high = quartiles([r.draft_s / 4 for r in steady])
    low = tokens * min(STEP_SAMPLES) / (4 * d_high + v_high + OTHER)
    high = tokens * max(STEP_SAMPLES) / (4 * d_low + v_low + OTHER)
    assert why.predicted_interval == pytest.approx((low, high), rel=1e-9)
    assert low < why.predicted < high
    assert high / low > 1.3                              # the step's spread alone is 0.033 to 0.046


def test_the_interval_is_kept_only_when_target_ar_did_not_price_the_prediction():
    spec, base = spread_run(), target_ar(150)
    with_ar = prompt_run(StrategyRun("speculative", spec), StrategyRun("target", base), load_step_s=STEP)
    with_ar.load_step_samples = STEP_SAMPLES
    assert with_ar.why(with_ar.runs[0]).predicted_interval is None
    assert with_ar.to_dict()["strategies"]["speculative"]["predicted_interval"] is None
    # Without a load-time step the run's own rounds price it: still an interval, over their spread.
    own = prompt_run(StrategyRun("speculative", spec), target=False).why(with_ar.runs[0])
    assert own.cost_source == "estimated" and own.predicted_interval is not None
    low, high = own.predicted_interval
    assert low <= own.predicted <= high


def test_the_panel_the_comparison_and_the_json_show_the_interval():
    from repl.trace import _prompt, prompt_record
    from tests.helpers.repl import WordTokenizer, console

    pr = prompt_run(StrategyRun("speculative", spread_run(), text="x"), load_step_s=STEP, target=False)
    pr.load_step_samples = STEP_SAMPLES
    pr.finish()
    low, high = pr.why(pr.runs[0]).predicted_interval
    shown = f"[{low:.2f}-{high:.2f}x]"
    record = pr.to_dict()
    assert record["strategies"]["speculative"]["predicted_interval"] == [low, high]
    assert record["plain_step_at_load_samples_s"] == list(STEP_SAMPLES)
    c, out = console()
    c.print(render.strategy_panel(pr.runs[0], pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    assert shown in " ".join(line.strip("│ ") for line in out.getvalue().splitlines())
    assert any(shown in cell for cell in render.comparison_cells(pr, pr.runs[0]))
    back = _prompt(prompt_record(pr))
    assert back.load_step_samples == STEP_SAMPLES
    assert back.why(back.runs[0]).predicted_interval == pytest.approx((low, high))


# ------------------------------------------------------------ lookahead

WINDOW = 9          # W 5, N 3: (W - 1) + (N - 2) W rows
LOOKAHEAD_EMPTY = 0.070   # a round with no candidate: root + 9 window rows
LOOKAHEAD_FULL = 0.085    # a round with a 4-node tree: 14 rows


def lookahead_round(nodes: int, accepted: int, verify_s: float, rows: int | None = WINDOW) -> Round:
    """A lookahead round: a chain of ``nodes`` candidate nodes (or none), ``rows`` window rows fed."""
    note = {"candidates": 1 if nodes else 0, "pool": 10}
    if rows is not None:
        note["rows"] = rows
    tree = tuple(range(1, nodes + 1))
    return Round(tree[:max(accepted, min(nodes, accepted + 1))], accepted, 7, nodes > 0 and accepted == nodes,
                 gamma=2, verify_s=verify_s, tree_tokens=tree, tree_parents=tuple(range(-1, nodes - 1)),
                 path=tree[:accepted], ranks=(0,) * accepted, note=note)


def lookahead(rounds: int = 60, rows: int | None = WINDOW) -> GenerationResult:
    """Most rounds find no candidate (3 in 4); those that do verify 4 nodes and keep 2."""
    trace = [lookahead_round(0, 0, 0.25, rows)]
    for i in range(rounds - 1):
        trace.append(lookahead_round(4, 2, LOOKAHEAD_FULL, rows) if i % 4 == 3
                     else lookahead_round(0, 0, LOOKAHEAD_EMPTY, rows))
    return run_of(trace, tree=8)


def test_lookahead_rounds_are_priced_at_the_window_they_fed():
    look = lookahead()
    base = target_ar(len(look.tokens) + 20)
    truth = decode_speedup(look, base)
    assert truth < 0.75                            # the window costs more than its n-grams save
    pr = prompt_run(StrategyRun("lookahead", look), StrategyRun("target", base))
    why = pr.why(pr.runs[0])
    assert why.predicted_steady == pytest.approx(truth, rel=0.03)
    assert why.estimated == [] and why.costs.verify_s.keys() == {1, 1 + WINDOW, 5 + WINDOW}
    # The old pricing: a round that verified no candidate taken for a plain step.
    old = prompt_run(StrategyRun("lookahead", lookahead(rows=None)), StrategyRun("target", base))
    old_why = old.why(old.runs[0])
    assert old_why.predicted_steady > truth * 1.4
    assert old_why.estimated == ["window rows (not recorded)"]


def test_lookahead_has_no_best_gamma():
    from tests.helpers.repl import WordTokenizer, console

    look = lookahead()
    pr = prompt_run(StrategyRun("lookahead", look, text="x"), StrategyRun("target", target_ar(60), text="x"),
                    rtt=20.0)
    why = pr.why(pr.runs[0])
    assert why.best_gamma is None and why.best_speedup is None and why.no_gamma
    assert why.what_if is not None and why.what_if.best_gamma is None
    assert render.comparison_cells(pr, pr.runs[0])[render_column("best γ")] == "-"
    assert pr.to_dict()["strategies"]["lookahead"]["best_gamma"] is None
    c, out = console()
    c.print(render.strategy_panel(pr.runs[0], pr.prompt_ids, WordTokenizer(), debug=False, prompt_run=pr))
    text = " ".join(line.strip("│ ") for line in out.getvalue().splitlines())
    assert "best gamma -" in text and "best gamma 16" not in text and "None" not in text
    assert why.tree is None and "best tree" not in text       # nor a tree budget: G sets its tree


def render_column(header: str) -> int:
    return [h for h, _ in render.COMPARISON_COLUMNS].index(header)


# ------------------------------------------------------------ estimated inputs, decode parts

def test_estimated_inputs_name_each_width_no_round_measured():
    mix = RoundMix({4: 0.5, 2: 0.25, 0: 0.25}, {4: 3.0, 2: 2.0, 0: 1.0})
    assert estimated_inputs(mix, CostModel(0.01, {1: 0.04, 5: 0.07, 3: 0.05})) == []
    assert estimated_inputs(mix, CostModel(0.01, {5: 0.07})) == ["plain step", "verify at width 3"]
    window = RoundMix({0: 1.0}, {0: 1.0}, rows=9)
    assert estimated_inputs(window, CostModel(0.0, {1: 0.04})) == ["verify at width 10"]


def test_target_ar_plain_step_is_its_decode_part():
    """A long prompt: target AR's prefill is most of its time. Its rounds carry no verify times
    (a served target), so only the decode part keeps the prefill out of its plain step."""
    base = target_ar(20, prefill_s=3.0)
    timed_out = GenerationResult(tokens=base.tokens, seconds=base.seconds, target_calls=20,
                                 trace=[Round((), 0, 7, False)] * 20,
                                 first_token_s=base.first_token_s, first_tokens=1)
    assert ar_step_from_result(timed_out) == pytest.approx(STEP)
    assert base.seconds / len(base.tokens) > 4 * STEP      # what seconds over tokens would say


# ------------------------------------------------------------ what a live session records

def test_a_live_lookahead_run_records_its_window_and_the_runner_times_the_plain_step_at_load():
    from analysis.acceptance import verify_width
    from engine import pair_of
    from repl.runner import Runner
    from tests.helpers.repl import build_model, build_tokenizer

    settings = Settings(speculative=False, ngram=False, target=False, lookahead=True, lookahead_window=4,
                        lookahead_ngram=4, lookahead_guesses=3, length=16, chat=False)
    tokenizer = build_tokenizer()
    runner = Runner(pair_of(build_model(1, len(tokenizer), context=512), tokenizer=tokenizer))
    runner.load_step_s = runner.time_plain_step()
    assert runner.load_step_s is not None and runner.load_step_s > 0
    assert len(runner.load_step_samples) == 3
    assert min(runner.load_step_samples) <= runner.load_step_s <= max(runner.load_step_samples)
    pr = runner.run(runner.prepare("the cat and the dog and the cat and the", settings), settings)
    assert pr.load_step_s == runner.load_step_s
    trace = pr.runs[0].result.trace
    rows = (4 - 1) + (4 - 2) * 4                      # (W - 1) + (N - 2) W
    assert all(r.note["rows"] == rows for r in trace)
    assert all(verify_width(r) == len(r.tree_tokens) + 1 + rows for r in trace)
    why = pr.why(pr.runs[0])
    assert why.cost_source == "load" and why.plain_step_s == runner.load_step_s and why.best_gamma is None
    assert pr.load_step_samples == runner.load_step_samples and why.predicted_interval is not None
