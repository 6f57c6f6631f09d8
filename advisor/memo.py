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

DEPTH = 8           # the deepest a chain is computed when more is asked (the default grid's largest γ)
FIRST = 4           # a chain's depth when first asked for (past its first wrong draft none is judged)
FILLER = 0          # a draft past a chain's first wrong one: never judged, so any id (advisor.teacher's)


@dataclass
class Chain:
    """One position's chain: the drafts, q's nonzero entries per draft, q's width and dtype, and the
    widths a hook saw per draft (empty where the step is no module forward, a lean step)."""

    drafts: list[int]
    q: list[tuple[torch.Tensor, torch.Tensor]]
    width: int
    dtype: torch.dtype
    hooked: list[list[int]]
    settled: bool = False       # a draft left the output: every draft after it is never judged

    def serves(self, k: int) -> bool:
        return len(self.drafts) >= k or self.settled

    def take(self, k: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The first k drafts and their q, (k,) and (k, V), as the drafter returned them; past a
        settled chain's drafts, :data:`FILLER` with a one-hot q (drafted, counted, never judged)."""
        q = torch.zeros(k, self.width, dtype=self.dtype)
        for row, (index, value) in enumerate(self.q[:k]):
            q[row, index] = value
        filler = k - len(self.drafts)
        if filler > 0:
            q[len(self.drafts):, FILLER] = 1.0
        drafts = self.drafts[:k] + [FILLER] * max(0, filler)
        return torch.tensor(drafts, dtype=torch.long, device=device), q.to(device)

    def widths(self, k: int) -> list[int]:
        """What a hook saw over the first k drafts' forwards (a filler's as its chain's)."""
        each = self.hooked[-1] if self.hooked else []
        return [w for seen in self.hooked[:k] for w in seen] + each * max(0, k - len(self.hooked))


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
    from model_drafters.selfdraft import SelfDrafter
    from sampling import GreedyProcessor

    return (isinstance(drafter, SelfDrafter) and drafter.mode != "own"
            and isinstance(drafter.processor, GreedyProcessor))


class MemoDrafter(Drafter):
    """``inner`` (a self-drafter) with its proposals served from ``proposals`` where
    :func:`memoisable`; ``index``: the recorded prompt; ``widths``: the replay's hooked widths, to
    which a served call adds what the drafter's forwards would have shown."""

    def __init__(self, inner, proposals: Proposals, index: int, widths: list[int], output, max_gen_len: int):
        self.inner, self.proposals, self.index, self.widths = inner, proposals, index, widths
        self.output, self.max_gen_len = tuple(output), max_gen_len
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
        if chain is None or not chain.serves(k):
            room = self.max_gen_len - (ids.shape[1] - self.start) - 1     # the most a run's round may ask
            chain = self._chain(ids, max(k, min(FIRST if chain is None else DEPTH, room)))
            self.proposals.chains[key] = chain
        else:
            self.proposals.served += 1
        self.widths.extend(chain.widths(k))
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
        tokens = drafts.tolist()
        at = ids.shape[1] - self.start
        settled = any(at + i >= len(self.output) or t != self.output[at + i] for i, t in enumerate(tokens))
        return Chain(tokens, nonzero, q.shape[-1], q.dtype, per_step, settled)

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


def memoised(drafter, proposals: Proposals, index: int, widths: list[int], output, max_gen_len: int):
    """``drafter`` with its self-drafter (itself, or a hybrid's drafter model) served from
    ``proposals`` (:class:`MemoDrafter`); any other drafter as it is."""
    from model_drafters.selfdraft import SelfDrafter
    from ngram_assisted.hybrid import HybridDrafter

    if isinstance(drafter, SelfDrafter):
        return MemoDrafter(drafter, proposals, index, widths, output, max_gen_len)
    if isinstance(drafter, HybridDrafter) and isinstance(drafter.model, SelfDrafter):
        drafter.model = MemoDrafter(drafter.model, proposals, index, widths, output, max_gen_len)
    return drafter


def memoised_in(drafter) -> bool:
    """Whether ``drafter`` (or a hybrid's drafter model) was served by a memo that was on."""
    from ngram_assisted.hybrid import HybridDrafter

    inner = drafter.model if isinstance(drafter, HybridDrafter) else drafter
    return isinstance(inner, MemoDrafter) and inner.on
