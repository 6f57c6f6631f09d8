"""``advise``: which way of drafting this pair should use on this machine for these prompts, and why.

Greedy only: target AR's output replays every chain drafter's rounds (``advisor.replay``). The
steps: target AR on each prompt, once, warm (the record the replay reads, and the predictions'
anchor); the cost table; the replay of the grid; the ranking (``advisor.rank``); and the top few
confirmed for real through ``engine.run_strategy`` beside target AR, prompt by prompt (the measured
speedups' denominator), which then lead in the order their runs measured
(``advisor.rank.confirmed_first``). Every run takes one compile path, :data:`RANKED_COMPILE`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from advisor import CONFIRM
from advisor.bound import bounded_line
from advisor.costs import CONTEXT, MAX_CONTEXT, CostTable, drafter_key, measure_costs
from advisor.rank import ROUNDING, Advice, confirmed_first, is_copier, miss_line, rank, steady_steps

SEED = 42
WARM_TOKENS = 8     # the untimed run before a confirmed method's timed ones
SCREEN_KEEP = 3     # a self-drafter's trees replayed in full after screening on the first prompt
SCREEN_TOKENS = 24  # the first prompt's new tokens the screening replays
CONFIRM_REPEATS = 1  # the confirming passes over the prompts, each beside a pass of target AR, prompt by prompt
RANKED_COMPILE = "off"   # the compile path (engine.Strategy.compile) of every run an advice makes
COMPILE_CACHES = {"off": "dynamic cache", "static": "static cache", "graphs": "static cache, captured graphs"}
SAMPLING_NOTE = ("the processor samples: the advice replays greedy paths and confirms under greedy, so its "
                 "acceptance is an estimate for sampling")


@dataclass
class AdviceReport:
    """What ``advise`` found: the advice best first, its wall seconds in all, the costs it priced
    with, what it could not replay, and the baseline."""

    advice: list[Advice]
    seconds: float
    costs: CostTable
    unreplayable: list[tuple[str, str]]
    prompts: int
    length: int
    ar_tokens_per_s: float
    ar_step_s: float | None
    notes: list[str] = field(default_factory=list)
    compile: str = RANKED_COMPILE               # the compile path the advice ran and ranked on
    session_compile: str | None = None          # the session's, where given
    whatif: object = None                       # an advisor.whatif.Projected, where asked for
    screened: list = field(default_factory=list)  # Screened: trees left out after the first prompt
    bounded: list = field(default_factory=list)   # advisor.bound.Bounded: sources left out by their ceiling
    ar_passes: list = field(default_factory=list)  # target AR's tokens/s in each pass over the prompts

    @property
    def ranked_on(self) -> str:
        """``ranked on compile off (dynamic cache)``: the header's words for the path ranked on."""
        return f"ranked on compile {self.compile} ({COMPILE_CACHES.get(self.compile, self.compile)})"

    def rounding_line(self) -> str | None:
        """One line on the replays exact only up to rounding, with each distinct reason, or None."""
        reasons = list(dict.fromkeys(a.note for a in self.advice if a.exactness == ROUNDING))
        if not reasons:
            return None
        return "replay rounding: a real run's counts up to floating-point rounding: " + "; ".join(reasons)

    def to_dict(self) -> dict:
        return {"advice": [a.to_dict() for a in self.advice], "seconds": round(self.seconds, 3),
                "ranked_on": self.ranked_on, "compile": self.compile, "session_compile": self.session_compile,
                "costs": self.costs.to_dict(),
                "unreplayable": [{"method": m, "reason": r} for m, r in self.unreplayable],
                "prompts": self.prompts, "length": self.length,
                "baseline": {"tokens_per_s": round(self.ar_tokens_per_s, 4),
                             "passes_tokens_per_s": [round(rate, 4) for rate in self.ar_passes],
                             "decode_step_s": None if self.ar_step_s is None else round(self.ar_step_s, 6)},
                "notes": list(self.notes), "screened": [s.to_dict() for s in self.screened],
                "bounded": [b.to_dict() for b in self.bounded],
                **({"whatif": {self.whatif.topic: self.whatif.to_dict()}} if self.whatif is not None else {})}


@dataclass
class Timing:
    """Runs' tokens, target calls and seconds, in all and after each run's first round (the decode part)."""

    tokens: int = 0
    seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    calls: int = 0

    def add(self, result) -> None:
        self.tokens += len(result.tokens)
        self.seconds += result.seconds
        self.calls += result.target_calls
        decode = result.decode_seconds
        if decode is not None and decode > 0:
            self.decode_tokens += len(result.tokens) - result.first_tokens
            self.decode_seconds += decode

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_call(self) -> float | None:
        return self.tokens / self.calls if self.calls else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 and self.decode_tokens else None

    @classmethod
    def pooled(cls, timings) -> "Timing":
        """Several timings' runs as one."""
        out = cls()
        for t in timings:
            out.tokens += t.tokens
            out.seconds += t.seconds
            out.decode_tokens += t.decode_tokens
            out.decode_seconds += t.decode_seconds
            out.calls += t.calls
        return out


@dataclass
class Baseline:
    """Target AR over the prompts: per prompt its output, tokens, seconds and time to first token from
    the pass the replay reads; ``first`` that pass's timing and ``later`` each later pass's (run beside
    the confirming runs, prompt by prompt)."""

    outputs: list[list[int]] = field(default_factory=list)
    runs: list[tuple[int, float, float | None]] = field(default_factory=list)   # (tokens, seconds, TTFT)
    first: Timing = field(default_factory=Timing)
    later: list[Timing] = field(default_factory=list)

    def add(self, result) -> None:
        """A run of the pass the replay reads."""
        self.outputs.append(list(result.tokens))
        self.runs.append((len(result.tokens), result.seconds, result.first_token_s))
        self.first.add(result)

    def add_pass(self, results) -> None:
        """Another pass of target AR over the prompts (its runs)."""
        timing = Timing()
        for result in results:
            timing.add(result)
        self.later.append(timing)

    @property
    def passes(self) -> list[Timing]:
        """Every pass's timing apart, the record's first."""
        return [self.first, *self.later]

    @property
    def timing(self) -> Timing:
        """The runs the measured speedups are over: the passes beside the confirming runs, or the
        record's pass where none ran."""
        return Timing.pooled(self.later) if self.later else self.first

    def passes_line(self) -> str:
        """``target AR's passes over the prompts: 14.9 (the record), 13.8 tok/s``: how far the machine's
        speed moved between the record the predictions read and the runs the measured speedups read."""
        rates = ", ".join(f"{p.tokens_per_s:.1f}" for p in self.passes)
        return (f"target AR's passes over the prompts (the record's first; the measured speedups are over the "
                f"ones run beside the confirming runs): {rates} tok/s")

    @property
    def tokens_per_s(self) -> float:
        return self.timing.tokens_per_s

    @property
    def decode_tokens_per_s(self) -> float | None:
        return self.timing.decode_tokens_per_s

    @property
    def step_s(self) -> float | None:
        """Target AR's decode step in the pass the replay reads."""
        rate = self.first.decode_tokens_per_s
        return 1.0 / rate if rate else None


def greedy_fields(strategy_fields: dict):
    """``strategy_fields`` with the greedy processor and :data:`RANKED_COMPILE`: how every run of an
    advice (and of a check beside it) is set up."""
    from sampling import GreedyProcessor

    return {"processor": GreedyProcessor(), "compile": RANKED_COMPILE, **strategy_fields}


def compile_note(session_compile: str | None) -> str | None:
    """One line where the session's compile path is not the one the advice ranks on, else None."""
    if session_compile is None or session_compile == RANKED_COMPILE:
        return None
    return (f"the session runs compile {session_compile} ({COMPILE_CACHES.get(session_compile, session_compile)}); "
            f"this advice ran, ranked and confirmed every method on compile {RANKED_COMPILE}, where the speedups "
            "can differ")


def target_ar(length: int, seed: int):
    """Target AR as the advice runs it: greedy, on :data:`RANKED_COMPILE`."""
    from engine import Strategy

    return Strategy("target", **greedy_fields(dict(max_gen_len=length, seed=seed)))


def run_baseline(pair, prompts: list[list[int]], length: int, state, seed: int = SEED) -> tuple[Baseline, list]:
    """Target AR, greedy, on every prompt after a short untimed run: the baseline, and each run as the
    record the replay reads (``advisor.recorded.recorded_from``)."""
    from advisor.recorded import recorded_from, refuse_served
    from engine import run_strategy

    refuse_served(pair)
    strategy = target_ar(length, seed)
    run_strategy(replace(strategy, max_gen_len=min(length, WARM_TOKENS)), pair, prompts[0], state=state)
    out, recorded = Baseline(), []
    for prompt in prompts:
        result = run_strategy(strategy, pair, prompt, state=state)
        out.add(result)
        recorded.append(recorded_from(pair, prompt, result))
    return out, recorded


@dataclass
class Confirming:
    """One confirmed method's runs over the repeats: their timing, whether every output was
    target AR's, and the error of a run that failed."""

    advice: Advice
    timing: Timing = field(default_factory=Timing)
    identical: bool = True
    error: str = ""

    def finish(self, baseline: Baseline) -> None:
        """Fill the advice's measured speedups (over target AR's runs beside its own), identity and error."""
        advice = self.advice
        if self.error:
            advice.confirm_error = self.error
            return
        if self.timing.seconds > 0 and baseline.tokens_per_s > 0:
            advice.measured_speedup = self.timing.tokens_per_s / baseline.tokens_per_s
        decode = self.timing.decode_tokens_per_s
        if decode and baseline.decode_tokens_per_s:
            advice.measured_decode_speedup = decode / baseline.decode_tokens_per_s
        advice.measured_tokens_per_call = self.timing.tokens_per_call
        advice.identical = self.identical

    def strategy(self, length: int, seed: int):
        return self.advice.entry.method.strategy(**greedy_fields(dict(max_gen_len=length, seed=seed)))

    def warm(self, pair, prompt, length: int, state, seed: int = SEED) -> None:
        """An untimed short run of the method (its first forwards, its captures); a failure is kept."""
        self.run(pair, prompt, min(length, WARM_TOKENS), state, seed)

    def run(self, pair, prompt, length: int, state, seed: int = SEED, expected: list[int] | None = None) -> None:
        """One run of the method on ``prompt``, timed into ``timing`` where ``expected`` (target AR's
        output) is given; a method that fails for real is kept failed, not raised, and not run again."""
        from engine import run_strategy

        if self.error:
            return
        try:
            result = run_strategy(self.strategy(length, seed), pair, prompt, state=state)
        except Exception as e:          # a method that fails for real is shown failed, not the whole advice
            self.error = f"{type(e).__name__}: {e}"
            return
        if expected is not None:
            self.identical = self.identical and list(result.tokens) == expected
            self.timing.add(result)


def confirm_top(top: list[Advice], pair, prompts, length: int, state, baseline: Baseline, seed: int = SEED,
                repeats: int = CONFIRM_REPEATS, say: Callable[[str], None] = lambda line: None) -> None:
    """The ``top`` methods run for real ``repeats`` times over the prompts, prompt by prompt beside
    target AR: on each prompt target AR's run and then each method's, seconds apart, so a drift of the
    machine's speed during the advice (a quarter between minutes on a shared CPU) falls on both sides
    of every measured speedup. Target AR's runs make the later passes of ``baseline``, the measured
    speedups' denominator (``Confirming.finish``); each method runs once untimed first."""
    from engine import run_strategy

    confirming = [Confirming(a) for a in top]
    if not confirming:
        return
    for c in confirming:
        c.warm(pair, prompts[0], length, state, seed)
    target = target_ar(length, seed)
    names = ", ".join(c.advice.method for c in confirming)
    for repeat in range(max(1, repeats)):
        say(f"confirming {names} beside target AR, prompt by prompt"
            + (f" (repeat {repeat + 1} of {repeats})" if repeats > 1 else ""))
        results = []
        for prompt, expected in zip(prompts, baseline.outputs):
            results.append(run_strategy(target, pair, prompt, state=state))
            for c in confirming:
                c.run(pair, prompt, length, state, seed, expected=expected)
        baseline.add_pass(results)
    for c in confirming:
        c.finish(baseline)


def _needs(entries) -> tuple[set[int], dict[str, set[int]], dict, dict[str, tuple[float, int]]]:
    """The target widths and each drafter's step widths the entries' rounds ran, a method per
    drafter (to time one with no module of its own), and each drafter's steps the replays timed."""
    target: set[int] = {1}
    drafters: dict[str, set[int]] = {}
    methods = {}
    timed: dict[str, tuple[float, int]] = {}
    for entry in entries:
        target |= set(entry.replayed.widths)
        if is_copier(entry.method):      # its copy ceiling may round at any width up to γ + 1
            target |= set(range(1, entry.method.gamma + 2))
        if entry.draft_steps:
            key = drafter_key(entry.method)
            drafters.setdefault(key, {1}).update(steady_steps(entry, max(entry.replayed.widths, default=1)))
            methods.setdefault(key, entry.method)
            if entry.method.tree == 0 and entry.mode == "drafter":    # a chain's own proposals, timed
                seconds, steps = timed.get(key, (0.0, 0))
                timed[key] = (seconds + entry.timed[0], steps + entry.timed[1])
    return target, drafters, methods, timed


def context_of(prompts: list[list[int]], length: int) -> int:
    """The cache the forwards are priced on: the prompts' mean length and half the new tokens, the
    mean context a round of these runs reads."""
    return round(sum(len(p) for p in prompts) / len(prompts) + length / 2) if prompts else CONTEXT


def needed_costs(pair, entries, costs: CostTable | None, state, context: int | None = None,
                 anchor_s: float | None = None, extra=()) -> CostTable:
    """``costs`` when read from a file or when it has every width needed on a cache within a quarter of
    ``context``; else a table measured here (``anchor_s``: target AR's decode step). ``extra``: target
    widths needed beside the entries'."""
    target, drafters, methods, timed = _needs(entries)
    target |= set(extra)
    if costs is not None and costs.source:
        return costs
    if costs is not None and context is not None and abs(costs.context - context) > context / 4:
        costs = None                    # timed on another cache: timed again, whole
    if costs is not None and not costs.lacks(target, drafters):
        return costs
    return measure_costs(pair, target, drafters, state=state, base=costs, methods=methods, timed=timed,
                         context=costs.context if costs is not None else context, anchor_s=anchor_s)


def _source(method) -> tuple[str, str]:
    """The drafter a method drafts with, and its options: what the methods of one source share."""
    return method.drafter, repr(method.options)


def replay_sources(pair, recorded, methods, length: int, say, state=None, screen: bool = True, bounder=None
                   ) -> tuple[list, list[tuple[str, str]], list[Screened], list]:
    """Every method replayed (``advisor.replay.replay_grid``), one source at a time, so a source whose
    replay fails is left out with its reason; with ``screen``, a source's trees are screened first
    (:func:`screen_trees`). ``bounder(group, entries, name)``: where given, called before each source
    ``advisor.bound.boundable`` names (those replay last, after every other source) with the entries
    replayed so far; a source it returns an ``advisor.bound.Bounded`` for is not replayed.
    ``state``: shared with the confirming runs."""
    from advisor.bound import boundable
    from advisor.replay import replay_grid
    from advisor.stored import Stores

    stores = Stores(pair)              # the target's keys and values over each output, for every source
    sources: dict[tuple[str, str], list] = {}
    for m in methods:
        sources.setdefault(_source(m), []).append(m)
    bounds = {id(g): bounder is not None and boundable(pair, g) for g in sources.values()}
    groups = sorted(sources.values(), key=lambda group: bounds[id(group)])    # the bounded ones last
    entries, failed, screened, bounded = [], [], [], []
    for group in groups:
        name = group[0].key + (f" and {len(group) - 1} more of its drafter" if len(group) > 1 else "")
        try:
            if bounds[id(group)]:
                say(f"bounding {name}")
                out = _bounded(bounder, group, entries, name)
                if out is not None:
                    bounded.append(out)
                    continue
            say(f"replaying {name}")
            if screen:
                group, out = screen_trees(pair, recorded, group, length, state, stores)
                screened += out
            entries += replay_grid(pair, recorded, group, max_gen_len=length, state=state, stores=stores)
        except Exception as e:         # the rest of the grid is still advised on
            failed.append((name, f"its replay failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
    return entries, failed, screened, bounded


def _bounded(bounder, group, entries, name):
    """``bounder``'s answer for ``group``, or None (the source is replayed) where working out its
    bound fails: a bound only ever saves a replay."""
    try:
        return bounder(group, entries, name)
    except Exception:       # noqa: BLE001  (the replay that follows counts what the bound could not)
        return None


@dataclass(frozen=True)
class Screened:
    """A tree method left out after its replay on the first prompt: its tokens per target call and
    drafter forwards per token there, and what it was screened on."""

    method: str
    tokens_per_call: float
    forwards_per_token: float
    on: str

    def to_dict(self) -> dict:
        return {"method": self.method, "tokens_per_call": round(self.tokens_per_call, 3),
                "drafter_forwards_per_token": round(self.forwards_per_token, 3), "screened_on": self.on}


def _screens(pair, m) -> bool:
    """Whether ``m`` is screened: a tree of a drafter the replay runs for real on the target's cache
    (a self-drafter's trees, each round a forward per level of the drafter model)."""
    from advisor.replay import _target_reads, replay_mode

    return m.tree > 0 and replay_mode(pair, m) == "drafter" and _target_reads(pair, m) == "cache"


def _round_cost(entry) -> float:
    """A screened tree's target steps per token on its first prompt: its verifies and drafter forwards,
    each counted as one step (the drafter model is the target itself, or a copy of it)."""
    tokens = entry.replayed.tokens
    return (entry.replayed.calls + sum(entry.draft_steps.values())) / tokens if tokens else float("inf")


def screen_trees(pair, recorded, group: list, length: int, state, stores) -> tuple[list, list[Screened]]:
    """``group`` less the trees screened out: where it has more than :data:`SCREEN_KEEP` trees of a
    self-drafter and the advice replays more than the screening would (another prompt, or more than
    :data:`SCREEN_TOKENS` new tokens), each is replayed on the first prompt's first
    :data:`SCREEN_TOKENS` new tokens alone (its proposals kept for the full replay, ``advisor.memo``)
    and the :data:`SCREEN_KEEP` of fewest target steps per token there (:func:`_round_cost`) stay;
    the others come back as :class:`Screened`."""
    from advisor.replay import replay_grid

    trees = [m for m in group if _screens(pair, m)]
    tokens = min(length, SCREEN_TOKENS)
    if len(trees) <= SCREEN_KEEP or (len(recorded) < 2 and tokens == length):
        return group, []
    first = replay_grid(pair, recorded[:1], trees, max_gen_len=tokens, state=state, stores=stores)
    order = sorted(first, key=_round_cost)
    kept = {e.method.key for e in order[:SCREEN_KEEP]}
    on = f"the first {tokens} new tokens of prompt 1 of {len(recorded)}"
    out = [Screened(e.method.key, e.replayed.tokens_per_call,
                    sum(e.draft_steps.values()) / e.replayed.tokens if e.replayed.tokens else 0.0, on)
           for e in order[SCREEN_KEEP:]]
    return [m for m in group if not _screens(pair, m) or m.key in kept], out


def screened_line(screened: list[Screened]) -> str | None:
    """One line naming the methods screened out, or None."""
    if not screened:
        return None
    return (f"screened out, not replayed in full (each replayed on {screened[0].on} only, its tokens per "
            "target call there): " + ", ".join(f"{s.method} {s.tokens_per_call:.2f}" for s in screened))


def advise(pair, prompts: list[list[int]], *, length: int, costs: CostTable | None = None, confirm: int = CONFIRM,
           grid=None, state=None, seed: int = SEED, say: Callable[[str], None] = lambda line: None,
           processor=None, session_compile: str | None = None, screen: bool = True, bound: bool = True
           ) -> AdviceReport:
    """The advice for ``pair`` on ``prompts``, ``length`` new tokens each. ``costs``: a table to price
    with (only missing widths are measured); ``confirm``: how many to run for real; ``grid``: default
    ``advisor.replay.default_grid(pair)``; ``processor`` (a logits processor, or the
    ``sampling.spec.ProcessorSpec`` a front end holds): when it samples, chains are also estimated
    under it (``advisor.sampling``); ``session_compile``: named where it is not :data:`RANKED_COMPILE`;
    ``screen``: a self-drafter's trees screened on the first prompt (:func:`screen_trees`); ``bound``: a
    large source of a drafter model left out where its ceiling is under the best replayed before it
    (``advisor.bound``)."""
    from advisor.replay import default_grid, unreplayable
    from engine import EngineState

    if not prompts:
        raise ValueError("advise needs at least one prompt")
    if length < 1:
        raise ValueError(f"the length must be at least 1, got {length}")
    started = time.perf_counter()
    state = state if state is not None else EngineState()
    say(f"target AR on {len(prompts)} prompt(s): the baseline, and the output the replay reads")
    baseline, recorded = run_baseline(pair, prompts, length, state, seed)
    methods = list(grid) if grid is not None else default_grid(pair)
    context = min(MAX_CONTEXT, context_of(prompts, length))

    def bounder(group, entries, name):
        """The bound of ``group`` on the table the final pricing reuses (measured here once)."""
        from advisor.bound import bound, verify_widths

        nonlocal costs
        if not entries:
            return None
        costs = needed_costs(pair, entries, costs, state, context, baseline.step_s, extra=verify_widths(group))
        ranked = rank(entries, costs, baseline.step_s, recorded=recorded, max_gen_len=length, runs=baseline.runs)
        return bound(pair, group, ranked, costs, state=state, max_gen_len=length, ar_step_s=baseline.step_s,
                     name=name)

    entries, failed, screened, bounded = replay_sources(pair, recorded, methods, length, say, state, screen,
                                                        bounder if bound else None)
    say("pricing" if costs is not None and costs.source else "measuring the forward costs and pricing")
    table = needed_costs(pair, entries, costs, state, context, baseline.step_s)
    ranked = rank(entries, table, baseline.step_s, recorded=recorded, max_gen_len=length, runs=baseline.runs)
    confirm_top(ranked[:max(0, confirm)], pair, prompts, length, state, baseline, seed, say=say)
    misses = [line for line in (miss_line(a) for a in ranked[:max(0, confirm)]) if line]
    if misses:
        misses.append(baseline.passes_line())
    ranked, reordered = confirmed_first(ranked, confirm)
    notes = [line for line in (reordered, *misses, compile_note(session_compile), screened_line(screened),
                               bounded_line(bounded)) if line]
    if processor is not None and not processor.is_greedy:
        from advisor.sampling import estimate_chains
        from engine.run import loop_vocab_size
        from sampling.spec import as_processor

        why_not = estimate_chains(pair, as_processor(processor), recorded, ranked, table, baseline.step_s, loop_vocab_size(pair))
        if why_not:
            notes.append(why_not)
    if any(a.identical is False for a in ranked):
        notes.append("a confirmed run's output differed from target AR's: see its row")
    return AdviceReport(ranked, time.perf_counter() - started, table, list(unreplayable(pair)) + failed,
                        len(prompts), length, baseline.tokens_per_s, baseline.step_s, notes,
                        session_compile=session_compile, screened=screened, bounded=bounded,
                        ar_passes=[p.tokens_per_s for p in baseline.passes])
