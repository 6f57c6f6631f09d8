"""Autoregressive decoding of a served target: the engine's own sampler, one token a request.

The reference a served target's speculative output is held to is its own decode (a quantised
server is a different model from a local copy). Each token is one request, timed; Ctrl-C during
a request keeps the tokens made before it.
"""

from __future__ import annotations

import torch

from generation.common import timed_run
from generation.observer import Observer, Watch
from generation.options import LoopOptions
from generation.phases import split_phases
from generation.result import GenerationResult, Round
from kvcache.cache import SessionModel


class ServedModel(SessionModel):
    """A target whose cache lives in a serving engine (``remote.target.ServedTarget``): it makes a session
    per generation (:meth:`session`, shaped like ``kvcache.cache.CachedModel``) and decodes with the
    engine's own sampler (:meth:`decode`); nothing is probed."""

    def bound(self, processor):
        """This target with a run's sampling settings (they decide what a verify can take as exact)."""
        return self

    def decode(self, prompt: list[int], max_new: int, processor, seed: int):
        """Yield ``(token, seconds)`` as the engine's own sampler makes them."""
        raise NotImplementedError

    def network_mark(self):
        """Where the request counters stand now."""
        raise NotImplementedError

    def network_since(self, mark) -> dict:
        """The requests made since ``mark``: count, seconds on the wire, reported compute, round trip."""
        raise NotImplementedError


def served_generate(prompt: list[int], model: ServedModel, options: LoopOptions, *,
                    observer: Observer | None = None, interruptible: bool = False) -> GenerationResult:
    """Decode ``prompt`` with the server's own sampler (``options.processor``'s settings sent
    explicitly; the seed is ``options.generator``'s); stops after an end token or the budget."""
    result = GenerationResult()
    watch = Watch(observer)
    seed = options.generator.initial_seed() if options.generator is not None else 0
    mark = model.network_mark()
    tokens: list[int] = []
    with timed_run(result, torch.device("cpu"), interruptible=interruptible) as started:
        for token, seconds in model.decode(prompt, options.max_gen_len, options.processor, seed):
            tokens.append(token)
            result.rounds += 1
            result.trace.append(Round(drafted=(), accepted=0, token=token, bonus=False, gamma=0, verify_s=seconds))
            watch.round(result.trace[-1], [token])
            if token in options.eos:
                result.stop_reason = "eos"
                break
    result.seconds -= watch.paused_s
    result.first_token_s, result.first_tokens = watch.first_token(started)
    result.tokens = tokens
    result.target_calls = len(tokens)
    result.phases = split_phases(result.seconds, 0.0, sum(r.verify_s for r in result.trace))
    result.rollback = {"target": {"method": "server", "path": "served"}}
    result.network = model.network_since(mark)
    return result
