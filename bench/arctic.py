"""Snowflake ArcticInference's suffix-decoding cache as a peer of NASD's suffix storage.

``arctic_inference.suffix_decoding.SuffixDecodingCache`` (SuffixDecoding, Oliaro et al., NeurIPS
2025) only drafts here: :class:`ArcticSuffixDrafter` is a ``Drafter``, so our verify loop keeps the
output lossless. Its cache is run state like an n-gram storage's, set up as our suffix storage's
defaults (depth 32, 64 earlier responses, factor 1, min probability 0.1).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from engine import Drafter, register_drafter
from ngram_assisted.suffix import DEFAULT_FACTOR, DEFAULT_MAX_OUTPUTS, DEFAULT_MAX_PATTERN, MIN_PROB
from utils.devices import model_device

KIND = "arctic_suffix"
_requests = itertools.count()   # request ids: unique for every cache's whole life


class ArcticUnavailable(RuntimeError):
    """ArcticInference cannot be imported here; the message is one line."""


def cache_class():
    """``SuffixDecodingCache``, or ArcticUnavailable saying why in one line."""
    try:
        from arctic_inference.suffix_decoding import SuffixDecodingCache
    except Exception as exc:  # not installed, or its compiled extension does not load
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ArcticUnavailable(
            f"arctic_suffix: ArcticInference's suffix cache cannot be imported ({first}); `pip install "
            "arctic-inference` builds a C++ extension from source and did not build here: see "
            "docs/model_free.md") from None
    return SuffixDecodingCache


def new_cache():
    """An empty cache with our suffix storage's defaults (depth 2P, M earlier responses)."""
    return cache_class()(max_tree_depth=2 * DEFAULT_MAX_PATTERN, max_cached_requests=DEFAULT_MAX_OUTPUTS)


@dataclass(frozen=True)
class ArcticOptions:
    """The ``arctic_suffix`` drafter's options: the cache it drafts from (fresh or kept)."""

    cache: object
    factor: float = DEFAULT_FACTOR
    min_prob: float = MIN_PROB


class ArcticSuffixDrafter(Drafter):
    """Drafts a chain from a ``SuffixDecodingCache``, one request per generation: ``begin`` ends the
    earlier requests (their responses stay in its global tree), ``update`` appends the round's tokens.
    Deterministic drafts: q is one-hot."""

    kind = "ngram"

    def __init__(self, options: ArcticOptions, *, device: torch.device | str = "cpu"):
        self.cache = options.cache
        self.factor = options.factor
        self.min_prob = options.min_prob
        self.device = torch.device(device)
        self.request: int | None = None
        self.context: list[int] = []

    def begin(self, prompt: list[int]) -> None:
        for earlier in list(self.cache.active_requests):
            self.cache.stop_request(earlier)
        self.request = next(_requests)
        self.context = [int(t) for t in prompt]
        self.cache.start_request(self.request, self.context)

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None) -> tuple[torch.Tensor, None]:
        draft = self.cache.speculate(self.request, self.context[-self.cache.max_tree_depth:],
                                     max_spec_tokens=k, max_spec_factor=self.factor,
                                     min_token_prob=self.min_prob)
        return torch.tensor(list(draft.token_ids)[:k], dtype=torch.long, device=ids.device), None

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        tokens = [int(t) for t in new_tokens]
        self.context += tokens
        self.cache.add_active_response(self.request, tokens)


def _factory(pair, strategy, state, context) -> ArcticSuffixDrafter:
    if not isinstance(strategy.drafter_options, ArcticOptions):
        raise ValueError("the arctic_suffix drafter needs ArcticOptions with its cache")
    return ArcticSuffixDrafter(strategy.drafter_options, device=model_device(pair.target))


register_drafter(KIND, _factory)
