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
    """One kind of drafter model: what the engine needs of it.

    ``name``; ``prefix``: the ``--drafter`` spec it answers to (None for a kind the pair decides);
    ``is_spec(spec)``; ``made_for(module)``: the target a module of this kind was made for, else None;
    ``draft(pair, strategy, state, context)``: its ``Drafter`` for one run.

    Loading: ``attach(model, spec, *, target_name, label, cache_dir, say)`` loads the module beside a
    loaded target (``Attached``; refusals raise ``refused``; ``check(spec)`` may refuse before the target
    loads), for ``engine.kinds.load_attached_pair``; or ``load(target, spec, options, decode=...)``, a
    loader for the whole pair (``decode``: ``engine.run.greedy_run``, for a loader that measures);
    ``default``: ``load`` also takes the call that names neither model.

    One-line refusals or None: ``alone`` (cannot decode on its own), ``hybrid``, ``served``.
    ``hf_peer``: the benchmark's peer of speculative decoding with it. ``alone_inputs(pair, prompt_ids,
    state)``: the ids and end tokens its module decodes alone from, when not the target's.
    ``factories``: ``(name, factory)`` pairs registered as drafters of their own.

    Variants built beside a loaded pair (``--self-drafters``): ``variant_label(spec)``,
    ``variant_resolve(pair, spec, say, decode=...)`` -> (label or None, lines), ``variant_build(pair,
    label, state)`` (once, before any clock) and ``variant_repeats(pair, label)``: whether it would repeat
    the pair's target or drafter.

    ``own_step``: a forward of its module is its drafter's step (False for a lean step on the target's
    cache). ``target_reads``: what it reads of the target between verifies, ``""``, ``"cache"`` or
    ``"states"`` (the default). For the advisor: ``replay``, why a replay of its drafts is an estimate
    (None where it computes what a run does); ``rows``, why its q cannot be read from a forward of its
    own module (None where it can).
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
