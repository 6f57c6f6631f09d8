"""Tokenizer facts a decoding pair depends on: a shared vocabulary, the ids that end a turn, the context.

(Named ``vocab`` so it can never shadow the ``tokenizers`` library.) A shared tokenizer is compared
token by token, not through ``config.vocab_size``: pairs such as Qwen2.5-7B/3B share one but pad
their embeddings differently, so logits are compared over the shared length only.
"""

from __future__ import annotations

from utils.errors import ModelLoadError

# End-of-turn markers used by common chat templates (ChatML, Llama 3, Gemma, Phi-3).
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|end_of_turn|>")
# Special tokens whose identity matters to both models of a pair.
PAIR_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token")
_SENTINEL = "specdecsentinelreply"


def logits_width(model) -> int:
    """Number of logits the model produces per position (its output embedding rows)."""
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if weight is not None and weight.dim() == 2 and weight.shape[0] > 0:
        return int(weight.shape[0])
    return int(model.config.vocab_size)


def _first_vocab_difference(a, b) -> str:
    """Describe the first token id at which two tokenizers disagree."""
    a_tokens = a.convert_ids_to_tokens(list(range(len(a))))
    b_tokens = b.convert_ids_to_tokens(list(range(len(b))))
    for token_id, (x, y) in enumerate(zip(a_tokens, b_tokens)):
        if x != y:
            return f"token {token_id} is {x!r} vs {y!r}"
    return f"one vocabulary has {abs(len(a) - len(b))} extra tokens"


def _special_token_difference(a, b) -> str | None:
    """Describe the first special token (bos/eos/unk) the two tokenizers set differently."""
    for name in PAIR_SPECIAL_TOKENS:
        x, y = getattr(a, name, None), getattr(b, name, None)
        if x is not None and y is not None and str(x) != str(y):
            return f"{name} is {str(x)!r} vs {str(y)!r}"
    return None


def tokenizer_difference(target_tok, drafter_tok) -> str | None:
    """None when the two tokenizers map every token to the same id and agree on bos/eos/unk;
    otherwise the first difference, in words."""
    if drafter_tok is target_tok:
        return None  # one shared tokenizer object (a self-draft pair)
    if len(target_tok) != len(drafter_tok) or target_tok.get_vocab() != drafter_tok.get_vocab():
        return _first_vocab_difference(target_tok, drafter_tok)
    return _special_token_difference(target_tok, drafter_tok)


def check_compatible(target_tok, drafter_tok, target_model, drafter_model) -> int:
    """Check that target and drafter share a tokenizer (same ids, same bos/eos/unk); return the
    vocabulary length to compare logits over: the shared tokenizer's, capped by the narrower model
    (embeddings may be padded differently). A real mismatch raises ``ModelLoadError`` naming both sizes."""
    t_len, d_len = len(target_tok), len(drafter_tok)
    t_width, d_width = logits_width(target_model), logits_width(drafter_model)
    detail = tokenizer_difference(target_tok, drafter_tok)
    if detail is not None:
        raise ModelLoadError(
            f"Target and drafter do not share a tokenizer (target: {t_len} tokens, {t_width} logits; "
            f"drafter: {d_len} tokens, {d_width} logits; {detail}): pick a drafter from the target's model family."
        )
    return min(t_len, t_width, d_width)


def pair_vocabulary(target_tok, drafter_tok, target_model, drafter_model) -> tuple[int, str | None]:
    """The vocabulary length the target's distributions cover, and how the tokenizers differ in words
    (None when they are one; with two, the drafter drafts through text, ``cross_tokenizer``)."""
    detail = tokenizer_difference(target_tok, drafter_tok)
    if detail is None:
        return check_compatible(target_tok, drafter_tok, target_model, drafter_model), None
    return min(len(target_tok), logits_width(target_model)), detail


def _as_ids(value) -> list[int]:
    """An eos setting (None, an int, or a list of ints) as a list."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value if v is not None]


def _template_text(tokenizer) -> str:
    """The chat template source (all named templates joined), or ''."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template or ""


def _single_token_id(tokenizer, text: str) -> int | None:
    """The id of ``text`` if it is one token of the vocabulary, else None."""
    token_id = tokenizer.convert_tokens_to_ids(text)  # unknown text maps to <unk> (or None)
    if token_id is None or tokenizer.convert_ids_to_tokens(token_id) != text:
        return None
    return int(token_id)


def _rendered_end_of_turn(tokenizer) -> int | None:
    """The special token the chat template writes right after an assistant reply, if any."""
    if not _template_text(tokenizer):
        return None
    chat = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": _SENTINEL}]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False)
    except Exception:  # templates may reject this shape of chat; the marker scan still runs
        return None
    if _SENTINEL not in text:
        return None
    after = text.split(_SENTINEL, 1)[1]
    ids = tokenizer(after, add_special_tokens=False).input_ids if after else []
    if not ids:
        return None
    special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}))
    # The token must spell the text that follows (an <unk> for an unknown marker does not).
    spelled = tokenizer.convert_ids_to_tokens(ids[0])
    return ids[0] if ids[0] in special and after.startswith(spelled) else None


def chat_template_end_ids(tokenizer) -> list[int]:
    """End-of-turn token ids from the chat template: known markers it mentions and what it renders."""
    template = _template_text(tokenizer)
    found = [_single_token_id(tokenizer, m) for m in END_OF_TURN_MARKERS if m in template]
    found.append(_rendered_end_of_turn(tokenizer))
    return [i for i in found if i is not None]


def end_token_ids(tokenizer, model) -> list[int]:
    """Sorted unique ids that end generation: the tokenizer's eos, the generation config's (else the
    model config's) and the chat template's end-of-turn tokens present in the vocabulary."""
    ids = _as_ids(tokenizer.eos_token_id)
    generation = getattr(model, "generation_config", None)
    generation_eos = getattr(generation, "eos_token_id", None) if generation is not None else None
    ids += _as_ids(generation_eos if generation_eos is not None else getattr(model.config, "eos_token_id", None))
    ids += chat_template_end_ids(tokenizer)
    size = len(tokenizer)  # not cheap on fast tokenizers: once
    return sorted({i for i in ids if 0 <= i < size})


def context_length(model, tokenizer=None) -> int | None:
    """A model's maximum positions: its config's, else the tokenizer's ``model_max_length``, else
    None (unknown: no request is refused for its length)."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < 10**7:  # transformers uses ~1e30 for "unknown"
        return limit
    return None


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def _flat_ids(encoded) -> list[int]:
    """Token ids of one sequence from ``apply_chat_template(tokenize=True)``: a list in transformers
    4.x, a BatchEncoding in 5.x, whose ``input_ids`` may hold one list per conversation."""
    if hasattr(encoded, "keys"):
        encoded = encoded["input_ids"]
    if hasattr(encoded, "tolist"):
        encoded = encoded.tolist()
    ids = list(encoded)
    if ids and isinstance(ids[0], (list, tuple)):
        ids = list(ids[0])
    return [int(i) for i in ids]


def encode_prompt(tokenizer, text: str, *, chat: bool = True) -> list[int]:
    """Prompt token ids: one user turn through the chat template (with the assistant header) when
    ``chat`` is on and there is a template, else the plain text. Every front end and peer encodes
    here, so every strategy gets the same ids."""
    if chat and has_chat_template(tokenizer):
        return template_ids(tokenizer, [{"role": "user", "content": text}])
    return [int(i) for i in tokenizer(text).input_ids]


def template_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of ``messages`` (role, content) through the tokenizer's chat template, with the
    assistant header after them."""
    return _flat_ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
