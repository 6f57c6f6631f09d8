"""Running estimates the model policy learns from: decayed rates, recent medians, moving means."""

from __future__ import annotations

import statistics
from collections import deque


class Rate:
    """A success rate from exponentially decayed counts, shrunk toward a prior: rate = (successes +
    weight * prior) / (trials + weight), the old counts multiplied by ``decay`` at each trial, so about
    1 / (1 - decay) recent trials carry it."""

    __slots__ = ("successes", "trials")

    def __init__(self):
        self.successes = 0.0
        self.trials = 0.0

    def add(self, success: bool, decay: float) -> None:
        self.successes = self.successes * decay + (1.0 if success else 0.0)
        self.trials = self.trials * decay + 1.0

    def scale(self, factor: float) -> None:
        """Keep the estimate, with ``factor`` times the weight."""
        self.successes *= factor
        self.trials *= factor

    def value(self, prior: float, weight: float) -> float:
        return (self.successes + weight * prior) / (self.trials + weight)


class Recent:
    """The median of the last few samples: one slow forward (another process, a
    collector pause) moves it little, and it follows a lasting change within a
    few samples."""

    __slots__ = ("samples",)

    def __init__(self, keep: int = 5):
        self.samples: deque[float] = deque(maxlen=keep)

    def add(self, x: float) -> None:
        self.samples.append(x)

    @property
    def count(self) -> int:
        return len(self.samples)

    @property
    def value(self) -> float:
        return statistics.median(self.samples)


class Mean:
    """An exponential moving average that starts at its first sample."""

    __slots__ = ("value", "count")

    def __init__(self):
        self.value = 0.0
        self.count = 0

    def add(self, x: float, alpha: float) -> None:
        self.value = x if self.count == 0 else self.value + alpha * (x - self.value)
        self.count += 1
