"""The benchmark loop: warm-up, then every variant on every prompt, interleaved.

Each repeat runs prompt 1 through every variant, then prompt 2, ...; the next repeat reverses the
variants (A B C ..., then C B A ...), so drift hits every variant alike and a variant and its peer run
back to back. Prompts run in *sessions* (one prompt, a conversation's turns with ``--multi-turn``,
or K prompts with ``--session-size``); a session's first step starts from empty n-gram state, later
steps keep the same variant's (``bench.executor``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from bench.prompts import Prompt, chat_ids
from bench.records import RunRecord
from bench.variants import Variant


@dataclass(frozen=True)
class EncodedPrompt:
    prompt: Prompt
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Session:
    """Prompts run in a row with n-gram state kept across them. ``turns``: a conversation's user
    messages; a later step's ids are then ``follow_up(turns[:i + 1], answers so far)``."""

    id: str
    category: str
    steps: tuple[EncodedPrompt, ...]
    turns: tuple[str, ...] = field(default=())

    @property
    def conversation(self) -> bool:
        return bool(self.turns)


FollowUp = Callable[[list[str], list[list[int]]], list[int]]   # (turns so far, answers) -> prompt ids


@dataclass
class Skipped:
    prompt_id: str
    reason: str


def encode_prompts(prompts: Sequence[Prompt], tokenizer, *, chat: bool = True) -> list[EncodedPrompt]:
    """Token ids of every prompt, with the chat template when ``chat`` (same for all)."""
    return [EncodedPrompt(p, tuple(chat_ids(tokenizer, p.text, chat=chat))) for p in prompts]


def single_sessions(encoded: Sequence[EncodedPrompt]) -> list[Session]:
    """Each prompt a session of its own (every run fresh)."""
    return [Session(e.prompt.id, e.prompt.category, (e,)) for e in encoded]


def task_sessions(encoded: Sequence[EncodedPrompt], size: int) -> list[Session]:
    """``size`` prompts of one category in a row, in prompt order, as one session each (a
    category's last session may be shorter); ids ``CATEGORY#1``, ``CATEGORY#2``..."""
    by_category: dict[str, list[EncodedPrompt]] = {}
    for e in encoded:
        by_category.setdefault(e.prompt.category, []).append(e)
    out = []
    for category, items in by_category.items():
        for start in range(0, len(items), size):
            out.append(Session(f"{category}#{start // size + 1}", category, tuple(items[start:start + size])))
    return out


def conversation_sessions(conversations, first_ids: Callable[[str], list[int]]) -> list[Session]:
    """One session per conversation (a tuple of Prompts, one per turn): the first turn's ids
    encoded now, the later turns' built during the run from each variant's answers."""
    out = []
    for turns in conversations:
        steps = tuple(EncodedPrompt(p, tuple(first_ids(p.text)) if i == 0 else ())
                      for i, p in enumerate(turns))
        out.append(Session(turns[0].id.rsplit("/", 1)[0], turns[0].category, steps,
                           tuple(p.text for p in turns)))
    return out


def split_fitting_sessions(sessions: Sequence[Session], *, length: int, context_length: int | None,
                           follow_up: FollowUp | None = None) -> tuple[list[Session], list[Skipped]]:
    """Sessions whose every step fits the context with ``length`` new tokens, and the others (a later
    turn is bounded by its template plus ``length`` + 8 tokens per earlier answer)."""
    kept, skipped = [], []
    for session in sessions:
        need = max(len(step.ids) for step in session.steps)
        if session.conversation and follow_up is not None:
            earlier = len(session.turns) - 1
            need = len(follow_up(list(session.turns), [[]] * earlier)) + earlier * (length + 8)
        if context_length and need + length > context_length:
            skipped.append(Skipped(session.id, f"{need} prompt tokens + {length} new exceed the context "
                                               f"of {context_length}"))
        else:
            kept.append(session)
    return kept, skipped


def schedule(n_prompts: int, variants: Sequence[Variant],
             repeats: int) -> list[tuple[int, int, Variant]]:
    """(repeat, prompt index, variant) in run order; odd repeats reverse the variants, so pairs stay
    back to back and which of a pair runs first alternates."""
    order = [list(variants), list(reversed(variants))]
    return [(r, p, v) for r in range(repeats) for p in range(n_prompts) for v in order[r % 2]]


RunOne = Callable[..., RunRecord]
# run(variant, ids, fresh=, prompt_id=, category=, repeat=, session=, position=)


def run_session(run: RunOne, session: Session, variants: Sequence[Variant], repeat: int, *,
                follow_up: FollowUp | None = None, alone: bool = False,
                on_step: Callable[[str], None] | None = None) -> Iterator[RunRecord]:
    """Every step of ``session`` in order, each through every variant; only the first step is fresh.
    ``alone``: one prompt outside any session."""
    answers: dict[str, list[list[int]]] = {v.name: [] for v in variants}
    for position, step in enumerate(session.steps, start=1):
        for variant in variants:
            ids = list(step.ids)
            if session.conversation and position > 1:
                if follow_up is None:
                    raise ValueError("a conversation needs follow_up to build its later turns")
                ids = follow_up(list(session.turns[:position]), answers[variant.name])
            if on_step:
                where = "warm-up" if repeat < 0 else f"repeat {repeat + 1}"
                on_step(f"{variant.label} · {step.prompt.id} · {where}")
            record = run(variant, ids, fresh=position == 1, prompt_id=step.prompt.id,
                         category=step.prompt.category, repeat=repeat,
                         session="" if alone else session.id, position=0 if alone else position)
            answers[variant.name].append(list(record.tokens))
            yield record


def iter_session_runs(run: RunOne, sessions: Sequence[Session], variants: Sequence[Variant], *,
                      repeats: int, warmup: int = 1, follow_up: FollowUp | None = None,
                      alone: bool = False, on_step: Callable[[str], None] | None = None,
                      more: Callable[[int], bool] | None = None) -> Iterator[RunRecord]:
    """Warm up on the first session (``warmup`` times, untimed), then every session of every repeat in
    :func:`schedule`'s order. After ``repeats``, ``more(done)`` decides each further repeat."""
    for _ in range(warmup if sessions else 0):
        for _record in run_session(run, sessions[0], variants, -1, follow_up=follow_up, alone=alone,
                                   on_step=on_step):
            pass
    order = [list(variants), list(reversed(variants))]
    for repeat in itertools.count():
        if repeat >= repeats and (more is None or not more(repeat)):
            return
        for session in sessions:
            yield from run_session(run, session, order[repeat % 2], repeat, follow_up=follow_up,
                                   alone=alone, on_step=on_step)


def run_count(n_prompts: int, n_variants: int, *, repeats: int, warmup: int,
              first_session: int = 1) -> int:
    """How many decodes a benchmark makes, warm-up included (for the progress bar)."""
    return n_variants * (warmup * first_session * (n_prompts > 0) + n_prompts * repeats)
