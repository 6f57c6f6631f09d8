"""The drafter contract: everything a drafting method may do, as methods of one base with defaults.

The verify loop (``generation.verify``) calls only these methods, never ``getattr``.
A new drafting method subclasses :class:`Drafter`, implements :meth:`Drafter.propose`
(the one method without a default), overrides the abilities it has, and is
registered with ``engine.register_drafter``. transformers' ``CandidateGenerator``
has the same shape: propose candidates, learn how many were accepted.

What a round does with a drafter, in order::

    attach_target(target)   once, before the target and the drafter begin (a drafter that reads the
                            target's cache keeps it; one that drafts from the target's hidden states
                            sets ``target.keep_hidden``)
    begin(prompt)           once per generation
    fill_target(ids)        each round, before the draft clock starts (counted as verify time)
    propose(ids, k)         a chain of up to k drafts and their q   (or, with trees on:
    propose_tree(...)           a tree of top children, or
    propose_sampled_tree(...)   a tree whose children were drawn from q)
    extra_rows(ids, tree)   tree rounds only: rows to feed beside the tree (lookahead's window)
    extra_outputs(tokens)   tree rounds only, when extra rows were fed: the target's argmax at each
    draft_logits()          after a chain proposal, for the inspector (greedy: q is one-hot)
    update(new, top_k)      the tokens the round appended (and the target's top-k when asked)
    report()                once, at the end: a :class:`DrafterReport` (its cache's rollbacks, its model's
                            compile path, its tokenizer crossings, its round notes, its filling costs)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from generation.tree import ExtraRows, Tree
from kvcache.cache import off_path


@dataclass(frozen=True)
class DrafterReport:
    """What a drafter says of its generation once it ends; None: nothing to say.

    ``rollback``: how its own cache was rolled back (``kvcache.cache.RollbackStats.to_dict()``).
    ``compile``: how its own model ran (``CachedModel.compile_stats()``: its path, why it fell back,
    its captures); None for a drafter that ran no model. ``cross_tokenizer``: for a drafter with a
    tokenizer of its own, how its drafts crossed to the target's ids (``cross_tokenizer.drafter``).
    ``round_notes``: one small JSON-ready dict (or None) per round, in order, saying why it drafted
    what it did (the model-free drafters: ``{"source": ..., "match": ...}``); the verify loop puts
    each in its round's ``Round.note``. ``fill_costs``: the target's verify seconds by width it filled
    its chain rounds up to (``generation.widths``; the verify loop summarises the filling from them).
    """

    rollback: dict | None = None
    compile: dict | None = None
    cross_tokenizer: dict | None = None
    round_notes: list[dict | None] | None = None
    fill_costs: dict[int, float] | None = None


class Drafter(ABC):
    """Where drafts come from. Subclasses implement :meth:`propose`; every other ability has a default.

    Class attributes a subclass may set:

    ``kind``: ``"model"`` or ``"ngram"`` (γ policies treat the two differently).
    ``wants_top_k``: > 1 asks :meth:`update` for the target's top-k ids at each verified position.
    ``samples_trees``: True when :meth:`propose_sampled_tree` is implemented (sampled trees are
    verified by recursive rejection sampling, ``generation.accept.accept_tree_rrs``).
    ``most_extra_rows``: the most rows :meth:`extra_rows` feeds in one verify (a static cache holds them).
    """

    kind: str = "model"
    wants_top_k: int = 0
    samples_trees: bool = False
    most_extra_rows: int = 0

    @property
    def calls(self) -> int:
        """Drafter forward passes since :meth:`begin` (0 for a drafter with no model)."""
        return 0

    # ------------------------------------------------------------ a generation

    def attach_target(self, target) -> None:
        """The target's ``CachedModel`` of this generation, before it begins and before :meth:`begin`.

        Default: ignored. A drafter that drafts on the target's own cache (``selfdraft``) keeps it and
        drafts through ``target.beside`` (dynamic or static, as the target runs).
        A drafter that drafts from the target's final hidden states (``mtp``) sets its
        ``keep_hidden``: every target forward, the loop's verify included, then keeps them in
        ``target.hidden`` (no extra forward), and no shared prompt prefill is used.
        """

    def begin(self, prompt: list[int]) -> None:
        """Start a new generation from ``prompt`` (the encoder's ids for a seq2seq pair). Default: nothing."""

    def fill_target(self, ids: torch.Tensor) -> None:
        """Feed the target the committed tokens of ``ids`` (1, L) its cache lacks (the prompt, in the
        first round). The loop calls it each round before the draft clock starts and books its time as
        verify: target work, wherever the drafter needs it done. Default: nothing to feed."""

    # ------------------------------------------------------------ proposing

    @abstractmethod
    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Up to k draft ids, shape (k',), and their probabilities q, (k', V), or None for
        deterministic drafts (q is one-hot: an n-gram storage).

        ``ids``: (1, L) the (decoder) sequence so far, on the target's device. A drafter with
        probabilities stops early once its top probability falls below ``stop_below``.
        """

    def tree_support(self) -> str | None:
        """None when :meth:`propose_tree` can be called; otherwise why not, in a few words
        (the loop then runs chains and the result says so). Default: chains only."""
        return f"the {self.kind} drafter proposes chains only"

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        """A tree of at most ``nodes`` nodes and ``depth`` levels after ``ids`` (1, L), ``branch``
        children per expanded node, built without random draws (verified by ``accept_tree``)."""
        raise NotImplementedError(f"{type(self).__name__} proposes chains only")

    def propose_sampled_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int
                             ) -> tuple[Tree, torch.Tensor]:
        """A tree whose children were drawn from q without replacement, and q at the root and
        each node, (n + 1, V). Only called when ``samples_trees`` is True."""
        raise NotImplementedError(f"{type(self).__name__} does not sample trees")

    def extra_rows(self, ids: torch.Tensor, tree: Tree) -> ExtraRows | None:
        """Rows to feed in the tree round's verify pass beside ``tree`` (after the nodes), or None.

        Each extra row sees the committed prefix, the root and its own ancestors
        among the extra rows, nothing of the tree (``generation.tree.visibility``);
        their outputs never enter acceptance, and the cache drops them after the
        pass with the rejected nodes. Lookahead decoding's Jacobi window is fed
        this way (``ngram_assisted.lookahead``). Default: none.
        """
        return None

    def extra_outputs(self, tokens: list[int]) -> None:
        """The target's argmax at each extra row of this round, in order (read back in the
        round's one host sync), before :meth:`update`. Called only when :meth:`extra_rows`
        gave rows. Default: nothing to learn."""

    def draft_logits(self) -> torch.Tensor | None:
        """The last chain proposal's raw logits, (k', V), or None. Under greedy the inspector shows
        their softmax (q itself is one-hot). Default: none kept."""
        return None

    # ------------------------------------------------------------ learning and reporting

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        """The tokens appended this round, and (when ``wants_top_k`` > 1) the target's top-k ids at
        each of their positions. Called every round, also a round another drafter drafted (a
        hybrid, ``ngram_assisted.hybrid``, tells both its sides). Default: nothing to learn."""

    @property
    def capture_s(self) -> float:
        """Seconds its own model has spent capturing forwards in this generation (the static path's,
        ``CachedModel.capture_s``), read around each round to keep them out of its draft time."""
        return 0.0

    def report(self) -> DrafterReport:
        """What it says of the generation, once it ends. Default: a drafter that ran forwards of a
        model of its own (a kind keeping its own dynamic cache) ran it ``off``; else nothing."""
        return DrafterReport(compile=off_path() if self.calls else None)
