"""A pair built from models already in memory, for scripts and tests that bring their own.

``engine.load_pair`` loads models by name; ``pair_of`` wraps two model objects (or one, for
target-only decoding) in the same ``utils.models.ModelPair`` so ``run_strategy`` takes them.
"""

from __future__ import annotations

from utils.devices import model_device
from utils.hf_load import is_encoder_decoder, text_config
from utils.models import ModelPair


def shared_vocab_size(*models) -> int:
    """The vocabulary every model's logits cover: the shortest ``config.vocab_size`` (embeddings may be padded;
    a model whose config nests a text config, a Gemma 4 assistant, has it there)."""
    return min(text_config(m.config).vocab_size for m in models if m is not None)


def pair_of(target, drafter=None, *, end_tokens=(), vocab_size: int | None = None, tokenizer=None) -> ModelPair:
    """A ``ModelPair`` over ``target`` and ``drafter`` (None: no strategy drafts with a model);
    ``end_tokens`` (none: run to the budget); ``vocab_size`` (None: the shorter of their configs')."""
    from utils.vocab import context_length

    config = target.config
    return ModelPair(
        target=target,
        drafter=drafter,
        tokenizer=tokenizer,
        target_name=type(target).__name__,
        drafter_name=type(drafter).__name__ if drafter is not None else "none",
        end_tokens=[] if end_tokens is None else ([end_tokens] if isinstance(end_tokens, int) else list(end_tokens)),
        device=model_device(target),
        vocab_size=vocab_size or shared_vocab_size(target, drafter),
        context_length=context_length(target, tokenizer),
        self_draft_demo=False,
        is_encoder_decoder=is_encoder_decoder(config),
    )
