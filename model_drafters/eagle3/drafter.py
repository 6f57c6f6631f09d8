"""Drafting with an EAGLE-3 head from the target's hidden states of the verify the loop already runs.

EAGLE-3 (Li et al., NeurIPS 2025) drafts at the feature level: at *slot* j the head reads the
target's hidden states at position j from three layers, fused by ``fc``, and the embedding of
token j+1; its output gives the logits of token j+2 and stands in for the target's hidden state
at the next slot. With n committed tokens the target's states exist for slots 0..n-2, so a chain
of k drafts fills the head's missing slots from the target (one pass), reads draft 1 at slot
n-2, then feeds its own output forward for drafts 2..k. Draft slots are dropped from the head's
cache once drafted (EAGLE's ``stable_kv``): the cache always holds slots read from the target.

Draft ids map to target ids through ``d2t``; q is placed at the target ids (-inf elsewhere)
before the run's processor, so the accept rule stays exact. Trees grow as EAGLE-2's dynamic
trees (Li et al. 2024; ``generation.tree_draft``). The hidden states come from the target's own
forwards (``CachedModel.keep_hidden``, ``keep_block``): no target forward is added.
"""

from __future__ import annotations

import torch

from generation.hidden_rows import TargetHiddenStates
from generation.tree import Tree
from generation.tree_draft import best_tree, child_scores, top_children, tree_visibility
from kvcache.cache import drop_last
from sampling import LogitsProcessor


def to_target_logits(head, logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Draft-vocabulary logits (m, D) placed at their target ids in (m, V), -inf elsewhere;
    draft ids that map past V (the loop's vocabulary) are left out."""
    ids = head.target_ids()                                                  # (D,)
    inside = ids < vocab_size
    out = logits.new_full((logits.shape[0], vocab_size), float("-inf"))
    out[:, ids[inside]] = logits[:, inside]
    return out


class Eagle3Drafter(TargetHiddenStates):
    """Drafts chains and dynamic trees with an EAGLE-3 head (``head``: marked by ``eagle3.mark_eagle3``),
    q from ``processor``."""

    def __init__(self, head, processor: LogitsProcessor, *, vocab_size: int,
                 generator: torch.Generator | None = None):
        # rows: the target's fused states, (m, 3T) each. calls: one catch-up pass and one per
        # further draft, each round.
        super().__init__(head, processor, vocab_size=vocab_size, generator=generator)
        self.head = head
        self.cache = None
        self.slots = 0                       # slots the head's cache holds (all read from the target)

    # ------------------------------------------------------------------ contract

    def attach_target(self, target) -> None:
        """Ask every target forward of this generation to keep the hidden states the head reads."""
        self.target = target
        target.keep_hidden = self.head.aux_layers

    def begin(self, prompt: list[int]) -> None:
        from transformers import DynamicCache

        super().begin(prompt)
        self.cache = DynamicCache()
        self.slots = 0

    def chain_step(self, ids: torch.Tensor, n: int):
        out = self._catch_up(ids[0].to(self.device), n)[:, -1:]                   # (1, 1, H)

        def step(seq: torch.Tensor) -> torch.Tensor:             # (1, n + d) -> the head's logits, (1, V)
            nonlocal out
            if seq.shape[1] > n:              # slot n+d-2 reads the head's own output and the last draft
                position = torch.tensor([[seq.shape[1] - 2]], device=self.device)
                out = self.head.step(out, seq[:, -1:], position, self.cache, fused=False)
                self._forwards += 1
            return to_target_logits(self.head, self.head.draft_logits(out[0]), self.vocab_size)

        return step

    def chain_drawn(self, n: int, steps: int, drafts: torch.Tensor) -> None:
        self._drop_drafts()

    def tree_support(self) -> str | None:
        return None

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        """An EAGLE-2 dynamic tree of at most ``nodes`` nodes and ``depth`` levels (target ids)."""
        n = ids.shape[1]
        self._logits = []
        if n < 2:
            return Tree((), (), ())
        self.fill_target(ids)
        root = self._catch_up(ids[0].to(self.device), n)[:, -1]                     # (1, H)
        q = child_scores(self.processor, to_target_logits(self.head, self.head.draft_logits(root),
                                                          self.vocab_size), None)  # (1, V)
        # Candidates: token, parent (index into cand; -1 root), rank, depth, score (log q along the path).
        cand = [(token, -1, rank, 0, logq) for rank, (token, logq) in enumerate(top_children(q, branch)[0])]
        outputs = {-1: root[0]}                   # candidate -> the head's output at its slot, (H,)
        level, fed = list(range(len(cand))), []   # fed: candidates in the head's cache, in order
        for d in range(1, depth):
            expand = sorted(level, key=lambda c: -cand[c][4])[:branch]
            if not expand:
                break
            out = self._feed_level(cand, outputs, fed, expand, n)                   # (E, H)
            q = child_scores(self.processor, to_target_logits(self.head, self.head.draft_logits(out),
                                                              self.vocab_size), None)   # (E, V)
            level = []
            for c, row, kids in zip(expand, out, top_children(q, branch)):
                outputs[c] = row
                for rank, (token, logq) in enumerate(kids):
                    level.append(len(cand))
                    cand.append((token, c, rank, d, cand[c][4] + logq))
        self._drop_drafts()
        return best_tree(cand, nodes)

    def update(self, new_tokens: list[int], top_k) -> None:
        """Take the target's hidden states of the newly committed positions from the verify that just ran."""
        self.committed += len(new_tokens)
        self._collect(self.committed - 1)

    # ------------------------------------------------------------------ internals

    def _catch_up(self, seq: torch.Tensor, n: int) -> torch.Tensor:
        """Run the head over slots [slots, n-1) from the target's fused states; returns their outputs (1, m, H).

        Slot j reads the target's layers at position j and token seq[j + 1], at position j.
        """
        hidden = torch.cat(self.rows).to(self.device)[None]                      # (1, n-1-slots, 3T)
        self.rows = []
        tokens = seq[self.slots + 1:n][None]                                       # (1, n-1-slots)
        positions = torch.arange(self.slots, n - 1, device=self.device)[None]
        out = self.head.step(hidden, tokens, positions, self.cache, fused=True)
        self._forwards += 1
        self.slots = n - 1
        return out

    def _feed_level(self, cand, outputs: dict, fed: list[int], expand: list[int], n: int) -> torch.Tensor:
        """Feed the candidates ``expand`` to the head in one pass; returns their outputs (E, H).

        A candidate at depth d sits at slot n-1+d, reads its parent's output and its own
        token, and sees the target's slots (n-1 of them), its fed ancestors and itself.
        """
        hidden = torch.stack([outputs[cand[c][1]] for c in expand])[None]               # (1, E, H)
        tokens = torch.tensor([[cand[c][0] for c in expand]], device=self.device)
        positions = torch.tensor([[n - 1 + cand[c][3] for c in expand]], device=self.device)
        visible = tree_visibility(cand, fed, expand, n - 1).to(self.device)
        out = self.head.step(hidden, tokens, positions, self.cache, fused=False, visible=visible)
        self._forwards += 1
        fed.extend(expand)
        return out[0]

    def _drop_drafts(self) -> None:
        """Crop the head's cache back to the slots read from the target (the chain's own slots go)."""
        extra = self.cache.get_seq_length() - self.slots
        if extra > 0:
            drop_last(self.cache, extra)
