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

A chain is computed :data:`FIRST` deep the first time its position is asked for (:data:`DEPTH`, or
as deep as asked, when more is asked), so the shallow methods of a grid pay the deep ones' forwards
once. The seconds of those
computations (``timed``) price the drafter's step where its step is not its module's forward.
With :data:`BATCH` on, a cast copy with a lean step has a prompt's chains at every position computed
at once instead (:func:`batched_chains`), where :func:`batching_pays` finds that cheaper here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from generation.drafter import Drafter, DrafterReport
from generation.tree import Tree

DEPTH = 8           # the deepest a chain is computed when more is asked (the default grid's largest γ)
FIRST = 4           # a chain's depth when first asked for (past its first wrong draft none is judged)
FILLER = 0          # a draft past a chain's first wrong one: never judged, so any id (advisor.teacher's)
# A lean step's chains computed for every position of a prompt at once (batched_chains), where that
# pays. Off: on the default pair with a bfloat16 copy (an AVX-512 EPYC, 3 prompts of 64 tokens) it
# replayed the copy's 24 chain methods in 21 s instead of 50 s, but the batched products' rounding
# moved 13 of them by 1-8% in tokens per call, where the single steps' replay made the confirming
# runs' counts exactly (docs/results.md).
BATCH = False
CHUNK = 256         # chains per batched forward (bounds its memory on long outputs)
MIN_CHAINS = 8      # fewer round starts than this: one step at a time
PAYS = 0.5          # a batched chain's forward must cost under this share of a single step (batching_pays)


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
    batched: set = field(default_factory=set)     # (recorded prompt, id(model)) whose chains were batched
    pays: dict = field(default_factory=dict)      # id(model) -> whether its batched chains pay (timed once)

    def timed_of(self, model) -> tuple[float, int]:
        """(seconds, forwards) of ``model``'s computed chains so far."""
        seconds, forwards = self.timed.get(id(model), (0.0, 0))
        return seconds, forwards

    def time(self, model, seconds: float, forwards: int) -> None:
        entry = self.timed.setdefault(id(model), [0.0, 0])
        entry[0] += seconds
        entry[1] += forwards


def left_output(drafts: list[int], at: int, output) -> bool:
    """Whether a chain of ``drafts`` from output position ``at`` leaves the output (a draft past its
    end or not its token): every draft after that one is never judged."""
    return any(at + i >= len(output) or t != output[at + i] for i, t in enumerate(drafts))


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
        if chain is None and self._batch(ids):
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

    def _batch(self, ids: torch.Tensor) -> bool:
        """Compute this prompt's chains at every position at once where the drafter steps through a
        lean step on a cast copy and that pays here (:func:`batched_chains`), once per prompt;
        whether it did."""
        inner, proposals = self.inner, self.proposals
        mark = (self.index, id(inner.model))
        stored = getattr(inner.target, "stored", None)       # a replay's target that copies from a store
        if (not BATCH or mark in proposals.batched or stored is None
                or inner.mode != "copy" or inner.lean is None):
            return False
        store = stored()
        if store is None:
            return False
        proposals.batched.add(mark)
        prompt = ids[0, :self.start].tolist()
        chains = batched_chains(inner, store, prompt, self.output, DEPTH, proposals.pays)
        if chains is None:
            return False
        for length, chain in chains.items():
            proposals.chains.setdefault(chain_key(self.index, inner.model, length), chain)
        proposals.computed += len(chains)
        return True

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
        settled = left_output(tokens, at, self.output)
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


def batched_chains(inner, store: tuple, prompt: list[int], output, depth: int,
                   pays: dict | None = None) -> dict[int, Chain] | None:
    """A lean-step self-drafter's greedy chains at every round start of one recorded output, by
    committed length + 1 (the sequence length a round proposes after): each up to and including its
    first wrong draft (past it no draft is judged), at most ``depth`` deep, from one batched forward
    per depth of the chains still right (``LeanStep.branches``, :data:`CHUNK` chains at a time) over
    the target's keys and values of the prompt and the output (``store``: the replay's store and the
    positions it holds, cast as a round casts them). A chain equals the one the drafter's own steps
    compute but where its logits sit at a near-tie (the batched products round otherwise): the
    replay is labelled ``rounding`` either way. None where batching does not pay for this drafter
    here (:func:`batching_pays`, kept in ``pays`` by model). The lean step's held positions are left
    as the drafter had them."""
    from kvcache.shared import committed_positions
    from sampling.processors import probs_dtype

    lean, processor, vocab = inner.lean, inner.processor, inner.vocab_size
    cache, held = store
    sequence = list(prompt) + list(output)
    lengths = list(range(len(prompt), min(len(sequence) - 1, held) + 1))   # a round after ids[:n]
    if len(lengths) < MIN_CHAINS:
        return None
    target = torch.tensor(list(output) + [-1])          # the output, and "past it" (no draft is -1)
    pick = lambda rows: processor.greedy_ids(rows if vocab is None else rows[:, :vocab])    # noqa: E731
    kept = lean.length
    if held > kept:
        lean.append(committed_positions(cache, kept, held))
    drafted = []
    try:
        starts = [n - 1 for n in lengths]
        fed = torch.tensor([sequence[s] for s in starts], dtype=torch.long)
        key = id(inner.model)
        if pays is not None and key not in pays:
            pays[key] = batching_pays(lean, starts, fed, pick)
        if pays is not None and not pays[key]:
            return None
        for first in range(0, len(lengths), CHUNK):
            part = lengths[first:first + CHUNK]
            at = torch.tensor([n - len(prompt) for n in part])

            def going(rows, j, tokens, at=at):
                where = (at[rows] + j).clamp(max=len(output))
                return (tokens.cpu() == target[where]) & (where + 1 < len(output))

            drafted += lean.branches(starts[first:first + CHUNK], fed[first:first + CHUNK], depth, pick,
                                     going=going)[0].tolist()
    finally:
        lean.length = kept
    width = vocab if vocab is not None else inner.model.lm_head.out_features
    dtype = probs_dtype(lean.dtype)
    one = torch.ones(1, dtype=dtype)
    chains = {}
    for n, row in zip(lengths, drafted):
        row = [t for t in row if t >= 0]
        at = n - len(prompt)
        settled = left_output(row, at, output)
        q = [(torch.tensor([t]), one.clone()) for t in row]
        chains[n] = Chain(row, q, width, dtype, [[] for _ in row], settled)
    return chains


def batching_pays(lean, starts: list[int], fed: torch.Tensor, pick) -> bool:
    """Whether a batched forward of many chains (``LeanStep.branches``) costs less a chain than
    :data:`PAYS` of one step of the lean step alone, timed here, device-synced: a 16-bit product
    batches well only where the CPU has kernels for its type (on an AVX-512 EPYC a bfloat16 copy's
    batched row cost a sixteenth of its step, a float16 one's about a half)."""
    from utils.devices import synchronize

    count = min(len(starts), CHUNK)
    lean.branches(starts[:2], fed[:2], 1, pick)                 # warm: the rotation table, first calls
    synchronize(lean.device)
    began = time.perf_counter()
    lean.branches(starts[:count], fed[:count], 1, pick)
    synchronize(lean.device)
    row = (time.perf_counter() - began) / count
    step = math.inf
    kept = lean.length
    try:
        for token in fed[:3]:
            lean.length = kept                                  # past every held position a chain reads
            began = time.perf_counter()
            lean.step(token.view(1))
            synchronize(lean.device)
            step = min(step, time.perf_counter() - began)
    finally:
        lean.length = kept
    return row < PAYS * step


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
