"""Small helpers every decoding loop shares: argument checks, end tokens, timing."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch

from utils.devices import synchronize
from utils.options import MAX_GAMMA, check_int
from utils.vocab import context_length


class StrategyRefused(ValueError):
    """A strategy that cannot run on this pair with these settings; the message says why in one line
    (the front ends show it as ``refused: ...``)."""


class ContextLengthError(StrategyRefused):
    """The prompt plus the length budget does not fit in the model's context."""

    def __init__(self, prompt_tokens: int, max_gen_len: int, context_length: int):
        self.prompt_tokens = prompt_tokens
        self.max_gen_len = max_gen_len
        self.context_length = context_length
        super().__init__(
            f"the prompt has {prompt_tokens} tokens and {max_gen_len} new tokens were asked for, "
            f"but the model's context holds {context_length} tokens "
            f"(at most {max(context_length - prompt_tokens, 0)} new tokens fit)"
        )


def check_request(inputs: Sequence[int] | torch.Tensor, max_gen_len: int, *models) -> list[int]:
    """Validate a generation request; return the prompt as a list of ints. ValueError for an empty
    prompt or a negative length, ContextLengthError when prompt + budget exceeds a model's context."""
    prompt = inputs.tolist() if isinstance(inputs, torch.Tensor) else list(inputs)
    if not prompt:
        raise ValueError("the prompt is empty: at least one token is needed")
    check_int(max_gen_len, "max_gen_len", 0)
    for model in models:
        limit = context_length(model)
        if limit is not None and len(prompt) + max_gen_len > limit:
            raise ContextLengthError(len(prompt), max_gen_len, limit)
    return prompt


def check_gamma(gamma: int) -> int:
    """``gamma``, an integer from 1 to ``MAX_GAMMA`` (``utils.options``: the front ends' ranges end
    there too); else a one-line ValueError."""
    if check_int(gamma, "gamma", 1) > MAX_GAMMA:
        raise ValueError(f"gamma must be at most {MAX_GAMMA}, got {gamma}")
    return gamma


def end_tokens(eos_tokens_id: int | Iterable[int] | None) -> frozenset[int]:
    """Normalise an end token id or a list of them to a set."""
    if eos_tokens_id is None:
        return frozenset()
    if isinstance(eos_tokens_id, int):
        return frozenset([eos_tokens_id])
    return frozenset(int(t) for t in eos_tokens_id)


def cut_at_end(tokens: list[int], eos: frozenset[int]) -> tuple[list[int], bool]:
    """Tokens up to and including the first end token, and whether one was found."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1], True
    return tokens, False


def device_clock(device: torch.device) -> float:
    """``time.perf_counter()`` read after the device has finished its queued work."""
    synchronize(device)
    return time.perf_counter()


@contextmanager
def timed_run(result, device: torch.device, *, interruptible: bool) -> Iterator[float]:
    """Time the ``with`` body into ``result.seconds`` (device-synced); yields the start clock, for the
    time to first token. With ``interruptible`` a KeyboardInterrupt ends the body and sets
    ``stop_reason = "interrupted"``; without it the interrupt propagates."""
    start = device_clock(device)
    try:
        yield start
    except KeyboardInterrupt:
        if not interruptible:
            raise
        result.stop_reason = "interrupted"
    finally:
        result.seconds = device_clock(device) - start
