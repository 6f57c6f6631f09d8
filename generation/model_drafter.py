"""The drafter of speculative decoding: a smaller model (Leviathan et al. 2023; Chen et al. 2023)."""

from __future__ import annotations

import torch

from utils.devices import model_device
from generation.drafter import Drafter, DrafterReport
from generation.tree import Tree
from generation.tree_draft import draft_tree, sample_tree
from sampling import LogitsProcessor
from sampling.processors import probs_dtype
from kvcache.cache import tree_support
from kvcache.static import loop_model


def draft_tokens(step, seq: torch.Tensor, k: int, processor: LogitsProcessor, generator, vocab_size,
                 stop_below: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to k tokens drawn one by one from q = processor(step(seq)): ids (k',) and q (k', V).
    ``step(seq)``: the drafter's logits (1, V) for the token after ``seq`` (1, L). ``stop_below``
    ends the round once the next token's top probability falls below it (a host sync per step): the
    top of q, the distribution drawn from; under greedy, where q is one-hot, of the drafter's softmax
    (as transformers' confidence stop reads the scores, raw logits under greedy). Under greedy each
    token is the logits' argmax and the one-hot rows are built once for the round, not a row a step."""
    greedy = processor.is_greedy
    drafts, probs = [], []
    for _ in range(k):
        logits = step(seq)                                      # (1, V)
        if vocab_size is not None:
            logits = logits[:, :vocab_size]
        q = None if greedy else processor(logits)               # (1, V)
        if stop_below is not None and drafts and confidence(logits, q, processor) < stop_below:
            break
        token = processor.greedy_ids(logits) if greedy else processor.sample(q, generator)   # (1,)
        seq = torch.cat([seq, token.view(1, 1)], dim=1)
        drafts.append(token)
        probs.append(q)
    ids = torch.cat(drafts)
    if greedy:                                                  # processor(rows) of every step at once
        rows = torch.zeros((ids.shape[0], logits.shape[-1]), dtype=probs_dtype(logits.dtype), device=logits.device)
        return ids, rows.scatter_(-1, ids.view(-1, 1), 1.0)
    return ids, torch.cat(probs)


def confidence(logits: torch.Tensor, q: torch.Tensor | None, processor: LogitsProcessor) -> float:
    """The drafter's top probability for its next token, which the confidence policy stops below: of q
    (``processor(logits)`` when None), the distribution drawn from; under greedy, where q is one-hot
    (its top always 1), of the logits' softmax. One host sync."""
    if processor.is_greedy:
        return logits.float().softmax(dim=-1).max().item()
    return (processor(logits) if q is None else q).max().item()


class ModelDrafter(Drafter):
    """Drafts with a smaller model, sampling each token from q = processor(drafter logits).

    Keeps its own cache, fed only what it has not seen and rolled back at each round's start to a
    prefix of the kept sequence. That trusts the cached positions below the last token, which holds
    after its own round; after a round another drafter drafted (a hybrid's other side), rejected
    drafts of its own may lie past that round's start, so :meth:`update` lowers what the next
    proposal keeps to that round's start less its last token.
    """

    kind = "model"
    samples_trees = True

    def __init__(self, model, processor: LogitsProcessor, *, use_cache: bool = True,
                 vocab_size: int | None = None, generator: torch.Generator | None = None, prefills: tuple = (),
                 compile: str = "off", capacity: int | None = None):
        self.model = model
        self.prefills = prefills  # kvcache.cache.Prefill: a prefilled model begins from a copy
        self.processor = processor
        self.vocab_size = vocab_size
        self.generator = generator
        self.device = model_device(model)
        # ``compile``: its path (kvcache.static); ``capacity``: the positions a static cache must hold
        self.cached = loop_model(model, use_cache=use_cache, compile=compile, capacity=capacity, slot="drafter")
        self._logits: list[torch.Tensor] = []  # the last proposal's logits rows, (1, V) each
        self.committed = 0     # the committed sequence's length: begin's start plus every round's tokens
        self._drafted = False  # whether this round's drafts were this drafter's (a propose since update)
        self._trusted: int | None = None  # cache positions the next round may keep (None: all but the last token)

    @property
    def calls(self) -> int:
        """Drafter forward passes since begin()."""
        return self.cached.forwards

    def begin(self, prompt: list[int]) -> None:
        self.committed = len(self.cached.begin(prompt, self.prefills))
        self._drafted, self._trusted = False, None

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        """Count the round's tokens; after another drafter's round, keep no more of the cache than the
        positions before its last committed token (past it may lie rejected drafts of its own)."""
        if not self._drafted:
            cut = self.committed - 1
            self._trusted = cut if self._trusted is None else min(self._trusted, cut)
        self.committed += len(new_tokens)
        self._drafted = False

    def _start_round(self, seq: torch.Tensor) -> None:
        """Roll the cache back to the positions this round may keep, (1, L) ``seq`` being the
        sequence, and checkpoint it before the drafts are fed."""
        keep = seq.shape[1] - 1 if self._trusted is None else min(seq.shape[1] - 1, self._trusted)
        self.cached.rollback(keep)
        self.cached.checkpoint()
        self._drafted, self._trusted = True, None

    def tree_support(self) -> str | None:
        return None  # a model that cannot take a tree drafts a chain in its place

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to k tokens drawn one by one from the drafter: ids (k',) and q (k', V); ``stop_below`` as
        for :func:`draft_tokens`."""
        seq = ids.to(self.device)
        self._start_round(seq)
        self._logits = []

        def step(s: torch.Tensor) -> torch.Tensor:
            logits = self.cached.forward(s, keep=1)                 # (1, V)
            self._logits.append(logits)
            return logits

        drafts, probs = draft_tokens(step, seq, k, self.processor, self.generator, self.vocab_size, stop_below)
        del self._logits[drafts.shape[0]:]                          # a step past an early stop drafted nothing
        return drafts.to(ids.device), probs.to(ids.device)

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        """A dynamic tree (``generation.tree_draft``) of at most ``nodes`` nodes and ``depth`` levels; a
        chain of ``min(depth, nodes)`` drafts when this drafter cannot take a tree."""
        seq = ids.to(self.device)
        self._start_round(seq)
        if tree_support(self.cached) is not None:
            drafts, _ = self.propose(ids, min(depth, nodes))
            return Tree.chain(drafts.tolist())
        return draft_tree(self.cached, self.processor, self.vocab_size, seq, depth, nodes, branch)

    def propose_sampled_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int
                             ) -> tuple[Tree, torch.Tensor]:
        """A tree whose children are drawn from q without replacement (``generation.tree_draft.sample_tree``)
        and q at the root and each node, (n + 1, V); a chain and its q when it cannot take a tree."""
        seq = ids.to(self.device)
        self._start_round(seq)
        if tree_support(self.cached) is not None:
            drafts, q = self.propose(ids, min(depth, nodes))
            return Tree.chain(drafts.tolist()), torch.cat([q, torch.zeros_like(q[:1])])
        tree, q = sample_tree(self.cached, self.processor, self.vocab_size, seq, depth, nodes, branch,
                              self.generator)
        return tree, q.to(ids.device)

    def draft_logits(self) -> torch.Tensor | None:
        """The last proposal's raw logits, (k', V): the inspector shows their
        softmax under greedy, where q itself is one-hot."""
        if not self._logits:
            return None
        logits = torch.cat(self._logits)                            # (k', V_drafter)
        return logits if self.vocab_size is None else logits[:, :self.vocab_size]

    @property
    def capture_s(self) -> float:
        return self.cached.capture_s

    def report(self) -> DrafterReport:
        return DrafterReport(rollback=self.cached.stats.to_dict(), compile=self.cached.compile_stats())
