"""The registry of drafter kinds, and the one loader for a drafter attached beside its target.

``KINDS`` lists every kind of drafter model (``model_drafters.kind.DrafterKind``); the model
factory (``engine.drafters``), the loaders (``engine.loading``, ``engine.served_pair``) and the
benchmark loop over it. A new kind is a package under ``model_drafters`` and one line here.
"""

from __future__ import annotations


from kvcache.probe import probe_pair
from model_drafters.cross_tokenizer.kind import KIND as CROSS_TOKENIZER
from model_drafters.eagle3.kind import KIND as EAGLE3
from model_drafters.gemma4_assistant.kind import KIND as GEMMA4_ASSISTANT
from model_drafters.kind import DrafterKind
from model_drafters.mtp.kind import KIND as MTP
from model_drafters.selfdraft.kind import KIND as SELF
from utils.devices import model_device
from utils.models import LoadOptions, ModelLoadError, ModelPair, load_target
from utils.vocab import check_compatible, context_length, end_token_ids

# In the order the model factory asks them: the first that owns the pair drafts.
KINDS: list[DrafterKind] = [MTP, GEMMA4_ASSISTANT, EAGLE3, CROSS_TOKENIZER, SELF]


def register_kind(kind: DrafterKind) -> DrafterKind:
    """Add ``kind`` to the registry (before the kinds the pair decides); returns it."""
    KINDS.insert(0, kind)
    return kind


def kind_of_spec(spec: str | None) -> DrafterKind | None:
    """The kind a ``--drafter`` value names, or None (a drafter model, or none)."""
    return next((kind for kind in KINDS if spec is not None and kind.is_spec(spec)), None)


def kind_of_module(module) -> DrafterKind | None:
    """The kind of a loaded drafter module, or None for an ordinary drafter model."""
    return next((kind for kind in KINDS if kind.marks(module)), None)


def kind_of_pair(pair) -> DrafterKind | None:
    """The kind that drafts for ``pair`` (its drafter made for its target, or its tokenizer its own), or None."""
    return next((kind for kind in KINDS if kind.owns(pair)), None)


def variant_kind(spec: str) -> DrafterKind:
    """The kind that builds ``spec`` beside a loaded pair: the one whose spec it is, else the first that
    builds any (its refusal then names what it takes)."""
    kinds = [kind for kind in KINDS if kind.variant_label is not None]
    return next((kind for kind in kinds if kind.is_spec(spec)), kinds[0])


def variant_labels(parts: list[str]) -> list[str]:
    """The labels of the drafters ``parts`` (a comma-split list) names, in order, once each; an item
    that is no spec continues the one before (``self:skip=3,5``). ``ValueError`` for a bad spec."""
    items: list[str] = []
    for part in parts:
        if not items or variant_kind(part).is_spec(part):
            items.append(part)
        else:
            items[-1] += "," + part
    return list(dict.fromkeys(variant_kind(item).variant_label(item) for item in items))


def build_variant(pair, label: str, state):
    """Build the drafter ``label`` (a resolved spec) from ``pair`` once, kept in ``state``; its module."""
    return variant_kind(label).variant_build(pair, label, state)


def variant_repeats(pair, label: str) -> bool:
    """Whether the drafter ``label`` built from ``pair`` would repeat a model the pair has (its target
    over again, or its own drafter): nothing new to draft with."""
    repeats = variant_kind(label).variant_repeats
    return repeats is not None and repeats(pair, label)


def variant_drafter(label: str) -> str:
    """The strategy drafter (``Strategy(drafter=...)``) that drafts with the built drafter ``label``."""
    return variant_kind(label).factories[0][0]


def load_attached_pair(kind: DrafterKind, target: str | None, spec: str, options: LoadOptions) -> ModelPair:
    """The target ``target`` and the ``kind`` drafter ``spec`` attached beside it (it takes the target's
    dtype and device, and its vocabulary); ``ModelLoadError`` (one line) when it cannot draft for it."""
    say = options.say
    try:
        if kind.check is not None:
            kind.check(spec)                  # refuse what needs no target before loading one
    except kind.refused as exc:
        raise ModelLoadError(f"--drafter {spec}: {exc}") from exc
    model, tokenizer, label = load_target(target, options)
    try:
        attached = kind.attach(model, spec, target_name=target, label=label, cache_dir=options.cache_dir, say=say)
    except kind.refused as exc:
        raise ModelLoadError(f"--drafter {spec}: {exc}") from exc
    pair = ModelPair(
        target=model, drafter=attached.module, tokenizer=tokenizer, target_name=label,
        drafter_name=attached.name, end_tokens=end_token_ids(tokenizer, model), device=model_device(model),
        vocab_size=check_compatible(tokenizer, tokenizer, model, model),   # it drafts the target's ids
        context_length=context_length(model, tokenizer), self_draft_demo=False, notes=(attached.note,),
    )
    say("Probing the target's cached forward against the uncached one")
    pair.probe = probe_pair(pair)
    return pair
