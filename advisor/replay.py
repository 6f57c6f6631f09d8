"""Every drafter this pair can use, replayed over target AR's greedy output: no verify forward.

A :class:`Method` is one point of the advisor's grid (a drafter, its options, γ, its γ policy, a
chain or a tree); :func:`replay_grid` replays each over the recorded outputs
(``advisor.recorded.record``) into a :class:`ReplayEntry`: the target calls, drafted and accepted
tokens a real run would count (``engine.run_strategy``, greedy), its verify widths, the drafter's
forwards by width and its acceptance by draft position.

Every method runs through ``engine.run_strategy`` itself, one run per prompt, with the target
replaced by the record (``advisor.stored.RecordedTarget``: its verifies answered from target AR's
output, its cache kept as far as the drafter reads it); the counts, widths, first rounds and
draft seconds are the run's. Two kinds of drafter:

* teacher forcing (``advisor.teacher``): a plain drafter model's chains under a policy that needs
  no more than its argmax (constant, heuristic), alone or as the hybrid's drafter model, from one
  drafter forward per prompt, handed to the run as its drafter;
* the engine's own drafter (``engine.drafters.DRAFTERS``), built as a run builds it: n-gram
  storages, trees (a drafter model grows them best-first by its probability, so the nodes off the
  output's path matter: they are grown, not read from teacher-forced rows), self-drafters, the
  hybrid's trees, the confidence policy (the drafter's own early stop), and the drafters of the
  target's hidden states (MTP layers, EAGLE-3 heads, Gemma 4 assistants) and a drafter with a
  tokenizer of its own, whose entries are marked estimates (their kind's ``replay`` says why).

Each entry says how far its counts are a real run's (``advisor.rank.EXACTNESS``): ``exact`` on a
float32 target where the replay computes what a run computes; ``rounding`` where a run can part
from target AR's output by rounding alone (a bfloat16 or float16 target, whose verifies round a
near-tie otherwise than target AR's steps) or where the replay fed the target's cache the kept
tokens from other forwards than a run's verifies (a self-drafter: ``advisor.stored``'s one wide
forward, the same values up to rounding; a drafter of the target's states, whose target ran for real); ``estimated`` where :func:`_estimate_note` says why.

What cannot be replayed at all is listed by :func:`unreplayable` with its reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from advisor.rank import ESTIMATED, EXACT, ROUNDING
from advisor.memo import memoised, memoised_in
from advisor.recorded import Recorded, Replayed, storage_options
from advisor.stored import REAL, Stores, recorded_target
from advisor.teacher import TeacherDrafter, guesses, teachable
from engine.named import named_strategy
from engine.strategy import HybridOptions, NGramOptions, Strategy
from ngram_assisted.hybrid import HybridDrafter
from generation.result import Round
from utils.defaults import DEFAULTS
from utils.method_name import FILL, MethodName, parse_method_name
from utils.options import NGRAM_STORAGES

SELF_SPECS = ("self:bf16", "self:int8")
HYBRID_MATCH = 4            # the hybrid's L in the default grid
# Policies the replay runs through the engine's own policy object; "model" reads the machine's
# measured round times, which a replay has not.
REPLAYED_POLICIES = ("constant", "heuristic", "confidence")
TEACHER_POLICIES = ("constant", "heuristic")    # they read only the drafts' count and acceptance


@dataclass(frozen=True)
class Method:
    """One point of the grid. ``key`` names it as the benchmark names its variants
    (``speculative@4``, ``speculative:heuristic@4``, ``speculative+tree16@4``,
    ``speculative[self:int8]@4``, ``speculative+hybrid4@4``, ``ngram[suffix]@6``); ``drafter`` is an
    ``engine.drafters.DRAFTERS`` key, ``options`` the strategy's ``drafter_options``; ``tree`` the
    most draft nodes a round verifies (0: chains), ``branch`` children per expanded node."""

    key: str
    drafter: str
    options: object
    gamma: int
    gamma_policy: str = "constant"
    tree: int = 0
    branch: int = DEFAULTS.tree_branch

    def strategy(self, **fields) -> Strategy:
        """The Strategy that runs this method (``fields``: processor, max_gen_len, seed, ...;
        greedy and no inspector unless given)."""
        from sampling import GreedyProcessor

        hybrid = isinstance(self.options, HybridOptions)
        ngram = self.options.retrieval if hybrid else self.options
        fields = {"processor": GreedyProcessor(), "inspect": False, **fields}
        return named_strategy(parse_method_name(self.key), cross=self.options.model if hybrid else None,
                              tree_branch=self.branch, **fields,
                              **({"ngram": ngram} if isinstance(ngram, NGramOptions) else {}))


def method(drafter: str, options: object, gamma: int, gamma_policy: str = "constant", tree: int = 0,
           branch: int = DEFAULTS.tree_branch) -> Method:
    """A :class:`Method` with its key written as the benchmark writes the variant's name."""
    storage, spec = "", options if drafter == "self" else ""
    if drafter == "ngram":
        options = options or NGramOptions()
        storage = options.storage + (FILL if options.fill_width else "")
    hybrid = options.min_match if isinstance(options, HybridOptions) else 0
    name = MethodName("speculative" if drafter in ("model", "self") else drafter, gamma, gamma_policy, tree,
                      drafter=spec or "", hybrid=hybrid, storage=storage)
    return Method(name.name, drafter, options, gamma, gamma_policy, tree, branch)


@dataclass
class ReplayEntry:
    """One method replayed: ``replayed`` (calls, drafted, accepted, tokens, verify widths after the
    prefills); ``draft_steps`` the drafter model's forwards by width, all the engine runs
    ({} model-free), of which ``prefill_steps`` in each prompt's first round (the prompt fed);
    ``rates`` the acceptance by draft position; ``exactness`` (``advisor.rank.EXACTNESS``): how far
    the counts are a real greedy run's (``note`` says why where they are not exactly)."""

    method: Method
    replayed: Replayed
    draft_steps: dict[int, int]
    rates: list[float]
    exactness: str = EXACT
    note: str = ""
    prefill_steps: dict[int, int] = field(default_factory=dict)
    mode: str = ""              # "teacher" or "drafter" (replay_mode)
    # Per prompt, its first round (what a run's time to first token covers): (tokens it made,
    # the width of its verify where that was apart from the prefill, else None, the drafter's
    # forwards by width in it).
    firsts: list[tuple[int, int | None, dict[int, int]]] = field(default_factory=list)
    # The drafter's proposals after each prompt's first round, timed device-synced: (seconds,
    # forwards). A drafter whose step is not its module's forward alone is priced from these.
    timed: tuple[float, int] = (0.0, 0)
    # Seconds of the proposals after each prompt's first round that ran no drafter forward (a
    # storage's look-ups, a hybrid's storage rounds): the draft phase no forward cost prices.
    lookup_s: float = 0.0

    @property
    def exact(self) -> bool:
        return self.exactness == EXACT


# ---------------------------------------------------------------- what replays


def _kind(pair):
    from engine.kinds import kind_of_pair

    return kind_of_pair(pair)


def _model_reason(pair) -> str | None:
    """Why the pair's drafter model (the ``model`` drafter) cannot be replayed, or None."""
    return "the pair has no drafter model" if pair.drafter is None else None


def _target_path(pair) -> str:
    from kvcache.probe import cached_model

    return cached_model(pair.target).path


def _estimate_note(pair, m: Method) -> str:
    """Why ``m``'s replay on ``pair`` is an estimate, or "" where it is exact."""
    if isinstance(m.options, NGramOptions) and m.options.fill_width:
        return "fills its widths by forward costs measured once here; a run measures its own"
    if _target_path(pair) == "stepwise":
        return ("the target's cached forward runs one token at a time here (its probe), so a run counts a "
                "target call per token fed where the replay counts one per verify")
    kind = _kind(pair) if m.drafter == "model" else None
    if kind is not None and kind.replay is not None:
        return f"a {kind.name} drafter {kind.replay}"
    if replay_mode(pair, m) == "teacher" and _dtype(pair.drafter) != torch.float32:
        return f"a {_dtype(pair.drafter)} drafter's one pass over the output may round differently from its cached steps"
    return ""


def _rounding_note(pair, fed: bool) -> str:
    """Why a replay that is no estimate equals a run's counts only up to floating-point rounding,
    or "" where it is exact. ``fed``: the replay fed the target's cache kept tokens after its prefill."""
    dtype = _dtype(pair.target)
    if dtype not in (torch.float32, torch.float64):
        return (f"a {str(dtype).removeprefix('torch.')} target: a run's verifies round its logits otherwise "
                "than target AR's steps, so a near-tie can part a run from the output replayed")
    if fed:
        return ("the target's keys and values of the kept tokens come from other forwards than a run's "
                "verifies (the store's one wide forward, or the replay's feeds): the same up to rounding")
    return ""


def unreplayable(pair) -> list[tuple[str, str]]:
    """(method or kind, one-line reason) for each way of drafting this pair offers that the replay
    cannot count at all. What it replays as an estimate is marked ``estimated`` with its note in
    its :class:`ReplayEntry` instead."""
    return [("lookahead", "its Jacobi window is scored by the target off the output's path each round"),
            ("speculative:model", "the model policy picks γ from the machine's measured round times")]


def _policy_reason(m: Method) -> str | None:
    kind = m.gamma_policy.split()[0] if m.gamma_policy else "constant"
    return None if kind in REPLAYED_POLICIES else f"the {kind} policy is not replayed"


# ---------------------------------------------------------------- the grid


def default_grid(pair, *, gammas=(1, 2, 3, 4, 6, 8), policies=("constant", "heuristic"), trees=(0, 16),
                 self_specs=SELF_SPECS, storages=NGRAM_STORAGES) -> list[Method]:
    """Every replayable method this pair can use at each γ, policy and tree size: each n-gram
    storage, the drafter model (a plain one or the pair's self-drafter), each self-drafter spec the
    pair's target takes (``self_specs``), and the hybrid (the drafter model beside ``sam``, L =
    :data:`HYBRID_MATCH`; where the pair's kind takes a hybrid). Lookahead and the model policy
    (:func:`unreplayable`) are left out; so is a self-drafter spec that repeats the pair's target (a
    copy in its own dtype) or its drafter (the default pair's ``self:bf16``: its methods are the
    ``model`` drafter's already)."""
    from engine.kinds import variant_repeats

    sources: list[tuple[str, object]] = [("ngram", NGramOptions(storage=s)) for s in storages]
    model = pair.drafter is not None and _model_reason(pair) is None
    if model:
        sources.append(("model", None))
    for spec in self_specs if pair.target is not None else ():
        label = _self_label(pair, spec)
        if label is not None and not variant_repeats(pair, label):
            sources.append(("self", label))
    hybrid = model and (_kind(pair) is None or _kind(pair).hybrid is None)
    if hybrid:
        sources.append(("model", HybridOptions(min_match=HYBRID_MATCH)))
    return [method(drafter, options, gamma, policy, tree)
            for drafter, options in sources for tree in trees for policy in policies for gamma in gammas]


def _self_label(pair, spec: str) -> str | None:
    """The label of the self-drafter ``spec`` resolved on the pair's target, None where it does not apply."""
    from engine.loading import resolve_variant

    try:
        label, _ = resolve_variant(pair, spec)
    except (ValueError, RuntimeError):
        return None
    return label


# ---------------------------------------------------------------- replaying


def replay_grid(pair, recorded: list[Recorded], methods: list[Method], *, max_gen_len: int,
                state=None, stores: Stores | None = None) -> list[ReplayEntry]:
    """Each of ``methods`` replayed over ``recorded`` with a length budget of ``max_gen_len`` (the
    record's own: outputs longer are cut), in order; a method :func:`unreplayable` names, or one
    with a policy the replay does not run, is left out. ``state`` (an ``engine.EngineState``): a
    session's, whose built drafters (self-drafters) the replay shares, never its storages.
    ``stores``: the target's keys and values over each output (``advisor.stored``), shared with
    other calls over the same ``recorded``; one of its own when None."""
    from engine.state import EngineState

    own = EngineState()                         # the storages the replay fills and empties
    if state is not None:
        own.built = state.built                 # the drafters built for the pair, shared both ways
    state = own
    taught: dict[int, tuple[int, ...]] = {}     # guesses per record, shared by every taught method
    stores = stores if stores is not None else Stores(pair)
    return [_replay_one(pair, recorded, m, max_gen_len, state, taught, stores)
            for m in methods if replay_mode(pair, m) is not None]


def replay_mode(pair, m: Method) -> str | None:
    """How :func:`replay_grid` replays ``m`` on ``pair``: ``"teacher"`` (teacher forcing, one
    drafter forward per prompt), ``"drafter"`` (the engine's drafter proposing each round), or
    None where it cannot (:func:`unreplayable`)."""
    if _policy_reason(m) is not None or m.drafter == "lookahead":
        return None
    if m.drafter == "model":
        if _model_reason(pair) is not None:
            return None
        plain = m.options is None or (isinstance(m.options, HybridOptions) and m.options.model is None)
        if plain and m.tree == 0 and m.gamma_policy in TEACHER_POLICIES and teachable(pair) is None:
            return "teacher"
    return "drafter"


def _replay_one(pair, recorded, m: Method, max_gen_len: int, state, taught: dict, stores: Stores) -> ReplayEntry:
    from engine.run import loop_vocab_size

    vocab_size = loop_vocab_size(pair)
    if replay_mode(pair, m) == "teacher":
        def make(i: int, record: Recorded):
            if i not in taught:
                taught[i] = guesses(pair.drafter, record.prompt, record.output[:max_gen_len], vocab_size)
            teacher = TeacherDrafter(record.prompt, record.output[:max_gen_len], taught[i])
            if isinstance(m.options, HybridOptions) and m.options.min_match > 0:
                return _hybrid_of(pair, m, teacher, state, vocab_size, record, max_gen_len)
            return teacher
        module = None
    else:
        make = _engine_drafters(pair, m, state, vocab_size, max_gen_len)
        module = _draft_module(pair, m, state)
    drive = _drive(pair, recorded, make, m, max_gen_len, module, stores)
    note = _estimate_note(pair, m)
    rounding = "" if note else _rounding_note(pair, drive.fed)
    exactness = ESTIMATED if note else ROUNDING if rounding else EXACT
    return ReplayEntry(m, drive.replayed, drive.steps, drive.rates(), exactness, note or rounding,
                       drive.prefill_steps, replay_mode(pair, m), drive.firsts, (drive.timed_s, drive.timed_steps),
                       drive.lookup_s)


def _hybrid_of(pair, m: Method, teacher: TeacherDrafter, state, vocab_size: int, record: Recorded,
               max_gen_len: int):
    """The engine's hybrid drafter of ``m`` with ``teacher`` as its drafter model."""
    from engine.drafters import DraftContext, hybrid_drafter
    from sampling import GreedyProcessor

    context = DraftContext(GreedyProcessor(), None, vocab_size, list(record.prompt), max_gen_len)
    return hybrid_drafter(pair, m.options, teacher, state, context)


def _teacher_in(drafter) -> TeacherDrafter | None:
    """The teacher that drafts for ``drafter`` (itself, or a hybrid's drafter model), or None."""
    if isinstance(drafter, TeacherDrafter):
        return drafter
    if isinstance(drafter, HybridDrafter) and isinstance(drafter.model, TeacherDrafter):
        return drafter.model
    return None


def _dtype(model) -> torch.dtype | None:
    return next((t.dtype for t in model.parameters() if t.is_floating_point()), None)


def _engine_drafters(pair, m: Method, state, vocab_size: int, max_gen_len: int):
    """``make(i, record)``: the engine's drafter of ``m`` for one recorded prompt, as a run builds it."""
    from engine.drafters import DRAFTERS, DraftContext
    from sampling import GreedyProcessor

    strategy = m.strategy(max_gen_len=max_gen_len)
    factory = DRAFTERS[m.drafter]
    return lambda i, record: factory(pair, strategy, state, DraftContext(
        GreedyProcessor(), None, vocab_size, list(record.prompt), max_gen_len))


def _draft_module(pair, m: Method, state):
    """The drafter model whose forwards the replay counts by width, None for a model-free drafter."""
    if m.drafter == "model":
        return pair.drafter
    if m.drafter == "self":
        from engine.kinds import build_variant

        return build_variant(pair, m.options, state) if m.options else pair.drafter
    return None


@dataclass
class _Drive:
    replayed: Replayed = field(default_factory=Replayed)
    steps: dict[int, int] = field(default_factory=dict)
    prefill_steps: dict[int, int] = field(default_factory=dict)
    offered: list[int] = field(default_factory=list)     # per draft position: rounds that drafted it
    kept: list[int] = field(default_factory=list)        # per draft position: rounds that kept it
    firsts: list[tuple[int, int | None, dict[int, int]]] = field(default_factory=list)   # ReplayEntry.firsts
    timed_s: float = 0.0          # ReplayEntry.timed
    timed_steps: int = 0
    lookup_s: float = 0.0         # ReplayEntry.lookup_s
    fed: bool = False             # the target's cache was fed kept tokens after its prefill (_rounding_note)

    def judge(self, depth: int, accepted: int) -> None:
        while len(self.offered) < depth:
            self.offered.append(0)
            self.kept.append(0)
        for i in range(depth):
            self.offered[i] += 1
            self.kept[i] += i < accepted

    def rates(self) -> list[float]:
        return [k / n if n else 0.0 for k, n in zip(self.kept, self.offered)]


class _Widths:
    """The width (tokens fed) of every forward of a drafter model while :meth:`on` holds: around
    its proposals only, since a self-drafter's model may be the target's own module, which the
    replay also feeds the kept tokens."""

    def __init__(self):
        self.seen: list[int] = []
        self.active = False

    def hook(self, _module, args, kwargs):
        if self.active:
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is None:
                ids = kwargs.get("inputs_embeds")
            self.seen.append(int(ids.shape[1]) if ids is not None else 1)

    @contextlib.contextmanager
    def attached(self, module):
        handle = module.register_forward_pre_hook(self.hook, with_kwargs=True) if module is not None else None
        try:
            yield self
        finally:
            if handle is not None:
                handle.remove()

    @contextlib.contextmanager
    def on(self):
        self.active = True
        try:
            yield
        finally:
            self.active = False

    @contextlib.contextmanager
    def paused(self):
        """The target's own forwards (a store's build, a real forward): not the drafter's."""
        active, self.active = self.active, False
        try:
            yield
        finally:
            self.active = active


def _add(table: dict[int, int], width: int, n: int = 1) -> None:
    table[width] = table.get(width, 0) + n


def _target_reads(pair, m: Method) -> str:
    """What ``m``'s drafter reads of the target between verifies (its kind's ``target_reads``; a
    drafter model of no kind and the model-free drafters read nothing of it)."""
    from engine.kinds import KINDS, kind_of_pair

    if m.drafter == "model":
        kind = kind_of_pair(pair)
    else:
        kind = next((k for k in KINDS if any(name == m.drafter for name, _ in k.factories)), None)
    return kind.target_reads if kind is not None else ""


class _Rounds:
    """The observer of one replayed run: after each round, the drafter's forwards so far (its
    ``calls``, and those the widths hook saw), and the teacher's count by width after the first."""

    def __init__(self, drafter, widths: list[int]):
        self.drafter, self.widths = drafter, widths
        self.calls: list[int] = []
        self.hooked: list[int] = []
        self.first_steps: dict[int, int] | None = None

    def drafted(self, draft: list[int]) -> None:
        pass

    def round(self, rnd: Round, new_tokens: list[int], elapsed_s: float) -> None:
        self.calls.append(self.drafter.calls)
        self.hooked.append(len(self.widths))
        teacher = _teacher_in(self.drafter)
        if self.first_steps is None and teacher is not None:
            self.first_steps = dict(teacher.steps)


def _depth(parents: Sequence[int]) -> int:
    """The depth of a tree given by its nodes' parents (-1: the root)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 + (depths[parent] if parent >= 0 else 0))
    return max(depths, default=0)


def _drive(pair, recorded: Sequence[Recorded], make: Callable, m: Method, max_gen_len: int, module,
           stores: Stores | None = None) -> _Drive:
    """Run ``make(i, record)``'s drafter through ``engine.run_strategy`` over each recorded output,
    with the target replaced by the record (``advisor.stored.RecordedTarget``); read the counts,
    the verify widths, the first rounds and the draft times from what the run returns."""
    from engine.run import loop_vocab_size, run_strategy

    out = _Drive()
    vocab_size = loop_vocab_size(pair)
    reads = _target_reads(pair, m)
    timed = stores.proposals.timed_of(module) if stores is not None else (0.0, 0)
    for i, record in enumerate(recorded):
        output = record.output[:max_gen_len]
        recorder = _Widths()
        drafter = make(i, record)
        if stores is not None:
            drafter = memoised(drafter, stores.proposals, i, recorder.seen, output, max_gen_len)
        target = recorded_target(pair, record, output, vocab_size, reads=reads, stores=stores, index=i,
                                 quiet=recorder.paused, rows=stores.rows(i) if stores is not None else None)
        rounds = _Rounds(drafter, recorder.seen)
        with recorder.attached(module), recorder.on():
            result = run_strategy(m.strategy(max_gen_len=max_gen_len, decisions=False), pair, list(record.prompt),
                                  target=target, drafter=drafter, observer=rounds)
        out.replayed.add_run(result, target.verify_widths, len(record.prompt))
        out.fed = out.fed or target.copied > 0 or target.mode == REAL
        _tally_rounds(out, result.trace, rounds, recorder.seen, target.verify_widths)
        _count_steps(out, drafter, recorder.seen)
    if memoised_in(drafter):        # the draft seconds: the memo's own computations, not the served calls'
        seconds, steps = stores.proposals.timed_of(module)
        out.timed_s, out.timed_steps = seconds - timed[0], steps - timed[1]
    return out


def _tally_rounds(out: _Drive, trace: Sequence[Round], rounds: _Rounds, widths: list[int],
                  verify_widths: list[int | None]) -> None:
    """Acceptance by draft position, the first round's forwards, and the draft seconds of the later
    rounds (with a forward of the drafter's: ``timed``; without: ``lookup_s``), from a run's trace."""
    for rnd in trace:
        depth = _depth(rnd.tree_parents) if rnd.tree_tokens else len(rnd.drafted)
        out.judge(depth, rnd.accepted)
    if not trace:
        return
    first = trace[0]
    seen: dict[int, int] = {}
    if rounds.first_steps is not None:
        for w, n in rounds.first_steps.items():
            _add(seen, w, n)
    else:
        hooked = rounds.hooked[0]
        for w in widths[:hooked]:
            _add(seen, w)
        lean = rounds.calls[0] - hooked                   # forwards no hook saw (a lean step's)
        if lean > 0:
            _add(seen, 1, lean)
    for w, n in seen.items():
        _add(out.prefill_steps, w, n)
    made = first.accepted + (first.token is not None)
    out.firsts.append((made, verify_widths[0] if verify_widths else None, seen))
    for j, rnd in enumerate(trace[1:], start=1):
        forwards = rounds.calls[j] - rounds.calls[j - 1]
        if forwards > 0:
            out.timed_s += rnd.draft_s
            out.timed_steps += forwards
        elif rnd.gamma > 0:
            out.lookup_s += rnd.draft_s


def _count_steps(out: _Drive, drafter, widths: list[int]) -> None:
    """The drafter's forwards by width: the teacher's own count, else the hooked widths, and any
    forward the hook did not see (a lean step's) as width 1."""
    teacher = _teacher_in(drafter)
    if teacher is not None:
        for w, n in teacher.steps.items():
            _add(out.steps, w, n)
        return
    for w in widths:
        _add(out.steps, w)
    missing = drafter.calls - len(widths)
    if missing > 0:
        _add(out.steps, 1, missing)
