"""The constant policy: always gamma drafts."""

from __future__ import annotations

from generation.gamma_policies.base import check_kind
from generation.result import Round


class ConstantPolicy:
    """Always ``gamma`` drafts a round."""

    name = "constant"
    threshold = None

    def __init__(self, gamma: int):
        self.gamma = gamma

    def begin(self, drafter_kind: str) -> None:
        check_kind(drafter_kind)

    def next_gamma(self) -> int:
        return self.gamma

    def observe(self, rnd: Round) -> None:
        pass
