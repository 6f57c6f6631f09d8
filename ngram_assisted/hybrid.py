"""The hybrid drafter: a model-free storage's draft when its match is long, the drafter model's otherwise.

As SAM-Decoding (Hu et al., ACL 2025), Arctic Inference and TensorRT-LLM pair a suffix structure with
a drafter model: the storage is asked first, and when the sequence's tail matched at least L tokens
its draft is verified (q one-hot), else the model drafts (its real q). The choice rests only on the
sequence so far, so each round is a valid speculative step. Both sides see every round's tokens
(``update``), whichever drafted.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from generation.drafter import Drafter, DrafterReport
from generation.tree import Tree
from ngram_assisted.match_drafter import MatchDrafter
from ngram_assisted.suffix import Draft

MODEL = "model"  # the note's source of a round the drafter model drafted


class HybridDrafter(Drafter):
    """Drafts from ``retrieval`` (a :class:`MatchDrafter`) in a round whose match is at least
    ``min_match`` tokens and it has a draft, from ``model`` otherwise; each round's note names the
    source and the storage's match. Trees: top-children trees only (a storage's tree has no q to draw
    children from), so under sampling the loop verifies those."""

    kind = "model"  # γ policies: a drafter with a cost per drafted token

    def __init__(self, model: Drafter, retrieval: MatchDrafter, min_match: int):
        if isinstance(min_match, bool) or not isinstance(min_match, int) or min_match < 1:
            raise ValueError(f"the hybrid's match length L must be an integer >= 1, got {min_match!r}")
        self.model = model
        self.retrieval = retrieval
        self.min_match = min_match
        self.notes: list[dict | None] = []
        self._pending: dict | None = None   # this round's note, closed by update

    @property
    def calls(self) -> int:
        return self.model.calls

    def attach_target(self, target) -> None:
        self.model.attach_target(target)
        self.retrieval.attach_target(target)

    def begin(self, prompt: list[int]) -> None:
        self.model.begin(prompt)
        self.retrieval.begin(prompt)
        self.notes, self._pending = [], None

    def fill_target(self, ids: torch.Tensor) -> None:
        self.model.fill_target(ids)  # a self-drafter prefills the target here, whichever side drafts

    def tree_support(self) -> str | None:
        return self.model.tree_support() or self.retrieval.tree_support()

    # ------------------------------------------------------------ proposing

    def _retrieved(self, k: int, nodes: int | None = None, branch: int = 1) -> Draft | None:
        """The storage's draft when it matched at least L tokens and has one; None: the model drafts."""
        draft = self.retrieval.draft(k, nodes=nodes, branch=branch)
        if draft.match >= self.min_match and len(draft.tree) > 0:
            self._pending = draft.note()
            return draft
        self._pending = {"source": MODEL, "match": draft.match}
        return None

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The storage's chain (q None: one-hot) or the drafter model's chain and its q."""
        draft = self._retrieved(k)
        if draft is not None:
            return torch.tensor(draft.tree.tokens, dtype=torch.long, device=ids.device), None
        return self.model.propose(ids, k, stop_below)

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        draft = self._retrieved(depth, nodes, branch)
        if draft is not None:
            return draft.tree
        return self.model.propose_tree(ids, depth, nodes, branch)

    def draft_logits(self) -> torch.Tensor | None:
        """The drafter model's logits after a round it drafted; None after a retrieval round."""
        return self.model.draft_logits() if self.drafted_by_model else None

    @property
    def drafted_by_model(self) -> bool:
        """Whether the drafter model drafted the round in progress."""
        return self._pending is not None and self._pending["source"] == MODEL

    # ------------------------------------------------------------ learning and reporting

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        """Both sides learn the round's tokens, whichever drafted; close the round's note."""
        self.retrieval.update(new_tokens, top_k)
        self.model.update(new_tokens, top_k)
        self.notes.append(self._pending)
        self._pending = None

    @property
    def capture_s(self) -> float:
        return self.model.capture_s

    def report(self) -> DrafterReport:
        """The drafter model's report, with each round's note (which side drafted, the match)."""
        return replace(self.model.report(), round_notes=list(self.notes))
