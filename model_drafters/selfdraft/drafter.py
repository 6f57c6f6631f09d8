"""The self-drafter: a model made from the target, drafting on the target's own cache where it can.

:class:`SelfDrafter` is a ``generation.drafter.Drafter``. The verify loop hands
it the target's cache (``attach_target``) before the generation begins. When
that cache can be shared (``kvcache.shared``), each round the drafter

1. makes sure the target's cache holds every committed token but the last (in
   the first round the target's prefill runs here, once: the verify that
   follows feeds only the last token and the drafts);
2. builds its round's cached model: on the target's own layers (same dtype;
   ``target.beside``, dynamic or static as the target runs), or on its own cache
   topped up with the newly committed positions, cast;
3. drafts one token per forward, exactly as :class:`ModelDrafter` does, or,
   asked for a token tree (``propose_tree``), grows it on that round cache
   with ``generation.tree_draft`` (the root and one level per forward); a
   cast copy with a lean step (``selfdraft.lean``) drafts a chain through it,
   on the lean step's own buffers of the committed positions;
4. rolls its draft positions back (and a tree's root and nodes), so the
   target's cache is as it was.

Otherwise (no cache, recurrent layers, sliding layers for a cast copy) it
drafts like a :class:`ModelDrafter`, on a cache of its own. Its report's
``compile`` says where it drafted, and why not on the target's cache.
"""

from __future__ import annotations

import itertools

import torch

from utils.devices import model_device
from generation.drafter import Drafter, DrafterReport
from generation.model_drafter import ModelDrafter, draft_tokens
from generation.tree import Tree
from generation.tree_draft import draft_tree, sample_tree
from kvcache import shared as shared_cache
from model_drafters.selfdraft.lean import lean_of
from model_drafters.selfdraft.skip import kept_layers
from kvcache.cache import CachedModel, RollbackStats, new_cache, off_path, tree_support

OWN_CACHE = "it drafts on its own: the target's cache cannot be shared"


class SelfDrafter(Drafter):
    """Drafts with a self-draft model, reading the target's KV cache for committed tokens."""

    kind = "model"
    samples_trees = True

    def __init__(self, model, processor, *, use_cache: bool = True, vocab_size: int | None = None,
                 generator: torch.Generator | None = None):
        self.model = model
        self.processor = processor
        self.vocab_size = vocab_size
        self.generator = generator
        self.device = model_device(model)
        self.own = ModelDrafter(model, processor, use_cache=use_cache, vocab_size=vocab_size, generator=generator)
        # Whether a cache was asked for. The drafter's own cache may still run
        # uncached where the probe found its cached forward inexact (a dynamic
        # int8 copy quantises each forward's activations as one tensor, so no
        # split of a sequence reproduces it); drafting on the target's cache
        # needs no exact drafter forward: q is what the drafts were drawn from.
        self.use_cache = use_cache
        self.layers = kept_layers(model)  # None: every layer of the target
        self.dtype = _cache_dtype(model)
        self.target = None
        self.mode = "own"
        self.cache = None
        self.lean = None           # the model's lean step, in "copy" mode (selfdraft.lean)
        self._forwards = 0
        self._copied = 0           # committed positions in self.cache
        self._logits: list[torch.Tensor] = []  # the last chain proposal's logits rows, (1, V) each
        self.stats = RollbackStats(method="shared")
        self.compiled: dict | None = None      # where its forwards ran (its report's compile)

    # -------------------------------------------------------------- protocol

    @property
    def calls(self) -> int:
        return self._forwards if self.mode != "own" else self.own.calls

    def tree_support(self) -> str | None:
        return None  # where the model cannot take a tree it drafts a chain in its place

    def attach_target(self, target_cached) -> None:
        """The target's ``kvcache.cache.CachedModel`` of this generation (called before ``begin``)."""
        self.target = target_cached

    def begin(self, prompt: list[int]) -> None:
        self.mode = self._choose_mode()
        self._forwards, self._copied = 0, 0
        self._logits = []
        self.stats = RollbackStats(method="shared" if self.mode != "own" else "crop")
        dtype = str(self.dtype).removeprefix("torch.")
        self.compiled = off_path(f"a {dtype} copy drafts on a cache of its own, the target's cast to it"
                                 if self.mode == "copy" else OWN_CACHE)   # view: its round's (_round_model)
        if self.mode == "copy":
            self.cache = new_cache(self.model)
            self.lean = lean_of(self.model)[0]
            if self.lean is not None:
                self.lean.clear()
                self.stats.step = "lean"
        if self.mode == "own":
            self.own.begin(prompt)

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None):
        if self.mode == "own":
            return self.own.propose(ids, k, stop_below)
        committed = ids.shape[1] - 1
        self.fill_target(ids)
        forward, drop = self._round(committed)
        self._logits = []

        def step(seq: torch.Tensor) -> torch.Tensor:
            self._forwards += 1
            logits = forward(seq)                                   # (1, V)
            self._logits.append(logits)
            return logits

        try:
            drafts, probs = draft_tokens(step, ids.to(self.device), k, self.processor, self.generator,
                                         self.vocab_size, stop_below)
        finally:
            drop(len(self._logits))                                 # the steps fed, one token each
        del self._logits[drafts.shape[0]:]                          # a step past an early stop drafted nothing
        return drafts.to(ids.device), probs.to(ids.device)

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        """A dynamic tree (``generation.tree_draft``) of at most ``nodes`` nodes and ``depth``
        levels, grown on the round cache (the target's layers, or the cast copy): the root
        and then one level per forward. The root and every node are dropped again, so the
        target's cache is as it was. A chain of ``min(depth, nodes)`` drafts where the
        drafter cannot take a tree (no custom masks, no position ids)."""
        if self.mode == "own":
            return self.own.propose_tree(ids, depth, nodes, branch)
        tree = self._grow(ids, lambda cached, seq: draft_tree(
            cached, self.processor, self.vocab_size, seq, depth, nodes, branch, drop_root=True))
        if tree is None:
            drafts, _ = self.propose(ids, min(depth, nodes))
            return Tree.chain(drafts.tolist())
        return tree

    def propose_sampled_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int
                             ) -> tuple[Tree, torch.Tensor]:
        """A tree whose children are drawn from q without replacement
        (``generation.tree_draft.sample_tree``), grown and dropped again like
        :meth:`propose_tree`, and q at the root and each node, (n + 1, V); a chain
        and its q where the drafter cannot take a tree."""
        if self.mode == "own":
            return self.own.propose_sampled_tree(ids, depth, nodes, branch)
        grown = self._grow(ids, lambda cached, seq: sample_tree(
            cached, self.processor, self.vocab_size, seq, depth, nodes, branch, self.generator, drop_root=True))
        if grown is None:
            drafts, q = self.propose(ids, min(depth, nodes))
            return Tree.chain(drafts.tolist()), torch.cat([q, torch.zeros_like(q[:1])])
        tree, q = grown
        return tree, q.to(ids.device)

    def draft_logits(self) -> torch.Tensor | None:
        """The last chain proposal's raw logits, (k', V): the inspector shows their
        softmax under greedy, where q itself is one-hot."""
        if self.mode == "own":
            return self.own.draft_logits()
        if not self._logits:
            return None
        logits = torch.cat(self._logits)                            # (k', V_drafter)
        return logits if self.vocab_size is None else logits[:, :self.vocab_size]

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        """On a cache of its own, the round's tokens go to it (a round another drafter drafted
        cuts that cache back, see :class:`ModelDrafter`); on the target's cache there is nothing
        to keep: each round reads the committed positions afresh."""
        if self.mode == "own":
            self.own.update(new_tokens, top_k)

    def report(self) -> DrafterReport:
        own = self.mode == "own"
        return DrafterReport(rollback=self.own.report().rollback if own else self.stats.to_dict(),
                             compile=self.compiled if self.calls else None)

    def fill_target(self, ids: torch.Tensor) -> None:
        """Feed the target the committed tokens its cache lacks (the prompt, in the first round);
        the verify loop calls it before its draft clock starts, and ``propose`` again (a no-op
        then) for callers that do not."""
        if self.mode == "own":
            return
        committed = ids.shape[1] - 1
        if self.target.length < committed:
            self.target.forward(ids[:, :committed], keep=1)

    # ------------------------------------------------------------ internals

    def _grow(self, ids: torch.Tensor, grow):
        """``grow(cached, seq)`` on the round's cached model (:meth:`_round_model`); None (nothing
        fed) where the drafter cannot take a tree.

        ``grow`` feeds the root and one level per forward and drops them all in
        one crop (``drop_root``), so the target's cache is left as it was.
        """
        committed = ids.shape[1] - 1
        self.fill_target(ids)
        cached = self._round_model(committed)
        if tree_support(cached) is not None:
            return None
        self._logits = []
        try:
            return grow(cached, ids.to(self.device))
        except BaseException:  # a forward raised: still leave the target's cache as it was
            cached.rollback(committed)
            raise
        finally:
            self._forwards += cached.forwards

    def _choose_mode(self) -> str:
        target = self.target
        if target is None or target.cache is None or target.encoder_decoder or not self.use_cache:
            return "own"
        if target.needs_snapshots or not shared_cache.can_view(target.cache):
            return "own"
        if self.dtype == _cache_dtype(target.model):
            return "view"
        return "copy" if self.layers is None and shared_cache.can_copy(target.cache) else "own"

    def _round(self, committed: int):
        """(forward(seq) -> the logits after seq (1, L), (1, V); drop(n)) for this round's chain, on
        the lean step where the model has one, else on the round's cached model; drop(n) takes the
        n drafts fed back out, to the ``committed`` positions."""
        if self.lean is not None:
            self._append_lean(committed)
            return self._lean_forward, self.lean.drop
        cached = self._round_model(committed)
        return (lambda seq: cached.forward(seq, keep=1)), (lambda n: cached.rollback(committed))

    def _append_lean(self, committed: int) -> None:
        """Copy the target's committed positions the lean step lacks into its buffers (cast); its
        length is the committed positions it holds, since each round drops its drafts again."""
        if committed > self.lean.length:
            self.lean.append(shared_cache.committed_positions(self.target.cache, self.lean.length, committed))

    def _lean_forward(self, seq: torch.Tensor) -> torch.Tensor:
        return self.lean.step(seq[0, -1:])         # a chain's step feeds its last token (the first: the last committed)

    def _round_model(self, committed: int) -> CachedModel:
        """The drafter as a cached model holding the ``committed`` positions: fed over the target's
        own layers as the target is fed (``target.beside``: its dynamic cache, or its static one at its
        slots), or over its cast copy, topped up with the newly committed positions."""
        if self.mode == "view":
            cached = self.target.beside(self.model, self.layers)
            self.compiled = cached.compile_stats()
            return cached
        shared_cache.append_committed(self.cache, self.target.cache, self._copied, committed, self.dtype)
        self._copied = committed
        return CachedModel.over(self.model, self.cache, committed)


def _cache_dtype(model) -> torch.dtype:
    """The dtype of the keys and values ``model`` writes (its float weights' dtype; float32 for int8)."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):   # the first float one: no list of all
        if tensor.is_floating_point():
            return tensor.dtype
    return torch.float32
