"""The width a verify round is filled to, from the target's forward costs by width.

A verify forward over w tokens need not cost more than one over fewer. On some CPUs
the BLAS library runs a matrix product of 2 or 3 rows as separate vector products
and one of 4 or more as a blocked kernel (measured on a 2-core AMD EPYC: 55 ms for
1 token, 92 for 2, 114 for 3, 82 for 4, 74 for 5; docs/model_free.md), and on a GPU a
forward costs about the same up to a tile's width. A drafter that drafted d tokens
and can cheaply go on can then verify more of its continuation for less: extra
drafts never lower how many tokens the round keeps, and a forward that costs less
makes the round cheaper. A deterministic draft is lossless under every verify rule
(its q is one-hot), so a widened round of a model-free drafter gives the same tokens
under greedy and the same distribution under sampling.

The costs are measured by ``engine.widths.verify_costs``; the drafter that fills is
``ngram_assisted.MatchDrafter``.
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
