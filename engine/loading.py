"""The one model loader the front ends call: a drafter kind beside its target, or a pair of two models.

A ``--drafter`` naming a kind (``engine.kinds.KINDS``) loads through its own loader (the
self-drafters', which also takes the call that names neither model) or
``engine.kinds.load_attached_pair``; anything else goes to ``utils.models.load_pair``. Each attaches
the cache probe (``kvcache.probe``).
"""

from __future__ import annotations

from engine.kinds import KINDS, variant_kind, kind_of_spec, load_attached_pair
from engine.run import greedy_run
from model_drafters.kind import DrafterKind
from utils import models
from utils.models import LoadOptions, ModelLoadError, ModelPair
from utils.progress import no_progress
from kvcache.probe import probe_pair


def wants_self_draft(target: str | None, drafter: str | None) -> bool:
    """Whether a drafter kind loads the pair with its target: a kind's spec (``self:...``, ``mtp``, ...),
    or the default (neither given: a self-drafter)."""
    return kind_of_spec(drafter) is not None or (target is None and drafter is None)


def kind_to_load(drafter: str | None) -> DrafterKind:
    """The kind ``drafter`` names; with none named, the kind that loads the default."""
    return kind_of_spec(drafter) or next(kind for kind in KINDS if kind.default)


def load_pair(target: str | None = None, drafter: str | None = None, options: LoadOptions | None = None,
              **keywords) -> ModelPair:
    """Load the pair the user asked for: ``options``, or ``utils.models.LoadOptions``' fields as keywords.
    A drafter kind is loaded with the target and takes its dtype and device (a self-drafter's spec
    names its own precision), so ``drafter_dtype``, ``drafter_quantize`` and ``device_map`` do not apply."""
    options = LoadOptions.of(options, **keywords)
    if wants_self_draft(target, drafter):
        return pair_loader(kind_to_load(drafter))(target, drafter, options)
    pair = models.load_two_models(target, drafter, options)
    options.say("Probing each model's cached forward against the uncached one")
    pair.probe = probe_pair(pair)
    return pair


def pair_loader(kind: DrafterKind):
    """The function ``(target, spec, options: LoadOptions) -> ModelPair`` that loads a pair with a ``kind``
    drafter: its own (``kind.load``, handed the engine's greedy run to measure with), or the attached loader."""
    if kind.load is None and kind.attach is None:
        def refuse(target, spec, options):
            raise ModelLoadError(f"--drafter {spec}: the {kind.name} kind has no loader (build its pair with pair_of)")
        return refuse
    if kind.load is None:
        return lambda target, spec, options: load_attached_pair(kind, target, spec, options)
    return lambda target, spec, options: kind.load(target, spec, options, decode=greedy_run)


def resolve_variant(pair, spec: str, say=no_progress) -> tuple[str | None, list[str]]:
    """``spec`` resolved against ``pair`` by its kind: the label to build (None: nothing to run) and its
    lines (None's: why). ``ValueError`` (one line) where it does not apply to the target."""
    return variant_kind(spec).variant_resolve(pair, spec, say, decode=greedy_run)
