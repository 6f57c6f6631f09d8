"""Mutations the tests patch in to show a check has power: each breaks one rule on purpose."""

from __future__ import annotations

import torch


def shifted_rows(real):
    """Mutation of a tree accept rule ``real``: each node's draw taken from the row
    of the node after it (an off-by-one)."""
    def accept(p, *args, **kwargs):
        return real(torch.cat([p[1:], p[-1:]]), *args, **kwargs)
    return accept
