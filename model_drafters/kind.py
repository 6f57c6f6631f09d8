"""A drafter kind: everything the engine needs to know of one kind of drafter model, in one value.

Each package under ``model_drafters`` exports one :class:`DrafterKind` (``KIND``); ``engine.kinds``
lists them, and the engine's model factory, its loaders and the benchmark loop over that list
instead of naming kinds. A new kind is a package and one line there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Attached:
    """A drafter module loaded beside a loaded target: the module, its banner name and one banner note."""

    module: object
    name: str
    note: str


# What a served target cannot draft beside, in the words every kind refusing it uses.
SERVED_WEIGHTS = ("is made from the target's weights, which are on the server: "
                  "name a drafter model sharing its tokenizer (or none: the offline default)")
SERVED_STATES = ("drafts from the target's hidden states, which a served target does not return: "
                 "name a drafter model sharing its tokenizer (or none)")


# A kind that does not say how far the advisor's replay of its drafts is a run's.
UNKNOWN_REPLAY = ("is a kind whose replay was never held to runs: its drafter may read the target's state, "
                  "which the replay takes from other forwards than a run's verifies")


def not_in_hybrid(drafter: str) -> str:
    """The line refusing ``drafter`` (``"an EAGLE-3 head"``) inside the hybrid drafter."""
    return f"the hybrid drafter (/hybrid) does not take {drafter} yet: set /hybrid 0"


def never(_module) -> None:
    """``made_for`` of a kind whose modules carry no mark (the pair tells, see ``DrafterKind.owns_pair``)."""
    return None


@dataclass(frozen=True)
class DrafterKind:
    """One kind of drafter model.

    ``name``: a label (``"mtp"``); ``prefix``: the ``--drafter`` spec it answers to (``"self:"``,
    ``"mtp"``, ``"eagle3:"``; None for a kind the pair decides, as a drafter with its own tokenizer);
    ``is_spec(spec)``: whether a ``--drafter`` value names this kind; ``made_for(module)``: the
    target a loaded module of this kind was made for, None for any other module; ``draft(pair,
    strategy, state, context)``: its ``Drafter`` for one run (``engine.drafters`` passes the run's
    ``DraftContext``).

    Loading, one of two ways: ``attach(model, spec, *, target_name, label, cache_dir, say)``
    loads the module beside a target already loaded (``Attached``; one-line refusals raise
    ``refused``, and ``check(spec)`` may refuse before the target loads), for
    ``engine.kinds.load_attached_pair``; or ``load``, a loader of its own for the whole pair, called as
    ``load(target, spec, options, decode=...)`` (``options`` a ``utils.models.LoadOptions``; ``decode``
    the engine's greedy run, ``engine.run.greedy_run``, for a loader that decodes to measure).
    ``default``: this kind's ``load`` also takes the call that names neither model.

    Refusals, each one line or None: ``alone`` (why its module cannot decode on its own),
    ``hybrid`` (why it cannot draft inside the hybrid), ``served`` (why it cannot draft beside a
    served target; ``--drafter SPEC`` is put before it). ``hf_peer``: the benchmark's peer of
    speculative decoding with it (``"hf_assisted"``; ``"hf_mtp"``, at constant gammas only; None: none).
    ``alone_inputs(pair, prompt_ids, state)``: the prompt ids and end tokens its module decodes
    alone from, when they are not the target's (a drafter with its own tokenizer); None: the target's.
    ``factories``: ``(name, factory)`` pairs the engine registers as strategy drafters of their own
    (``Strategy(drafter=name)``), beside the ``model`` drafter that reaches ``draft``.

    Drafters built beside a loaded pair (the benchmark's ``--self-drafters``), for a kind whose
    first factory drafts with such a spec (``drafter_options``): ``variant_label(spec)`` its label
    (one-line ``ValueError`` for a bad spec); ``variant_resolve(pair, spec, say, decode=...)``
    -> (the label to build, or None where there is nothing to run, and its lines; ``decode`` as
    for ``load``); ``variant_build(pair, label, state)`` builds it once (kept in
    ``state``), before any clock starts, and returns its module; ``variant_repeats(pair, label)``:
    whether that module would repeat a model the pair has: its target over again (a copy in the
    target's own dtype) or its own drafter (the pair's drafter is that variant already).

    ``own_step``: whether a forward of its module is its drafter's step (False for a drafter that
    steps by a path of its own, a self-drafter's lean step on the target's cache: the advisor then
    times its step in a short run).

    ``target_reads``: what its drafter reads of the target between verifies: ``""`` nothing (a
    cache of its own), ``"cache"`` the target's keys and values of the committed tokens (they must
    be there when it drafts), ``"states"`` what a verify forward returns besides its logits (hidden
    states, shared keys: the default, which the advisor's replay serves with real forwards).

    What the advisor may claim of it: ``replay``, why a replay of its drafts over target AR's output
    is an estimate (its label, ``advisor.rank.EXACTNESS``), or None where the replay computes what a
    run computes; by default a kind is an estimate, since its drafter may read the target's state,
    which a replay takes from other forwards than a run's verifies. ``rows``, why its q along an
    output cannot be read from a forward of its own module over the tokens (the advisor's sampling
    estimate), or None where it can.
    """

    name: str
    prefix: str | None
    is_spec: Callable[[object], bool]
    made_for: Callable[[object], object]
    draft: Callable
    attach: Callable | None = None
    check: Callable[[str], None] | None = None
    refused: type[Exception] = ValueError
    load: Callable | None = None
    default: bool = False
    owns_pair: Callable[[object], bool] | None = None
    alone: str | None = None
    hybrid: str | None = None
    served: str | None = None
    hf_peer: str | None = "hf_assisted"
    alone_inputs: Callable | None = None
    factories: tuple[tuple[str, Callable], ...] = ()
    variant_label: Callable[[str], str] | None = None
    variant_resolve: Callable | None = None
    variant_build: Callable | None = None
    variant_repeats: Callable[[object, str], bool] | None = None
    own_step: bool = True
    target_reads: str = "states"
    replay: str | None = UNKNOWN_REPLAY
    rows: str | None = "drafts from the target's state or its own vocabulary, not from a forward of its own"

    def marks(self, module) -> bool:
        """Whether ``module`` is a module of this kind (made for any target)."""
        return module is not None and self.made_for(module) is not None

    def owns(self, pair) -> bool:
        """Whether ``pair``'s drafter is of this kind, made for ``pair``'s target."""
        if self.owns_pair is not None:
            return self.owns_pair(pair)
        return pair.drafter is not None and self.made_for(pair.drafter) is pair.target
