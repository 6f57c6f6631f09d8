"""What a drafting run would gain at another batch size: its own rounds, priced by shape.

Acceptance does not change with the load; the price of a forward does. At batch size B every
sequence runs the same rounds in lockstep, so

    speedup(B) = tokens per round x T(B, 1) / (sum over widths w of share(w) T(B, w) + f D(B))

with T the target's forward by shape (``engine.shapes``), f the drafter forwards per round and D the
drafter's forward at B (timed by shape, scaled as the target's step for a self-drafter, paid per
sequence for a storage). Sampling and host work are left out of both sides. No torch. Also the
``--whatif`` flag's values (:func:`whatif_choice`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class RoundFacts:
    """What a run's rounds did: ``tokens_per_round``, the share of rounds by verify ``widths``,
    ``drafter_steps`` (drafter forwards per round, 0 for a storage), ``draft_s`` (its drafting
    seconds per round at batch 1)."""

    tokens_per_round: float
    widths: dict[int, float]
    drafter_steps: float
    draft_s: float


def facts_of(result, rounds=None) -> RoundFacts | None:
    """The rounds of a finished drafting run (``GenerationResult``) after its first (which carries
    the prefill), or those of them given (``rounds``); None when there are none."""
    rounds = list(result.trace or [])[1:] if rounds is None else list(rounds)
    if not rounds:
        return None
    widths: dict[int, float] = {}
    for r in rounds:
        width = (len(r.tree_tokens) if r.tree_tokens else len(r.drafted)) + 1
        widths[width] = widths.get(width, 0.0) + 1 / len(rounds)
    tokens = sum(r.accepted + (r.token is not None) for r in rounds) / len(rounds)
    steps = max(0, result.drafter_calls) / max(1, result.rounds or len(result.trace))
    return RoundFacts(tokens, widths, steps, sum(r.draft_s for r in rounds) / len(rounds))


MIN_ROUNDS = 4      # rounds near a context that speak for its acceptance (fewer: the run's own is held)
CONTEXTS = (128, 512, 2048, 8192, 32768)     # the contexts projected, up to the model's window


def nearest_context(contexts: Sequence[int], position: int) -> int:
    """The context of ``contexts`` nearest a round at ``position`` (the tokens before it), on a log scale."""
    import math

    return min(contexts, key=lambda c: abs(math.log(c / max(position, 1))))


def contexts_within(context_length: int | None, widest: int, own: int) -> list[int]:
    """The contexts a projection over context length prices: each of :data:`CONTEXTS` that leaves room
    in the model's window (``context_length``; the last of them where it has none) for the widest
    verify, and ``own``."""
    window = (context_length or CONTEXTS[-1]) - widest
    return sorted({own} | {c for c in CONTEXTS if c <= window})


def project_contexts(facts: RoundFacts, near: dict[int, RoundFacts | None], own: int,
                     target: dict[int, dict[tuple[int, int], float]],
                     drafter: dict[int, dict[tuple[int, int], float] | None] | None = None,
                     on_target_weights: bool = False, fixed_s: float = 0.0,
                     scaled_source: str | None = None, drafter_steps: dict[int, float] | None = None) -> Projection:
    """One method's rounds at batch 1 over the contexts of ``target`` ({L: {(B, w): seconds}} timed
    over a cache of L): at each L the rounds that ran near it (``near[L]``), else ``facts`` (all of
    them); a drafter model of its own priced by ``drafter[L]`` where it was timed; a drafter on the
    target's weights (``on_target_weights``) stepping as the target's step scales from ``own``'s, its
    drafting seconds less ``fixed_s`` (look-ups, which do not) scaled so; a storage's look-ups as
    they were. ``scaled_source``: the drafter cost's label where it was scaled so. ``drafter_steps``
    ({L: seconds}, every context and ``own`` in it): such a drafter's own step timed at each context,
    which its drafting scales with instead of the target's step."""
    contexts = sorted(target)
    speedups, source = [], ""
    for c in contexts:
        at = near.get(c) or facts
        mine = drafter.get(c) if drafter else None
        scaled = on_target_weights and mine is None
        if scaled:
            ratio = (drafter_steps[c] / drafter_steps[own] if drafter_steps
                     else target[c][(1, 1)] / target[own][(1, 1)])
            at = replace(at, draft_s=(at.draft_s - fixed_s) * ratio + fixed_s)
        p = project(at, lambda b, w, c=c: target[c][(b, w)], (1,),
                    drafter_s=None if mine is None else (lambda b, mine=mine: mine[(b, 1)]), scaled_step=scaled)
        speedups.append(p.speedups[0])
        source = scaled_source if scaled and scaled_source else p.drafter_source
    return Projection(tuple(contexts), tuple(speedups), source)


def facts_by_context(result, prompt: int, contexts: Sequence[int]) -> dict[int, RoundFacts | None]:
    """The run's rounds after its first, split by where they ran: each round goes to the context of
    ``contexts`` nearest its own position (the prompt and the tokens before it, on a log scale);
    a context with fewer than :data:`MIN_ROUNDS` rounds gets None (its acceptance was not seen)."""
    near: dict[int, list] = {c: [] for c in contexts}
    position = prompt + sum(r.accepted + (r.token is not None) for r in list(result.trace or [])[:1])
    for r in list(result.trace or [])[1:]:
        near[nearest_context(contexts, position)].append(r)
        position += r.accepted + (r.token is not None)
    return {c: facts_of(result, rounds) if len(rounds) >= MIN_ROUNDS else None for c, rounds in near.items()}


@dataclass(frozen=True)
class Projection:
    """A run's projected speedup over target AR at each batch size, and the first batch size where
    speculation stops paying (speedup below 1; None within the batches projected)."""

    batches: tuple[int, ...]
    speedups: tuple[float, ...]
    drafter_source: str

    @property
    def stops_paying(self) -> int | None:
        return next((b for b, s in zip(self.batches, self.speedups) if s < 1.0), None)

    def to_dict(self) -> dict:
        return {"batches": list(self.batches), "speedups": list(self.speedups),
                "stops_paying_at": self.stops_paying, "drafter_cost": self.drafter_source}


def project(facts: RoundFacts, target_s: Callable[[int, int], float], batches: Sequence[int],
            drafter_s: Callable[[int], float] | None = None, scaled_step: bool = True,
            drafter_source: str = "timed by shape") -> Projection:
    """``facts`` priced at each batch size. ``target_s(B, w)``: the target's forward; ``drafter_s(B)``:
    the drafter's forward at width 1, where it was timed by shape. Without it the run's own drafting
    seconds per round are scaled as the target's step scales from batch 1 (``scaled_step``: a
    drafter that is the target's weights) or paid once per sequence (a storage's look-ups)."""
    speedups = []
    source = (drafter_source if drafter_s is not None else "the run's drafting scaled as the target's step"
              if scaled_step else "the run's look-ups, once per sequence")
    for batch in batches:
        verify = sum(share * target_s(batch, width) for width, share in facts.widths.items())
        if drafter_s is not None:
            draft = facts.drafter_steps * drafter_s(batch)
        elif scaled_step:
            draft = facts.draft_s * target_s(batch, 1) / target_s(1, 1)
        else:
            draft = facts.draft_s * batch
        speedups.append(facts.tokens_per_round * target_s(batch, 1) / (verify + draft))
    return Projection(tuple(batches), tuple(speedups), source)


def whatif_choice(text: str) -> str:
    """``--whatif``'s value checked: ``batch``, ``context``, or ``machine:NAME`` (``machine=NAME``) with
    NAME a profile of ``analysis.roofline.PROFILES`` (returned under its own name). ``ValueError``, one
    line, for anything else."""
    from analysis.roofline import PROFILES, profile_named

    word, sep, name = text.strip().partition(":")
    if not sep:
        word, sep, name = text.strip().partition("=")
    word = word.strip().lower()
    if word in ("batch", "context") and not sep:
        return word
    if word == "machine":
        if not name.strip():
            raise ValueError(f"name one machine: --whatif machine:NAME (one of {', '.join(PROFILES)})")
        return f"machine:{profile_named(name.strip()).name}"
    raise ValueError(f"--whatif takes batch, context or machine:NAME (NAME one of {', '.join(PROFILES)}), got {text!r}")


def whatif_argument(text: str) -> str:
    """:func:`whatif_choice` as an argparse ``type``: its one line as the flag's error."""
    import argparse

    try:
        return whatif_choice(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
