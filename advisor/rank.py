"""Rank replayed drafting methods by their predicted speedup, each with its why in numbers.

A method's replayed rounds (:class:`advisor.replay.ReplayEntry`) are priced by the speedup model
(``analysis.speedup``), so a prediction here and ``/stats`` rest on the same formula. The cost
table's forwards are read as ratios to its own one-token step and anchored on target AR's measured
decode step: the ratios carry over from a bare forward or another machine where seconds do not
(docs/advisor.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import analysis.ceiling
from analysis.report import Why, round_or_none
from analysis.speedup import CostModel, RoundMix, mix_round, mix_speedup

from advisor.costs import CostTable, drafter_key
from utils.options import MATCH_STORAGES


# How far a replay's counts are a real greedy run's, best first: ``exact``, the same; ``rounding``,
# the same up to floating-point rounding (a near-tie that a run's forwards round the other way
# parts the run from the output replayed); ``estimated``, an estimate. An entry's ``note`` says
# why where it is not exact (``advisor.replay``).
EXACT, ROUNDING, ESTIMATED = "exact", "rounding", "estimated"
EXACTNESS = (EXACT, ROUNDING, ESTIMATED)
# A confirmed run further than this from its prediction (either way) gets a line splitting the miss
# into what its runs made per target call and what each call cost (:func:`miss_line`).
MISS = 0.10


@dataclass
class Advice:
    """One ranked method: the prediction, the measured speedup once a real run confirmed it, and why.
    ``predicted_speedup``: end to end (time to first token included) where target AR's runs were given,
    else the steady state; ``predicted_decode_speedup``: the steady state. ``exactness``
    (:data:`EXACTNESS`) and ``note``: how far the replay's counts are a real run's. ``entry``: the replay."""

    method: str
    gamma: int
    gamma_policy: str
    tree: int
    predicted_speedup: float
    tokens_per_call: float
    why: Why
    predicted_decode_speedup: float | None = None
    exactness: str = EXACT
    note: str = ""
    drafter: str = ""
    measured_speedup: float | None = None
    measured_decode_speedup: float | None = None
    identical: bool | None = None
    confirm_error: str = ""
    sampling: object = None         # advisor.sampling.SamplingEstimate under a sampling processor
    tokens_per_round: float = 0.0   # tokens per round after each prompt's first: what the model prices
    predicted_rank: int = 0         # its place by prediction (1: first), before the confirmed runs reorder
    measured_tokens_per_call: float | None = None   # the confirming runs' tokens per target call
    entry: object = field(default=None, repr=False, compare=False)

    def sampling_line(self) -> str:
        """``method: α ..., tok/call, speedup`` of the estimate under sampling, or ""."""
        e = self.sampling
        if e is None:
            return ""
        return (f"{self.method}: overlap {e.alpha:.2f}, {e.tokens_per_call:.2f} tok/call, "
                f"{e.predicted_speedup:.2f}x (est.)")

    def predicted_text(self) -> str:
        """``1.23x``, with `` (est.)`` where the prediction rests on an estimate (:attr:`estimate`)."""
        return f"{self.predicted_speedup:.2f}x" + (" (est.)" if self.estimate else "")

    def measured_text(self) -> str:
        """The confirmed run's speedup, ``failed`` where it failed, "" where none ran."""
        if self.confirm_error:
            return "failed"
        return "" if self.measured_speedup is None else f"{self.measured_speedup:.2f}x"

    def decode_text(self) -> str:
        """The decode part in a cell: predicted (the steady state) / measured, where confirmed."""
        predicted = "" if self.predicted_decode_speedup is None else f"{self.predicted_decode_speedup:.2f}x"
        if self.measured_decode_speedup is None:
            return predicted
        return f"{predicted} / {self.measured_decode_speedup:.2f}x"

    def tokens_text(self) -> str:
        """Tokens per target call in a cell: the replay's / the confirming runs', where confirmed."""
        if self.measured_tokens_per_call is None:
            return f"{self.tokens_per_call:.2f}"
        return f"{self.tokens_per_call:.2f} / {self.measured_tokens_per_call:.2f}"

    @property
    def exact(self) -> bool:
        """The replay's counts are a real greedy run's, not only up to rounding."""
        return self.exactness == EXACT

    @property
    def estimate(self) -> bool:
        """The prediction rests on an estimate: the replay was estimated, or a cost was read off
        other widths (a replay exact up to rounding is not an estimate)."""
        return self.exactness == ESTIMATED or bool(self.why.estimated)

    def to_dict(self) -> dict:
        return {"method": self.method, "drafter": self.drafter, "gamma": self.gamma,
                "gamma_policy": self.gamma_policy, "tree": self.tree,
                "predicted_speedup": round(self.predicted_speedup, 4),
                "predicted_decode_speedup": round_or_none(self.predicted_decode_speedup),
                "tokens_per_call": round(self.tokens_per_call, 4), "tokens_per_round": round(self.tokens_per_round, 4),
                "predicted_rank": self.predicted_rank,
                "measured_speedup": round_or_none(self.measured_speedup),
                "measured_decode_speedup": round_or_none(self.measured_decode_speedup),
                "measured_tokens_per_call": round_or_none(self.measured_tokens_per_call),
                "identical": self.identical, "confirm_error": self.confirm_error,
                "exactness": self.exactness, "exact": self.exact, "estimate": self.estimate, "note": self.note,
                "why": self.why.to_dict(),
                "sampling_estimate": None if self.sampling is None else self.sampling.to_dict()}


# ------------------------------------------------------------------ pricing

def is_copier(method) -> bool:
    """Whether the method drafts by copying a continuation from the text (its copy ceiling applies):
    a storage that matches the tail (``analysis.ceiling``)."""
    return getattr(getattr(method, "options", None), "storage", None) in MATCH_STORAGES


def _verify_costs(costs: CostTable, widths, step: float, estimated: list[str]) -> dict[int, float]:
    """Seconds of a verify at each width, the table's ratio to its own step times ``step``."""
    own = costs.target(1)[0]
    out = {}
    for width in sorted(set(widths) | {1}):
        seconds, guessed = costs.target(width)
        out[width] = step if width == 1 else seconds / own * step
        if guessed:
            estimated.append(f"verify at width {width}")
    return out


def _anchor(costs: CostTable, ar_step_s: float | None) -> tuple[float, float]:
    """(one step in seconds: target AR's measured decode step, else the table's own; the factor
    that turns the table's seconds into it)."""
    step = ar_step_s if ar_step_s and ar_step_s > 0 else costs.target(1)[0]
    return step, step / costs.target(1)[0]


def steady_steps(entry, widest: int) -> dict[int, int]:
    """The drafter's forwards by width outside each prompt's first round (the prefill, not priced):
    ``prefill_steps`` taken out, else every step wider than the widest verify + 1."""
    prefill = getattr(entry, "prefill_steps", None)
    if prefill is None:
        return {w: n for w, n in entry.draft_steps.items() if w <= widest + 1}
    return {w: n - prefill.get(w, 0) for w, n in entry.draft_steps.items() if n > prefill.get(w, 0)}


def _draft_seconds(entry, costs: CostTable, scale: float, widest: int, estimated: list[str]) -> tuple[float, int]:
    """(seconds, forwards) of the drafter's steps in the priced rounds (:func:`steady_steps`)."""
    key = drafter_key(entry.method)
    seconds, steps = 0.0, 0
    for width, count in sorted(steady_steps(entry, widest).items()):
        cost, guessed = costs.draft(key, width)
        seconds += count * cost * scale
        steps += count
        if guessed:
            estimated.append(f"{key} step at width {width}")
    return seconds, steps


def _model(widths: dict[int, int], tokens_per_round: float, verify_s: dict[int, float], draft_round_s: float,
           host_s: float) -> tuple[RoundMix, CostModel]:
    """The speedup model's mix and costs for rounds ``widths`` ({verify width: rounds}) that each
    yield ``tokens_per_round`` and spend ``draft_round_s`` drafting on average."""
    rounds = sum(widths.values())
    shares = {w - 1: n / rounds for w, n in sorted(widths.items())}
    mix = RoundMix(shares, {k: tokens_per_round for k in shares})
    mean_k = mix.mean_length
    per_draft = draft_round_s / mean_k if mean_k > 0 else 0.0
    other = host_s + (draft_round_s if mean_k <= 0 else 0.0)
    return mix, CostModel(per_draft, verify_s, other_per_round_s=other)


def _ceiling(entry, recorded, max_gen_len: int, verify_s, costs, step, host_s, estimated):
    """(tokens per call, speedup) of the copy ceiling at the method's γ over ``recorded``."""
    calls = tokens = 0
    widths: dict[int, int] = {}
    for record in recorded:
        cost = lambda w: _verify_costs(costs, [w], step, [])[w]   # noqa: E731
        ceiling = analysis.ceiling.copy_ceiling(record.prompt, record.output, entry.method.gamma, max_gen_len, cost)
        calls += ceiling.calls
        tokens += ceiling.tokens
        for width, n in ceiling.widths.items():
            widths[width] = widths.get(width, 0) + n
    if not calls or not widths:
        return (tokens / calls if calls else None), None
    verify = _verify_costs(costs, widths, step, estimated)
    mix, model = _model(widths, tokens / calls, verify, 0.0, host_s)
    return tokens / calls, mix_speedup(mix, model)


def price(entry, costs: CostTable, ar_step_s: float | None = None, *, recorded: Sequence = (),
          max_gen_len: int = 0, runs: Sequence | None = None) -> Advice:
    """One entry's prediction and why. ``recorded`` / ``max_gen_len``: for a copier's copy ceiling.
    ``runs``: target AR's (tokens, seconds, time to first token) per prompt for :func:`end_to_end`."""
    method, replayed = entry.method, entry.replayed
    step, scale = _anchor(costs, ar_step_s)
    estimated: list[str] = []
    tokens_per_call = replayed.tokens / replayed.calls if replayed.calls else 0.0
    widths = replayed.steady_widths        # the rounds after each prompt's first: the steady state
    rounds = sum(widths.values())
    c = None
    if entry.draft_steps:
        c = costs.draft(drafter_key(method), 1)[0] / costs.target(1)[0]
    advice = Advice(method.key, method.gamma, method.gamma_policy, method.tree, 0.0, tokens_per_call,
                    Why(list(entry.rates), c=c, tokens_per_call=tokens_per_call, host_ms=costs.host_s * 1e3),
                    exactness=entry.exactness, note=entry.note, drafter=drafter_key(method), entry=entry)
    if not rounds:
        advice.note = (advice.note + "; " if advice.note else "") + "no round after the prefill to price"
        advice.exactness = ESTIMATED
        return advice
    verify_s = _verify_costs(costs, replayed.widths, step, estimated)
    draft_s, steps = _draft_seconds(entry, costs, scale, max(replayed.widths), estimated) if entry.draft_steps \
        else (0.0, 0)
    lookup_s = float(getattr(entry, "lookup_s", 0.0) or 0.0)      # timed here: unscaled, as host work is
    advice.tokens_per_round = replayed.tokens_per_round      # what each of those rounds makes
    mix, model = _model(widths, advice.tokens_per_round, verify_s, (draft_s + lookup_s) / rounds, costs.host_s)
    advice.predicted_speedup = advice.predicted_decode_speedup = mix_speedup(mix, model)
    whole = end_to_end(entry, runs, mix, model, costs, step, scale, c) if runs else None
    if whole is not None:
        advice.predicted_speedup = whole
    why = advice.why
    why.verify = {w: s / step for w, s in verify_s.items()}
    why.mean_width = sum(w * n for w, n in widths.items()) / rounds
    why.draft_steps = steps / rounds
    why.lookup_ms = lookup_s / rounds * 1e3
    if recorded and max_gen_len and is_copier(method):
        why.ceiling_tokens_per_call, why.ceiling_speedup = _ceiling(entry, recorded, max_gen_len, verify_s, costs,
                                                                    step, costs.host_s, estimated)
    why.estimated = list(dict.fromkeys(estimated))
    return advice


def price_chain(gamma: int, tokens_per_round: float, costs: CostTable, ar_step_s: float | None = None,
                key: str = "model") -> float:
    """The steady-state speedup of chains of ``gamma`` drafts of drafter ``key`` making
    ``tokens_per_round`` each, priced as :func:`price` prices a replayed round."""
    step, scale = _anchor(costs, ar_step_s)
    verify_s = _verify_costs(costs, [gamma + 1], step, [])
    draft_s = gamma * costs.draft(key, 1)[0] * scale
    mix, model = _model({gamma + 1: 1}, tokens_per_round, verify_s, draft_s, costs.host_s)
    return mix_speedup(mix, model)


def end_to_end(entry, runs: Sequence, mix: RoundMix, model: CostModel, costs: CostTable, step: float,
               scale: float, c: float | None) -> float | None:
    """Target AR's seconds over the method's predicted seconds, summed over the prompts.

    Per prompt, as ``analysis.speedup.mix_run_speedup`` splits a run: the first round costs target AR's
    time to first token plus what the method adds to it, every later token the rounds' mean cost,
    scaled by that prompt's decode step over the mean one. A drafter forward wider than the table's
    (its own prefill) costs ``c`` times the time to first token. None where a prompt's is unknown.
    """
    firsts = list(getattr(entry, "firsts", None) or [])
    if len(firsts) != len(runs) or step <= 0:
        return None
    tokens_round, round_s = mix_round(mix, model)
    if tokens_round <= 0:
        return None
    key = drafter_key(entry.method)
    widest = max(costs.draft_s.get(key, {}) or {0: 0})
    ar_total = method_total = 0.0
    for (tokens, seconds, ttft), (first_tokens, first_width, first_steps) in zip(runs, firsts):
        if ttft is None or tokens < 1:
            return None
        step_here = (seconds - ttft) / (tokens - 1) if tokens > 1 and seconds > ttft else step
        first = ttft + costs.host_s
        if first_width is not None:
            first += model.target_call(first_width) * step_here / step
        for width, count in first_steps.items():
            if width <= widest:
                first += count * costs.draft(key, width)[0] * scale
            elif c is not None:
                first += count * c * ttft
        ar_total += seconds
        method_total += first + max(0, tokens - first_tokens) * round_s / tokens_round * step_here / step
    return ar_total / method_total if method_total > 0 else None


def _order(advice: Advice):
    """Best first: the higher prediction; at a tie (to 1e-9) an exact replay before one exact up to
    rounding before an estimate, then the smaller tree, the smaller γ, the name."""
    return (-round(advice.predicted_speedup, 9), EXACTNESS.index(advice.exactness), advice.tree, advice.gamma,
            advice.method)


def rank(entries, costs: CostTable, ar_step_s: float | None = None, *, recorded: Sequence = (),
         max_gen_len: int = 0, runs: Sequence | None = None) -> list:
    """Every entry priced (:func:`price`; ``runs``: target AR's on the same prompts, for the
    end-to-end prediction), best first (:func:`_order`), each with its ``predicted_rank``."""
    ranked = sorted((price(e, costs, ar_step_s, recorded=recorded, max_gen_len=max_gen_len, runs=runs)
                     for e in entries), key=_order)
    for place, advice in enumerate(ranked, 1):
        advice.predicted_rank = place
    return ranked


def ran_clean(advice: Advice) -> bool:
    """Whether a confirming run measured ``advice`` and gave target AR's output."""
    return advice.measured_speedup is not None and not advice.confirm_error and advice.identical is not False


def miss_line(advice: Advice) -> str | None:
    """Where a clean confirmed run measured more than :data:`MISS` off its prediction, one line that
    splits the miss: the measured speedup over the predicted is the runs' tokens per target call over
    the replay's (what the drafts made) times the rest (what a call cost against target AR's step
    beside it: the costs priced). None otherwise."""
    measured, made = advice.measured_speedup, advice.measured_tokens_per_call
    predicted, replayed = advice.predicted_speedup, advice.tokens_per_call
    if not ran_clean(advice) or not made or not replayed or predicted <= 0:
        return None
    total = measured / predicted
    if abs(total - 1.0) <= MISS:
        return None
    drafts = made / replayed
    return (f"{advice.method} measured {measured:.2f}x against {predicted:.2f}x predicted ({total - 1:+.0%}): "
            f"its runs made {made:.2f} tokens a target call against the replay's {replayed:.2f} ({drafts - 1:+.0%}); "
            f"the rest, {total / drafts - 1:+.0%}, is the time a call took against target AR's step "
            "beside it (the costs priced)")


def confirmed_first(advice: list[Advice], confirmed: int) -> tuple[list[Advice], str | None]:
    """``advice`` (ranked) with its first ``confirmed`` (the ones run for real) ordered by their
    measured speedup where the run measured them and gave target AR's output, the others of them
    (failed, or their output differed) after those in predicted order, the rest as ranked; and one
    line where the measured order moved the predicted first, else None. A real run is the better
    evidence between methods predicted close: the pick is the fastest one measured."""
    top, rest = advice[:max(0, confirmed)], advice[max(0, confirmed):]
    clean = sorted((a for a in top if ran_clean(a)), key=lambda a: -a.measured_speedup)   # stable at a tie
    ordered = clean + [a for a in top if not ran_clean(a)] + rest
    if not top or ordered[0] is top[0]:
        return ordered, None
    first, was = ordered[0], top[0]
    was_measured = f"measured {was.measured_speedup:.2f}x" if ran_clean(was) else "its run failed or differed"
    return ordered, (f"ordered by the confirmed runs: {first.method} first, measured {first.measured_speedup:.2f}x "
                     f"(predicted {first.predicted_speedup:.2f}x, #{first.predicted_rank} by prediction); "
                     f"{was.method}, predicted first at {was.predicted_speedup:.2f}x, {was_measured}")
