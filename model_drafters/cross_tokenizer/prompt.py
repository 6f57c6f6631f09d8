"""The drafter's own prompt, from the target's prompt ids.

A chat prompt's user text is taken back out of the target's template and rendered with the
drafter's (the target's special tokens mean nothing to it); any other prompt is decoded without
special tokens and encoded by the drafter, so there is one BOS, never two.
"""

from __future__ import annotations

from utils.vocab import encode_prompt, has_chat_template

_SENTINEL = "specdecsentinelprompt"


def _decode(tokenizer, ids: list[int], *, skip_special: bool) -> str:
    return tokenizer.decode(ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False)


def user_message(tokenizer, text: str) -> str | None:
    """The user's text, when ``text`` is one user turn rendered by ``tokenizer``'s chat
    template with the assistant header; else None."""
    if not has_chat_template(tokenizer):
        return None
    try:
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": _SENTINEL}], add_generation_prompt=True, tokenize=False)
    except Exception:  # a template that refuses this chat: treat the prompt as plain text
        return None
    if not isinstance(rendered, str) or rendered.count(_SENTINEL) != 1:
        return None
    head, tail = rendered.split(_SENTINEL)
    if len(text) < len(head) + len(tail) or not (text.startswith(head) and text.endswith(tail)):
        return None
    return text[len(head):len(text) - len(tail)]


def drafter_prompt(target_tokenizer, drafter_tokenizer, ids: list[int]) -> list[int]:
    """The drafter's prompt ids for the target's prompt ``ids``."""
    message = user_message(target_tokenizer, _decode(target_tokenizer, ids, skip_special=False))
    if message is not None and has_chat_template(drafter_tokenizer):
        return encode_prompt(drafter_tokenizer, message, chat=True)
    text = message if message is not None else _decode(target_tokenizer, ids, skip_special=True)
    out = [int(i) for i in drafter_tokenizer(text).input_ids]
    if not out:  # an empty text: start from the drafter's BOS (or its first id)
        bos = drafter_tokenizer.bos_token_id
        out = [bos if bos is not None else 0]
    return out
