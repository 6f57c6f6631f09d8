"""This machine's forward costs for one pair: what the advisor prices replayed rounds with.

A :class:`CostTable` holds the target's forward seconds by width (``generation.timing.time_target``:
warm, device-synced, each width's median ratio to the one-token step of the same turn), each
drafter model's step seconds by width (the same timer on the drafter module), and the verify
loop's host seconds per round (read off a short model-free run). It is measured once per pair
(:func:`measure_costs`) and kept by the front end; :meth:`CostTable.save` and
:meth:`CostTable.load` write and read it as JSON, so a table measured on another machine
(``--costs FILE``) prices the same replay, always labelled with where it was measured
(:meth:`CostTable.label`). A width the table lacks is read between or beyond the measured ones
(``analysis.speedup.CostModel.verify``) and named an estimate.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from analysis.speedup import CostModel

FORMAT = 1
CONTEXT = 64            # tokens in the cache while the widths are timed, unless told (as engine.widths does)
MAX_CONTEXT = 4096      # the longest cache the widths are timed on
REPEATS = 3             # turns of every width after a warm one (the spread between processes is wider)
HOST_RUN_TOKENS = 24    # the short n-gram run the host seconds per round are read from
MIN_TIMED_STEPS = 16    # a replay's timed drafter steps that price it without a run of its own
# CPU flags worth naming beside the model name: what changes a forward's kernels.
FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8")


class CostsError(ValueError):
    """A costs file that cannot be read or written (one line)."""


def drafter_key(method) -> str:
    """The name a method's drafter costs are kept under: its engine drafter, and its spec when the
    options are one (``self self:int8``); the pair's own drafter model is ``model``."""
    options = getattr(method, "options", None)
    return method.drafter + (f" {options}" if isinstance(options, str) and options else "")


def _lookup(table: dict[int, float], width: int) -> tuple[float, bool]:
    """(seconds at ``width``, whether it was read off other widths) through the speedup model's
    own interpolation (``CostModel.verify``)."""
    if width in table:
        return table[width], False
    return CostModel(0.0, dict(table)).verify(width), True


@dataclass
class CostTable:
    """One pair's costs on one machine (module docstring). ``where``: device, CPU model and flags,
    threads, date. ``notes``: how a part was measured when not as the others were (host work not
    measured, a drafter timed from a run). ``source``: the file it was read from ("" when measured
    in this process). ``context``: the tokens in the cache the forwards were timed on (a verify's
    cost over a step's grows with the context its attention reads)."""

    target_s: dict[int, float]
    draft_s: dict[str, dict[int, float]]
    host_s: float
    where: str
    notes: list[str] = field(default_factory=list)
    source: str = ""
    context: int = CONTEXT
    # The target's (and a drafter model's) forwards by batch size and width (``engine.shapes.PairShapes
    # .to_dict``), where ``--whatif batch`` timed them: a table read from a file projects with them.
    shapes: dict | None = None
    # The target's (and a drafter model's) forwards at batch 1 over caches of several lengths, one
    # ``PairShapes.to_dict`` each, where ``--whatif context`` timed them: a table read from a file
    # projects over context with them.
    by_context: list | None = None

    def label(self) -> str:
        """``measured on <where>`` on a cache of how many tokens, and the file when it was read from one."""
        return (f"measured on {self.where}, on a cache of {self.context} tokens"
                + (f" (read from {self.source})" if self.source else ""))

    def batch_shapes(self):
        """The forwards by shape this table holds (``engine.shapes.PairShapes``, labelled with where
        they were timed and the file), or None."""
        from engine.shapes import PairShapes

        if self.shapes is None:
            return None
        return PairShapes.from_dict(self.shapes, self.where + (f" (read from {self.source})" if self.source else ""))

    def context_shapes(self):
        """The forwards by context this table holds (a list of ``engine.shapes.PairShapes``, one per
        length timed, labelled with where they were timed and the file), or None."""
        from engine.shapes import PairShapes

        if not self.by_context:
            return None
        where = self.where + (f" (read from {self.source})" if self.source else "")
        return [PairShapes.from_dict(d, where) for d in self.by_context]

    def target(self, width: int) -> tuple[float, bool]:
        """(the target's forward seconds at ``width``, estimated: the table lacks the width)."""
        if not self.target_s:
            raise ValueError("the cost table holds no target width")
        return _lookup(self.target_s, width)

    def draft(self, key: str, width: int) -> tuple[float, bool]:
        """(drafter ``key``'s step seconds at ``width``, estimated); ValueError when the table has no
        step of that drafter at all."""
        table = self.draft_s.get(key)
        if not table:
            raise ValueError(f"the cost table holds no step of the drafter {key!r}")
        return _lookup(table, width)

    def lacks(self, target_widths, drafters: dict[str, set[int]]) -> bool:
        """Whether measuring again would add anything: a target width or a drafter step missing."""
        return (any(w not in self.target_s for w in target_widths)
                or any(w not in self.draft_s.get(k, {}) for k, ws in drafters.items() for w in ws))

    def to_dict(self) -> dict:
        return {"format": FORMAT, "where": self.where, "label": self.label(),
                "target_s": {str(w): s for w, s in sorted(self.target_s.items())},
                "draft_s": {k: {str(w): s for w, s in sorted(v.items())} for k, v in sorted(self.draft_s.items())},
                "host_s": self.host_s, "notes": list(self.notes), "context": self.context,
                **({"shapes": self.shapes} if self.shapes is not None else {}),
                **({"by_context": self.by_context} if self.by_context else {})}

    @classmethod
    def from_dict(cls, data: dict, source: str = "") -> "CostTable":
        """The table a :meth:`to_dict` wrote; CostsError (one line) for anything else."""
        try:
            if data.get("format") != FORMAT:
                raise CostsError(f"not a cost table of format {FORMAT} (format {data.get('format')!r})")
            target = {int(w): float(s) for w, s in data["target_s"].items()}
            draft = {str(k): {int(w): float(s) for w, s in v.items()} for k, v in data["draft_s"].items()}
            table = cls(target, draft, float(data["host_s"]), str(data["where"]),
                        [str(n) for n in data.get("notes", [])], source, int(data.get("context", CONTEXT)),
                        data.get("shapes"), data.get("by_context"))
            table.batch_shapes()                       # a shape table that cannot be read fails here
            table.context_shapes()
        except CostsError:
            raise
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise CostsError(f"not a cost table: {type(e).__name__} {e}") from None
        if not target or 1 not in target or any(s <= 0 for s in target.values()):
            raise CostsError("a cost table needs the target's one-token step and positive seconds")
        return table

    def save(self, path) -> None:
        try:
            Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n", encoding="utf-8")
        except OSError as e:
            raise CostsError(f"cannot write the costs to {path}: {e.strerror or e}") from None

    @classmethod
    def load(cls, path) -> "CostTable":
        """The table in the JSON file ``path``, labelled as read from it; CostsError (one line)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise CostsError(f"cannot read the costs file {path}: {e.strerror or e}") from None
        except ValueError as e:
            raise CostsError(f"the costs file {path} is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise CostsError(f"the costs file {path} holds no cost table")
        return cls.from_dict(data, source=str(path))


# ------------------------------------------------------------------ measuring

def where_measured(device) -> str:
    """The device in words: a GPU's name, or the CPU's model and the flags that pick its kernels;
    the threads and the date."""
    import torch

    from utils.machine_load import cpu_description

    day = time.strftime("%Y-%m-%d", time.gmtime())
    if getattr(device, "type", str(device)) == "cuda" and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(device)}, {day}"
    name, flags = cpu_description()
    present = [f for f in FLAGS if f in flags.split()]
    return f"{name} ({' '.join(present) or 'no avx2'}), {torch.get_num_threads()} threads, {day}"


def _context_ids(pair, module, context: int = CONTEXT):
    import torch

    from utils.devices import model_device

    vocab = max(2, int(pair.vocab_size or 2))
    return (torch.arange(context, device=model_device(module)) % (vocab - 1) + 1).view(1, -1)


def time_widths(pair, module, widths, context: int = CONTEXT) -> dict[int, float]:
    """``module``'s forward seconds over each width in ``widths`` (1 always) on a cache of
    ``context`` tokens (``generation.timing.time_target``, each width bracketed by one-token steps)."""
    from generation.timing import time_target

    return time_target(module, _context_ids(pair, module, context), widths=sorted(set(widths) | {1}),
                       repeats=REPEATS, bracketed=True).verify_s


def drafter_module(pair, key: str, state):
    """The module drafter ``key`` steps with: the pair's drafter for ``model``, a self-drafter spec
    built from the target (kept in ``state``), or None when it has no module of its own to time."""
    drafter, _, spec = key.partition(" ")
    if drafter == "model" and not spec:
        return pair.drafter
    if drafter == "self":
        if not spec:
            return pair.drafter
        from engine.kinds import build_variant

        return build_variant(pair, spec, state)
    return None


def _chain_of(method):
    """``method`` as a greedy chain of constant γ 4 over :data:`HOST_RUN_TOKENS` (a hybrid's drafter model
    alone): the run a drafter's step is timed on."""
    from dataclasses import replace

    from engine import HybridOptions
    from sampling import GreedyProcessor

    if method is None:
        raise ValueError("a drafter timed by a run needs its method")
    strategy = replace(method.strategy(processor=GreedyProcessor(), max_gen_len=HOST_RUN_TOKENS, seed=0),
                       tree=0, gamma=4, gamma_policy="constant")
    if isinstance(strategy.drafter_options, HybridOptions):       # the drafter model alone
        strategy = replace(strategy, drafter_options=strategy.drafter_options.model)
    return strategy


def _warm_chain(pair, strategy, state) -> None:
    from dataclasses import replace

    from engine import run_strategy

    run_strategy(replace(strategy, max_gen_len=8), pair, _context_ids(pair, pair.target)[0].tolist()[:16],
                 state=state)


def _seconds_a_draft(pair, strategy, prompt: list[int], state, method, where: str = "in a short run") -> float:
    """The chain's draft seconds over its drafts on ``prompt``, the prompt's round left out."""
    from engine import run_strategy

    rounds = run_strategy(strategy, pair, prompt, state=state).trace[1:]
    drafted = sum(len(r.drafted) for r in rounds)
    if not drafted:
        raise ValueError(f"{method.key} drafted nothing {where}: its step cannot be timed")
    return sum(r.draft_s for r in rounds) / drafted


def run_step_seconds(pair, method, state) -> tuple[float, str]:
    """(a drafter's seconds per step, how they were had) from a short greedy run of ``method`` as a
    chain of constant γ 4: its draft seconds over its drafts, the first round (the prompt's) left
    out, after an untimed run. For drafters whose step is not their module's forward alone: a
    self-drafter steps through its lean path on the target's cache, MTP layers and an EAGLE-3
    head step on the target's state. Every width is priced so."""
    strategy = _chain_of(method)
    _warm_chain(pair, strategy, state)
    step = _seconds_a_draft(pair, strategy, _context_ids(pair, pair.target)[0].tolist()[:16], state, method)
    return step, f"its step timed in a short run ({step * 1e3:.2f} ms a draft, every width priced so)"


def step_seconds_by_context(pair, method, state, contexts) -> dict[int, float]:
    """A drafter's seconds per step over a cache of each of ``contexts`` tokens: after one untimed short
    run, the chain :func:`run_step_seconds` times on a short prompt, on a prompt of about each length.
    For a drafter whose step reads the target's cache (a self-drafter), whose cost grows with it
    unlike the target's step."""
    strategy = _chain_of(method)
    _warm_chain(pair, strategy, state)
    return {context: _seconds_a_draft(
                pair, strategy, _context_ids(pair, pair.target, max(16, context - HOST_RUN_TOKENS // 2))[0].tolist(),
                state, method, f"over a cache of {context} tokens")
            for context in contexts}


def steps_alone(module) -> bool:
    """Whether ``module``'s own forward is its drafter's step (an ordinary drafter model, or a kind
    that says so), not a step by a path of its own (a self-drafter's lean step on the target's cache)."""
    from engine.kinds import kind_of_module

    kind = kind_of_module(module)
    return kind is None or kind.own_step


def host_seconds(pair, state) -> tuple[float, str]:
    """(the verify loop's host seconds per round, a note or ""): from a short greedy n-gram run
    (its drafts are look-ups, its draft and verify phases are timed apart from the rest)."""
    from engine import NGramOptions, Strategy, run_strategy
    from sampling import GreedyProcessor

    try:
        strategy = Strategy("advisor-host", drafter="ngram", drafter_options=NGramOptions(),
                            processor=GreedyProcessor(), max_gen_len=HOST_RUN_TOKENS, seed=0, inspect=False)
        result = run_strategy(strategy, pair, _context_ids(pair, pair.target)[0].tolist()[:16], state=state)
    except Exception as e:    # the advice goes on without it, saying so
        return 0.0, f"host work per round not measured ({type(e).__name__}: {e}): taken as 0"
    if not result.trace:
        return 0.0, "host work per round not measured (the run made no round): taken as 0"
    return float(result.phases.get("other", 0.0)) / len(result.trace), ""


def measure_costs(pair, target_widths, drafters: dict[str, set[int]], *, state=None,
                  base: CostTable | None = None, methods: dict | None = None,
                  timed: dict[str, tuple[float, int]] | None = None, context: int | None = None,
                  anchor_s: float | None = None) -> CostTable:
    """A table for ``pair`` on this machine: the target at ``target_widths`` (and 1), each drafter
    of ``drafters`` (``drafter_key`` -> the step widths its rounds ran) at its widths. ``base``: a
    table measured here before, whose widths are kept and only the missing ones timed.
    ``methods``: a method per drafter key, run briefly for a drafter with no module of its own to
    time (:func:`run_step_seconds`), unless ``timed`` holds (seconds, forwards) of its steps timed
    over a replay's own proposals (``advisor.replay.ReplayEntry.timed``): then those, kept as their
    ratio to ``anchor_s`` (target AR's decode step, timed just before the replay) times the
    table's own step, so that a machine whose speed moved between the replay and the table's turns
    keeps the drafter's cost over the target's as the replay saw it. ``context``:
    the cache the forwards are timed on (``base``'s, else :data:`CONTEXT`; at most
    :data:`MAX_CONTEXT`); a ``base`` of another context is timed again whole."""
    from engine import EngineState

    state = state if state is not None else EngineState()
    context = min(MAX_CONTEXT, max(1, context or (base.context if base else CONTEXT)))
    if base is not None and base.context != context:
        base = None
    target = dict(base.target_s) if base else {}
    draft = {k: dict(v) for k, v in base.draft_s.items()} if base else {}
    notes = list(base.notes) if base else []
    # A forward is timed as a ratio to the one-token step of the same turns: widths added to a
    # table are timed again with the ones it has, so that all of them share one step.
    if set(target_widths) - set(target) or not target:
        target = time_widths(pair, pair.target, set(target) | set(target_widths), context)
    for key, widths in drafters.items():
        if not set(widths) - set(draft.get(key, {})):
            continue
        wanted = set(draft.get(key, {})) | set(widths)
        module = drafter_module(pair, key, state)
        if module is None or not steps_alone(module):
            seconds, steps = (timed or {}).get(key, (0.0, 0))
            if steps >= MIN_TIMED_STEPS:
                step = seconds / steps
                note = (f"its step timed over the replay's own {steps} drafts ({step * 1e3:.2f} ms a draft"
                        + (f", {step / anchor_s:.3f} of target AR's step" if anchor_s else "")
                        + ", every width priced so)")
                if anchor_s:
                    step = step / anchor_s * target[1]
            else:
                step, note = run_step_seconds(pair, (methods or {}).get(key), state)
            notes = [n for n in notes if not n.startswith(f"{key}: ")] + [f"{key}: {note}"]
            draft[key] = {w: step for w in wanted}
            continue
        draft[key] = time_widths(pair, module, wanted, context)
    if base is not None:
        host, host_note = base.host_s, ""
    else:
        host, host_note = host_seconds(pair, state)
    if host_note:
        notes.append(host_note)
    return CostTable(target, draft, host, where_measured(pair.device), notes, context=context)
