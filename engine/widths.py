"""Measuring the target's verify forward by width, for filling rounds (``generation.widths``).

:func:`verify_costs` times the target once per pair and widest width (kept in the engine
state); :func:`fill_refusal` says why a target cannot be measured.
"""

from __future__ import annotations

import torch

from generation.timing import TargetTiming, time_target
from generation.common import StrategyRefused
from utils.devices import model_device

# The widest verify measured for filling: a γ above it is filled up to this width only.
MAX_FILL_WIDTH = 33
MEASURE_REPEATS = 3
MEASURE_CONTEXT = 64    # tokens in the cache while the widths are timed


def fill_refusal(target) -> str | None:
    """Why the target's widths cannot be measured here (one line), or None when they can."""
    from generation.served import ServedModel

    if isinstance(target, ServedModel):
        return "filling verify widths needs a local target (a served one is priced per request)"
    if getattr(getattr(target, "config", None), "is_encoder_decoder", False):
        return "filling verify widths needs a decoder-only target"
    return None


def verify_costs(pair, state, gamma: int, vocab_size: int) -> dict[int, float]:
    """Seconds of ``pair.target``'s forward over 1..min(gamma + 1, MAX_FILL_WIDTH) new tokens
    (``generation.timing.time_target`` over a fixed context: a forward's cost by width
    does not depend on the tokens), measured once per pair and widest width (kept in ``state``)."""
    reason = fill_refusal(pair.target)
    if reason is not None:
        raise StrategyRefused(reason)
    widest = max(1, min(gamma + 1, MAX_FILL_WIDTH))

    return _timing(pair, state, widest, vocab_size).verify_s


def plain_step_timing(pair, state, vocab_size: int) -> tuple[float, tuple[float, ...]]:
    """(seconds, samples) of ``pair.target``'s one-token step on a cache of MEASURE_CONTEXT tokens:
    the median of MEASURE_REPEATS timed turns, and each turn's own step (their spread)."""
    reason = fill_refusal(pair.target)
    if reason is not None:
        raise ValueError(reason)
    timing = _timing(pair, state, 1, vocab_size)
    return timing.verify_s[1], timing.step_samples


def _timing(pair, state, widest: int, vocab_size: int) -> TargetTiming:
    """``time_target`` over widths 1..``widest``, measured once per pair and widest width (kept in ``state``)."""

    def measure() -> TargetTiming:
        ids = (torch.arange(MEASURE_CONTEXT, device=model_device(pair.target)) % max(1, vocab_size - 1) + 1).view(1, -1)
        return time_target(pair.target, ids, widths=range(1, widest + 1), repeats=MEASURE_REPEATS)

    return state.for_pair(pair, f"verify_costs:{widest}", measure)
