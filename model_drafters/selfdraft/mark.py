"""The mark a self-draft model carries: the target it was made from (``selfdraft.build`` sets it)."""

from __future__ import annotations

SELF_DRAFT_ATTR = "self_draft_of"  # on a self-draft model: the target it was made from


def mark_self_draft(drafter, target, label: str) -> None:
    """Record on ``drafter`` that it was made from ``target`` (so the engine can share the cache)."""
    object.__setattr__(drafter, SELF_DRAFT_ATTR, (target, label))


def self_draft_target(model):
    """The target ``model`` (a drafter model) was made from, or None for an ordinary drafter model."""
    mark = getattr(model, SELF_DRAFT_ATTR, None)
    return mark[0] if mark else None


def self_draft_label(model) -> str | None:
    """The spec label ``model`` was built from (``self:bf16``), or None for an ordinary drafter model."""
    mark = getattr(model, SELF_DRAFT_ATTR, None)
    return mark[1] if mark else None
