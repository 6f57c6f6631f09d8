"""Filling verify widths (``/fill_width``, ``NGramOptions.fill_width``): the suffix and sam storages
draw a round's chain longer when a wider verify forward is measured cheaper.

The width rule is checked on cost tables shaped like the ones measured (a CPU whose 2- and 3-row
products cost more than a 5-row one); the drafter on a hand-made sequence; decoding through the
engine's one way in against target AR under greedy and against the exact target distribution under
sampling (chi-square), with rounds really filled and their extra drafts both kept and rejected; the
measurement itself on a tiny model; the refusals; and the REPL, JSON and benchmark ends.
"""

from __future__ import annotations

import json

import pytest
import torch

import engine.drafters
import engine.widths
import generation.accept
from analysis.sources import fill_summary
from advisor.recorded import storage_options
from utils.method_name import STORAGE_NAMES
from bench.variants import Variant, parse_variant_name
from checks.stats import goodness_of_fit
from engine import EngineState, NGramOptions, Strategy, pair_of, run_strategy
from engine.widths import MAX_FILL_WIDTH, fill_refusal, verify_costs
from generation.result import Round
from generation.widths import fill_width
from ngram_assisted import MatchDrafter, SuffixStorage
from generation.served import ServedModel
from repl.commands import execute
from repl.render import fill_text
from repl.runner import strategy_for
from repl.settings import Settings
from sampling import GreedyProcessor, MultinomialProcessor
from tests.helpers.distribution import P_FLOOR, PROMPT as SAMPLING_PROMPT, STEPS, V, exact, target  # noqa: F401 (fixtures)
from tests.helpers.models import tiny_bart, tiny_llama

# Shaped as measured on a 2-core AMD EPYC (ms): 2 and 3 tokens dearer than 4 and 5.
EPYC = {1: 55.0, 2: 92.0, 3: 114.0, 4: 82.0, 5: 74.0, 6: 80.0, 7: 97.0, 8: 76.0, 9: 84.0}
RISING = {w: 50.0 + 10.0 * w for w in range(1, 10)}     # every wider forward dearer: nothing to fill


# ------------------------------------------------------------------ the width rule


def test_a_round_goes_to_the_widest_width_that_costs_less_within_its_limit():
    assert fill_width(EPYC, 2, 9) == 9            # 84 ms for 8 drafts against 92 for 1
    assert fill_width(EPYC, 3, 9) == 9
    assert fill_width(EPYC, 2, 4) == 4            # the round's γ allows 4 at most
    assert fill_width(EPYC, 2, 3) == 2            # 3 costs more than 2
    assert fill_width(EPYC, 1, 9) == 1            # one token is the cheapest forward of all
    assert fill_width(EPYC, 5, 9) == 5            # nothing wider costs less than 74
    assert fill_width(EPYC, 6, 9) == 8            # 76 ms is 5% under 80; 84 is not
    assert [fill_width(RISING, w, 9) for w in RISING] == list(RISING)


def test_a_wider_width_must_be_cheaper_by_the_margin():
    assert fill_width({2: 100.0, 3: 97.0}, 2, 3) == 2          # 3% cheaper: within the noise
    assert fill_width({2: 100.0, 3: 95.0}, 2, 3) == 3          # 5%: filled
    assert fill_width({2: 100.0, 4: 80.0, 5: 96.0}, 2, 5) == 4
    assert fill_width({2: 100.0, 4: 80.0, 5: 90.0}, 2, 5) == 5  # dearer than 4, cheaper than 2
    assert fill_width({2: 100.0, 3: 95.0}, 2, 3, margin=0.1) == 2
    assert fill_width({3: 100.0, 4: 10.0}, 2, 4) == 2          # an unmeasured width is left as it is


# ------------------------------------------------------------------ the drafter


def _drafter(costs):
    storage = SuffixStorage(64, max_pattern=4)
    drafter = MatchDrafter(storage, verify_costs=costs)
    # "5 6" went on as "7 8 9 10" once: a 2-token match drafts 2 tokens at α 1.
    drafter.begin([5, 6, 7, 8, 9, 10, 1, 2, 5, 6])
    return drafter


def test_the_drafter_draws_its_chain_to_the_filled_width_and_notes_how_many_it_added():
    ids = torch.zeros((1, 1), dtype=torch.long)
    plain, _ = _drafter(None).propose(ids, 8)
    assert plain.tolist() == [7, 8]                                  # width 3
    only_five = {**RISING, 5: 50.0}                                  # width 5 alone costs less than 3
    drafter = _drafter(only_five)
    filled, q = drafter.propose(ids, 8)
    assert q is None and filled.tolist() == [7, 8, 9, 10]           # width 5
    drafter.update([7, 11], None)
    assert drafter.report().round_notes == [{"source": "prompt", "match": 2, "filled": 2}]
    rising = _drafter(RISING)
    assert rising.propose(ids, 8)[0].tolist() == [7, 8]
    rising.update([7], None)
    assert rising.report().round_notes == [{"source": "prompt", "match": 2}]


def test_the_drafter_fills_no_further_than_the_storage_can_continue():
    # Width 9 (8 drafts) is asked for; the trie keeps 8 tokens, 2 of them the match.
    drafter = _drafter(EPYC)
    assert drafter.propose(torch.zeros((1, 1), dtype=torch.long), 8)[0].tolist() == [7, 8, 9, 10, 1, 2]
    assert drafter.propose(torch.zeros((1, 1), dtype=torch.long), 3)[0].tolist() == [7, 8, 9]   # limit 4


# ------------------------------------------------------------------ through the engine

V_GREEDY = 64
PROMPT = [8, 5, 17, 33, 1, 8, 5, 17, 12, 2, 8, 5, 17, 33, 3, 8, 5, 17]
# Every width from 2 up costs more than 6: each drafting round that can is filled to 6.
WIDE = {1: 1.0, **{w: 2.0 for w in range(2, 6)}, 6: 1.5, **{w: 3.0 for w in range(7, 20)}}


# For the sampling check (γ 4): a round of 1 or 2 drafts is filled to 3, or to 2 where the length
# budget leaves room for 2 only.
SHORT = {1: 1.0, 2: 2.0, 3: 1.8, 4: 1.5, 5: 3.0}


def _force(monkeypatch, table: dict[int, float]) -> list[int]:
    """The engine's width measurement replaced by ``table``; returns the γ of each call."""
    calls = []

    def fake(pair, state, gamma, vocab_size):
        calls.append(gamma)
        return dict(table)

    monkeypatch.setattr(engine.drafters, "verify_costs", fake)
    return calls


@pytest.fixture
def forced_costs(monkeypatch):
    return _force(monkeypatch, WIDE)


def _run(target, prompt, *, processor, fill=True, storage="suffix", gamma=8, length=40, state=None,
         reset=True, generator=None):
    options = NGramOptions(storage=storage, max_pattern=4, max_outputs=8, reset=reset, fill_width=fill)
    strategy = Strategy("ngram", drafter="ngram", drafter_options=options, gamma=gamma, processor=processor,
                        max_gen_len=length)
    return run_strategy(strategy, pair_of(target), prompt, state=state, generator=generator)


@pytest.fixture(scope="module")
def greedy_target():
    return tiny_llama(3, vocab_size=V_GREEDY, logit_scale=4.0)


@pytest.mark.parametrize("storage", ["suffix", "sam"])
def test_greedy_output_is_the_targets_with_filled_drafts_kept_and_rejected(greedy_target, forced_costs, storage):
    expected = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=40),
                            pair_of(greedy_target), PROMPT).tokens
    result = _run(greedy_target, PROMPT, processor=GreedyProcessor(), storage=storage)
    plain = _run(greedy_target, PROMPT, processor=GreedyProcessor(), storage=storage, fill=False)
    assert result.tokens == expected == plain.tokens
    fill = result.width_fill
    assert fill["rounds"] > 0 and 0 < fill["drafts"] and fill["accepted"] < fill["drafts"]
    assert fill["verify_ms"] == {str(w): 1000 * s for w, s in sorted(WIDE.items())}
    filled = [r for r in result.trace if (r.note or {}).get("filled")]
    assert len(filled) == fill["rounds"]
    # Verified up to 6 wide (the storage may run out of continuation first), some exactly 6.
    widths = [len(r.drafted) + 1 for r in filled if r.token is not None]
    assert max(widths) == 6 and all(len(r.drafted) - r.note["filled"] + 1 <= 5 for r in filled)
    assert result.drafted > plain.drafted and not plain.width_fill
    json.dumps(result.to_dict(with_trace=True))


def test_the_costs_are_asked_for_only_with_fill_on(greedy_target, forced_costs):
    _run(greedy_target, PROMPT, processor=GreedyProcessor(), fill=False)
    assert forced_costs == []
    _run(greedy_target, PROMPT, processor=GreedyProcessor(), gamma=5)
    assert forced_costs == [5]


SAMPLES = 600
MUTATION_SAMPLES = 1200   # as in test_suffix_drafters: the mutation's bias is small on this target


def _sampled(target, samples: int = SAMPLES):
    generator = torch.Generator().manual_seed(4321)
    state, counts, filled = EngineState(), {}, {"rounds": 0, "drafts": 0, "accepted": 0}
    with torch.inference_mode():
        for _ in range(samples):
            # Decoded past the STEPS tokens compared, so that the rounds have room to fill.
            r = _run(target, SAMPLING_PROMPT, processor=MultinomialProcessor(1.0), gamma=4, length=STEPS + 4,
                     state=state, reset=False, generator=generator)
            counts[tuple(r.tokens[:STEPS])] = counts.get(tuple(r.tokens[:STEPS]), 0) + 1
            for key in filled:
                filled[key] += r.width_fill[key]
    return counts, filled


def test_sampling_with_filled_rounds_keeps_the_target_distribution(monkeypatch, target, exact):
    _force(monkeypatch, SHORT)
    counts, filled = _sampled(target)
    assert filled["rounds"] > SAMPLES // 4 and 0 < filled["accepted"] < filled["drafts"]
    fit = goodness_of_fit(counts, exact)
    assert fit.p_value > P_FLOOR, fit.describe()


def test_a_filled_round_resampled_from_p_is_caught(monkeypatch, target, exact):
    """The same check's power here: drawing from p instead of the residual after a rejection."""
    _force(monkeypatch, SHORT)
    monkeypatch.setattr(generation.accept, "residual_distributions", lambda p, q, draft: p)
    counts, _ = _sampled(target)
    assert goodness_of_fit(counts, exact).p_value < P_FLOOR


# ------------------------------------------------------------------ the measurement and its refusals


def test_the_costs_are_measured_once_per_pair_up_to_gamma_plus_one(monkeypatch, greedy_target):
    real, calls = engine.widths.time_target, []

    def counted(*args, **kwargs):
        calls.append(list(kwargs["widths"]))
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.widths, "time_target", counted)
    pair, state = pair_of(greedy_target), EngineState()
    costs = verify_costs(pair, state, 4, V_GREEDY)
    assert sorted(costs) == [1, 2, 3, 4, 5] and all(s > 0 for s in costs.values())
    assert verify_costs(pair, state, 4, V_GREEDY) is costs and len(calls) == 1
    assert sorted(verify_costs(pair, state, 100, V_GREEDY)) == list(range(1, MAX_FILL_WIDTH + 1))
    assert len(calls) == 2


def test_a_target_that_cannot_be_measured_is_refused_in_one_line():
    message = fill_refusal(tiny_bart(0))
    assert message and "decoder-only" in message and "\n" not in message
    with pytest.raises(ValueError, match="decoder-only"):
        _run(tiny_bart(0), [5, 6, 7, 5, 6], processor=GreedyProcessor(), length=4)
    served = fill_refusal(ServedModel())
    assert served and "local target" in served and "\n" not in served
    assert fill_refusal(tiny_llama(0)) is None


# ------------------------------------------------------------------ the summary and the front ends


def test_the_summary_counts_only_what_filling_added():
    rounds = [
        Round(drafted=(1, 2, 3, 4), accepted=3, token=9, bonus=False, note={"source": "prompt", "match": 1, "filled": 3}),
        Round(drafted=(1, 2, 3, 4), accepted=1, token=9, bonus=False, note={"source": "prompt", "match": 1, "filled": 2}),
        Round(drafted=(1, 2), accepted=2, token=9, bonus=True, note={"source": "prompt", "match": 2}),
        Round(drafted=(), accepted=0, token=9, bonus=False, note={"source": "", "match": 0}),
    ]
    # Round 1: its own draft was 1 token, 2 of the 3 added were kept; round 2: none of the added.
    assert fill_summary(rounds, {1: 0.05, 2: 0.0925}) == {
        "rounds": 2, "drafts": 5, "accepted": 2, "verify_ms": {"1": 50.0, "2": 92.5}}
    assert fill_summary(rounds[2:]) == {"rounds": 0, "drafts": 0, "accepted": 0}


def test_the_repl_turns_it_on_and_shows_what_it_did(greedy_target, forced_costs):
    settings = Settings(ngram_storage="suffix")
    assert execute("/fill_width on", settings).ok and settings.fill_width
    assert strategy_for("ngram", settings).drafter_options.fill_width
    assert not strategy_for("ngram", Settings()).drafter_options.fill_width
    result = _run(greedy_target, PROMPT, processor=GreedyProcessor())
    line = fill_text(result).plain
    assert line.startswith(f"filled {result.width_fill['rounds']} rounds to a cheaper verify width: "
                           f"+{result.width_fill['drafts']} drafts, {result.width_fill['accepted']} accepted")
    assert "verify ms by width 1:1000 2:2000" in fill_text(result, widths=True).plain
    assert fill_text(_run(greedy_target, PROMPT, processor=GreedyProcessor(), fill=False)) is None


def test_the_benchmark_runs_a_filling_storage_as_a_variant_of_its_own():
    assert {"suffix+fill", "sam+fill"} <= set(STORAGE_NAMES) and "basic+fill" not in STORAGE_NAMES
    options = storage_options(NGramOptions(max_pattern=8), "suffix+fill")
    assert (options.storage, options.fill_width, options.max_pattern) == ("suffix", True, 8)
    assert not storage_options(options, "sam").fill_width
    variant = Variant("ngram", 16, storage="suffix+fill")
    assert parse_variant_name(variant.name) == variant and "suffix+fill" in variant.name
