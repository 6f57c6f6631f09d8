"""transformers' own decoders on the same loaded models, as the benchmark's peers.

``hf_generate``: ``model.generate`` (autoregressive). ``hf_assisted``: assisted
generation with the drafter as ``assistant_model``, drafting exactly gamma
tokens a round (constant schedule, no confidence early stop unless asked).
``hf_prompt_lookup``: prompt lookup decoding with ``prompt_lookup_num_tokens``
= gamma. Every call gets an explicit generation config, so no model default
(a repetition penalty, a sampling flag) changes what is compared.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import warnings

import torch
from transformers import GenerationConfig

from bench.processors import ProcessorSpec, hf_sampling_kwargs


def generation_config(spec: ProcessorSpec, *, max_new_tokens: int, end_tokens: list[int],
                      pad_token_id: int | None, prompt_lookup: int | None = None,
                      max_matching_ngram_size: int | None = None) -> GenerationConfig:
    """The settings every peer call uses: same length, same end tokens, same rule."""
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        eos_token_id=list(end_tokens),
        pad_token_id=pad_token_id if pad_token_id is not None else end_tokens[0],
        num_beams=1,
        use_cache=True,
        prompt_lookup_num_tokens=prompt_lookup,
        max_matching_ngram_size=max_matching_ngram_size,
        **hf_sampling_kwargs(spec),
    )


@contextlib.contextmanager
def assistant_settings(drafter, gamma: int, confidence: float):
    """Make ``drafter`` propose exactly ``gamma`` tokens a round; restore its config after."""
    saved = copy.deepcopy(drafter.generation_config)
    config = drafter.generation_config
    config.num_assistant_tokens = gamma
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = confidence
    try:
        yield
    finally:
        drafter.generation_config = saved


@contextlib.contextmanager
def quiet_transformers():
    """Silence transformers' generation warnings and log lines for the benchmark."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            logger.setLevel(level)


def peer_call(strategy: str, target, drafter, input_ids: torch.Tensor, config: GenerationConfig):
    """A zero-argument function that runs one peer decode and returns its output ids."""
    mask = torch.ones_like(input_ids)
    kwargs = {"assistant_model": drafter} if strategy == "hf_assisted" else {}

    def call():
        return target.generate(input_ids, attention_mask=mask, generation_config=config,
                               use_model_defaults=False, **kwargs)
    return call
