"""A drafter model whose tokenizer differs from the target's.

Universal assisted generation (Timor et al. 2025, "Accelerating LLM Inference with Lossless
Speculative Decoding Algorithms for Heterogeneous Vocabularies"), two methods on the one verify loop:

**SLEM** (string-level exact match, the default): the drafter's greedy draft is decoded to text
and re-tokenised for the target, with no q, so the accept rule treats it as deterministic (keep x
with probability p(x), else draw from p without x): exact under every processor. It drafts one
step past the requested length so a draft does not end inside a word.

**TLI** (token-level intersection): the drafter samples from its distribution restricted to the
shared tokens, and that q, moved onto the target's ids (``cross_tokenizer.vocab_map``), is verified
by min(1, p/q) with the residual norm(max(0, p - q)).

The two sides are kept in step through the committed text, never token ids: the drafter keeps the
longest prefix of its ids whose text prefixes the target's, re-encodes the rest and rolls its cache
back to what it kept.
"""

from __future__ import annotations

import time

from dataclasses import replace

import torch

from model_drafters.cross_tokenizer.prompt import drafter_prompt
from model_drafters.cross_tokenizer.text import REPLACEMENT, TextView, complete, continuation, cut_word_tail, longest_prefix
from model_drafters.cross_tokenizer.vocab_map import VocabMap, special_ids
from utils.devices import model_device
from generation.drafter import Drafter, DrafterReport
from generation.model_drafter import confidence
from sampling import LogitsProcessor
from kvcache.probe import cached_model

METHODS = ("slem", "tli")
BACKOFF = 4  # how many kept drafter ids a re-encoding may replace when the rest does not encode alone


def common_prefix_length(a, b) -> int:
    """Length of the longest common prefix of two strings or lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _text_common_prefix(a: str, b: str) -> int:
    """Longest common prefix of two strings, by halving (slice compares run in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class CrossTokenizerDrafter(Drafter):
    """Drafts with a model of another tokenizer, by SLEM or TLI (see the module docstring)."""

    kind = "model"

    def __init__(self, model, target_tokenizer, drafter_tokenizer, processor: LogitsProcessor,
                 vocab_map: VocabMap, *, method: str = "slem", use_cache: bool = True,
                 generator: torch.Generator | None = None, target_end: int | None = None,
                 drafter_ends=()):
        if method not in METHODS:
            raise ValueError(f"unknown cross-tokenizer method {method!r} (choose {' or '.join(METHODS)})")
        self.model = model
        self.method = method
        self.processor = processor
        self.generator = generator
        self.vocab_map = vocab_map
        self.target_tokenizer = target_tokenizer
        self.drafter_tokenizer = drafter_tokenizer
        self.t_view = TextView(target_tokenizer)
        self.d_view = TextView(drafter_tokenizer)
        self.target_end = target_end
        self.drafter_ends = frozenset(drafter_ends)
        self.drafter_specials = frozenset(special_ids(drafter_tokenizer))
        self.device = model_device(model)
        self.cached = cached_model(model, use_cache=use_cache)
        self._id_table = vocab_map.target_id_of() if method == "tli" else None
        self._reset()

    def _reset(self) -> None:
        self.prompt: list[int] = []       # the drafter's own prompt ids
        self.fed: list[int] = []          # the drafter sequence the cache holds a prefix of
        self.t_gen: list[int] = []        # target ids generated so far (committed)
        self.t_raw = ""                   # their text (may end inside a character)
        self.d_gen: list[int] = []        # drafter ids after its prompt
        self.d_ends: list[int] = []       # text length after each of them; -1 inside a character
        self.d_raw = ""                   # their text
        self.retokenize_s = 0.0
        self.sync_misses = 0

    # ------------------------------------------------------------------ protocol

    @property
    def calls(self) -> int:
        return self.cached.forwards

    def begin(self, prompt: list[int]) -> None:
        self._reset()
        start = time.perf_counter()
        self.prompt = drafter_prompt(self.target_tokenizer, self.drafter_tokenizer, prompt)
        self.retokenize_s += time.perf_counter() - start
        self.cached.begin(self.prompt)
        self.fed = list(self.prompt)

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to k target-token drafts: ids (k',) and, for TLI, q (k', V) (None for SLEM)."""
        start = time.perf_counter()
        self._sync()
        inside_char = complete(self.t_raw) != self.t_raw
        self.retokenize_s += time.perf_counter() - start
        if inside_char:  # the target stopped inside a character: let it finish it alone
            return ids.new_empty(0), None
        if self.method == "tli":
            return self._propose_tli(ids, k, stop_below)
        return self._propose_slem(ids, k, stop_below)

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        """Record the committed target tokens; the drafter catches up at its next proposal."""
        added = self.t_view.after(self.t_gen, new_tokens)
        self.t_gen.extend(new_tokens)
        self.t_raw = self.t_raw + added if added is not None else self.t_view.text(self.t_gen)

    def report(self) -> DrafterReport:
        """Its cache's rollbacks, and what the panel, /stats and the JSON show about the tokenizer crossing."""
        vmap = self.vocab_map
        crossing = {"method": self.method, "shared_tokens": vmap.shared, "shared_of_drafter": vmap.share_of_drafter(),
                    "shared_of_target": vmap.share_of_target(), "retokenize_s": self.retokenize_s,
                    "sync_misses": self.sync_misses}
        return replace(super().report(), rollback=self.cached.stats.to_dict(), cross_tokenizer=crossing)

    # ------------------------------------------------------------ keeping in step

    def _end_at(self, m: int) -> int:
        return 0 if m == 0 else self.d_ends[m - 1]

    def _sync(self) -> None:
        """Make the drafter's ids spell the committed text (whole characters)."""
        committed = complete(self.t_raw)
        agreed = _text_common_prefix(self.d_raw, committed)
        m = len(self.d_gen)
        while m > 0 and not (0 <= self.d_ends[m - 1] <= agreed):
            m -= 1
        tail = None
        for _ in range(BACKOFF + 1):
            tail = continuation(self.d_view, self.d_gen[:m], committed[self._end_at(m):])
            if tail is not None or m == 0:
                break
            m -= 1  # re-encode one more kept id with the rest (back to a whole character)
            while m > 0 and self.d_ends[m - 1] < 0:
                m -= 1
        if tail is None:  # no exact spelling: the drafter reads a near one (acceptance may drop)
            self.sync_misses += 1
            tail = self.d_view.encode(committed[self._end_at(m):])
        self._keep(m, tail)

    def _keep(self, m: int, tail: list[int]) -> None:
        """Keep the first m drafter ids and append ``tail``, with their text ends."""
        del self.d_gen[m:], self.d_ends[m:]
        self.d_raw = self.d_raw[:self._end_at(m)]
        self._append(tail)

    def _append(self, tail: list[int]) -> None:
        base_ids, base_len = list(self.d_gen), len(self.d_raw)
        added = ""
        for i in range(len(tail)):
            piece = self.d_view.after(base_ids, tail[:i + 1])
            if piece is None:  # decoding together changed the text before: decode in full
                piece = self.d_view.text(base_ids + tail[:i + 1])[base_len:]
            whole = complete(piece) == piece
            self.d_ends.append(base_len + len(piece) if whole else -1)
            added = piece
        self.d_gen.extend(tail)
        self.d_raw = self.d_raw[:base_len] + added

    def _roll_cache(self, seq: list[int]) -> None:
        """Roll the cache back to what it holds of ``seq`` (at most all but its last id)."""
        keep = min(common_prefix_length(self.fed, seq), len(seq) - 1)
        self.cached.rollback(keep)
        if self.cached.length > keep:  # a restored snapshot cannot go back this far: start again
            self.cached.begin(self.prompt)
            self.fed = list(self.prompt)
        self.cached.checkpoint()

    # ------------------------------------------------------------------ drafting

    def _step(self, seq: torch.Tensor) -> torch.Tensor:
        """The drafter's logits (1, Vd) after ``seq`` (1, L)."""
        logits = self.cached.forward(seq, keep=1)
        return logits[:, :self.vocab_map.drafter_size]

    def _draft_ids(self, k: int, stop_below: float | None, choose) -> tuple[list[int], list[torch.Tensor]]:
        """Run the drafter up to k steps; ``choose(logits) -> (token (1,), q (1, Vd) or None, top)``."""
        seq_list = self.prompt + self.d_gen
        self._roll_cache(seq_list)
        seq = torch.tensor([seq_list], dtype=torch.long, device=self.device)
        tokens, probs = [], []
        for _ in range(k):
            token, q, top = choose(self._step(seq))
            if stop_below is not None and tokens and top < stop_below:
                break
            seq = torch.cat([seq, token.view(1, 1)], dim=1)
            tokens.append(token)
            if q is not None:
                probs.append(q)
        self.fed = seq_list + [int(t) for t in torch.cat(tokens).tolist()] if tokens else seq_list
        return self.fed[len(seq_list):], probs

    def _top(self, logits: torch.Tensor, stop_below: float | None, q: torch.Tensor | None = None) -> float:
        """The top probability the confidence stop reads (``generation.model_drafter.confidence``); 1 when
        no stop is asked (no sync)."""
        return confidence(logits, q, self.processor) if stop_below is not None else 1.0

    def _propose_slem(self, ids: torch.Tensor, k: int, stop_below: float | None):
        def choose(logits):
            return logits.argmax(dim=-1), None, self._top(logits, stop_below)

        drafted, _ = self._draft_ids(k + 1, stop_below, choose)
        start = time.perf_counter()
        specials = [i for i, t in enumerate(drafted) if t in self.drafter_specials]
        ends_turn = bool(specials) and drafted[specials[0]] in self.drafter_ends
        drafted = drafted[:specials[0]] if specials else drafted
        base = len(self.d_raw)
        self._append(drafted)
        text = complete(self.d_raw[base:])
        text = text.split(REPLACEMENT, 1)[0]  # invalid bytes inside the draft: the target cannot spell them
        if not ends_turn:
            text = cut_word_tail(text)
        draft = continuation(self.t_view, self.t_gen, text)
        if draft is None:
            draft = longest_prefix(self.t_view, self.t_gen, self.t_view.encode(text), text)
        elif ends_turn and self.target_end is not None:
            draft = draft + [self.target_end]
        self.retokenize_s += time.perf_counter() - start
        return torch.tensor(draft[:k], dtype=torch.long, device=ids.device), None

    def _propose_tli(self, ids: torch.Tensor, k: int, stop_below: float | None):
        vmap = self.vocab_map

        def choose(logits):
            restricted = vmap.restrict(logits)
            q = self.processor(restricted)                               # (1, Vd), zero off the shared set
            return self.processor.sample(q, self.generator), q, self._top(restricted, stop_below, q)

        drafted, probs = self._draft_ids(k, stop_below, choose)
        start = time.perf_counter()
        self._append(drafted)
        draft = self._id_table[torch.tensor(drafted, dtype=torch.long)]  # (k',) target ids
        self.retokenize_s += time.perf_counter() - start
        if not drafted:
            return ids.new_empty(0), None
        q = vmap.to_target(torch.cat(probs))                          # (k', Vt)
        return draft.to(ids.device), q.to(ids.device)
