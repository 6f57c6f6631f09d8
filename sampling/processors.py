"""Logits processors: turn logits into the distribution a strategy samples from.

Every processor maps logits of shape (..., V) to probabilities of the same
shape, and never modifies its input. Temperature is applied before top-k and
top-p filtering, as transformers' warpers do. ``sample`` draws one id per row
from torch's global RNG unless a ``torch.Generator`` is given.

Greedy is exactly argmax: its "distribution" is one-hot, so the speculative
accept rule min(1, p/q) degenerates to "accept iff the target's argmax equals the
draft", and greedy speculative output equals greedy autoregressive output.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch

from utils.options import check_int


def _widen(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits are processed in float32; float32/float64 stay as they are."""
    return logits.to(probs_dtype(logits.dtype))


def probs_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a processor's probabilities over logits of ``dtype`` come out in (``_widen``)."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _check_temperature(temperature: float) -> float:
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature)) or temperature <= 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r}")
    return float(temperature)


def _check_top_p(top_p: float) -> float:
    if not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    return float(top_p)


def _top_k_filter(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Set every logit below the k-th largest to -inf (ties at the threshold kept)."""
    k = min(top_k, logits.shape[-1])
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def _top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p.

    A token is dropped when the mass of the tokens ranked above it already
    reaches top_p; the most likely token is always kept.
    """
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop_sorted = mass_before >= top_p
    drop_sorted[..., 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


class LogitsProcessor(ABC):
    """Base class: ``processor(logits) -> probs`` and ``processor.sample(probs) -> ids``."""

    is_greedy = False

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """Probabilities over the last dimension of ``logits`` (at least float32)."""
        return self._filter(_widen(logits)).softmax(dim=-1)

    @abstractmethod
    def _filter(self, logits: torch.Tensor) -> torch.Tensor:
        """Scaled and filtered logits (a new tensor; the input is left alone)."""

    def sample(self, probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """One token id per distribution: (..., V) -> (...)."""
        flat = probs.reshape(-1, probs.shape[-1])
        ids = torch.multinomial(flat, 1, generator=generator)
        return ids.reshape(probs.shape[:-1])

    def greedy_ids(self, logits: torch.Tensor) -> torch.Tensor:
        """``sample(self(logits))`` for a processor whose draw is no draw (``is_greedy``): (..., V) ->
        (...). A greedy processor reads it off the logits without building the one-hot rows."""
        return self.sample(self(logits))

    def describe(self) -> str:
        """A short human label, e.g. ``nucleus(t=0.7, p=0.9)``."""
        return repr(self)


class GreedyProcessor(LogitsProcessor):
    """Argmax decoding. ``temperature`` is accepted for a uniform interface and has no effect."""

    is_greedy = True

    def __init__(self, temperature: float = 1.0):
        self.temperature = _check_temperature(temperature)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        ids = logits.argmax(dim=-1, keepdim=True)
        return torch.zeros_like(_widen(logits)).scatter_(-1, ids, 1.0)

    def _filter(self, logits: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError("greedy overrides __call__")

    def sample(self, probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        return probs.argmax(dim=-1)

    def greedy_ids(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)      # the one-hot rows' argmax is the logits' first maximum

    def __repr__(self) -> str:
        return "greedy"


class MultinomialProcessor(LogitsProcessor):
    """Sample from softmax(logits / temperature)."""

    def __init__(self, temperature: float = 1.0):
        self.temperature = _check_temperature(temperature)

    def _filter(self, logits: torch.Tensor) -> torch.Tensor:
        return logits / self.temperature

    def __repr__(self) -> str:
        return f"multinomial(t={self.temperature:g})"


class TopKProcessor(MultinomialProcessor):
    """Sample among the top_k most likely tokens (after temperature)."""

    def __init__(self, temperature: float = 1.0, top_k: int = 50):
        super().__init__(temperature)
        self.top_k = check_int(top_k, "top_k", 1)

    def _filter(self, logits: torch.Tensor) -> torch.Tensor:
        return _top_k_filter(super()._filter(logits), self.top_k)

    def __repr__(self) -> str:
        return f"topk(t={self.temperature:g}, k={self.top_k})"


class NucleusProcessor(MultinomialProcessor):
    """Nucleus (top-p) sampling (Holtzman et al. 2020), after temperature."""

    def __init__(self, temperature: float = 1.0, top_p: float = 0.9):
        super().__init__(temperature)
        self.top_p = _check_top_p(top_p)

    def _filter(self, logits: torch.Tensor) -> torch.Tensor:
        return _top_p_filter(super()._filter(logits), self.top_p)

    def __repr__(self) -> str:
        return f"nucleus(t={self.temperature:g}, p={self.top_p:g})"


class TopKNucleusProcessor(MultinomialProcessor):
    """Top-k, then top-p, after temperature (the order transformers applies them)."""

    def __init__(self, temperature: float = 1.0, top_k: int = 50, top_p: float = 0.9):
        super().__init__(temperature)
        self.top_k = check_int(top_k, "top_k", 1)
        self.top_p = _check_top_p(top_p)

    def _filter(self, logits: torch.Tensor) -> torch.Tensor:
        scaled = super()._filter(logits)
        return _top_p_filter(_top_k_filter(scaled, self.top_k), self.top_p)

    def __repr__(self) -> str:
        return f"topknucleus(t={self.temperature:g}, k={self.top_k}, p={self.top_p:g})"
