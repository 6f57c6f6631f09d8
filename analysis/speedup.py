"""The speedup model: how fast speculative decoding should be, given what a run measured.

Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative Decoding", section 3):
with a rate a_i per draft position a round of gamma drafts yields

    E(gamma) = sum_{i=0..gamma} prod_{j<i} a_j

tokens, and costs gamma drafter steps, one target forward over gamma+1 tokens and host work, so

    speedup(gamma) = E(gamma) * verify(1) / (gamma * draft_step + verify(gamma + 1) + other)

(gamma = 0 is plain decoding: speedup 1). A network round trip (``/rtt``) adds ``rtt`` to every
target call (``CostModel.rtt_s``). Rounds that chose their own draft length (SuffixDecoding, the
suffix automaton), or only a share m of which drafted, are priced as measured: with s_k the share
of rounds that drafted k tokens and t_k what such a round yielded (:class:`RoundMix`),

    speedup = sum_k s_k t_k * verify(1) / (sum_k s_k (k * draft_step + verify(k + 1)) + other)

Lookahead's window of r rows widens every verify to k + 1 + r (``RoundMix.rows``). What the model
filled in rather than measured is named by :func:`estimated_inputs`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from analysis.acceptance import _get, drafted_count, round_counts, verify_width, window_rows


# The largest γ the speedup model searches for the best one (a run's own γ widens it).
SEARCH_GAMMA = 16

def _rate(rates: Sequence[float], j: int) -> float:
    """a_j; positions past the measured list reuse the last rate; none measured: 0."""
    if not rates:
        return 0.0
    return float(rates[j] if j < len(rates) else rates[-1])


def expected_tokens(rates: Sequence[float], gamma: int) -> float:
    """Expected tokens one round of ``gamma`` drafts produces (1.0 at gamma 0)."""
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {gamma}")
    total, survive = 0.0, 1.0
    for i in range(gamma + 1):
        total += survive  # the round reaches token i with probability prod_{j<i} a_j
        survive *= _rate(rates, i)
    return total


@dataclass
class CostModel:
    """What one round's pieces cost, in seconds.

    ``draft_step_s``: one drafter step (about 0 for n-gram look-ups). ``verify_s``: target forward
    seconds by width (k drafts + 1). ``other_per_round_s``: host work per round. ``rtt_s``: a network
    round trip added to every target call. ``trip_per_position``: each scored position is a request of
    its own (llama.cpp's server), so a call of width w pays w round trips.
    """

    draft_step_s: float
    verify_s: dict[int, float] = field(default_factory=dict)
    other_per_round_s: float = 0.0
    rtt_s: float = 0.0
    trip_per_position: bool = False

    def target_call(self, width: int) -> float:
        """Seconds of one target call at ``width`` tokens: its forward plus the round trip(s)."""
        return self.verify(width) + self.rtt_s * (width if self.trip_per_position else 1)

    def verify(self, width: int) -> float:
        """Target forward seconds at ``width`` tokens.

        Between measured widths: linear interpolation; above the widest: the line through the two widest,
        never falling; below the narrowest: that line, but never under the narrowest cost scaled by width.
        One measured width is taken as flat (the paper's memory-bound assumption).
        """
        if width < 1:
            raise ValueError(f"width must be >= 1, got {width}")
        if not self.verify_s:
            raise ValueError("no verify cost measured")
        points = sorted(self.verify_s.items())
        if width in self.verify_s:
            return self.verify_s[width]
        if len(points) == 1:
            return points[0][1]
        if width > points[-1][0]:
            (w0, c0), (w1, c1) = points[-2], points[-1]
            return c1 + max(0.0, (c1 - c0) / (w1 - w0)) * (width - w1)
        if width < points[0][0]:
            (w0, c0), (w1, c1) = points[0], points[1]
            line = c0 - (c1 - c0) / (w1 - w0) * (w0 - width)
            return max(line, c0 * width / w0)
        for (w0, c0), (w1, c1) in zip(points, points[1:]):
            if w0 < width < w1:
                return c0 + (c1 - c0) * (width - w0) / (w1 - w0)
        raise AssertionError("unreachable: width lies between measured widths")

    def round_s(self, gamma: int) -> float:
        """Seconds for one round of ``gamma`` drafts."""
        return gamma * self.draft_step_s + self.target_call(gamma + 1) + self.other_per_round_s


@dataclass(frozen=True)
class RoundMix:
    """Rounds by the number of tokens they drafted, and what such a round yields.

    ``shares[k]``: the share of rounds that drafted k tokens (k = 0: a plain step); ``tokens[k]``: the
    tokens such a round yields on average (a tree round counts its nodes as k). ``rows``: rows every
    verify feeds besides its drafts (lookahead's window), so a round is k + 1 + rows wide.
    """

    shares: dict[int, float]
    tokens: dict[int, float]
    rows: int = 0

    def width(self, k: int) -> int:
        """Tokens the verify of a round of ``k`` drafts feeds."""
        return k + 1 + self.rows

    @classmethod
    def constant(cls, rates: Sequence[float], gamma: int, draft_share: float = 1.0) -> "RoundMix":
        """The paper's case: a share ``draft_share`` of rounds drafts ``gamma``
        tokens and yields E(gamma) (:func:`expected_tokens`); the rest are plain steps."""
        if not 0.0 <= draft_share <= 1.0:
            raise ValueError(f"draft_share must be in [0, 1], got {draft_share}")
        m = draft_share
        return cls({gamma: m, 0: 1 - m}, {gamma: expected_tokens(rates, gamma), 0: 1.0})

    @property
    def mean_length(self) -> float:
        """Drafts per round on average (the plain steps count 0)."""
        return sum(share * k for k, share in self.shares.items())


def _yield(rnd: Any, cap: int | None) -> tuple[int, int]:
    """(draft length, tokens yielded) of one round, its chain cut to ``cap`` drafts.

    Cut to c drafts, a chain round would have accepted min(accepted, c) of the same drafts and then
    taken the target's token: a round's drafts do not depend on the cap.
    """
    length, accepted = drafted_count(rnd), round_counts(rnd)[1]
    own = _get(rnd, "token", None) is not None
    if cap is not None and _get(rnd, "tree_tokens", ()):
        raise ValueError("a tree round cannot be cut to a draft length")
    if cap is None or length <= cap:
        return length, accepted + own
    return cap, min(accepted, cap) + (own or accepted > cap)


def measured_mix(rounds: Sequence[Any], cap: int | None = None) -> RoundMix:
    """The rounds' own draft lengths and yields; ``cap``: every chain cut to at most ``cap`` drafts (the
    what-if of a smaller γ). The first round counts too, as in the acceptance rates."""
    counts: dict[int, int] = {}
    tokens: dict[int, int] = {}
    for rnd in rounds:
        length, got = _yield(rnd, cap)
        counts[length] = counts.get(length, 0) + 1
        tokens[length] = tokens.get(length, 0) + got
    n = sum(counts.values())
    if not n:
        raise ValueError("no rounds to measure draft lengths from")
    return RoundMix({k: c / n for k, c in sorted(counts.items())},
                    {k: tokens[k] / c for k, c in sorted(counts.items())},
                    max(window_rows(rnd) for rnd in rounds))


def mix_round(mix: RoundMix, costs: CostModel) -> tuple[float, float]:
    """(expected tokens, expected seconds) of one round drawn from ``mix``."""
    tokens, round_s = 0.0, 0.0
    for k, share in mix.shares.items():
        tokens += share * mix.tokens[k]
        round_s += share * (k * costs.draft_step_s + costs.target_call(mix.width(k)))
    round_s += costs.other_per_round_s
    if round_s <= 0:
        raise ValueError("a round's predicted cost is not positive")
    return tokens, round_s


def mix_speedup(mix: RoundMix, costs: CostModel) -> float:
    """Predicted tokens/s over plain target decoding for rounds drawn from ``mix``
    (the steady state, as :func:`predicted_speedup`)."""
    tokens, round_s = mix_round(mix, costs)
    return tokens * costs.target_call(1) / round_s


def predicted_speedup(rates: Sequence[float], gamma: int, costs: CostModel, *,
                      draft_share: float = 1.0) -> float:
    """Predicted tokens/s over plain target decoding for ``gamma`` drafts per round, in the steady
    state (prefill left out; :func:`predicted_run_speedup`). ``draft_share``: the share of rounds that
    draft at all."""
    if gamma == 0:
        return 1.0
    return mix_speedup(RoundMix.constant(rates, gamma, draft_share), costs)


def throughput_by_gamma(accept: Sequence[float], propose: Sequence[float], verify: Sequence[float], *,
                        draft_step_s: float, other_s: float) -> list[float]:
    """Predicted tokens per second for gamma = 0..len(accept), when the drafter may stop early.

    ``accept[i]``: P(draft i proposed and accepted | drafts 0..i-1 were); ``propose[i]``: P(draft i
    proposed | 0..i-1 were); ``verify[w - 1]``: target forward seconds at width w. A round costs
    draft_step * E[drafted] + E[verify(1 + drafted)] + other, drafted capped at gamma.
    """
    out = []
    tokens, reach = 1.0, 1.0        # E(gamma); P(drafts 0..gamma-1 all accepted)
    length_at_least = 1.0           # P(drafter proposes >= gamma tokens)
    drafted = 0.0                   # E[drafted], drafts capped at gamma
    verify_below = 0.0              # sum_{k<gamma} P(drafted == k) * verify(1 + k)
    for gamma in range(len(accept) + 1):
        if gamma > 0:
            reach *= accept[gamma - 1]
            tokens += reach
            longer = length_at_least * propose[gamma - 1]
            verify_below += (length_at_least - longer) * verify[gamma - 1]
            length_at_least = longer
            drafted += longer
        seconds = draft_step_s * drafted + verify_below + length_at_least * verify[gamma] + other_s
        out.append(tokens / seconds if seconds > 0 else 0.0)
    return out


def first_round(result: Any) -> tuple[float, int]:
    """(seconds, tokens) of a run's first round, which carries the prefill: its measured time to first
    token where there is one, else the first round's draft and verify seconds."""
    measured = _get(result, "first_token_s", None)
    if measured is not None:
        return float(measured), int(_get(result, "first_tokens", 0) or 0)
    rounds = list(_get(result, "trace", None) or [])
    if not rounds:
        return 0.0, 0
    rnd = rounds[0]
    drafted, accepted = round_counts(rnd)
    seconds = float(_get(rnd, "draft_s", 0.0) or 0.0) + float(_get(rnd, "verify_s", 0.0) or 0.0)
    return seconds, accepted + (_get(rnd, "token", None) is not None)


def predicted_run_speedup(result: Any, rates: Sequence[float], gamma: int, costs: CostModel,
                          ar_tokens_per_s: float, *, draft_share: float = 1.0) -> float | None:
    """The model's speedup for this run, comparable with the measured one: the first round as measured,
    the rest priced by the model (it tends to :func:`predicted_speedup` for long outputs). None when the
    run is too short. With ``costs.rtt_s``, ``ar_tokens_per_s`` must be at that round trip too
    (:func:`tokens_per_s_at_rtt`)."""
    if gamma < 1:
        return None
    return mix_run_speedup(result, RoundMix.constant(rates, gamma, draft_share), costs, ar_tokens_per_s)


def mix_run_speedup(result: Any, mix: RoundMix, costs: CostModel, ar_tokens_per_s: float) -> float | None:
    """:func:`predicted_run_speedup` with the rounds drawn from ``mix`` (see :class:`RoundMix`)."""
    total = len(_get(result, "tokens", None) or [])
    first_s, first_tokens = first_round(result)
    if total <= first_tokens or ar_tokens_per_s <= 0:
        return None
    tokens, round_s = mix_round(mix, costs)
    seconds = first_s + costs.rtt_s + (total - first_tokens) * round_s / tokens
    return total / seconds / ar_tokens_per_s


def tokens_per_s_at_rtt(result: Any, rtt_s: float) -> float:
    """A run's tokens/s had each of its target calls paid ``rtt_s`` more."""
    tokens = len(_get(result, "tokens", None) or [])
    seconds = float(_get(result, "seconds", 0.0) or 0.0) + rtt_s * int(_get(result, "target_calls", 0) or 0)
    return tokens / seconds if seconds > 0 else 0.0


def best_gamma(rates: Sequence[float], costs: CostModel, max_gamma: int = SEARCH_GAMMA, *,
               draft_share: float = 1.0) -> tuple[int, float]:
    """(gamma, predicted speedup) maximising the prediction over 0..max_gamma; 0: drafting does not
    pay. Ties go to the smaller gamma."""
    best = (0, 1.0)
    for gamma in range(1, max_gamma + 1):
        speedup = predicted_speedup(rates, gamma, costs, draft_share=draft_share)
        if speedup > best[1]:
            best = (gamma, speedup)
    return best


def best_cap(rounds: Sequence[Any], costs: CostModel, max_gamma: int = SEARCH_GAMMA) -> tuple[int, float]:
    """(cap, predicted speedup) for a drafter that chooses its own draft lengths: the cap on them the
    measured rounds predict fastest (:func:`measured_mix`); 0 when drafting does not pay. Never above
    the longest measured draft (what a longer one would have held was never seen); ties to the smaller."""
    best = (0, 1.0)
    for cap in range(1, max_gamma + 1):
        speedup = mix_speedup(measured_mix(rounds, cap), costs)
        if speedup > best[1]:
            best = (cap, speedup)
    return best


def best_drafting_gamma(rates: Sequence[float], costs: CostModel, max_gamma: int = SEARCH_GAMMA, *,
                        draft_share: float = 1.0) -> tuple[int, float]:
    """(gamma >= 1, predicted speedup) maximising the prediction when drafting at all: where
    :func:`best_gamma` says 0, this still ranks drafters by how little they lose."""
    return max(((gamma, predicted_speedup(rates, gamma, costs, draft_share=draft_share))
                for gamma in range(1, max_gamma + 1)), key=lambda item: item[1])


def _timed_rounds(rounds: list) -> list:
    """The rounds whose times describe a steady round: the first carries the
    prompt's prefill, so it is left out when there are others."""
    return rounds[1:] if len(rounds) > 1 else rounds


def _timed_costs(rounds: list) -> tuple[dict[int, list[float]], list[tuple[float, int]]]:
    """Of the steady rounds (:func:`_timed_rounds`): the verify seconds measured at each width
    (:func:`analysis.acceptance.verify_width`), and each round's (draft seconds, drafts)."""
    by_width: dict[int, list[float]] = {}
    drafts = []
    for rnd in _timed_rounds(rounds):
        verify = float(_get(rnd, "verify_s", 0.0) or 0.0)
        if verify > 0:
            by_width.setdefault(verify_width(rnd), []).append(verify)
        drafts.append((float(_get(rnd, "draft_s", 0.0) or 0.0), round_counts(rnd)[0]))
    return by_width, drafts


def ar_step_from_result(result: Any) -> float | None:
    """Seconds per token of plain target decoding, prefill left out: the AR run's decode part where
    measured, else its rounds' verify times (the first skipped), else its seconds over its tokens."""
    tokens = len(_get(result, "tokens", None) or [])
    seconds = float(_get(result, "seconds", 0.0) or 0.0)
    first_s = _get(result, "first_token_s", None)
    if first_s is not None:
        rest = tokens - int(_get(result, "first_tokens", 0) or 0)
        if rest > 0 and seconds > first_s:
            return (seconds - float(first_s)) / rest
    rounds = list(_get(result, "trace", None) or [])
    steady = _timed_rounds(rounds)
    verify = [float(_get(r, "verify_s", 0.0) or 0.0) for r in steady]
    if len(rounds) > 1 and all(v > 0 for v in verify):
        phases = _get(result, "phases", None) or {}
        other = float(phases.get("other", 0.0) or 0.0) / len(rounds)
        return sum(verify) / len(verify) + other
    return seconds / tokens if tokens and seconds > 0 else None


def costs_from_result(result: Any, ar_step_s: float | None = None, rtt_s: float = 0.0) -> CostModel | None:
    """A CostModel from a run's rounds (a GenerationResult, or its trace-file dict).

    Draft seconds over drafted tokens; the mean verify seconds at each width
    (:func:`analysis.acceptance.verify_width`); ``other`` over the rounds; the first round (the
    prefill) left out when there are others. ``ar_step_s``, the plain step, replaces the width-1 cost.
    None when no round measured a verify time.
    """
    rounds = list(_get(result, "trace", None) or [])
    by_width, drafts = _timed_costs(rounds)
    if not by_width:
        return None
    draft_s, drafted_total = sum(s for s, _ in drafts), sum(n for _, n in drafts)
    verify_s = {w: sum(v) / len(v) for w, v in by_width.items()}
    if ar_step_s is not None and ar_step_s > 0:
        verify_s[1] = ar_step_s
    phases = _get(result, "phases", None) or {}
    other = float(phases.get("other", 0.0) or 0.0) / len(rounds)
    return CostModel(
        draft_step_s=draft_s / drafted_total if drafted_total else 0.0,
        verify_s=verify_s,
        other_per_round_s=other,
        rtt_s=rtt_s,
    )


def needed_widths(mix: RoundMix) -> set[int]:
    """The verify widths a prediction for ``mix`` reads: each round's, and 1, the plain step
    every prediction is a ratio to."""
    return {1} | {mix.width(k) for k, share in mix.shares.items() if share > 0}


def estimated_inputs(mix: RoundMix, costs: CostModel) -> list[str]:
    """What the prediction for ``mix`` did not measure and the model filled in ([] when nothing):
    ``plain step``, and ``verify at width w`` for each width the rounds need and none measured."""
    missing = sorted(w for w in needed_widths(mix) if w not in costs.verify_s)
    return [("plain step" if w == 1 else f"verify at width {w}") for w in missing]


# ------------------------------------------------------------ a prediction's interval

# The spread of a run's own per-round costs the interval prices: their quartiles.
SPREAD_QUANTILES = (0.25, 0.75)


def _spread(values: Sequence[float], centre: float) -> tuple[float, float]:
    """(low, high) of ``values``: their quartiles (the one value twice when there is one), widened
    to take in ``centre``, the figure the point prediction priced (a mean that outliers lifted)."""
    ordered = sorted(values)
    if len(ordered) < 2:
        low = high = ordered[0] if ordered else centre
    else:
        low, high = (_quantile(ordered, q) for q in SPREAD_QUANTILES)
    return min(low, centre), max(high, centre)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolated linearly between neighbours."""
    at = q * (len(ordered) - 1)
    below = int(at)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (at - below)


def cost_bounds(result: Any, costs: CostModel, step_samples: Sequence[float] = ()) -> tuple[CostModel, CostModel]:
    """(dear, cheap): ``costs`` with every priced piece at the high end of its spread, and at the low.
    The plain step spans ``step_samples`` (min to max); each verify width and the drafter step the
    quartiles of the run's rounds (the first left out). Dear rounds over the cheapest plain step give
    the low end of the speedup."""
    by_width, drafts = _timed_costs(list(_get(result, "trace", None) or []))
    steps = [seconds / drafted for seconds, drafted in drafts if drafted]
    dear: dict[int, float] = {}
    cheap: dict[int, float] = {}
    for width, cost in costs.verify_s.items():
        cheap[width], dear[width] = _spread(by_width.get(width, ()), cost)
    plain = costs.verify_s.get(1)
    if step_samples and plain is not None:
        dear[1], cheap[1] = min(min(step_samples), plain), max(max(step_samples), plain)
    elif plain is not None:
        dear[1], cheap[1] = cheap[1], dear[1]          # the run's own plain rounds: low step, low speedup
    draft_low, draft_high = _spread(steps, costs.draft_step_s)
    return (CostModel(draft_high, dear, costs.other_per_round_s, costs.rtt_s, costs.trip_per_position),
            CostModel(draft_low, cheap, costs.other_per_round_s, costs.rtt_s, costs.trip_per_position))


def prediction_interval(result: Any, mix: RoundMix, costs: CostModel,
                        step_samples: Sequence[float] = ()) -> tuple[float, float]:
    """(low, high) of :func:`mix_speedup` for ``mix`` over the spread of what it priced
    (:func:`cost_bounds`): the range a prediction made without target AR carries."""
    dear, cheap = cost_bounds(result, costs, step_samples)
    ends = mix_speedup(mix, dear), mix_speedup(mix, cheap)
    return min(ends), max(ends)
