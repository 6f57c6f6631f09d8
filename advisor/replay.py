"""Every drafter this pair can use, replayed over target AR's greedy output: no verify forward.

A :class:`Method` is one point of the advisor's grid (a drafter, its options, γ, its γ policy, a
chain or a tree); :func:`replay_grid` replays each over the recorded outputs
(``advisor.recorded.record``) into a :class:`ReplayEntry`: the target calls, drafted and accepted
tokens a real run would count (``engine.run_strategy``, greedy), its verify widths, the drafter's
forwards by width and its acceptance by draft position.

Two ways, both through one round loop (:func:`_drive`) that runs the engine's own γ policy
objects (``generation.gamma_policies.make_policy``) and counts as the verify loop does:

* teacher forcing (``advisor.teacher``): a plain drafter model's chains under a policy that needs
  no more than its argmax (constant, heuristic), alone or as the hybrid's drafter model, from one
  drafter forward per prompt;
* the engine's own drafter (``engine.drafters.DRAFTERS``), each round proposing from the output so
  far: n-gram storages, trees (a drafter model grows them best-first by its probability, so the
  nodes off the output's path matter: they are grown, not read from teacher-forced rows),
  self-drafters (their committed positions are the target's own cache, fed the output's tokens,
  never a verify), the hybrid's trees, and the confidence policy (the drafter's own early stop). The
  drafters of the target's hidden states (MTP layers, EAGLE-3 heads, Gemma 4 assistants) and a
  drafter with a tokenizer of its own run the same way, their target fed the kept tokens; their
  entries are marked estimates (:data:`ESTIMATED_KINDS` says why).

Each entry says how far its counts are a real run's (``advisor.rank.EXACTNESS``): ``exact`` on a
float32 target where the replay computes what a run computes; ``rounding`` where a run can part
from target AR's output by rounding alone (a bfloat16 or float16 target, whose verifies round a
near-tie otherwise than target AR's steps) or where the replay fed the target's cache the kept
tokens from other forwards than a run's verifies (a self-drafter: ``advisor.stored``'s one wide
forward, the same values up to rounding); ``estimated`` where :func:`_estimate_note` says why.

What cannot be replayed at all is listed by :func:`unreplayable` with its reason.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from advisor.rank import ESTIMATED, EXACT, ROUNDING
from advisor.recorded import Recorded, Replayed, _book, storage_options
from advisor.stored import Stores, stored_target
from advisor.teacher import TeacherDrafter, guesses, teachable
from engine.named import named_strategy
from engine.strategy import HybridOptions, NGramOptions, Strategy
from generation.tree import Tree
from generation.tree_round import first_choice_line
from ngram_assisted.hybrid import HybridDrafter
from generation.result import Round
from utils.defaults import DEFAULTS
from utils.devices import model_device, synchronize
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


# The kinds whose replay is an estimate, and why: each is replayed by its own proposals, but its
# state after accepted drafts is held to the engine's counts only on random drafters that accept few.
ESTIMATED_KINDS = {
    "mtp": "drafts from the target's hidden states, here from a forward over the kept tokens (a run "
           "takes them from its verify); checked against runs on random MTP layers only",
    "eagle3": "drafts from the target's hidden states, here from a forward over the kept tokens (a run "
              "takes them from its verify); checked against runs on random heads only",
    "gemma4_assistant": "drafts from the target's last states, here from a forward over the kept tokens "
                        "(a run takes them from its verify); checked against runs on random assistants only",
    "cross_tokenizer": "re-tokenises text between two vocabularies each round; checked against runs on "
                       "random drafters that accept no drafts only",
}


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
    if kind is not None and kind.name in ESTIMATED_KINDS:
        return f"a {kind.name} drafter {ESTIMATED_KINDS[kind.name]}"
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
    (:func:`unreplayable`) are left out; a self-drafter copy in the target's own dtype too."""
    sources: list[tuple[str, object]] = [("ngram", NGramOptions(storage=s)) for s in storages]
    model = pair.drafter is not None and _model_reason(pair) is None
    if model:
        sources.append(("model", None))
    for spec in self_specs if pair.target is not None else ():
        label = _self_label(pair, spec)
        if label is not None and not _same_precision(pair.target, label):
            sources.append(("self", label))
    hybrid = model and (_kind(pair) is None or _kind(pair).hybrid is None)
    if hybrid:
        sources.append(("model", HybridOptions(min_match=HYBRID_MATCH)))
    return [method(drafter, options, gamma, policy, tree)
            for drafter, options in sources for tree in trees for policy in policies for gamma in gammas]


def _same_precision(target, label: str) -> bool:
    """Whether the self-drafter ``label`` is a copy of ``target`` in the dtype it already has."""
    from model_drafters.selfdraft.spec import PRECISIONS, parse_self_draft

    kind = parse_self_draft(label).kind
    return kind in PRECISIONS and getattr(torch, PRECISIONS[kind]) == _dtype(target)


def _self_label(pair, spec: str) -> str | None:
    """The label of the self-drafter ``spec`` resolved on the pair's target, None where it does not apply."""
    from engine.kinds import resolve_variant

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
        from model_drafters.selfdraft.kind import self_draft_model

        return self_draft_model(pair, m.options, state) if m.options else pair.drafter
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


def _add(table: dict[int, int], width: int, n: int = 1) -> None:
    table[width] = table.get(width, 0) + n


@torch.inference_mode()
def _drive(pair, recorded: Sequence[Recorded], make: Callable, m: Method, max_gen_len: int, module,
           stores: Stores | None = None) -> _Drive:
    """Run ``make(i, record)``'s drafter through the verify loop's rounds over each recorded output,
    with the target's verify replaced by the output itself; the target's feeds (a drafter on its
    cache) copied from ``stores`` where it can (``advisor.stored``)."""
    from generation.gamma_policies import make_policy
    from kvcache.cache import tree_support

    out = _Drive()
    device = model_device(pair.target)
    for i, record in enumerate(recorded):
        output = record.output[:max_gen_len]
        drafter = make(i, record)
        target = stored_target(pair, stores, i, record, output)
        drafter.attach_target(target)
        start = target.begin(list(record.prompt))
        begun = target.forwards                 # a target that snapshots layers prefills all but the last token
        out.replayed.calls += begun
        drafter.begin(list(record.prompt))
        policy = make_policy(m.gamma_policy, m.gamma)
        policy.begin(drafter.kind)
        trees = m.tree > 0 and (tree_support(target) or drafter.tree_support()) is None
        ids = torch.tensor([start], dtype=torch.long, device=device)      # (1, L), where the verify loop keeps it
        at, first, recorder = 0, True, _Widths()
        widths = recorder.seen
        with recorder.attached(module):
            while at < len(output):
                k = min(policy.next_gamma(), max_gen_len - at - 1)
                before = target.forwards
                drafter.fill_target(ids)       # a drafter on the target's cache: its prefill, then the tokens kept
                # A round's verify is priced unless it is the prefill: the first, where the drafter
                # did not have the target prefill the prompt apart (then that is one call more).
                priced = not first or target.forwards > before or begun > 0
                if first and target.forwards > before:
                    out.replayed.calls += 1
                out.fed = out.fed or (not first and target.forwards > before)
                widths_before = dict(out.replayed.widths) if first else {}
                calls_before = drafter.calls
                synchronize(device)
                started = time.perf_counter()
                with recorder.on():
                    if trees:
                        new, rnd = _tree_round(out, drafter, ids, output, at, k, m, priced)
                    else:
                        new, rnd = _chain_round(out, drafter, ids, output, at, k, policy.threshold, priced)
                synchronize(device)
                if not first and drafter.calls > calls_before:
                    out.timed_s += time.perf_counter() - started
                    out.timed_steps += drafter.calls - calls_before
                elif not first and k > 0:
                    out.lookup_s += time.perf_counter() - started
                policy.observe(rnd)
                width = drafter.wants_top_k
                rows = [list(record.top[at + j][:width]) for j in range(len(new))] if width > 1 else None
                drafter.update(new, rows)
                ids = torch.cat([ids, torch.tensor([new], dtype=torch.long, device=device)], dim=1)
                at += len(new)
                if first:
                    teacher = _teacher_in(drafter)
                    seen: dict[int, int] = {}
                    for w, n in (teacher.steps.items() if teacher is not None else ((w, 1) for w in widths)):
                        _add(seen, w, n)
                        _add(out.prefill_steps, w, n)
                    lean = drafter.calls - len(widths) if teacher is None else 0     # forwards no hook saw
                    if lean > 0:
                        _add(seen, 1, lean)
                    width = next((w for w, n in out.replayed.widths.items() if n > widths_before.get(w, 0)), None)
                    out.firsts.append((len(new), width, seen))
                first = False
        _count_steps(out, drafter, widths)
    return out


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


def _chain_round(out: _Drive, drafter, ids, output, at: int, k: int, stop_below, priced: bool):
    """One chain round judged against the output; (tokens appended, its Round for the policy)."""
    draft = drafter.propose(ids, k, stop_below)[0].tolist() if k > 0 else []
    before = out.replayed.accepted
    new = _book(out.replayed, draft, output, at, len(draft) + 1 if priced else None)
    kept = out.replayed.accepted - before
    token_in = len(new) > kept                  # else the output's end token ended it among the drafts
    drafted = draft if token_in else draft[:kept]
    out.judge(len(drafted), kept)
    return new, Round(drafted=tuple(drafted), accepted=kept, token=new[-1] if token_in else None,
                      bonus=token_in and kept == len(draft) > 0, gamma=k)


def _tree_round(out: _Drive, drafter, ids, output, at: int, k: int, m: Method, priced: bool):
    """One tree round: the drafter's own tree, its path along the output (the target's greedy
    token at each node), counted as ``generation.tree_round.count_tree`` counts."""
    tree = drafter.propose_tree(ids, k, m.tree, m.branch) if k > 0 and m.tree > 0 else Tree((), (), ())
    if drafter.extra_rows(ids, tree) is not None:
        raise ValueError(f"{m.key}: a drafter that asks the target for extra rows cannot be replayed")
    path = _path(tree, output, at)
    n = len(path)
    new = list(output[at:at + n + 1])       # the path, then the target's token (none past the end)
    token_in = len(new) > n
    kept = n if token_in else len(new)
    r = out.replayed
    r.calls += 1
    r.drafted += len(tree) if token_in else kept
    r.accepted += kept
    r.tokens += len(new)
    if priced:
        _add(r.widths, len(tree) + 1)
    stop_node = path[-1] if path else -1
    line = [tree.tokens[j] for j in path] + first_choice_line(tree, stop_node)
    depth = max((_depth(tree, j) for j in range(len(tree))), default=0)
    out.judge(depth, kept)
    return new, Round(drafted=tuple(line if token_in else line[:kept]), accepted=kept,
                      token=new[-1] if token_in else None,
                      bonus=token_in and n > 0 and not tree.children(stop_node), gamma=k)


def _path(tree: Tree, output: Sequence[int], at: int) -> list[int]:
    """The nodes greedy verification keeps: from the root, the child that is the output's next token."""
    path, node = [], -1
    while at + len(path) < len(output):
        want = output[at + len(path)]
        node = next((c for c in tree.children(node) if tree.tokens[c] == want), None)
        if node is None:
            break
        path.append(node)
    return path


def _depth(tree: Tree, node: int) -> int:
    depth = 0
    while node >= 0:
        depth, node = depth + 1, tree.parents[node]
    return depth
