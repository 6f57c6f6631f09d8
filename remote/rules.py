"""Which sampling settings a served target decodes losslessly, and the logits rows it hands the loop.

An engine returns the top N log-probabilities; a row holds them and -inf elsewhere (:func:`row_of`).
Exact from such a row: greedy; top-k with K <= N (then top-p too); nucleus alone only where the
returned mass certifies the kept set (:func:`nucleus_certified`; the missing mass spread over the
tokens not returned, else asked again with more); plain multinomial only with the whole
vocabulary. Never renormalised over a top-N: a row is either exact or refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from generation.common import StrategyRefused
from remote.transport import ServerError
from sampling.processors import (GreedyProcessor, LogitsProcessor, MultinomialProcessor, NucleusProcessor,
                                 TopKNucleusProcessor, TopKProcessor)

DEFAULT_PROBS = 20


@dataclass(frozen=True)
class ServedPlan:
    """How a processor is served: ``mode`` ("top1", "topk", "nucleus" or "full") and the N to ask for."""

    mode: str
    n_probs: int
    vocab_size: int

    @property
    def fill_tail(self) -> bool:
        return self.mode == "nucleus"


class SamplerRefused(ServerError, StrategyRefused):
    """A processor this server cannot serve losslessly at its N: the run is refused (the REPL's
    "refused: ..." line), not failed; still a ServerError to code that catches those."""


def plan_for(processor: LogitsProcessor, n_probs: int, vocab_size: int) -> ServedPlan:
    """The plan for ``processor`` with N = ``n_probs`` returned; a refusal is one line (SamplerRefused)."""
    n = min(n_probs, vocab_size)
    if n >= vocab_size:
        return ServedPlan("full", vocab_size, vocab_size)
    if isinstance(processor, GreedyProcessor):
        return ServedPlan("top1", n, vocab_size)
    if isinstance(processor, (TopKProcessor, TopKNucleusProcessor)):
        # A K above N asks for K: the kept set must lie inside what is returned.
        return ServedPlan("topk", max(n, min(processor.top_k, vocab_size)), vocab_size)
    if isinstance(processor, NucleusProcessor):
        return ServedPlan("nucleus", n, vocab_size)
    if type(processor) is MultinomialProcessor:
        raise SamplerRefused(
            f"plain multinomial sampling needs the server's whole vocabulary ({vocab_size} log-probabilities a "
            f"position, slow): pass --server-probs {vocab_size}, or sample with topk or nucleus")
    raise SamplerRefused(f"{processor.describe()} cannot be served losslessly from top-{n} log-probabilities")


def rules_text(n_probs: int, vocab_size: int) -> str:
    """The banner's line on what is exact against this server."""
    if n_probs >= vocab_size:
        return (f"lossless against the server: every processor (the whole vocabulary of {vocab_size} "
                "log-probabilities is returned; slow)")
    return (f"lossless against the server (top-{n_probs} log-probabilities a position): greedy exact; "
            f"topk exact with K <= {n_probs} (a larger K asks for K); nucleus where the returned mass "
            "certifies the kept set (else asks for more); plain multinomial refused")


def row_of(ids: list[int], logprobs: list[float], plan: ServedPlan) -> torch.Tensor:
    """A logits row (V,): the returned log-probabilities, -inf elsewhere (the tail mass spread evenly
    over the tokens not returned when the plan fills it)."""
    row = torch.full((plan.vocab_size,), float("-inf"), dtype=torch.float32)
    if plan.fill_tail:
        missing = plan.vocab_size - len(ids)
        rest = 1.0 - math.fsum(math.exp(v) for v in logprobs)
        if missing > 0 and rest > 0:
            row.fill_(math.log(rest / missing))
    row[torch.tensor(ids, dtype=torch.long)] = torch.tensor(logprobs, dtype=torch.float32)
    return row


def nucleus_certified(logprobs: list[float], temperature: float, top_p: float, vocab_size: int) -> bool:
    """Whether the top-p kept set after ``temperature`` is decided by the returned ``logprobs``.

    The tempered normaliser is known over the returned tokens and bounded over the rest, whose raw mass
    R = 1 - Σ exp(lp) is split among M tokens each at most exp(lp_min): Σ x^α (α = 1/T) lies between
    R·m^(α-1) and M·(R/M)^α. Certified when both bounds keep the same tokens and at least one returned
    token is dropped (every unreturned token ranks below it).
    """
    lp = torch.tensor(sorted(logprobs, reverse=True), dtype=torch.float64)       # (N,)
    alpha = 1.0 / temperature
    a = torch.exp(alpha * lp)                                                    # (N,)
    rest = max(1.0 - float(torch.exp(lp).sum()), 0.0)
    missing = vocab_size - lp.numel()
    if missing <= 0 or rest == 0.0:
        bounds = (0.0, 0.0)
    else:
        smallest = math.exp(float(lp[-1]))
        bounds = (rest * smallest ** (alpha - 1), missing * (rest / missing) ** alpha)
    kept = set()
    for tail in bounds:
        z = float(a.sum()) + tail
        before = (a.cumsum(0) - a) / z
        keep = before < top_p
        keep[0] = True
        kept.add(int(keep.sum()))
    return len(kept) == 1 and kept.pop() < lp.numel()
