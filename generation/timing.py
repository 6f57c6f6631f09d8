"""Timing a target's forward passes on this machine: its one-token step, its verify by width, its prefill.

``time_target`` is what the width-filling costs (``engine.widths``), the self-drafter choice
(``model_drafters.selfdraft.calibrate``) and the replay scripts read a target's forward costs from. Every timer
waits for the model's device on both sides (``generation.common.device_clock``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from generation.common import device_clock
from kvcache.probe import cached_model
from utils.devices import model_device

# Width 4 is timed, not interpolated: on a CPU the BLAS changes kernels there (float32
# SmolLM2-135M, 2 threads: 1.15 target steps for 3 tokens, 1.52 for 4, 1.56 for 5).
VERIFY_WIDTHS = (1, 2, 3, 4, 5, 9)
REPEATS = 5


@dataclass
class TargetTiming:
    """Seconds of the target's forwards: ``verify_s`` by width (1 = a plain decode step) and the prefill;
    ``step_samples``: each turn's one-token step (their spread goes into a prediction's interval)."""

    verify_s: dict[int, float]
    prefill_s: float
    prompt_tokens: int
    step_samples: tuple[float, ...] = ()

    def to_dict(self) -> dict:
        return {"verify_s": {str(k): v for k, v in self.verify_s.items()}, "prefill_s": self.prefill_s,
                "prompt_tokens": self.prompt_tokens}

    @classmethod
    def from_dict(cls, data: dict) -> "TargetTiming":
        return cls({int(k): float(v) for k, v in data["verify_s"].items()}, float(data["prefill_s"]),
                   int(data["prompt_tokens"]))


def timed(fn, model) -> float:
    """Seconds of ``fn()``, read after ``model``'s device finished its queued work on both sides
    (a CUDA forward returns before it has run: unsynced, the clock times the launch)."""
    device = model_device(model)
    start = device_clock(device)
    fn()
    return device_clock(device) - start


@torch.inference_mode()
def time_target(target, ids: torch.Tensor, widths=VERIFY_WIDTHS, repeats: int = REPEATS, *,
                bracketed: bool = False) -> TargetTiming:
    """Seconds of the target's forward over ``w`` new tokens on a cache holding ``ids``, per width: each
    width's median ratio to the same turn's one-token step, times the median step, so a load that
    comes and goes moves the step, not the ratios the speedup model rests on.

    ``bracketed``: a one-token step is timed before the first width and after every width, and each
    width's ratio is to the mean of the two steps beside it rather than to the turn's one step. On a
    shared CPU a quiet or a busy spell lasts a few forwards; a ratio whose step was timed a whole turn
    away takes it in (one width's ratio ranged 1.28-1.68 between tables timed in one process, 1.34-1.42
    bracketed: docs/results.md). One more forward a width."""
    cached = cached_model(target)
    cached.begin(ids[0].tolist())
    prefill = timed(lambda: cached.forward(ids, keep=1), target)
    base = ids.shape[1]
    extra = ids[:, -1:].repeat(1, max(widths))

    def forward(width: int) -> float:
        cached.checkpoint()
        seconds = timed(lambda: cached.forward(torch.cat([ids, extra[:, :width]], dim=1), keep=width), target)
        cached.rollback(base)
        return seconds

    wider = sorted(set(widths) - {1})
    steps, ratios = [], {w: [] for w in wider}
    for turn in range(repeats + 1):                           # the first turn warms up
        if bracketed:
            around = [forward(1)]
            spans = {}
            for width in wider:
                spans[width] = forward(width)
                around.append(forward(1))
            turn_ratios = {w: spans[w] / ((around[i] + around[i + 1]) / 2) for i, w in enumerate(wider)}
            step_here = statistics.median(around)
        else:
            step_here = forward(1)
            turn_ratios = {w: forward(w) / step_here for w in wider}
        if turn:
            steps.append(step_here)
            for w, r in turn_ratios.items():
                ratios[w].append(r)
    step = statistics.median(steps)
    verify = {1: step, **{w: step * statistics.median(r) for w, r in ratios.items()}}
    return TargetTiming(dict(sorted(verify.items())), prefill, base, tuple(steps))
