"""Build a self-drafter model from a loaded target, for a :class:`selfdraft.spec.SelfDraftSpec`."""

from __future__ import annotations

import torch

from model_drafters.selfdraft.copies import int8_copy, precision_copy
from model_drafters.selfdraft.lean import attach_lean
from model_drafters.selfdraft.mark import mark_self_draft
from model_drafters.selfdraft.skip import skip_view
from model_drafters.selfdraft.spec import PRECISIONS, SelfDraftSpec


def build_self_drafter(target, spec: SelfDraftSpec) -> torch.nn.Module:
    """The drafter model for ``spec`` made from ``target`` (which is left untouched).

    A copy (precision or int8) gets its lean one-token step where it has the Llama shape
    (``selfdraft.lean``).

    ``self:skip=auto`` must be resolved to layers first (``model_drafters.selfdraft.search``).
    Raises ``selfdraft.skip.SkipRefused`` (one line) where layer skipping does not apply.
    """
    if spec.kind in PRECISIONS:
        model = precision_copy(target, getattr(torch, PRECISIONS[spec.kind]))
        attach_lean(model)
    elif spec.kind == "int8":
        model = int8_copy(target, spec.route or None)
        attach_lean(model)
    elif spec.auto:
        raise ValueError("self:skip=auto: search for the layers first (model_drafters.selfdraft.search.search_skip)")
    else:
        model = skip_view(target, spec.layers)
    mark_self_draft(model, target, spec.label)
    return model
