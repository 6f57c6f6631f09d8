"""Drafting with the target's MTP layers, from the hidden states of the verify the loop already runs.

An MTP layer (DeepSeek-V3, Liu et al. 2024, section 2.2) predicts one token further ahead than the
one before: at *slot* j depth 0 reads the target's final hidden state h_j and the embedding of
x_{j+1} and predicts x_{j+2}; depth d reads depth d-1's output. Each depth keeps a cache of its own
(``MtpCache``, as transformers' ``MTPCandidateGenerator``). With n committed tokens a chain of k
drafts advances depth d = 0..k-1 to slot n-2; after the verify each depth is cropped to the slots
whose tokens were kept. Depths past the K layers reuse the last one, as serving engines do.

Trees: level L from depth L over the slots of its path, cropped back after each node. The hidden
states come from the target's own forwards (``CachedModel.keep_hidden``).
"""

from __future__ import annotations

import torch

from generation.hidden_rows import TargetHiddenStates
from generation.tree import Tree
from generation.tree_draft import best_tree, child_scores, top_children
from kvcache.cache import drop_last, record_past
from sampling import LogitsProcessor


class _Depth:
    """One draft depth: its MTP layer, its cache, and its outputs at the slots it holds."""

    def __init__(self, mtp, layer: int):
        from transformers.cache_utils import MtpCache

        self.layer = layer                                          # which MTP layer runs this depth
        self.cache = MtpCache(config=mtp.config)
        record_past(self.cache)                                     # an exact crop of a sliding layer
        self.outs: torch.Tensor | None = None                       # (1, slots, H)

    @property
    def length(self) -> int:
        return 0 if self.outs is None else self.outs.shape[1]

    def append(self, out: torch.Tensor) -> None:
        self.outs = out if self.outs is None else torch.cat([self.outs, out], dim=1)

    def keep(self, slots: int) -> int:
        """Keep the first ``slots`` slots (cache and outputs); returns how many were dropped."""
        dropped = self.length - slots
        if dropped > 0:
            drop_last(self.cache.layers[self.layer], dropped)
            self.outs = self.outs[:, :slots]
        return max(dropped, 0)


class MtpDrafter(TargetHiddenStates):
    """Drafts a chain with the target's MTP layers (``mtp``: a marked ``MtpModel``), q from ``processor``."""

    def __init__(self, mtp, processor: LogitsProcessor, *, vocab_size: int | None = None,
                 generator: torch.Generator | None = None):
        super().__init__(mtp, processor, vocab_size=vocab_size, generator=generator)
        self.mtp = mtp
        self.num_layers = len(mtp.layers)
        self.depths: list[_Depth] = []       # calls: one forward per depth per round
        self._round: tuple[int, int, torch.Tensor] | None = None   # (n, depths run, drafts) of the last chain
        self.tree_logits: list[tuple[tuple[int, ...], torch.Tensor]] = []   # the last tree's (path, logits)

    # ------------------------------------------------------------------ contract

    def attach_target(self, target) -> None:
        """Ask every target forward of this generation to keep its final hidden states."""
        self.target = target
        target.keep_hidden = True

    def begin(self, prompt: list[int]) -> None:
        super().begin(prompt)
        self.depths, self._round = [], None

    def tree_support(self) -> str | None:
        return None

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        """A dynamic tree from the MTP logits, grown as ``generation.tree_draft`` grows a drafter model's; a
        node at level L is expanded by depth L over the slots that read its path, its cache cropped back
        after it."""
        n = ids.shape[1]
        self._logits, self._round = [], None
        if n < 2 or depth < 1 or nodes < 1:
            return Tree((), (), ())
        self.fill_target(ids)
        seq = ids[0].to(self.device)
        root = self._advance(0, seq, n)[:, -1:]                             # depth 0 at slot n-2, (1, 1, H)
        outs = {-1: root[:, :0]}                                            # node -> its depth's path slots
        logits = self._logits_of(root)                                      # (1, V)
        self.tree_logits = [((), logits)]
        q = child_scores(self.processor, logits, self.vocab_size)                # (1, V)
        cand = [(token, -1, rank, 0, logq) for rank, (token, logq) in enumerate(top_children(q, branch)[0])]
        level = list(range(len(cand)))
        for d in range(1, depth):
            expand = sorted(level, key=lambda c: -cand[c][4])[:branch]
            if not expand:
                break
            level = []
            for c in expand:
                path = [cand[i][0] for i in _path(cand, c)]                     # t_1..t_d
                outs[c], logits = self._expand(seq, n, path, outs[cand[c][1]])
                self.tree_logits.append((tuple(path), logits))
                kids = top_children(child_scores(self.processor, logits, self.vocab_size), branch)[0]
                for rank, (token, logq) in enumerate(kids):
                    level.append(len(cand))
                    cand.append((token, c, rank, d, cand[c][4] + logq))
        return best_tree(cand, nodes)

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to k drafts, one per depth, each drawn from q = processor(MTP logits): (k',), (k', V)."""
        self._round = None
        return super().propose(ids, k, stop_below)

    def chain_step(self, ids: torch.Tensor, n: int):
        def step(seq: torch.Tensor) -> torch.Tensor:             # (1, n + d) -> depth d's logits, (1, V)
            out = self._advance(seq.shape[1] - n, seq[0], n)                # (1, m, H)
            return self.mtp._project_to_logits(out[:, -1:])[0]

        return step

    def chain_drawn(self, n: int, steps: int, drafts: torch.Tensor) -> None:
        self._round = (n, steps, drafts)      # update crops each depth to the drafts kept

    def update(self, new_tokens: list[int], top_k) -> None:
        """Crop each depth to the slots whose tokens were kept, then take the target's hidden
        states of the newly committed positions from the verify that just ran."""
        if self._round is not None:
            self._settle(new_tokens, *self._round)
            self._round = None
        self.committed += len(new_tokens)
        self._collect(self.committed - 1)

    # ------------------------------------------------------------------ internals

    def _advance(self, d: int, seq: torch.Tensor, n: int, end: int | None = None) -> torch.Tensor | None:
        """Run depth d over its slots [its length, end) (end: n-1); its outputs there (1, m, H), or None.
        Slot j reads token seq[j + d + 1] at position j + d + 1 and the target's h_j (depth 0) or depth
        d-1's output at slot j."""
        end = n - 1 if end is None else end
        if d == len(self.depths):
            self.depths.append(_Depth(self.mtp, min(d, self.num_layers - 1)))
        depth = self.depths[d]
        start = depth.length
        if start >= end:
            return None
        if d == 0:
            hidden = torch.cat(self.rows).to(self.device)[None]            # (1, n-1-start, H)
            self.rows = []
        else:
            hidden = self.depths[d - 1].outs[:, start:end]                  # (1, end-start, H)
        tokens = seq[start + d + 1:end + d + 1][None]                       # (1, end-start)
        positions = torch.arange(start + d + 1, end + d + 1, device=self.device)[None]
        out = self.mtp.forward_layer(depth.layer, hidden, positions, depth.cache, input_ids=tokens)
        self._forwards += 1
        depth.append(out)
        return out

    def _logits_of(self, out: torch.Tensor) -> torch.Tensor:
        """The MTP head's logits of the last slot of ``out`` (1, m, H): (1, V)."""
        logits = self.mtp._project_to_logits(out[:, -1:])[0]
        return logits[:, :self.vocab_size] if self.vocab_size is not None else logits

    def _expand(self, seq: torch.Tensor, n: int, path: list[int], parent: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Depth L = len(path) over slots n-1-L..n-2 (the path's tokens at positions n..n+L-1, depth L-1's
        outputs there, ``parent`` (1, L-1, H)): its outputs (1, L, H) and the last one's logits (1, V);
        the depth's cache is left with its committed slots."""
        L = len(path)
        self._advance(L, seq, n, end=n - 1 - L)                             # its committed slots
        depth = self.depths[L]
        below = self.depths[L - 1].outs[:, n - 1 - L:n - L]                  # (1, 1, H)
        hidden = torch.cat([below, parent], dim=1)                          # (1, L, H)
        tokens = torch.tensor([path], dtype=torch.long, device=self.device)
        positions = torch.arange(n, n + L, device=self.device)[None]
        out = self.mtp.forward_layer(depth.layer, hidden, positions, depth.cache, input_ids=tokens)
        self._forwards += 1
        drop_last(depth.cache.layers[depth.layer], L)
        return out, self._logits_of(out)

    def _settle(self, new_tokens: list[int], n: int, ran: int, drafts: torch.Tensor) -> None:
        """After a chain from n committed tokens that ran ``ran`` depths: keep, at each depth,
        the slots whose tokens are in the sequence now (depth d's slot j read token j+d+1)."""
        if ran < 2:
            return                                     # depth 0 reads committed tokens only
        drafted = drafts.tolist()                      # already on the host side of the round's sync
        same = 0
        while same < min(len(drafted), len(new_tokens)) and drafted[same] == new_tokens[same]:
            same += 1                                  # drafts that stand in the sequence as drafted
        limit = None
        for d, depth in enumerate(self.depths):
            keep = depth.length if d >= ran else min(depth.length, n - 1 + same - d)
            keep = keep if limit is None else min(keep, limit)
            dropped = depth.keep(keep)
            if dropped:
                self.stats.refed_tokens += dropped     # slots a later round computes again
            limit = keep


def _path(cand: list, c: int) -> list[int]:
    """Candidate indices from the root's child down to ``c``."""
    path = []
    while c >= 0:
        path.append(c)
        c = cand[c][1]
    return path[::-1]
