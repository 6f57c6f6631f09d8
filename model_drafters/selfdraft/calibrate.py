"""Measure a target and its self-drafters on this machine: forward timings and acceptance.

What the default-drafter choice (``model_drafters.selfdraft.choose``) rests on:

- the target's one-token step, its verify cost at a few widths (tokens fed at
  once) and its prefill, each the median of a few forward passes on a cache
  holding a short calibration text (``generation.timing.time_target``);
- for each self-drafter, a short greedy speculative run on the calibration
  prompt through the real engine (shared cache included; the engine hands its
  loader a :data:`Decode`, ``engine.run.greedy_run``): its acceptance by
  draft position, its seconds per draft step and the host seconds per round,
  read from the run's rounds by ``analysis`` (``measure_drafter``);
- a top-1 agreement on a text (teacher-forced, one uncached forward each):
  the cheap score the layer-skip search ranks candidates by.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from analysis.acceptance import position_counts, verify_width
from analysis.speedup import costs_from_result
from generation.result import GenerationResult
from generation.timing import REPEATS, timed
from kvcache.cache import CachedModel
from utils.vocab import encode_prompt

CALIBRATION_TEXT = ("Explain in a few sentences how the gears of a bicycle work, and why a cyclist "
                    "changes gear before climbing a steep hill.")
CALIBRATION_TOKENS = 48     # greedy tokens of the target's own continuation (the skip search's text)
# Greedy tokens of each drafter's speculative run: about 30 rounds at γ 4, so a
# position's acceptance rests on some 30 verdicts (48 tokens gave a dozen, and
# the pick between two int8 routes turned on one of them).
DRAFT_RUN_TOKENS = 128

# ``decode(target, drafter, prompt_ids, tokens, gamma)``: a greedy run of ``tokens`` tokens through
# the engine's one way in, target AR where ``drafter`` is None, else speculative decoding at ``gamma``
# with it. The engine passes its own to a kind's loader (``engine.run.greedy_run``): measuring
# decodes, and decoding is the engine's.
Decode = Callable[[object, object, list, int, int], GenerationResult]


def calibration_ids(tokenizer) -> torch.Tensor:
    """The calibration prompt through the chat template, (1, L)."""
    return torch.tensor([encode_prompt(tokenizer, CALIBRATION_TEXT)], dtype=torch.long)


@dataclass
class DrafterMeasure:
    """One self-drafter measured by a short greedy speculative run.

    ``rates``: acceptance by draft position (``smoothed_rates``); ``draft_step_s``: seconds per drafted
    token (the first round, which holds the prefill, left out); ``other_s``: host
    seconds per round (both scaled by ``load_scale``, see :func:`load_scale`); ``cache``: how it read the committed tokens ("shared" or
    "crop"/"restore": a cache of its own). ``skipped``: when the run was not made,
    why (a number).
    """

    label: str
    rates: list[float] = field(default_factory=list)
    draft_step_s: float = 0.0
    other_s: float = 0.0
    cache: str = ""
    build_s: float = 0.0
    skipped: str = ""
    load_scale: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


@torch.inference_mode()
def step_s(model, ids: torch.Tensor, repeats: int = REPEATS) -> float:
    """Median seconds of one-token forwards of ``model`` on a cache holding ``ids`` (its own cache)."""
    cached = CachedModel(model, path="cached")             # a step on a cache, as a self-drafter drafts
    cached.begin(ids[0].tolist())
    cached.forward(ids, keep=1)
    seq, times = ids, []
    for _ in range(repeats + 1):
        seq = torch.cat([seq, ids[:, -1:]], dim=1)
        times.append(timed(lambda: cached.forward(seq, keep=1), model))
    return statistics.median(times[1:])


@torch.inference_mode()
def paired_step_s(drafter, target, ids: torch.Tensor, repeats: int = REPEATS) -> tuple[float, float]:
    """(drafter step, target step): median seconds of one-token forwards of each,
    taken in turn (drafter, target, drafter, ...) on caches holding ``ids``.

    Interleaved, the two share whatever else the machine is doing at the time,
    so their ratio holds when the load drifts between one measurement and the next.
    """
    # Timed on a cache whatever the probe said of the drafter's own cached
    # forward: a self-drafter drafts on the target's cache (a dynamic int8
    # copy's own cache runs uncached, which would time a whole-prompt forward).
    models = [CachedModel(drafter, path="cached"), CachedModel(target, path="cached")]
    seqs = [ids, ids]
    for cached in models:
        cached.begin(ids[0].tolist())
        cached.forward(ids, keep=1)
    times: list[list[float]] = [[], []]
    for _ in range(repeats + 1):                              # the first pair warms up
        for i, cached in enumerate(models):
            seqs[i] = torch.cat([seqs[i], ids[:, -1:]], dim=1)
            times[i].append(timed(lambda: cached.forward(seqs[i], keep=1), cached.model))
    return statistics.median(times[0][1:]), statistics.median(times[1][1:])


def smoothed_rates(rounds) -> list[float]:
    """Acceptance by draft position by Laplace's rule of succession: (accepted + 1) / (judged + 2).

    A calibration run judges each position some 30 times. A drafter that passed
    all of them is not taken as one that is never rejected: with a rate of 1 the
    speedup model would put its best γ at the largest one it tries (on the
    default model a weight-only int8 copy passed all of a 48-token run's dozen,
    and was accepted 93% of the time on the built-in prompts).
    """
    return [(passed + 1) / (judged + 2) for passed, judged in position_counts(rounds) if judged]


def load_scale(rounds, reference: dict[int, float]) -> float:
    """How much faster the machine was when ``reference`` (the target's verify
    seconds by width) was timed than during ``rounds``: the median, over the
    rounds whose verify width ``reference`` holds, of reference / that round's
    verify seconds. 1.0 when no round can be compared.

    Every round drafts and then verifies, so its verify time is a target timing
    taken under the same load as its drafts: scaling the run's costs by this
    brings them to the conditions ``reference`` was measured in.
    """
    ratios = [reference[w] / rnd.verify_s for rnd in rounds
              if (w := verify_width(rnd)) in reference and rnd.verify_s > 0]
    return statistics.median(ratios) if ratios else 1.0


def measure_drafter(decode: Decode, label: str, drafter, target, ids: torch.Tensor, *, gamma: int = 4,
                    tokens: int = DRAFT_RUN_TOKENS, reference: dict[int, float] | None = None) -> DrafterMeasure:
    """Acceptance and costs of ``drafter`` from a greedy speculative run of ``tokens`` tokens.

    With ``reference`` (the target's verify seconds by width, ``time_target``),
    the costs are scaled by :func:`load_scale` to the load ``reference`` was
    measured under, so candidates measured at different times compare fairly.
    """
    result = decode(target, drafter, ids[0].tolist(), tokens, gamma)
    costs = costs_from_result(result)
    rounds = result.trace[1:] if len(result.trace) > 1 else result.trace
    scale = load_scale(rounds, reference) if reference else 1.0
    return DrafterMeasure(
        label=label,
        rates=[round(r, 4) for r in smoothed_rates(rounds)],
        draft_step_s=costs.draft_step_s * scale if costs else 0.0,
        other_s=costs.other_per_round_s * scale if costs else 0.0,
        cache=(result.rollback.get("drafter") or {}).get("method", ""),
        load_scale=round(scale, 4),
    )


@torch.inference_mode()
def agreement(target, drafter, ids: torch.Tensor, start: int = 0) -> float:
    """Share of positions from ``start`` on where the drafter's argmax equals the target's (uncached)."""
    want = target(input_ids=ids, use_cache=False).logits[0, start:].argmax(-1)
    got = drafter(input_ids=ids, use_cache=False).logits[0, start:].argmax(-1)
    return float((want == got).float().mean())


@torch.inference_mode()
def greedy_continuation(decode: Decode, target, ids: torch.Tensor, tokens: int = CALIBRATION_TOKENS) -> torch.Tensor:
    """``ids`` followed by the target's own greedy continuation, (1, L + tokens)."""
    out = decode(target, None, ids[0].tolist(), tokens, 0)
    return torch.cat([ids, torch.tensor([out.tokens], dtype=torch.long)], dim=1)
