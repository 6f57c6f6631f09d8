"""A Gemma 4 assistant checkpoint, loaded for a Gemma 4 target the way transformers loads it.

transformers (5.24) ships ``Gemma4AssistantForCausalLM``: Gemma 4 layers without key or value
projections of their own, reading the target's keys and values of its last non-shared layer of each
attention type. ``load_assistant`` reads a user's directory (``model_type`` ``gemma4_assistant``)
with that class, or refuses in one line (:class:`AssistantRefused`).
"""

from __future__ import annotations

import os

import transformers

from kvcache.probe import ProbeResult, remember
from utils.hf_load import text_config

PREFIX = "gemma4-assistant:"
ASSISTANT_ATTR = "assistant_of"   # on a loaded assistant: the target it drafts for
MODEL_TYPE = "gemma4_assistant"
TARGET_TYPE = "gemma4_text"


class AssistantRefused(ValueError):
    """The assistant cannot draft for this target; the message says why (one line)."""


def is_assistant_spec(spec) -> bool:
    """Whether ``--drafter`` names a Gemma 4 assistant (``gemma4-assistant:PATH``)."""
    return spec is not None and str(spec).strip().lower().startswith(PREFIX)


def assistant_path(spec: str) -> str:
    """The PATH of ``gemma4-assistant:PATH``; :class:`AssistantRefused` when it is empty."""
    path = str(spec).strip()[len(PREFIX):].strip()
    if not path:
        raise AssistantRefused(f"{PREFIX}PATH needs the directory of a Gemma 4 assistant checkpoint")
    return path


def has_assistant_model() -> bool:
    """Whether this transformers has the ``Gemma4AssistantForCausalLM`` the drafter is built on and
    tested with (5.24 on). 5.17's earlier one failed to draft (``KeyError: 'sliding_attention'``,
    on a GPU machine's transformers), and the releases between were not tested, so they are refused."""
    from kvcache.cache import TRANSFORMERS_RELEASE

    return (TRANSFORMERS_RELEASE >= (5, 24)
            and getattr(transformers, "Gemma4AssistantForCausalLM", None) is not None)


def assistant_class():
    """transformers' ``Gemma4AssistantForCausalLM``; :class:`AssistantRefused` on a transformers without it."""
    if not has_assistant_model():
        raise AssistantRefused(f"a Gemma 4 assistant needs a transformers with Gemma4AssistantForCausalLM "
                               f"(5.24 on); this is transformers {transformers.__version__}")
    return transformers.Gemma4AssistantForCausalLM


def producer_layers(config) -> dict[str, int]:
    """layer type -> the index of the target layer whose keys and values the assistant reads
    (the last non-shared layer of that type: ``"store"`` in ``kv_sharing_modes``)."""
    modes = getattr(config, "kv_sharing_modes", None) or []
    return {config.layer_types[i]: i for i, mode in enumerate(modes) if mode == "store"}


def kv_shape(config, layer: int) -> tuple[int, int]:
    """(key/value heads, head dim) of ``layer`` of a Gemma 4 text config."""
    per_layer = getattr(config, "per_layer_config", None)
    layer_config = per_layer[layer] if per_layer is not None else config
    return int(layer_config.num_key_value_heads), int(layer_config.head_dim)


def check_target(target) -> dict[str, int]:
    """The target's producer layers; :class:`AssistantRefused` for a target that is not a Gemma 4."""
    config = text_config(target.config)
    kind = getattr(config, "model_type", None) or type(target).__name__
    if kind != TARGET_TYPE:
        raise AssistantRefused(f"a Gemma 4 assistant drafts for a Gemma 4 target only (this target is {kind})")
    return producer_layers(config)


def check_sizes(assistant_config, target) -> None:
    """:class:`AssistantRefused` when the assistant was not made for a target of this shape."""
    producers = check_target(target)
    mine, theirs = text_config(assistant_config), text_config(target.config)
    if assistant_config.backbone_hidden_size != theirs.hidden_size:
        raise AssistantRefused(f"the assistant reads hidden states of width {assistant_config.backbone_hidden_size}, "
                               f"the target's are {theirs.hidden_size} wide")
    if mine.vocab_size != theirs.vocab_size:
        raise AssistantRefused(f"the assistant's vocabulary has {mine.vocab_size} entries, the target's "
                               f"{theirs.vocab_size}")
    for layer, kind in enumerate(mine.layer_types):
        if kind not in producers:
            raise AssistantRefused(f"the assistant has {kind} layers, the target keeps no {kind} keys to share")
        want, have = kv_shape(mine, layer), kv_shape(theirs, producers[kind])
        if want != have:
            raise AssistantRefused(f"the assistant's {kind} layers read {want[0]} key/value heads of "
                                   f"{want[1]}, the target's have {have[0]} of {have[1]}")


def load_assistant(path: str, target, *, cache_dir=None):
    """The assistant at ``path`` for ``target``, in the target's dtype and on its device, eval mode."""
    cls = assistant_class()
    check_target(target)
    if _looks_local(path) and not os.path.isdir(path):
        raise AssistantRefused(f"no Gemma 4 assistant at {path}: no such directory")
    try:
        config = transformers.AutoConfig.from_pretrained(path, cache_dir=cache_dir)
    except (OSError, ValueError) as exc:
        raise AssistantRefused(f"no Gemma 4 assistant at {path}: {_first_line(exc)}") from exc
    if getattr(config, "model_type", None) != MODEL_TYPE:
        raise AssistantRefused(f"{path} is not a Gemma 4 assistant (its config's model_type is "
                               f"{getattr(config, 'model_type', None)!r}, not {MODEL_TYPE!r})")
    check_sizes(config, target)
    parameter = next(target.parameters())
    try:
        model = cls.from_pretrained(path, config=config, dtype=parameter.dtype, cache_dir=cache_dir)
    except (OSError, ValueError, RuntimeError) as exc:
        raise AssistantRefused(f"the Gemma 4 assistant at {path} cannot be loaded: {_first_line(exc)}") from exc
    return mark_assistant(model.to(parameter.device).eval(), target)


def _looks_local(path: str) -> bool:
    """A filesystem path rather than a hub id (``owner/name``)."""
    return os.path.exists(path) or os.path.isabs(path) or path.startswith(("./", "../", "~")) or path.count("/") > 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def mark_assistant(model, target):
    """Record that ``model`` (a ``Gemma4AssistantForCausalLM``) drafts for ``target``; returns it.

    The engine then drafts with it through ``gemma4_assistant.AssistantDrafter``. It keeps no
    cache (it attends to the target's), so the cache probe, which runs models alone, records it
    without running it. :class:`AssistantRefused` on a transformers whose assistant it does not run.
    """
    assistant_class()
    check_sizes(model.config, target)
    object.__setattr__(model, ASSISTANT_ATTR, target)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    remember(model, ProbeResult(type(model).__name__, dtype, "cached", rollback="none",
                                reason="Gemma 4 assistant: no cache of its own, it reads the target's keys "
                                       "and values"))
    return model


def assistant_target(model):
    """The target ``model`` drafts for when it is a marked Gemma 4 assistant, else None."""
    return getattr(model, ASSISTANT_ATTR, None) if model is not None else None
