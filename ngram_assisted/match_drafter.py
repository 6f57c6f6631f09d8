"""The drafter of the model-free match storages: SuffixDecoding's tries and the suffix automaton.

The storage holds the sequence, so drafting never reads the device; each round's note says where its
drafts came from and how long the match was. Given the target's verify costs by width, a chain is
drawn longer to reach a cheaper width (``generation.widths.fill_width``).
"""

from __future__ import annotations

import torch

from generation.drafter import Drafter, DrafterReport
from generation.tree import Tree
from generation.widths import fill_width
from ngram_assisted.suffix import DEFAULT_FACTOR, Draft


class MatchDrafter(Drafter):
    """Drafts deterministically (q is one-hot) from a storage with ``initialize``, ``extend`` and
    ``draft(k, factor, nodes=, branch=) -> Draft`` (``ngram_assisted.suffix.SuffixStorage``,
    ``ngram_assisted.sam.SAMStorage``). ``factor`` (α): a match of m tokens drafts at most α·m.
    ``verify_costs``: the target's forward seconds by width; given, chain rounds are filled
    to a cheaper wider verify (module docstring)."""

    kind = "ngram"  # no model: no forward passes, no cache to roll back

    def __init__(self, storage, *, factor: float = DEFAULT_FACTOR, device: torch.device | str = "cpu",
                 verify_costs: dict[int, float] | None = None):
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
            raise ValueError(f"the draft factor must be a number > 0, got {factor!r}")
        self.storage = storage
        self.factor = float(factor)
        self.verify_costs = dict(verify_costs) if verify_costs else None
        self.device = torch.device(device)
        self.notes: list[dict | None] = []
        self._pending: dict | None = None

    def tree_support(self) -> str | None:
        return None

    def begin(self, prompt: list[int]) -> None:
        self.storage.initialize(prompt)
        self.notes, self._pending = [], None

    def draft(self, k: int, *, nodes: int | None = None, branch: int = 1) -> Draft:
        """The storage's draft of this round (a chain of up to k tokens; with ``nodes``, a tree of
        at most ``nodes`` nodes and k levels), with where it came from and its match length; it
        becomes the round's note. A hybrid (``ngram_assisted.hybrid``) reads the match from it."""
        draft = self.storage.draft(k, self.factor, nodes=nodes, branch=branch)
        self._pending = draft.note()
        return draft

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None) -> tuple[torch.Tensor, None]:
        """Up to k tokens: the storage's best chain after the longest match (no q: one-hot),
        drawn longer when a wider verify is cheaper (with ``verify_costs``)."""
        tokens = self.draft(k).tree.tokens
        if self.verify_costs and tokens:      # a round without a match stays one token wide
            width = fill_width(self.verify_costs, len(tokens) + 1, k + 1)
            if width > len(tokens) + 1:
                # α as large as the width asks: the budget becomes width - 1, whatever the match.
                longer = self.storage.draft(width - 1, float(width))
                if len(longer.tree) > len(tokens):
                    self._pending = {**longer.note(), "filled": len(longer.tree) - len(tokens)}
                    tokens = longer.tree.tokens
        return torch.tensor(tokens, dtype=torch.long, device=ids.device), None

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        """The storage's tree of continuations after the longest match, weighted by their counts."""
        return self.draft(depth, nodes=nodes, branch=branch).tree

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        """Append the round's tokens to the storage; close the round's note."""
        self.storage.extend(new_tokens)
        self.notes.append(self._pending)
        self._pending = None

    def report(self) -> DrafterReport:
        return DrafterReport(round_notes=list(self.notes), fill_costs=self.verify_costs)
