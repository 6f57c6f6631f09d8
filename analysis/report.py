"""A run's report, computed once when a prompt's runs end and kept with each run.

Why a drafting strategy ran as fast as it did (:class:`Why`, docs/why.md; the advisor keeps a
replayed method's numbers in one too), what a round trip would do (:class:`WhatIf`), the copy
ceiling and the JSON record. Pure arithmetic on results read as data, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import analysis.ceiling
from analysis.acceptance import AcceptanceCounts, acceptance_counts, draft_share, engine_numbers, yield_by_position
from analysis.divergence import Divergence
from analysis.lookahead import lookahead_summary
from analysis.sources import drafter_chose_lengths, source_numbers
from analysis.speedup import (
    SEARCH_GAMMA, CostModel, RoundMix, best_cap, best_gamma, costs_from_result, estimated_inputs, first_round,
    measured_mix, mix_run_speedup, mix_speedup, prediction_interval, tokens_per_s_at_rtt,
)
from analysis.trees import tree_model, tree_summary

# The strategies whose runs draft, and so have a why (the REPL's keys).
DRAFTING = ("speculative", "ngram", "lookahead")


@dataclass
class WhatIf:
    """The speedup model with a round trip of ``rtt_ms`` on every target call (``/rtt``): ``predicted``
    for this run, ``predicted_steady`` for long outputs, and the best γ there."""

    rtt_ms: float
    predicted: float | None
    predicted_steady: float
    best_gamma: int | None          # None: the strategy has no γ to choose (lookahead)
    best_speedup: float | None
    measured_ms: float | None = None   # a served run: the round trip per request it measured


@dataclass
class Why:
    """The numbers behind a speedup prediction (docs/why.md): a drafting run's (:func:`why_of`) or a
    replayed method's (``advisor.rank.price``, docs/advisor.md).

    ``yield_rates``: acceptance by draft position, as the model prices it. ``estimated``: the inputs
    the model filled in rather than measured.

    A run's: ``acceptance`` (``analysis.acceptance``: every acceptance number shown comes from it);
    ``predicted`` (the first round as measured, the rest priced), comparable with the measured speedup,
    and ``predicted_steady`` (no prefill), comparable with :func:`decode_speedup`; ``first_round_s``;
    ``best_gamma`` / ``best_speedup`` (``no_gamma`` for lookahead); ``cost_source`` and ``plain_step_s``,
    the plain step every prediction is a ratio to (:data:`PLAIN_STEP_SOURCES`); ``predicted_interval``
    for a prediction made without target AR; ``measured`` when the drafter chose its own draft lengths
    (then priced as measured, ``mix``, and ``best_gamma`` is the best cap); ``sources``; ``ceiling``
    (:func:`copy_ceiling_of`).

    A replayed method's, in target steps: ``c`` (a drafter step; None: model-free), ``verify`` by width,
    ``mean_width``, ``tokens_per_call``, ``draft_steps`` and ``host_ms`` / ``lookup_ms`` per round, and
    the copy ceiling (``ceiling_tokens_per_call``, ``ceiling_speedup``).
    """

    yield_rates: list[float]
    estimated: list[str] = field(default_factory=list)
    # a drafting run's
    acceptance: AcceptanceCounts = field(default_factory=AcceptanceCounts)
    draft_share: float = 1.0
    gamma: int = 0
    costs: CostModel | None = None
    predicted: float | None = None
    predicted_steady: float | None = None
    first_round_s: float | None = None
    best_gamma: int | None = None
    best_speedup: float | None = None
    cost_source: str | None = None
    what_if: WhatIf | None = None
    tree: dict | None = None
    measured: bool = False
    sources: dict | None = None
    ceiling: dict | None = None
    plain_step_s: float | None = None
    no_gamma: bool = False
    predicted_interval: tuple[float, float] | None = None
    # a replayed method's
    c: float | None = None
    verify: dict[int, float] = field(default_factory=dict)
    mean_width: float = 0.0
    tokens_per_call: float = 0.0
    draft_steps: float = 0.0
    host_ms: float = 0.0
    lookup_ms: float = 0.0
    ceiling_tokens_per_call: float | None = None
    ceiling_speedup: float | None = None

    def mix(self, trace: list) -> RoundMix:
        """The rounds the speedup model prices: the measured draft lengths, or γ."""
        if self.measured:
            return measured_mix(trace)
        return RoundMix.constant(self.yield_rates, self.gamma, self.draft_share)

    def best(self, trace: list, costs: CostModel) -> tuple[int, float]:
        """(γ, speedup) the model predicts best at ``costs``: over constant γ, or over a cap on the
        lengths the drafter chose; (None, None) for lookahead."""
        if self.no_gamma:
            return None, None
        search = max(SEARCH_GAMMA, self.gamma)
        if self.measured and not any(r.tree_tokens for r in trace):
            return best_cap(trace, costs, search)
        return best_gamma(self.yield_rates, costs, search, draft_share=self.draft_share)

    @property
    def counts(self) -> list[tuple[int, int]]:
        """(accepted, reached) at each draft position some round reached."""
        a = self.acceptance
        return [(p, n) for p, n in zip(a.accepted_by_position, a.reached_by_position) if n]

    def to_dict(self) -> dict:
        """A replayed method's numbers, for the advisor's JSON."""
        return {"rates": [round(r, 4) for r in self.yield_rates], "c": round_or_none(self.c),
                "verify": {str(w): round(v, 4) for w, v in sorted(self.verify.items())},
                "mean_width": round(self.mean_width, 3), "tokens_per_call": round(self.tokens_per_call, 4),
                "draft_steps": round(self.draft_steps, 3), "host_ms": round(self.host_ms, 3),
                "ceiling_tokens_per_call": round_or_none(self.ceiling_tokens_per_call),
                "ceiling_speedup": round_or_none(self.ceiling_speedup), "estimated": list(self.estimated),
                "lookup_ms": round(self.lookup_ms, 4)}

    def line(self) -> str:
        """A replayed method's in one line: acceptance by position, c, the verify widths in steps,
        tokens per call, ceiling."""
        parts = []
        if self.yield_rates:
            rates = self.yield_rates
            shown = " ".join(f"{r:.2f}" for r in rates[:6]) + (" …" if len(rates) > 6 else "")
            parts.append(f"accept {shown}")
        if self.c is not None:
            parts.append(f"c {self.c:.2f}")
        wide = {w: v for w, v in self.verify.items() if w > 1}
        if wide:
            top = sorted(wide, key=lambda w: abs(w - self.mean_width))[:3]     # the widths near the mean
            parts.append("verify " + ", ".join(f"w{w} {wide[w]:.2f}" for w in sorted(top)) + " steps")
        parts.append(f"{self.tokens_per_call:.2f} tok/call")
        if self.lookup_ms >= 0.05:
            parts.append(f"look-up {self.lookup_ms:.1f} ms/round")
        if self.ceiling_tokens_per_call is not None:
            parts.append(f"copy ceiling {self.ceiling_tokens_per_call:.2f} tok/call"
                         + (f" {self.ceiling_speedup:.2f}x" if self.ceiling_speedup else ""))
        if self.estimated:
            parts.append("(est.) " + ", ".join(self.estimated[:3]) + (" …" if len(self.estimated) > 3 else ""))
        return " · ".join(parts)


def round_or_none(value: float | None, digits: int = 4) -> float | None:
    """``value`` rounded to ``digits`` places, None kept (for a JSON record)."""
    return None if value is None else round(value, digits)


# Where the plain step came from (``Why.cost_source``, the JSON's ``prediction_cost_source``), and
# how the panel says it.
PLAIN_STEP_SOURCES = {
    "target AR": "from target AR this prompt",
    "load": "measured at load",
    "own rounds": "from this run's plain rounds",
    "estimated": "estimated, not measured (read off this run's wider verifies)",
}


def plain_step_words(why: Why) -> str:
    """``plain step: measured at load, 37 ms``."""
    words = PLAIN_STEP_SOURCES.get(why.cost_source or "", why.cost_source or "unknown")
    cost = "" if why.plain_step_s is None else f", {why.plain_step_s * 1e3:.0f} ms"
    return f"plain step: {words}{cost}"


def lookahead_window_unrecorded(trace: list) -> bool:
    """A lookahead trace whose rounds do not say how many window rows they fed (written before
    the rounds' notes had ``rows``): its rounds are then priced without the window."""
    notes = [r.note for r in trace if isinstance(r.note, dict) and "pool" in r.note]
    return bool(notes) and not any("rows" in n for n in notes)


def measured_round_trip_s(result) -> float | None:
    """A served run's measured round trip per request (None for a local target)."""
    network = result.network or {}
    return network["round_trip_per_request_ms"] / 1000.0 if network.get("requests") else None


def per_position_requests(result) -> bool:
    """Whether a served run's target calls were a request per scored position (llama.cpp), so a
    round trip is paid per position, not per call (an engine scoring a prompt's positions: one)."""
    calls = (result.network or {}).get("per_call") or []
    return any(requests > 1 for requests, *_ in calls)


def gamma_cap(gamma: int, policy: str) -> int:
    """The longest draft a round may ask for: /gamma, or under the model policy, which chooses
    among 0..max(/gamma, SEARCH_GAMMA) drafts, that maximum."""
    return max(gamma, SEARCH_GAMMA) if policy == "model" else gamma


def round_gamma(trace: list) -> int:
    """The longest draft any round asked for or made."""
    return max((max(r.gamma, len(r.drafted)) for r in trace), default=0)


# ------------------------------------------------------------ what a report reads

@dataclass(frozen=True)
class PromptFacts:
    """What a run's report reads besides the run itself: the prompt's ``settings``, target AR's complete
    result (``baseline``, or None), the plain step ``(seconds, source)`` the predictions are ratios to,
    and ``plain_step_samples``, the turns a step timed at load took (its spread goes into the interval)."""

    prompt_ids: list[int]
    greedy: bool
    settings: dict
    baseline: object | None = None
    plain_step: tuple[float | None, str | None] = (None, None)
    plain_step_samples: tuple[float, ...] = ()

    @property
    def rtt_ms(self) -> float:
        """The what-if round trip the prompt ran with (``/rtt``; 0 in old traces)."""
        return float(self.settings.get("rtt") or 0.0)


def usable(result) -> bool:
    """A complete result to compare against (not failed, not interrupted)."""
    return result is not None and not result.interrupted


def speedup(result, baseline) -> float | None:
    """tokens/s of ``result`` over tokens/s of target AR's ``baseline``."""
    if baseline is None or not usable(result) or baseline.tokens_per_second <= 0:
        return None
    return result.tokens_per_second / baseline.tokens_per_second


def decode_speedup(result, baseline) -> float | None:
    """Decode tokens/s of ``result`` over target AR's (time to first token left out of both), the
    measured counterpart of ``Why.predicted_steady``; None where either is unknown."""
    if baseline is None or not usable(result):
        return None
    ours, theirs = result.decode_tokens_per_second, baseline.decode_tokens_per_second
    return ours / theirs if ours and theirs else None


def call_cost(result, baseline) -> float | None:
    """Seconds per target call of ``result`` (drafting and host work included) over target AR's: the
    speedup is tokens per target call divided by it. None without a baseline or a target call."""
    if baseline is None or not usable(result) or not result.target_calls or not baseline.target_calls:
        return None
    theirs = baseline.seconds / baseline.target_calls
    return (result.seconds / result.target_calls) / theirs if theirs > 0 else None


# ------------------------------------------------------------ why, what-if, copy ceiling

def why_of(key: str, result, facts: PromptFacts, rtt_ms: float | None = None,
           ceilings: dict | None = None) -> Why | None:
    """Acceptance statistics and the speedup model for a drafting run (None for the others).
    ``rtt_ms`` > 0 adds the prediction at that round trip (``Why.what_if``); ``ceilings`` caches copy
    ceilings by (strategy, γ, output length)."""
    if key not in DRAFTING or result is None:
        return None
    trace = result.trace
    settings = facts.settings
    # Lookahead's rounds ask for N - 1 drafts, whatever /gamma says.
    own = (int(settings.get("lookahead_ngram") or 0) - 1) if key == "lookahead" else 0
    gamma = own if own > 0 else int(settings.get("gamma") or round_gamma(trace))
    why = Why(
        acceptance=acceptance_counts(trace),
        yield_rates=yield_by_position(trace),
        draft_share=draft_share(trace),
        gamma=gamma,
        # Lookahead's rounds are priced as they ran (their candidates and the window they
        # fed), and it has no γ to search: W, N and G fix its rounds.
        measured=drafter_chose_lengths(trace) or key == "lookahead",
        sources=source_numbers(trace),
        no_gamma=key == "lookahead",
    )
    if key == "ngram":
        why.ceiling = copy_ceiling_of(key, result, facts, max(gamma, round_gamma(trace)), ceilings)
    plain_s, source = facts.plain_step
    if result.tree and not why.no_gamma:   # lookahead's tree is its G candidates, not a budget to choose
        why.tree = tree_model(result, ar_step_s=plain_s)
    costs = costs_from_result(result, ar_step_s=plain_s)
    if costs is None or gamma < 1:
        return why
    try:
        mix = why.mix(trace)
        why.predicted_steady = mix_speedup(mix, costs)
        base = facts.baseline
        why.predicted = why.predicted_steady if base is None else mix_run_speedup(
            result, mix, costs, base.tokens_per_second)
        if base is None:       # priced without target AR: the prediction carries its inputs' spread
            samples = facts.plain_step_samples if source == "load" else ()
            why.predicted_interval = prediction_interval(result, mix, costs, samples)
        why.first_round_s = first_round(result)[0]
        why.best_gamma, why.best_speedup = why.best(trace, costs)
    except ValueError:  # costs that cannot price a round (all zero)
        return why
    why.costs = costs
    why.plain_step_s = costs.verify(1)
    why.cost_source = source or ("own rounds" if 1 in costs.verify_s else "estimated")
    why.estimated = estimated_inputs(mix, costs)
    if key == "lookahead" and lookahead_window_unrecorded(trace):
        why.estimated.append("window rows (not recorded)")
    rtt_ms = facts.rtt_ms if rtt_ms is None else rtt_ms
    if rtt_ms > 0:
        why.what_if = what_if(result, why, rtt_ms, facts)
    return why


def copy_ceiling_of(key: str, result, facts: PromptFacts, gamma: int, ceilings: dict | None = None) -> dict | None:
    """The copy ceiling of a greedy run's output (``analysis.ceiling``) at this γ, after a match of 1
    token (``after_1``) and of 2 (``after_2``); ``skipped`` says why it was not computed; None under
    sampling. ``ceilings``: those already computed."""
    if not facts.greedy or gamma < 1 or result is None:
        return None
    ceilings = {} if ceilings is None else ceilings
    cache_key = (key, gamma, len(result.tokens))
    if cache_key not in ceilings:
        tokens = result.tokens
        total = len(facts.prompt_ids) + len(tokens)
        most = analysis.ceiling.MAX_TOKENS
        if total > most:
            ceilings[cache_key] = {"skipped": f"prompt and output hold {total} tokens (it is computed up to {most})"}
        else:
            length = max(int(facts.settings.get("length") or 0), len(tokens))
            ceilings[cache_key] = {"gamma": gamma, **{
                f"after_{m}": analysis.ceiling.copy_ceiling(facts.prompt_ids, tokens, gamma, length,
                                                            match=m).tokens_per_call
                for m in (1, 2)}}
    return ceilings[cache_key]


def what_if(result, why: Why, rtt_ms: float, facts: PromptFacts) -> WhatIf:
    """The speedup model with a round trip of ``rtt_ms`` on every target call: added whole for a local
    target, in place of the measured round trip for a served run."""
    measured = measured_round_trip_s(result)
    costs = costs_from_result(result, ar_step_s=facts.plain_step[0], rtt_s=rtt_ms / 1000.0 - (measured or 0.0))
    if costs is not None and per_position_requests(result):
        costs = replace(costs, trip_per_position=True)
    trace, base = result.trace, facts.baseline
    mix, predicted = why.mix(trace), None
    if base is not None:
        ar_rate = tokens_per_s_at_rtt(base, rtt_ms / 1000.0 - (measured_round_trip_s(base) or 0.0))
        predicted = mix_run_speedup(result, mix, costs, ar_rate)
    best, best_speedup = why.best(trace, costs)
    return WhatIf(rtt_ms, predicted, mix_speedup(mix, costs), best, best_speedup,
                  None if measured is None else 1000.0 * measured)


# ------------------------------------------------------------ one run's report

@dataclass(frozen=True)
class RunReport:
    """What a strategy run came to beside target AR, computed once when the prompt's runs end: its
    ``why`` (None unless drafting), and under greedy ``identical`` / ``first_divergence`` and the
    ``divergence`` explained (None when identical or not compared)."""

    why: Why | None
    speedup: float | None
    decode_speedup: float | None
    call_cost: float | None
    identical: bool | None
    first_divergence: int | None
    divergence: Divergence | None = None


def run_report(key: str, result, facts: PromptFacts, divergence: tuple[bool | None, int | None],
               ceilings: dict | None = None, explained: Divergence | None = None) -> RunReport:
    """The report of strategy ``key``'s ``result`` on the prompt of ``facts``; ``divergence`` and
    ``explained`` as ``repl.runs.PromptRun`` computes them."""
    base = facts.baseline
    return RunReport(why=why_of(key, result, facts, ceilings=ceilings), speedup=speedup(result, base),
                     decode_speedup=decode_speedup(result, base), call_cost=call_cost(result, base),
                     identical=divergence[0], first_divergence=divergence[1], divergence=explained)


def strategy_record(label: str, error: str | None, result, text: str, other_load: float | None,
                    report: RunReport | None) -> dict:
    """One strategy's JSON entry: output, measured numbers and the why numbers (``report``: the
    run's, None for a run without a result)."""
    entry: dict = {"label": label}
    if error is not None:
        entry["error"] = error
    if result is None:
        return entry
    r, why = result, report.why
    entry.update(
        text=text,
        tokens=len(r.tokens),
        token_ids=r.tokens,
        seconds=r.seconds,
        tokens_per_s=r.tokens_per_second,
        first_token_s=r.first_token_s,
        decode_tokens_per_s=r.decode_tokens_per_second,
        other_load=other_load,
        acceptance_rate=why.acceptance.draft_acceptance_rate if why else None,
        tokens_per_target_call=r.tokens_per_target_call,
        target_calls=r.target_calls,
        drafter_calls=r.drafter_calls,
        drafted=r.drafted,
        accepted=r.accepted,
        stop_reason=r.stop_reason,
        speedup=report.speedup,
        call_cost=report.call_cost,
        identical_to_target=report.identical,
        first_divergence=report.first_divergence,
        divergence=None if report.divergence is None else report.divergence.to_dict(),
        phases=dict(r.phases),
        rollback=r.rollback,
        gamma_policy=r.gamma_policy,
        verify_rule=r.verify_rule,
        tree_rule=r.tree_rule,
        draft_share=why.draft_share if why else None,
        predicted_speedup=why.predicted if why else None,
        predicted_speedup_steady=why.predicted_steady if why else None,
        decode_speedup=report.decode_speedup,
        first_round_s=why.first_round_s if why else None,
        best_gamma=why.best_gamma if why else None,
        best_gamma_speedup=why.best_speedup if why else None,
        prediction_cost_source=why.cost_source if why else None,
        prediction_plain_step_s=why.plain_step_s if why else None,
        prediction_estimated=list(why.estimated) if why else None,
        predicted_interval=list(why.predicted_interval) if why and why.predicted_interval else None,
        prediction_draft_lengths=("measured" if why.measured else "gamma") if why else None,
    )
    if why is not None:
        entry.update(engine_numbers(why.acceptance))
    if why is not None and why.sources is not None:
        entry.update(why.sources)
    if why is not None and why.ceiling is not None:
        entry["copy_ceiling"] = dict(why.ceiling)
    stats = tree_summary(r.trace, tokens=len(r.tokens), target_calls=r.target_calls) if r.tree else None
    if stats is not None:
        entry["tree_stats"] = {**stats, **(why.tree if why is not None and why.tree else {})}
    entry["compile"] = r.compile   # the path the forwards took (kvcache.static.compile_report; None: served)
    if r.hybrid:
        entry["hybrid"] = r.hybrid
    if r.network:
        entry["network"] = dict(r.network)      # a served target's requests and their times
    lookahead = lookahead_summary(r.trace, tokens=len(r.tokens), target_calls=r.target_calls)
    if lookahead is not None:
        entry["lookahead_stats"] = lookahead
    if why is not None and why.what_if is not None:
        w = why.what_if
        entry["what_if_rtt"] = {"rtt_ms": w.rtt_ms, "measured_rtt_ms": w.measured_ms, "predicted_speedup": w.predicted,
                                "predicted_speedup_steady": w.predicted_steady,
                                "best_gamma": w.best_gamma, "best_gamma_speedup": w.best_speedup}
    return entry
