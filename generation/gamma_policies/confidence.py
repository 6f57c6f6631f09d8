"""Dynamic speculation: a model drafter stops once its confidence falls below a threshold."""

from __future__ import annotations

from generation.gamma_policies.base import check_kind
from generation.result import Round

DEFAULT_CONFIDENCE = 0.4     # transformers' assistant_confidence_threshold default


class ConfidencePolicy:
    """At most ``gamma`` drafts; a model drafter stops below top probability ``threshold``. For an n-gram
    drafter, which has no probabilities, it is the constant policy (``threshold`` None)."""

    def __init__(self, gamma: int, threshold: float = DEFAULT_CONFIDENCE):
        self.gamma = gamma
        self.confidence = threshold
        self.threshold: float | None = threshold
        self.name = f"confidence {threshold:g}"

    def begin(self, drafter_kind: str) -> None:
        check_kind(drafter_kind)
        self.threshold = self.confidence if drafter_kind == "model" else None

    def next_gamma(self) -> int:
        return self.gamma

    def observe(self, rnd: Round) -> None:
        pass
