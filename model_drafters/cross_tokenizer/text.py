"""Token ids as text, for a pair of models that tokenise differently: they agree only on text.

``TextView.text(ids)`` decodes behind a fixed anchor token, so a decoder that strips a leading space
(SentencePiece's Metaspace) keeps it; ``complete`` drops the U+FFFD of a multi-byte character cut in
half, so only whole characters cross over; ``continuation`` finds ids that add exactly a text after
others, encoding behind an anchor and checking by decoding (a normalising tokenizer may have none:
the caller falls back to ``longest_prefix``).
"""

from __future__ import annotations

import unicodedata

REPLACEMENT = "\ufffd"
# Texts to encode a fragment behind: nothing first, then separators that no
# tokenizer merges with a following word in practice.
ANCHORS = ("", "\n", " ", "a")
WINDOW = 8  # ids of context used to decode a continuation


def complete(text: str) -> str:
    """``text`` without a trailing partial character (U+FFFD from unfinished bytes)."""
    return text.rstrip(REPLACEMENT)


def joins(char: str) -> bool:
    """Whether ``char`` may continue a word: letters and digits of scripts that
    write spaces between words. CJK ideographs and emoji (East Asian wide) stand
    alone, so a text may end after any of them."""
    return char.isalnum() and unicodedata.east_asian_width(char) not in ("W", "F")


def cut_word_tail(text: str) -> str:
    """``text`` without its trailing run of word characters (and the spaces before it), unless the whole
    text is one word: a partial word tokenises differently from the whole one."""
    end = len(text)
    while end > 0 and joins(text[end - 1]):
        end -= 1
    if end == len(text):
        return text
    cut = text[:end].rstrip(" \t")
    return cut if cut else text


class TextView:
    """How one tokenizer's ids read as text."""

    def __init__(self, tokenizer, window: int = WINDOW):
        self.tokenizer = tokenizer
        self.window = window
        self.anchor = list(tokenizer.encode("a", add_special_tokens=False))
        self.anchor_text = self._decode(self.anchor)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def text(self, ids: list[int]) -> str:
        """The text ``ids`` add after preceding text (a leading space kept)."""
        full = self._decode(self.anchor + list(ids))
        if full.startswith(self.anchor_text):
            return full[len(self.anchor_text):]
        return self._decode(list(ids))

    def after(self, before: list[int], ids: list[int]) -> str | None:
        """The text ``ids`` add after ``before`` (decoded with a few ids of context),
        or None when decoding them together changes the text of ``before`` (it ended
        inside a character that ``ids`` complete)."""
        context = list(before[-self.window:]) if before else []
        head = self.text(context)
        full = self.text(context + list(ids))
        return full[len(head):] if full.startswith(head) else None


def continuation(view: TextView, before: list[int], text: str) -> list[int] | None:
    """Ids that add exactly ``text`` after ``before``, or None when none was found."""
    if not text:
        return []
    for anchor in ANCHORS:
        encoded = view.encode(anchor + text)
        # Drop the ids that spell the anchor (it may have taken a prepended space with it).
        for skip in range(min(len(encoded) - 1, len(anchor) + 1) + 1) if anchor else (0,):
            candidate = encoded[skip:]
            if view.after(before, candidate) == text:
                return candidate
    return None


def longest_prefix(view: TextView, before: list[int], ids: list[int], text: str) -> list[int]:
    """The longest prefix of ``ids`` whose whole-character text after ``before`` starts ``text``."""
    for n in range(len(ids), 0, -1):
        added = view.after(before, ids[:n])
        if added is not None and added == complete(added) and text.startswith(added):
            return ids[:n]
    return []
