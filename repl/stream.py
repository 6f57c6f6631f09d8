"""Incremental detokenizing: text that is final, token by token.

As vLLM's ``detokenize_incrementally`` and transformers' ``TextStreamer``: two offsets into the ids,
``prefix`` (where the decode window starts) and ``read`` (what was shown). A token's text is
decode(window + token) minus decode(window), emitted only once it does not end in U+FFFD, so the
pushed pieces concatenate to the decoded text and never show a broken character.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 8  # prompt tokens kept as the first window (leading spaces, merges)


class IncrementalDecoder:
    """Feed token ids one by one; get back only the text that will not change.

    ``context``: ids before the first pushed token (their text is never
    emitted). Special tokens are decoded as text, as the debug view shows them.
    """

    def __init__(self, tokenizer, context=(), *, context_tokens: int = CONTEXT_TOKENS):
        self.tokenizer = tokenizer
        self.ids: list[int] = list(context)[-context_tokens:] if context_tokens else []
        self.prefix = 0               # decode window start
        self.read = len(self.ids)     # ids[:read] have been emitted (or are context)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def push(self, token: int) -> str:
        """Add one token; the text that became final ("" while a character is incomplete)."""
        self.ids.append(int(token))
        shown = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if len(text) <= len(shown) or text.endswith(REPLACEMENT):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        self._trim()
        return text[len(shown):]

    def extend(self, tokens) -> list[str]:
        """:meth:`push` for each token: the text each one made final."""
        return [self.push(t) for t in tokens]

    def held(self) -> str:
        """The text of the tokens pushed but not yet emitted, decoded as it
        stands (U+FFFD for an incomplete character); "" when none are held."""
        if self.read == len(self.ids):
            return ""
        return self._decode(self.ids[self.prefix:])[len(self._decode(self.ids[self.prefix:self.read])):]

    def fork(self) -> "IncrementalDecoder":
        """An independent copy: decode what-ifs (drafts not yet verified) from here."""
        copy = IncrementalDecoder(self.tokenizer, context_tokens=0)
        copy.ids, copy.prefix, copy.read = list(self.ids), self.prefix, self.read
        return copy

    def preview(self, tokens) -> list[str]:
        """Each token's text if ``tokens`` came next (the last one flushed,
        held bytes included), without changing this decoder."""
        tokens = list(tokens)
        if not tokens:
            return []
        copy = self.fork()
        pieces = copy.extend(tokens)
        pieces[-1] += copy.held()
        return pieces

    def _trim(self) -> None:
        """Drop ids before the window, so each push decodes a few tokens."""
        if self.prefix:
            del self.ids[:self.prefix]
            self.read -= self.prefix
            self.prefix = 0
