"""Replay model-free drafters over a recorded greedy output, without the target.

Under greedy decoding every lossless strategy produces target AR's tokens, so a model-free
drafter's rounds can be replayed from that output alone and priced from forward costs measured on
the machine (``generation.timing.time_target``): seconds for any number of drafters and γ, where
running each costs minutes. :func:`replay` runs the engine's own drafters through
``engine.run_strategy`` with the target answered from the record (``tests/test_replay.py`` holds it
to the engine's counts); :class:`PromptLookup` wraps transformers' prompt lookup; :func:`oracle`
cuts every draft to what the target would accept; :func:`copy_ceiling` bounds the copying drafters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch

import analysis.ceiling
from analysis.ceiling import accepted_prefix as _accepted
from generation.drafter import Drafter, DrafterReport
from utils.method_name import storage_kind

TOP_K = 8       # the target's top ids recorded per position: the widest a storage recycles


def storage_options(options, name: str):
    """``options`` (an ``NGramOptions``) for the storage ``name`` (``utils.method_name.STORAGE_NAMES``)."""
    kind, fill = storage_kind(name)
    return replace(options, storage=kind, fill_width=fill)


@dataclass(frozen=True)
class Recorded:
    """One prompt's greedy output and, per output position i, the target's top-k ids of the
    distribution that produced ``output[i]`` (best first)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    top: tuple[tuple[int, ...], ...]


@dataclass
class Replayed:
    """What a drafter's replay came to: target calls (prefill included), drafted and accepted tokens as
    the engine counts them, tokens made, and rounds by verify width (prefill rounds left out).
    ``steady`` and ``steady_tokens``: the rounds after each run's first (which carries the prompt:
    the end-to-end prediction prices it apart) by verify width, and the tokens they made (empty
    where the counts came from elsewhere); ``steady_rounds``: each of those rounds as (the tokens
    before it, its prompt's included; its verify width; the tokens it made), for acceptance by
    context (``advisor.whatif.project_context``)."""

    calls: int = 0
    drafted: int = 0
    accepted: int = 0
    tokens: int = 0
    widths: dict[int, int] = field(default_factory=dict)
    steady: dict[int, int] = field(default_factory=dict)
    steady_tokens: int = 0
    steady_rounds: list[tuple[int, int, int]] = field(default_factory=list)

    def add_run(self, result, verify_widths, prompt_tokens: int = 0) -> None:
        """Count one replayed run: ``result`` (a ``GenerationResult``) and its recorded target's
        ``verify_widths`` (None for the prefill's, which is not priced), on a prompt of
        ``prompt_tokens``. Each round after the first is one verify, the last ones of ``verify_widths``."""
        self.calls += result.target_calls
        self.drafted += result.drafted
        self.accepted += result.accepted
        self.tokens += len(result.tokens)
        for width in verify_widths:
            if width is not None:
                self.widths[width] = self.widths.get(width, 0) + 1
        trace = result.trace or []
        later = len(trace) - 1
        if 0 < later <= len(verify_widths):
            first = trace[0].accepted + (trace[0].token is not None)
            position = prompt_tokens + first
            for width, round_ in zip(verify_widths[len(verify_widths) - later:], trace[1:]):
                made = round_.accepted + (round_.token is not None)
                if width is not None:
                    self.steady[width] = self.steady.get(width, 0) + 1
                    self.steady_rounds.append((position, width, made))
                position += made
            self.steady_tokens += max(0, len(result.tokens) - first)

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.calls if self.calls else 0.0

    @property
    def steady_widths(self) -> dict[int, int]:
        """The rounds the steady state is priced on: those after each run's first, by verify width;
        every priced round where no run had a second."""
        return self.steady or self.widths

    @property
    def tokens_per_round(self) -> float:
        """What a round of :attr:`steady_widths` makes: the later rounds' tokens over their count;
        tokens per call where no run had a second round."""
        return self.steady_tokens / sum(self.steady.values()) if self.steady else self.tokens_per_call

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def forward_s(self, cost: Callable[[int], float]) -> float:
        """Seconds of target forwards after the prefills, at ``cost(width)`` each."""
        return sum(cost(width) * rounds for width, rounds in self.widths.items())


class _Cut(Drafter):
    """``inner``'s proposals shortened by ``cut(draft, output, at)`` before the target judges them."""

    def __init__(self, inner: Drafter, cut: Callable, output: Sequence[int]):
        self.inner, self.cut, self.output = inner, cut, output
        self.kind, self.wants_top_k = inner.kind, inner.wants_top_k
        self.start = 0

    @property
    def calls(self) -> int:
        return self.inner.calls

    def begin(self, prompt: list[int]) -> None:
        self.start = len(prompt)
        self.inner.begin(prompt)

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None):
        draft, _ = self.inner.propose(ids, k, stop_below)
        kept = self.cut(draft.tolist(), self.output, ids.shape[1] - self.start)
        return torch.tensor(kept, dtype=torch.long, device=ids.device), None

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        self.inner.update(new_tokens, top_k)

    def report(self) -> DrafterReport:
        return replace(super().report(), fill_costs=self.inner.report().fill_costs)


def replay(pair, make_drafter: Callable[[], Drafter], recorded: Sequence[Recorded], gamma: int, max_gen_len: int,
           *, cut: Callable[[list[int], Sequence[int], int], list[int]] | None = None) -> Replayed:
    """Replay a fresh ``make_drafter()`` per prompt over ``recorded`` through ``engine.run_strategy``,
    the target answered from the record; ``cut(draft, output, at)`` shortens each draft first."""
    from advisor.stored import recorded_target
    from engine.run import loop_vocab_size, run_strategy
    from engine.strategy import Strategy
    from sampling import GreedyProcessor

    out = Replayed()
    strategy = Strategy("ngram", drafter="ngram", gamma=gamma, processor=GreedyProcessor(), max_gen_len=max_gen_len,
                        inspect=False, decisions=False)
    vocab_size = loop_vocab_size(pair)
    for index, record in enumerate(recorded):
        output = record.output[:max_gen_len]
        drafter = make_drafter()
        if cut is not None:
            drafter = _Cut(drafter, cut, output)
        target = recorded_target(pair, record, output, vocab_size, reads="", stores=None, index=index)
        out.add_run(run_strategy(strategy, pair, list(record.prompt), target=target, drafter=drafter),
                    target.verify_widths, len(record.prompt))
    return out


def oracle(draft: list[int], output: Sequence[int], at: int) -> list[int]:
    """A draft cut to the prefix the target would accept: what a perfect length rule keeps."""
    return draft[:_accepted(draft, output, at)]


def copy_ceiling(recorded: Sequence[Recorded], gamma: int, max_gen_len: int, cost: Callable[[int], float],
                 *, match: int = 1) -> Replayed:
    """The copy ceiling (``analysis.ceiling``) of every recorded output, summed as a replay's counts,
    priced by ``cost`` per verify width."""
    out = Replayed()
    for record in recorded:
        ceiling = analysis.ceiling.copy_ceiling(record.prompt, record.output, gamma, max_gen_len, cost, match=match)
        out.calls += ceiling.calls
        out.drafted += ceiling.kept
        out.accepted += ceiling.kept
        out.tokens += ceiling.tokens
        for width, rounds in ceiling.widths.items():
            out.widths[width] = out.widths.get(width, 0) + rounds
    return out


class PromptLookup(Drafter):
    """transformers' prompt lookup (``PromptLookupCandidateGenerator``, up to γ tokens after the
    first earlier occurrence of the last ``ngram`` tokens, then fewer) behind the drafter contract."""

    kind = "ngram"

    def __init__(self, ngram: int = 2):
        self.ngram = ngram

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None):
        from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

        generator = PromptLookupCandidateGenerator(num_output_tokens=k, max_matching_ngram_size=self.ngram,
                                                   max_length=ids.shape[1] + k + 1)
        candidates, _ = generator.get_candidates(ids)
        return candidates[0, ids.shape[1]:], None


def record(pair, prompts: list[list[int]], length: int, *, top_k: int = TOP_K) -> list[Recorded]:
    """Target AR's greedy output on each prompt with the target's top-k at each position
    (:func:`recorded_from`); ``ValueError`` for a served target."""
    from engine import Strategy, run_strategy
    from sampling import GreedyProcessor

    refuse_served(pair)
    return [recorded_from(pair, prompt, run_strategy(Strategy("target", processor=GreedyProcessor(),
                                                               max_gen_len=length), pair, prompt), top_k)
            for prompt in prompts]


def refuse_served(pair) -> None:
    """``ValueError`` (one line) for a served target: its logits stay on its server."""
    from kvcache.cache import SessionModel

    if isinstance(pair.target, SessionModel):
        raise ValueError("a served target's greedy output cannot be replayed here: its logits stay on its server "
                         "(load the target locally)")


def recorded_from(pair, prompt: list[int], result, top_k: int = TOP_K) -> Recorded:
    """``result`` (a greedy target AR run) as a :class:`Recorded`: its tokens and the rows that decided
    them (``generation.decisions``), else from one forward over the sequence."""
    tokens = list(result.tokens)
    rows = result.decisions
    if rows is not None and len(rows) >= len(tokens) and all(len(r.indices) >= top_k for r in rows[:len(tokens)]):
        top = tuple(tuple(r.indices[:top_k]) for r in rows[:len(tokens)])
        return Recorded(tuple(prompt), tuple(tokens), top)
    from advisor.teacher import rows_along

    logits = rows_along(pair.target, prompt, tokens)
    top = tuple(tuple(row) for row in logits.topk(top_k, dim=-1).indices.tolist())
    return Recorded(tuple(prompt), tuple(tokens), top)


def drafter_factory(pair, storage: str, vocab_size: int, gamma: int = 4) -> Callable[[], Drafter]:
    """A fresh engine drafter for ``storage`` (emptied for each prompt), or transformers' prompt lookup
    for ``prompt_lookup``; ``+fill`` storages fill widths measured up to ``gamma`` + 1."""
    from engine.drafters import DRAFTERS, DraftContext
    from engine.state import EngineState
    from engine.strategy import NGramOptions, Strategy
    from sampling import GreedyProcessor

    if storage == "prompt_lookup":
        return PromptLookup
    strategy = Strategy("ngram", drafter="ngram", drafter_options=storage_options(NGramOptions(), storage),
                        gamma=gamma)
    context = DraftContext(GreedyProcessor(), None, vocab_size, [], 0)
    state = EngineState()       # one for every prompt: the widths are measured once (the storage is reset)
    return lambda: DRAFTERS["ngram"](pair, strategy, state, context)
