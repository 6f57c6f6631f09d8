"""Draft-length (gamma) policies: how many tokens the drafter proposes each round.

The verify loop calls ``policy.begin(drafter_kind)`` once per generation, ``k = policy.next_gamma()``
each round (capped by the length budget; a model drafter also stops below ``policy.threshold``) and
``policy.observe(round)`` after it. Four policies (``make_policy``), one module each:

* ``constant``: always ``gamma``.
* ``heuristic``: transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 after a fully
  accepted round, -1 (never below 1) after a rejection.
* ``confidence T``: at most ``gamma``, stopping below top probability ``T`` (transformers'
  ``assistant_confidence_threshold``).
* ``model``: the gamma in 0..``gamma`` that maximises predicted tokens per second (:class:`ModelPolicy`).

Pure Python: no torch, no device syncs.
"""

from __future__ import annotations

from generation.gamma_policies.base import DRAFTER_KINDS, GammaPolicy
from generation.gamma_policies.confidence import DEFAULT_CONFIDENCE, ConfidencePolicy
from generation.gamma_policies.constant import ConstantPolicy
from generation.gamma_policies.heuristic import HeuristicPolicy
from generation.gamma_policies.model import ModelPolicy
from utils.options import check_int

POLICIES = ("constant", "heuristic", "confidence", "model")

__all__ = [
    "DEFAULT_CONFIDENCE",
    "DRAFTER_KINDS",
    "POLICIES",
    "ConfidencePolicy",
    "ConstantPolicy",
    "GammaPolicy",
    "HeuristicPolicy",
    "ModelPolicy",
    "make_policy",
]


def _split_name(name: str, threshold: float | None) -> tuple[str, float | None]:
    """``"confidence 0.4"`` -> ("confidence", 0.4); a threshold in both places must agree."""
    words = str(name).split()
    if not words:
        raise ValueError(f"empty gamma policy name (choose from {', '.join(POLICIES)})")
    if len(words) > 2:
        raise ValueError(f"gamma policy {name!r}: expected a name and at most one threshold")
    if len(words) == 2:
        try:
            value = float(words[1])
        except ValueError:
            raise ValueError(f"gamma policy {name!r}: threshold {words[1]!r} is not a number") from None
        if threshold is not None and threshold != value:
            raise ValueError(f"gamma policy {name!r} and threshold={threshold} disagree")
        threshold = value
    return words[0], threshold


def make_policy(name: str, gamma: int, threshold: float | None = None):
    """A fresh gamma policy. ``gamma``: the constant value, the heuristic's start,
    or the most drafts a round (confidence, model). ``threshold`` only for
    ``confidence`` (default 0.4; also written as ``"confidence 0.4"``).
    ValueError with a one-line message for an unknown name or a bad value."""
    kind, threshold = _split_name(name, threshold)
    if kind not in POLICIES:
        raise ValueError(f"unknown gamma policy {kind!r} (choose from {', '.join(POLICIES)})")
    gamma = check_int(gamma, "gamma", 1)
    if kind != "confidence":
        if threshold is not None:
            raise ValueError(f"gamma policy {kind!r} takes no threshold (only confidence does)")
        return {"constant": ConstantPolicy, "heuristic": HeuristicPolicy,
                "model": ModelPolicy}[kind](gamma)
    if threshold is None:
        threshold = DEFAULT_CONFIDENCE
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise ValueError(f"confidence threshold must be a number between 0 and 1 (exclusive), "
                         f"got {threshold!r}")
    return ConfidencePolicy(gamma, float(threshold))
