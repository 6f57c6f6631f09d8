"""What one prompt produced, and the numbers read from it; no torch.

:class:`StrategyRun` and :class:`PromptRun` are filled by the runner in a live
session and rebuilt from a trace file by ``infer.py --replay``, so the
renderer and the JSON output read the same objects either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from analysis import (
    AcceptanceCounts,
    CostModel,
    RoundMix,
    acceptance_counts,
    ar_step_from_result,
    best_cap,
    best_gamma,
    costs_from_result,
    draft_share,
    drafter_chose_lengths,
    engine_numbers,
    estimated_inputs,
    first_round,
    measured_mix,
    mix_run_speedup,
    mix_speedup,
    source_numbers,
    tokens_per_s_at_rtt,
    yield_by_position,
)
from analysis.ceiling import MAX_TOKENS as CEILING_MAX_TOKENS, copy_ceiling
from analysis.speedup import SEARCH_GAMMA
from analysis.lookahead import lookahead_summary
from analysis.trees import tree_model, tree_summary
from generation.result import GenerationResult, Round, first_divergence
from repl.settings import STRATEGY_LABELS

DRAFTING = ("speculative", "ngram", "lookahead")
PIECE_WINDOW = 8  # tokens of left context used to decode one token's text


# ------------------------------------------------------------ token pieces

def token_pieces(tokenizer, context: list[int], tokens: list[int]) -> list[str]:
    """The text each of ``tokens`` adds after ``context`` (special tokens shown).

    Decoding a token alone breaks multi-byte characters and leading spaces, so
    each piece is the difference between decoding a short window with and
    without the token.
    """
    pieces, seq = [], list(context[-PIECE_WINDOW:])
    for token in tokens:
        before = tokenizer.decode(seq, skip_special_tokens=False)
        after = tokenizer.decode(seq + [token], skip_special_tokens=False)
        pieces.append(after[len(before):] if after.startswith(before) else tokenizer.decode([token]))
        seq = (seq + [token])[-PIECE_WINDOW:]
    return pieces


def round_pieces(tokenizer, prompt_ids: list[int], trace: list[Round]) -> list[dict]:
    """Per round, the text of each drafted token and of the target's token.

    ``{"drafted": [...], "token": str | None}``: accepted drafts are decoded
    after the text so far, rejected ones and the target's token after the
    accepted drafts. A trace file stores these, since a replay has no tokenizer.
    """
    out, context = [], list(prompt_ids)
    for rnd in trace:
        accepted = list(rnd.drafted[: rnd.accepted])
        after = context + accepted
        drafted = token_pieces(tokenizer, context, accepted) + token_pieces(tokenizer, after, list(rnd.rejected))
        token = None if rnd.token is None else token_pieces(tokenizer, after, [rnd.token])[0]
        piece = {"drafted": drafted, "token": token}
        if getattr(rnd, "tree_tokens", ()):
            # The candidates that lost where the path stopped (the stop node's children).
            stop = rnd.path[-1] if rnd.path else -1
            losers = [t for t, p in zip(rnd.tree_tokens, rnd.tree_parents) if p == stop]
            piece["losers"] = token_pieces(tokenizer, after, losers) if losers else []
        out.append(piece)
        context = after + ([rnd.token] if rnd.token is not None else [])
    return out


# ------------------------------------------------------------ one strategy

@dataclass
class StrategyRun:
    """One strategy's outcome: a result and its decoded text, or an error line.

    ``pieces``: per round, the decoded text of its tokens (see
    :func:`round_pieces`); filled when a trace is written or read back.
    ``other_load``: the cores' worth of CPU other processes used while it ran
    (``utils.machine_load.other_load``; None when unknown or not measured).
    """

    key: str
    result: GenerationResult | None = None
    text: str = ""
    error: str | None = None
    pieces: list[dict] | None = None
    other_load: float | None = None

    @property
    def label(self) -> str:
        return STRATEGY_LABELS[self.key]

    @property
    def usable(self) -> bool:
        """A complete result to compare against (not failed, not interrupted)."""
        return self.result is not None and not self.result.interrupted

    @property
    def drafting(self) -> bool:
        return self.key in DRAFTING


@dataclass
class WhatIf:
    """The speedup model with a network round trip of ``rtt_ms`` on every target
    call (``/rtt``), from the run's own acceptance and costs: ``predicted`` for
    this run (target AR's rate at that round trip as the baseline),
    ``predicted_steady`` for long outputs, and the best γ there."""

    rtt_ms: float
    predicted: float | None
    predicted_steady: float
    best_gamma: int | None          # None: the strategy has no γ to choose (lookahead)
    best_speedup: float | None
    measured_ms: float | None = None   # a served run: the round trip per request it measured


@dataclass
class Why:
    """Why a drafting strategy ran as fast as it did (see docs/why.md).

    ``acceptance``: the run's acceptance counters, as the serving engines count
    them (``analysis.acceptance``): every acceptance number shown comes from it.
    ``yield_rates``: the rates the
    speedup model uses (a draft asked for and not made counts as rejected).
    ``predicted`` is the model's speedup for this run (its first round, the
    prompt's prefill, as measured; the rest priced by the model), comparable
    with the measured speedup; ``predicted_steady`` the decode part's prediction
    (no prefill: the long-output limit), comparable with :meth:`PromptRun.decode_speedup`;
    ``first_round_s`` what the prefill round took. ``best_gamma`` /
    ``best_speedup`` the steady-state optimum (None for lookahead, which has no γ
    to choose: ``no_gamma``). ``cost_source`` says where the plain step every
    prediction is a ratio to came from (:data:`PLAIN_STEP_SOURCES`), ``plain_step_s``
    what it cost. ``estimated``: the inputs the prediction did not measure and the
    model filled in (``analysis.speedup.estimated_inputs``); empty when all were measured.

    ``measured``: the run's drafter chose each round's draft length (a match
    drafter, docs/model_free.md); the model then prices the measured draft
    lengths (``mix``, ``analysis.speedup.measured_mix``) instead of one γ, and
    ``best_gamma`` is the best cap on them. ``sources``: where its drafts came
    from and the draft-length distribution (``analysis.sources.source_numbers``).
    ``ceiling``: for a greedy NASD run, the copy ceiling of its output
    (:meth:`PromptRun.copy_ceiling`).
    """

    acceptance: AcceptanceCounts
    yield_rates: list[float]
    draft_share: float
    gamma: int
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
    estimated: list[str] = field(default_factory=list)
    no_gamma: bool = False

    def mix(self, trace: list) -> RoundMix:
        """The rounds the speedup model prices: the measured draft lengths, or γ."""
        if self.measured:
            return measured_mix(trace)
        return RoundMix.constant(self.yield_rates, self.gamma, self.draft_share)

    def best(self, trace: list, costs: CostModel) -> tuple[int, float]:
        """(γ, speedup) the model predicts best at ``costs``: over constant γ, or, when
        the drafter chose its lengths (chains), over a cap on them; (None, None) for a
        strategy with no γ to choose (lookahead)."""
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


def _round_gamma(trace: list[Round]) -> int:
    return max((max(r.gamma, len(r.drafted)) for r in trace), default=0)


# ------------------------------------------------------------ one prompt

@dataclass
class PromptRun:
    """Every strategy's run on one prompt, and the comparisons between them.

    ``settings``: the session settings the prompt ran with (``Settings.to_dict``).
    ``token_text``: the text of token ids the inspector names (filled when a
    trace is written or read back; a live session decodes with its tokenizer).
    ``target_dtype``: the target's dtype ("bfloat16", ...; "" when unknown, as
    for a served target).
    ``machine_load``: the machine's state over the whole prompt
    (``utils.machine_load.load_record``: cores, load averages at its start and end, the
    other processes' load and whether that was busy); None when not measured (old traces).
    """

    prompt: str
    prompt_ids: list[int]
    greedy: bool
    runs: list[StrategyRun] = field(default_factory=list)
    interrupted: bool = False
    settings: dict = field(default_factory=dict)
    token_text: dict[int, str] = field(default_factory=dict)
    target_dtype: str = ""
    machine_load: dict | None = None
    _ceilings: dict = field(default_factory=dict, repr=False, compare=False)   # copy_ceiling's, per run and γ
    # The target's one-token step (seconds) the runner timed at load (``Runner.warm_up``): the plain
    # step the predictions take when target AR did not run this prompt; None when not measured.
    load_step_s: float | None = None

    def baseline(self) -> StrategyRun | None:
        """The target autoregressive run, when it ran to completion."""
        run = next((r for r in self.runs if r.key == "target"), None)
        return run if run is not None and run.usable else None

    def speedup(self, run: StrategyRun) -> float | None:
        """tokens/s of ``run`` over tokens/s of target autoregressive decoding."""
        base = self.baseline()
        if base is None or not run.usable or base.result.tokens_per_second <= 0:
            return None
        return run.result.tokens_per_second / base.result.tokens_per_second

    def decode_speedup(self, run: StrategyRun) -> float | None:
        """Decode tokens/s of ``run`` over target AR's (``GenerationResult.decode_tokens_per_second``:
        the time to first token left out of both), the measured counterpart of the decode
        prediction (``Why.predicted_steady``). None where either is unknown."""
        base = self.baseline()
        if base is None or not run.usable:
            return None
        ours, theirs = run.result.decode_tokens_per_second, base.result.decode_tokens_per_second
        return ours / theirs if ours and theirs else None

    def call_cost(self, run: StrategyRun) -> float | None:
        """Seconds per target call of ``run`` (its drafting and host work included) over target
        AR's, the benchmark's ``call cost``: the speedup is tokens per target call divided by it.
        None without a baseline or for a run that made no target call (drafter AR)."""
        base = self.baseline()
        if base is None or not run.usable or not run.result.target_calls or not base.result.target_calls:
            return None
        theirs = base.result.seconds / base.result.target_calls
        return (run.result.seconds / run.result.target_calls) / theirs if theirs > 0 else None

    def divergence(self, run: StrategyRun) -> tuple[bool | None, int | None]:
        """(identical to target AR, first differing token index) under greedy.

        (None, None) when the check does not apply: sampling, no baseline, or
        an incomplete run.
        """
        base = self.baseline()
        if not self.greedy or base is None or not run.usable:
            return None, None
        index = first_divergence(run.result.tokens, base.result.tokens)
        return index is None, index

    def ar_step_s(self) -> float | None:
        """Target AR's seconds per token (prefill left out), when it ran to completion."""
        base = self.baseline()
        return None if base is None else ar_step_from_result(base.result)

    def plain_step(self) -> tuple[float | None, str | None]:
        """(seconds, source) of the plain target step the predictions are ratios to: target AR's
        decode seconds per token when it ran this prompt (``"target AR"``), else the step timed at
        load (``"load"``), else (None, None): each run then reads it off its own rounds."""
        ar_step = self.ar_step_s()
        if ar_step is not None:
            return ar_step, "target AR"
        if self.load_step_s:
            return self.load_step_s, "load"
        return None, None

    def rtt_ms(self) -> float:
        """The what-if round trip the prompt ran with (``/rtt``; 0 in old traces)."""
        return float(self.settings.get("rtt") or 0.0)

    def why(self, run: StrategyRun, rtt_ms: float | None = None) -> Why | None:
        """Acceptance statistics and the speedup model for a drafting run.

        ``rtt_ms`` (default: the prompt's ``/rtt``) > 0 adds the model's
        prediction with that round trip on every target call (``Why.what_if``).
        """
        if not run.drafting or run.result is None:
            return None
        trace = run.result.trace
        # Lookahead's rounds ask for N - 1 drafts, whatever /gamma says.
        own = (int(self.settings.get("lookahead_ngram") or 0) - 1) if run.key == "lookahead" else 0
        gamma = own if own > 0 else int(self.settings.get("gamma") or _round_gamma(trace))
        why = Why(
            acceptance=acceptance_counts(trace),
            yield_rates=yield_by_position(trace),
            draft_share=draft_share(trace),
            gamma=gamma,
            # Lookahead's rounds are priced as they ran (their candidates and the window they
            # fed), and it has no γ to search: W, N and G fix its rounds.
            measured=drafter_chose_lengths(trace) or run.key == "lookahead",
            sources=source_numbers(trace),
            no_gamma=run.key == "lookahead",
        )
        if run.key == "ngram":
            why.ceiling = self.copy_ceiling(run, max(gamma, _round_gamma(trace)))
        plain_s, source = self.plain_step()
        if run.result.tree and not why.no_gamma:   # lookahead's tree is its G candidates, not a budget to choose
            why.tree = tree_model(run.result, ar_step_s=plain_s)
        costs = costs_from_result(run.result, ar_step_s=plain_s)
        if costs is None or gamma < 1:
            return why
        try:
            mix = why.mix(trace)
            why.predicted_steady = mix_speedup(mix, costs)
            base = self.baseline()
            why.predicted = why.predicted_steady if base is None else mix_run_speedup(
                run.result, mix, costs, base.result.tokens_per_second)
            why.first_round_s = first_round(run.result)[0]
            why.best_gamma, why.best_speedup = why.best(trace, costs)
        except ValueError:  # costs that cannot price a round (all zero)
            return why
        why.costs = costs
        why.plain_step_s = costs.verify(1)
        why.cost_source = source or ("own rounds" if 1 in costs.verify_s else "estimated")
        why.estimated = estimated_inputs(mix, costs)
        if run.key == "lookahead" and lookahead_window_unrecorded(trace):
            why.estimated.append("window rows (not recorded)")
        rtt_ms = self.rtt_ms() if rtt_ms is None else rtt_ms
        if rtt_ms > 0:
            why.what_if = self._what_if(run, why, rtt_ms)
        return why

    def copy_ceiling(self, run: StrategyRun, gamma: int) -> dict | None:
        """The copy ceiling of a greedy run's output (``analysis.ceiling``): the most tokens per
        target call any drafter copying from this prompt and output could have made at this γ,
        after a match of 1 token (``after_1``) and of 2 (``after_2``); with hindsight, so a bound,
        not a method. ``skipped`` says why it was not computed (one line); None under sampling."""
        if not self.greedy or gamma < 1 or run.result is None:
            return None
        key = (run.key, gamma, len(run.result.tokens))
        if key not in self._ceilings:
            tokens = run.result.tokens
            total = len(self.prompt_ids) + len(tokens)
            if total > CEILING_MAX_TOKENS:
                self._ceilings[key] = {"skipped": f"prompt and output hold {total} tokens "
                                                  f"(it is computed up to {CEILING_MAX_TOKENS})"}
            else:
                length = max(int(self.settings.get("length") or 0), len(tokens))
                self._ceilings[key] = {"gamma": gamma, **{
                    f"after_{m}": copy_ceiling(self.prompt_ids, tokens, gamma, length, match=m).tokens_per_call
                    for m in (1, 2)}}
        return self._ceilings[key]

    def _what_if(self, run: StrategyRun, why: Why, rtt_ms: float) -> WhatIf:
        """The speedup model with a round trip of ``rtt_ms`` on every target call. A local target
        has none, so all of it is added; a served run measured its own, so the model swaps the
        measured round trip per request for ``rtt_ms`` (each run, target AR included, its own)."""
        measured = measured_round_trip_s(run.result)
        costs = costs_from_result(run.result, ar_step_s=self.plain_step()[0],
                                  rtt_s=rtt_ms / 1000.0 - (measured or 0.0))
        if costs is not None and per_position_requests(run.result):
            costs = replace(costs, trip_per_position=True)
        trace, base = run.result.trace, self.baseline()
        mix, predicted = why.mix(trace), None
        if base is not None:
            ar_rate = tokens_per_s_at_rtt(base.result, rtt_ms / 1000.0 - (measured_round_trip_s(base.result) or 0.0))
            predicted = mix_run_speedup(run.result, mix, costs, ar_rate)
        best, best_speedup = why.best(trace, costs)
        return WhatIf(rtt_ms, predicted, mix_speedup(mix, costs), best, best_speedup,
                      None if measured is None else 1000.0 * measured)

    def strategy_dict(self, run: StrategyRun) -> dict:
        """One strategy's JSON entry: output, measured numbers and the why numbers."""
        entry: dict = {"label": run.label}
        if run.error is not None:
            entry["error"] = run.error
        if run.result is None:
            return entry
        r = run.result
        identical, index = self.divergence(run)
        why = self.why(run)
        entry.update(
            text=run.text,
            tokens=len(r.tokens),
            token_ids=r.tokens,
            seconds=r.seconds,
            tokens_per_s=r.tokens_per_second,
            first_token_s=r.first_token_s,
            decode_tokens_per_s=r.decode_tokens_per_second,
            other_load=run.other_load,
            acceptance_rate=why.acceptance.draft_acceptance_rate if why else None,
            tokens_per_target_call=r.tokens_per_target_call,
            target_calls=r.target_calls,
            drafter_calls=r.drafter_calls,
            drafted=r.drafted,
            accepted=r.accepted,
            stop_reason=r.stop_reason,
            speedup=self.speedup(run),
            call_cost=self.call_cost(run),
            identical_to_target=identical,
            first_divergence=index,
            phases=dict(r.phases),
            rollback=r.rollback,
            gamma_policy=r.gamma_policy,
            verify_rule=r.verify_rule,
            tree_rule=r.tree_rule,
            draft_share=why.draft_share if why else None,
            predicted_speedup=why.predicted if why else None,
            predicted_speedup_steady=why.predicted_steady if why else None,
            decode_speedup=self.decode_speedup(run),
            first_round_s=why.first_round_s if why else None,
            best_gamma=why.best_gamma if why else None,
            best_gamma_speedup=why.best_speedup if why else None,
            prediction_cost_source=why.cost_source if why else None,
            prediction_plain_step_s=why.plain_step_s if why else None,
            prediction_estimated=list(why.estimated) if why else None,
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

    def to_dict(self) -> dict:
        """The JSON object scripted mode prints for this prompt."""
        return {
            "prompt": self.prompt,
            "prompt_tokens": len(self.prompt_ids),
            "plain_step_at_load_s": self.load_step_s,
            "interrupted": self.interrupted,
            "machine_load": self.machine_load,
            "strategies": {run.key: self.strategy_dict(run) for run in self.runs},
        }
