"""A suffix-automaton storage (SAM-Decoding, Hu et al., ACL 2025).

The suffix automaton of a text (Blumer et al. 1985) is built online in amortised constant time per
token; each append's *suffix link* gives the longest match of the sequence's tail for free. Each
state keeps one end position of its substrings (the latest one matched), and a draft copies the
tokens that followed it. With a corpus (``--corpus FILE``) a second, static automaton is shared
across prompts and matched with a cursor; the longer match drafts (the context on a tie). A draft
after a match of m tokens has at most ``floor(factor * m)`` tokens, as in SuffixDecoding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from generation.tree import Tree
from ngram_assisted.storage import check_token
from ngram_assisted.suffix import DEFAULT_FACTOR, NO_DRAFT, Draft, draft_budget
from utils.options import check_int
from utils.text_files import UnreadableText, read_text


class SuffixAutomaton:
    """The online suffix automaton of a token sequence (``text``)."""

    def __init__(self):
        self.next: list[dict[int, int]] = [{}]   # state -> {token: state}
        self.link: list[int] = [-1]              # state -> its suffix link (-1 for the root)
        self.length: list[int] = [0]             # state -> its longest substring's length
        self.end: list[int] = [-1]               # state -> a recorded end position of its substrings
        self.text: list[int] = []
        self.last = 0                            # the state of the whole text

    def _new_state(self, length: int, end: int, link: int = -1, moves: dict | None = None) -> int:
        self.next.append({} if moves is None else moves)
        self.link.append(link)
        self.length.append(length)
        self.end.append(end)
        return len(self.length) - 1

    def append(self, token: int) -> tuple[int, int]:
        """Append ``token``; returns (m, e): the longest suffix of the text that occurred
        earlier has m tokens, and e is an earlier end position of it (-1 when m is 0)."""
        i = len(self.text)
        self.text.append(token)
        cur = self._new_state(self.length[self.last] + 1, i)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:   # split q: its substrings of up to length(p) + 1 tokens move to a clone
                clone = self._new_state(self.length[p] + 1, self.end[q], self.link[q], dict(self.next[q]))
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = self.link[cur] = clone
        self.last = cur
        match = self.link[cur]
        earlier = self.end[match]
        self.end[match] = i                      # the match's latest end is now i
        return self.length[match], (earlier if match else -1)

    def extend(self, tokens: Iterable[int]) -> tuple[int, int]:
        """Append every token; returns :meth:`append`'s answer for the last one ((0, -1) for none)."""
        answer = (0, -1)
        for token in tokens:
            answer = self.append(token)
        return answer

    def finish_static(self) -> None:
        """For a text that will not grow: make each state's end its substrings' last end (exact),
        by passing ends up the suffix-link tree, longest states first."""
        for state in sorted(range(1, len(self.length)), key=self.length.__getitem__, reverse=True):
            parent = self.link[state]
            if parent > 0 and self.end[state] > self.end[parent]:
                self.end[parent] = self.end[state]

    def __len__(self) -> int:
        return len(self.length)


class Cursor:
    """The longest suffix of a growing sequence that occurs in a fixed automaton (amortised O(1) a token)."""

    def __init__(self, automaton: SuffixAutomaton):
        self.automaton = automaton
        self.state = 0
        self.length = 0

    def step(self, token: int) -> None:
        sam = self.automaton
        while self.state and token not in sam.next[self.state]:
            self.state = sam.link[self.state]
            self.length = sam.length[self.state]
        if token in sam.next[self.state]:
            self.state = sam.next[self.state][token]
            self.length += 1
        else:
            self.state, self.length = 0, 0


def read_corpus(path: str, tokenizer) -> list[int]:
    """The ids of a UTF-8 text file under ``tokenizer`` (no special tokens); ValueError, in one line,
    when it cannot be read or is empty."""
    try:
        text = read_text(path)
    except UnreadableText as e:
        raise ValueError(f"cannot read the corpus {path!r}: {e}") from None
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    if not ids:
        raise ValueError(f"the corpus {path!r} has no tokens")
    return ids


def corpus_automaton(ids: Sequence[int]) -> SuffixAutomaton:
    """The static automaton of a tokenised corpus (built once; every state's last end exact)."""
    sam = SuffixAutomaton()
    sam.extend(ids)
    sam.finish_static()
    return sam


class SAMStorage:
    """Drafts from the longest match of the sequence's tail in its own past (an online
    suffix automaton over prompt + output) or in a corpus automaton (see the module docstring).

    :meth:`initialize` starts a new automaton per prompt; the corpus automaton is kept.
    """

    kind = "sam"
    wants_top_k = 0

    def __init__(self, vocab_size: int, *, corpus: SuffixAutomaton | None = None):
        check_int(vocab_size, "vocab_size", 1)
        if corpus is not None and corpus.text and max(corpus.text) >= vocab_size:
            raise ValueError(f"the corpus has token id {max(corpus.text)}, outside the vocabulary (size {vocab_size})")
        self.vocab_size = vocab_size
        self.corpus = corpus
        self.reset()

    def reset(self) -> None:
        """Forget the context (the corpus automaton is not learned, so it stays)."""
        self.initialize(())

    def initialize(self, prompt: Sequence[int]) -> None:
        self.context = SuffixAutomaton()
        self.cursor = Cursor(self.corpus) if self.corpus is not None else None
        self.match, self.match_end = 0, -1
        self.extend(prompt)

    def extend(self, tokens: Iterable[int]) -> None:
        """Append tokens to the context automaton (and move the corpus cursor)."""
        for token in tokens:
            token = check_token(self.vocab_size, token)
            self.match, self.match_end = self.context.append(token)
            if self.cursor is not None:
                self.cursor.step(token)

    def draft(self, k: int, factor: float = DEFAULT_FACTOR, *, nodes: int | None = None, branch: int = 1) -> Draft:
        """The continuation of the longer match (context or corpus) as a chain of up to
        ``floor(factor * m)`` tokens, at most k (a tree of one path when trees are on; at
        most ``nodes`` nodes)."""
        k = k if nodes is None else min(k, nodes)
        candidates = [("context", self.match, self.context.text, self.match_end)]
        if self.cursor is not None:
            candidates.append(("corpus", self.cursor.length, self.corpus.text,
                               self.corpus.end[self.cursor.state]))
        for source, match, text, end in sorted(candidates, key=lambda c: -c[1]):   # stable: context on a tie
            budget = draft_budget(match, factor, k)
            tokens = text[end + 1:end + 1 + budget] if end >= 0 else []
            if tokens:
                return Draft(Tree.chain(tokens), source, match)
        return NO_DRAFT

    def __len__(self) -> int:
        return len(self.context.text)

    def __repr__(self) -> str:
        corpus = f", corpus={len(self.corpus.text)} tokens" if self.corpus is not None else ""
        return f"SAMStorage(context={len(self.context.text)} tokens{corpus})"
