"""The self-draft kind (``--drafter self:...``): a drafter made from the target itself.

Its loader (``model_drafters.selfdraft.load``) measures which self-drafter pays by decoding with the
greedy run the engine hands it, as does the layer search that resolves ``self:skip=auto`` for a
drafter built beside a loaded pair.
"""

from __future__ import annotations

from generation.common import check_request
from model_drafters.kind import SERVED_WEIGHTS, DrafterKind
from model_drafters.selfdraft.build import build_self_drafter
from model_drafters.selfdraft.drafter import SelfDrafter
from model_drafters.selfdraft.load import load_self_draft_pair, resolve_variant
from model_drafters.selfdraft.mark import self_draft_label, self_draft_target
from model_drafters.selfdraft.spec import PRECISIONS, PREFIX, is_self_draft, parse_self_draft


def draft(pair, strategy, state, context) -> SelfDrafter:
    """The pair's own self-drafter, drafting on the target's cache (the ``model`` drafter's choice)."""
    check_request(context.prompt, context.max_gen_len, pair.drafter)
    return SelfDrafter(pair.drafter, context.processor, use_cache=strategy.use_cache,
                       vocab_size=context.vocab_size, generator=context.generator)


def self_drafter(pair, strategy, state, context) -> SelfDrafter:
    """A self-drafter built from the pair's target: ``drafter_options`` is its spec
    (``"self:int8"``, ``"self:skip=3,5"``, ...), built once per pair and kept in ``state``;
    None for the pair's own drafter, which must then be made from the target. The engine
    registers it as the ``self`` drafter."""
    spec = strategy.drafter_options
    if spec is None:
        model = pair.drafter
        if self_draft_target(model) is not pair.target:
            raise ValueError("this pair's drafter is not made from its target: pass a self: spec")
    else:
        model = self_draft_model(pair, spec, state)
    return SelfDrafter(model, context.processor, use_cache=strategy.use_cache, vocab_size=context.vocab_size,
                       generator=context.generator)


def self_draft_model(pair, spec: str, state):
    """The self-draft model ``spec`` made from ``pair.target``, built once per pair and spec (kept in ``state``)."""
    return state.for_pair(pair, spec, lambda: build_self_drafter(pair.target, parse_self_draft(spec)))


def is_drafter(pair, label: str) -> bool:
    """Whether ``pair``'s own drafter is the self-drafter ``label`` made from its target."""
    return self_draft_target(pair.drafter) is pair.target and self_draft_label(pair.drafter) == label


def same_precision(target, label: str) -> bool:
    """Whether the self-drafter ``label`` is a copy of ``target`` in the dtype it already has."""
    import torch

    kind = parse_self_draft(label).kind
    dtype = next((t.dtype for t in target.parameters() if t.is_floating_point()), None)
    return kind in PRECISIONS and getattr(torch, PRECISIONS[kind]) == dtype


KIND = DrafterKind(
    name="self", prefix=PREFIX, is_spec=is_self_draft, made_for=self_draft_target, draft=draft,
    load=load_self_draft_pair, default=True,
    served=SERVED_WEIGHTS,
    factories=(("self", self_drafter),),
    variant_label=lambda spec: parse_self_draft(spec).label,
    variant_resolve=resolve_variant, variant_build=self_draft_model,
    variant_repeats=lambda pair, label: same_precision(pair.target, label) or is_drafter(pair, label),
    own_step=False,
    target_reads="cache",
    replay=None,        # held to runs by tests/test_advisor_replay.py (its rounding is the target's)
    rows=None,          # a copy of the target (or its layers) with a forward of its own
)
