"""The other-tokenizer kind: a drafter model whose tokenizer differs from the target's (SLEM, TLI).

No ``--drafter`` prefix names it: the pair does (``ModelPair.drafter_tokenizer`` set).
"""

from __future__ import annotations

from model_drafters.cross_tokenizer.factory import (cross_tokenizer_drafter, drafter_ends, drafter_inputs,
                                                    has_own_tokenizer, vocab_map_of)
from model_drafters.cross_tokenizer.options import CrossTokenizerOptions
from model_drafters.kind import DrafterKind, never


def cross_drafter(pair, strategy, state, context):
    """A drafter model with a tokenizer of its own (SLEM or TLI, Timor et al. 2025), by
    ``strategy.drafter_options`` (:class:`CrossTokenizerOptions`; SLEM when None); the engine
    registers it as the ``cross_tokenizer`` drafter."""
    options = strategy.drafter_options
    if options is None:
        options = CrossTokenizerOptions()
    if not isinstance(options, CrossTokenizerOptions):
        raise ValueError(f"the model drafter takes CrossTokenizerOptions, got {type(options).__name__}")
    return cross_tokenizer_drafter(pair, context.processor, method=options.method,
                                   use_cache=strategy.use_cache, generator=context.generator,
                                   vmap=state.for_pair(pair, "vocab_map", lambda: vocab_map_of(pair)),
                                   ends=state.for_pair(pair, "drafter_ends", lambda: drafter_ends(pair)))


def alone_inputs(pair, prompt_ids: list[int], state) -> tuple[list[int], list[int]]:
    """Drafter AR reads and writes the drafter's own ids: the prompt in them, and its own end tokens."""
    return drafter_inputs(pair, prompt_ids, state.for_pair(pair, "drafter_ends", lambda: drafter_ends(pair)))


KIND = DrafterKind(
    name="cross_tokenizer", prefix=None, is_spec=lambda spec: False, made_for=never, draft=cross_drafter,
    owns_pair=lambda pair: has_own_tokenizer(pair), alone_inputs=alone_inputs, factories=(("cross_tokenizer", cross_drafter),),
    target_reads="",
    replay="re-tokenises text between two vocabularies each round; checked against runs on "
           "random drafters that accept no drafts only",
)
