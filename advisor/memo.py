"""A self-drafter's proposals, computed once per position and served to every method of its grid.

Under greedy every replayed method commits target AR's output, so the sequence a drafter drafts
after is always a prefix of prompt + output. A self-drafter that drafts on the target's cache
(``SelfDrafter`` in its ``view`` or ``copy`` mode) reads, at a round from committed length L, only
the target's keys and values of those L - 1 positions (in the replay: the store's, the same for every
method, ``advisor.stored``) and its own drafts' on top; its chain's draft i is therefore one value per
(L, i), whatever γ or γ policy asked for it, computed by the same forwards in the same order. A tree
is one value per (L, depth, nodes, branch). :class:`Proposals` keeps them per recorded prompt and
drafter model; :class:`MemoDrafter` serves them behind the drafter contract and counts the forwards
(and the widths a hook would have seen) the drafter would have run for each call, so a replay's
counts are the unmemoised replay's.

A chain is computed :data:`DEPTH` deep (or as deep as asked, if more) the first time its position is
asked for, so the shallow methods of a grid pay the deep ones' forwards once. The seconds of those
computations (``timed``) price the drafter's step where its step is not its module's forward.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from generation.drafter import Drafter, DrafterReport
from generation.tree import Tree

DEPTH = 8           # a chain is computed this deep when first asked for (the default grid's largest γ)


@dataclass
class Chain:
    """One position's chain: the drafts, q's nonzero entries per draft, q's width and dtype, and the
    widths a hook saw per draft (empty where the step is no module forward, a lean step)."""

    drafts: list[int]
    q: list[tuple[torch.Tensor, torch.Tensor]]
    width: int
    dtype: torch.dtype
    hooked: list[list[int]]

    def take(self, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The first k drafts and their q, (k,) and (k, V), as the drafter returned them."""
        q = torch.zeros(k, self.width, dtype=self.dtype)
        for row, (index, value) in enumerate(self.q[:k]):
            q[row, index] = value
        return torch.tensor(self.drafts[:k], dtype=torch.long, device=device), q.to(device)


@dataclass
class Proposals:
    """Chains and trees by (recorded prompt, drafter model, position, shape), and the seconds and
    forwards their computation took after each prompt's first round (``timed``)."""

    chains: dict[tuple, Chain] = field(default_factory=dict)
    trees: dict[tuple, tuple[Tree, int, list[int]]] = field(default_factory=dict)
    timed: dict[int, list[float]] = field(default_factory=dict)    # id(model) -> [seconds, forwards]
    computed: int = 0           # proposals computed for real (a test counts them)
    served: int = 0             # proposals served from the memo

    def timed_of(self, model) -> tuple[float, int]:
        """(seconds, forwards) of ``model``'s computed chains so far."""
        seconds, forwards = self.timed.get(id(model), (0.0, 0))
        return seconds, forwards

    def time(self, model, seconds: float, forwards: int) -> None:
        entry = self.timed.setdefault(id(model), [0.0, 0])
        entry[0] += seconds
        entry[1] += forwards


def chain_key(index: int, model, length: int) -> tuple:
    """What decides a chain: the recorded prompt, the drafter model, the committed length (+ 1)."""
    return index, id(model), length


def tree_key(index: int, model, length: int, depth: int, nodes: int, branch: int) -> tuple:
    """What decides a tree: a chain's, and its shape (best-first growth under a depth limit is no
    prefix of a deeper tree's)."""
    return index, id(model), length, depth, nodes, branch


def memoisable(drafter) -> bool:
    """Whether ``drafter``'s proposals are a function of the committed prefix alone (after its
    ``begin``): a self-drafter drafting on the target's cache, greedy, with a cache."""
    from model_drafters.selfdraft.drafter import SelfDrafter
    from sampling import GreedyProcessor

    return (isinstance(drafter, SelfDrafter) and drafter.mode != "own"
            and isinstance(drafter.processor, GreedyProcessor))


class MemoDrafter(Drafter):
    """``inner`` (a self-drafter) with its proposals served from ``proposals`` where
    :func:`memoisable`; ``index``: the recorded prompt; ``widths``: the replay's hooked widths, to
    which a served call adds what the drafter's forwards would have shown."""

    def __init__(self, inner, proposals: Proposals, index: int, widths: list[int], max_gen_len: int):
        self.inner, self.proposals, self.index, self.widths = inner, proposals, index, widths
        self.max_gen_len = max_gen_len
        self.start = 0
        self.kind, self.samples_trees = inner.kind, inner.samples_trees
        self.wants_top_k, self.most_extra_rows = inner.wants_top_k, inner.most_extra_rows
        self.on = False
        self._calls = 0
        self._rounds = 0

    @property
    def calls(self) -> int:
        return self._calls if self.on else self.inner.calls

    @property
    def capture_s(self) -> float:
        return self.inner.capture_s

    def attach_target(self, target) -> None:
        self.inner.attach_target(target)

    def begin(self, prompt: list[int]) -> None:
        self.inner.begin(prompt)
        self.on = memoisable(self.inner)
        self._calls, self._rounds, self.start = 0, 0, len(prompt)

    def fill_target(self, ids: torch.Tensor) -> None:
        self.inner.fill_target(ids)

    def tree_support(self) -> str | None:
        return self.inner.tree_support()

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None):
        if not self.on or stop_below is not None or k <= 0:
            return self.inner.propose(ids, k, stop_below)
        self._rounds += 1
        key = chain_key(self.index, self.inner.model, ids.shape[1])
        chain = self.proposals.chains.get(key)
        if chain is None or len(chain.drafts) < k:
            room = self.max_gen_len - (ids.shape[1] - self.start) - 1     # the most a run's round may ask
            chain = self._chain(ids, max(k, min(DEPTH, room)))
            self.proposals.chains[key] = chain
        else:
            self.proposals.served += 1
        k = min(k, len(chain.drafts))
        for seen in chain.hooked[:k]:
            self.widths.extend(seen)
        self._calls += k
        return chain.take(k, ids.device)

    def _chain(self, ids: torch.Tensor, depth: int) -> Chain:
        """The inner drafter's chain of ``depth`` drafts after ``ids``, one step at a time as it runs
        them (a chain's step i does not depend on how many follow), with what its forwards showed."""
        before, calls = len(self.widths), self.inner.calls
        started = time.perf_counter()
        drafts, q = self.inner.propose(ids, depth)
        seconds = time.perf_counter() - started
        forwards = self.inner.calls - calls
        seen = self.widths[before:]
        del self.widths[before:]                  # the served part is added back by the caller
        if self._rounds > 1:
            self.proposals.time(self.inner.model, seconds, forwards)
        self.proposals.computed += 1
        per_step = [[w] for w in seen] if len(seen) == forwards else [[] for _ in range(forwards)]
        rows = q.float() if q.dtype not in (torch.float32, torch.float64) else q
        nonzero = [(row.nonzero().flatten().cpu(), q[i, row.nonzero().flatten()].cpu()) for i, row in enumerate(rows)]
        return Chain(drafts.tolist(), nonzero, q.shape[-1], q.dtype, per_step)

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        if not self.on:
            return self.inner.propose_tree(ids, depth, nodes, branch)
        self._rounds += 1
        key = tree_key(self.index, self.inner.model, ids.shape[1], depth, nodes, branch)
        kept = self.proposals.trees.get(key)
        if kept is None:
            before, calls = len(self.widths), self.inner.calls
            tree = self.inner.propose_tree(ids, depth, nodes, branch)
            kept = (tree, self.inner.calls - calls, list(self.widths[before:]))
            del self.widths[before:]
            self.proposals.trees[key] = kept
            self.proposals.computed += 1
        else:
            self.proposals.served += 1
        tree, forwards, seen = kept
        self.widths.extend(seen)
        self._calls += forwards
        return tree

    def propose_sampled_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int):
        return self.inner.propose_sampled_tree(ids, depth, nodes, branch)

    def draft_logits(self) -> torch.Tensor | None:
        return None if self.on else self.inner.draft_logits()

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        self.inner.update(new_tokens, top_k)

    def report(self) -> DrafterReport:
        return self.inner.report()


def memoised(drafter, proposals: Proposals, index: int, widths: list[int], max_gen_len: int):
    """``drafter`` with its self-drafter (itself, or a hybrid's drafter model) served from
    ``proposals`` (:class:`MemoDrafter`); any other drafter as it is."""
    from model_drafters.selfdraft.drafter import SelfDrafter
    from ngram_assisted.hybrid import HybridDrafter

    if isinstance(drafter, SelfDrafter):
        return MemoDrafter(drafter, proposals, index, widths, max_gen_len)
    if isinstance(drafter, HybridDrafter) and isinstance(drafter.model, SelfDrafter):
        drafter.model = MemoDrafter(drafter.model, proposals, index, widths, max_gen_len)
    return drafter


def memoised_in(drafter) -> bool:
    """Whether ``drafter`` (or a hybrid's drafter model) was served by a memo that was on."""
    from ngram_assisted.hybrid import HybridDrafter

    inner = drafter.model if isinstance(drafter, HybridDrafter) else drafter
    return isinstance(inner, MemoDrafter) and inner.on
