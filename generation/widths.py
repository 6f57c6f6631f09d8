"""The width a verify round is filled to, from the target's forward costs by width.

A verify over w tokens need not cost more than one over fewer: some CPU BLAS libraries run 2 or 3
rows as vector products and 4 or more as a blocked kernel (a 2-core EPYC: 55 ms for 1 token, 114 for
3, 82 for 4; docs/model_free.md), and a GPU forward costs about the same up to a tile. Extra drafts
never lower what a round keeps, and a deterministic draft is lossless under every rule, so a
model-free drafter may widen a round to a cheaper width (costs: ``engine.widths.verify_costs``).
"""

from __future__ import annotations

# A wider forward replaces a narrower one only when it is measured this much cheaper
# (the measurements are medians of a few turns; a smaller gap could be noise).
FILL_MARGIN = 0.05


def fill_width(costs: dict[int, float], width: int, limit: int, margin: float = FILL_MARGIN) -> int:
    """The width to verify a round of natural ``width`` (drafts + 1) at: the widest measured width
    up to ``limit`` whose forward costs at least ``margin`` less than ``width``'s (as many drafts as
    can be verified for less), or ``width`` itself when none does or ``width`` was not measured."""
    own = costs.get(width)
    if own is None:
        return width
    cheaper = [wider for wider in range(width + 1, limit + 1)
               if wider in costs and costs[wider] <= own * (1.0 - margin)]
    return max(cheaper, default=width)
