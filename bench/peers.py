"""transformers' own decoders on the same loaded models, as the benchmark's peers.

``hf_generate`` (``model.generate``), ``hf_assisted`` (the drafter as ``assistant_model``; the
constant, heuristic and confidence policies map to transformers' own), ``hf_prompt_lookup``
(``prompt_lookup_num_tokens`` = gamma) and ``hf_mtp`` (``generate(use_mtp=True)``); the first three
also on the static cache (:func:`static_peer_refusal`). With two tokenizers ``hf_assisted`` is
universal assisted generation, whose token-level path prunes the assistant in place, so it gets a
copy (``bench.executor``).

Every call gets an explicit generation config so no model default changes what is compared:
4.x is told ``use_model_defaults=False``; 5.x has no switch, so the fields that change the output
are set explicitly.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import logging
import warnings
import weakref

import torch
import transformers
from transformers import GenerationConfig

from bench.processors import ProcessorSpec, hf_sampling_kwargs
from sampling.spec import parse_processor_words

# The neutral value of every setting a model's own generation config could
# carry that changes which token is chosen (transformers 5.x fills unset fields
# from it). Sampling settings come from ``hf_sampling_kwargs``.
NEUTRAL = dict(
    repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0,
    min_length=0, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0, length_penalty=1.0,
    renormalize_logits=False, remove_invalid_values=False,
)


def generation_config(spec: ProcessorSpec, *, max_new_tokens: int, end_tokens: list[int],
                      pad_token_id: int | None, prompt_lookup: int | None = None,
                      max_matching_ngram_size: int | None = None, static: bool = False,
                      cache_len: int | None = None) -> GenerationConfig:
    """The settings every peer call uses: same length, same end tokens, same rule. ``static``: on
    transformers' static cache (compiled by transformers on CUDA); ``cache_len``: its size when the
    call's own length would not hold it (:func:`static_cache_len`)."""
    sized = {"max_cache_len": cache_len} if cache_len is not None else {}
    return GenerationConfig(
        cache_implementation="static" if static else None,
        **sized,
        max_new_tokens=max_new_tokens,
        eos_token_id=list(end_tokens),
        pad_token_id=pad_token_id if pad_token_id is not None else end_tokens[0],
        num_beams=1,
        use_cache=True,
        prompt_lookup_num_tokens=prompt_lookup,
        max_matching_ngram_size=max_matching_ngram_size,
        **NEUTRAL,
        **hf_sampling_kwargs(spec),
    )


def assistant_schedule(policy: str, default_confidence: float) -> tuple[str, float]:
    """(num_assistant_tokens_schedule, assistant_confidence_threshold) for one of our policies;
    ``default_confidence`` is --assisted-confidence (0 = none)."""
    words = policy.split()
    if words[0] == "constant":
        return "constant", default_confidence
    if words[0] == "heuristic":
        return "heuristic", 0.0
    if words[0] == "confidence":
        return "constant", float(words[1])
    raise ValueError(f"transformers' assisted generation has no {policy!r} schedule")


@contextlib.contextmanager
def assistant_settings(drafter, gamma: int, confidence: float, schedule: str = "constant"):
    """Set ``drafter``'s assisted-generation schedule for one call and restore its config after: the
    heuristic schedule writes its last value back, and every call must start at ``gamma`` as ours does."""
    saved = copy.deepcopy(drafter.generation_config)
    config = drafter.generation_config
    config.num_assistant_tokens = gamma
    config.num_assistant_tokens_schedule = schedule
    config.assistant_confidence_threshold = confidence
    try:
        yield
    finally:
        drafter.generation_config = saved


def static_cache_len(strategy: str, prompt_tokens: int, max_new_tokens: int, gamma: int | None) -> int | None:
    """The static cache a drafting peer needs: the prompt, the budget and one round's drafts past it
    (prompt lookup verifies beyond ``max_new_tokens``); None for ``hf_generate``."""
    if strategy not in ("hf_assisted", "hf_prompt_lookup"):
        return None
    return prompt_tokens + max_new_tokens + (gamma or 0) + 1


# target -> {(peer, id of the drafter tried): why it was refused, or None}: each trial runs once a process.
_STATIC_TRIALS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def static_peer_refusal(strategy: str, target, drafter=None) -> str | None:
    """Why peer ``strategy`` cannot run on transformers' static cache with ``target`` (and ``drafter``),
    in one line, or None. Decided by trying once per process (:func:`_static_trial`): no release
    number says it (4.x swaps in a dynamic cache, some 5.x releases raise, some models get none)."""
    helper = drafter if strategy == "hf_assisted" else None
    if strategy == "hf_assisted" and helper is None:
        return "no drafter model to try transformers' assisted generation with"
    tried = _STATIC_TRIALS.setdefault(target, {})
    key = (strategy, id(helper))
    if key not in tried:
        tried[key] = _static_trial(strategy, target, helper)
    return tried[key]


def _static_trial(strategy: str, target, drafter) -> str | None:
    """One tiny greedy call of the peer on a static cache: why it failed or did not use the static
    cache, or None."""
    from transformers.cache_utils import Cache, StaticCache

    version, name = transformers.__version__, type(target).__name__
    end = target.config.eos_token_id
    end = end if isinstance(end, int) else 0
    prompt = torch.tensor([[1, 2, 3, 1, 2, 3]], device=target.device)
    config = generation_config(parse_processor_words(["greedy"])[0], max_new_tokens=4, end_tokens=[end], pad_token_id=end,
                               prompt_lookup=2 if strategy == "hf_prompt_lookup" else None, static=True,
                               cache_len=static_cache_len(strategy, prompt.shape[1], 4, 2))
    config.disable_compile = True       # a trial, not a measurement: no compilation on CUDA
    seen: list[bool] = []

    def spy(module, args, kwargs):
        for value in kwargs.values():
            if isinstance(value, Cache):
                inner = getattr(value, "self_attention_cache", value)     # an encoder-decoder's pair of caches
                seen.append(isinstance(value, StaticCache) or isinstance(inner, StaticCache))
    hook = target.register_forward_pre_hook(spy, with_kwargs=True)
    schedule = assistant_settings(drafter, 2, 0.0) if drafter is not None else contextlib.nullcontext()
    try:
        with schedule, quiet_transformers(), torch.no_grad():
            peer_call(strategy, target, drafter, prompt, config)()
    except Exception as exc:  # noqa: BLE001  (any failure here is the failure the run would meet)
        text = str(exc).strip().splitlines()
        return (f"transformers {version} refuses {strategy} on a static cache with {name} "
                f"({type(exc).__name__}: {text[0] if text else ''})")
    finally:
        hook.remove()
    if not seen or not all(seen):
        return f"transformers {version} runs {strategy} with {name} on a dynamic cache only (it swaps a static one out)"
    return None


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


@functools.cache
def _takes_use_model_defaults(generate) -> bool:
    return "use_model_defaults" in inspect.signature(generate).parameters


def peer_call(strategy: str, target, drafter, input_ids: torch.Tensor, config: GenerationConfig,
              tokenizers: tuple | None = None):
    """A zero-argument function that runs one peer decode and returns its output ids; ``tokenizers``:
    (target's, drafter's) when they differ."""
    mask = torch.ones_like(input_ids)
    kwargs = {"assistant_model": drafter} if strategy == "hf_assisted" else {}
    if strategy == "hf_mtp":   # transformers reads the MTP layers from the target's checkpoint itself
        kwargs["use_mtp"] = True
    if kwargs and tokenizers is not None:
        kwargs.update(tokenizer=tokenizers[0], assistant_tokenizer=tokenizers[1])
    if _takes_use_model_defaults(type(target).generate):     # transformers 4.x
        kwargs["use_model_defaults"] = False

    def call():
        return target.generate(input_ids, attention_mask=mask, generation_config=config, **kwargs)
    return call
