"""``self:skip=auto``: search for the layers to skip that maximise the predicted speedup.

SWIFT (Xia et al. 2024) finds the layers to skip on the fly, on the input
itself, by optimising the draft's speed against its agreement with the target.
This is a short, deterministic version of that idea, run once at load time on
the calibration text (the prompt and the target's own greedy continuation):

1. rank the layers: skip each inner layer alone (the first and the last are
   always kept) and score how well the view still predicts the target's tokens
   (mean log-probability of the target's argmax, one uncached forward each);
2. for k = 1 .. n/2, skip the k least harmful layers: measure the top-1
   agreement (one forward each) and price a draft step as the target's step
   less k layers' share (the per-layer cost from one timed view with n/2 layers
   skipped);
3. keep the k with the highest predicted speedup (``analysis.speedup``).

About 1.5 n forward passes over a ~100-token text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from analysis.speedup import CostModel, best_gamma
from selfdraft.calibrate import agreement, drafter_step_s
from selfdraft.skip import num_layers, skip_view


@dataclass(frozen=True)
class SkipSearch:
    """The search's result: the layers to skip, its prediction, and how many sets it tried."""

    layers: tuple[int, ...]
    predicted: float
    gamma: int
    agreement: float
    tried: int

    def line(self, total: int) -> str:
        return (f"self:skip=auto searched {self.tried} layer sets on the calibration text: skip "
                f"{len(self.layers)} of {total} layers ({','.join(map(str, self.layers))}), top-1 agreement "
                f"{self.agreement:.0%}, predicted {self.predicted:.2f}x at γ {self.gamma}")


@torch.inference_mode()
def layer_harm(target, ids: torch.Tensor, start: int) -> dict[int, float]:
    """For each inner layer: minus the mean log-probability the view without it gives the target's argmax."""
    want = target(input_ids=ids, use_cache=False).logits[0, start:].argmax(-1)          # (T,)
    harm = {}
    for layer in range(1, num_layers(target) - 1):
        logits = skip_view(target, [layer])(input_ids=ids, use_cache=False).logits[0, start:]
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, want[:, None])      # (T, 1)
        harm[layer] = float(-logp.mean())
    return harm


def search_skip(target, text_ids: torch.Tensor, start: int, verify_s: dict[int, float]) -> SkipSearch:
    """The layer set to skip (see the module docstring); ``text_ids`` (1, L), scored from ``start`` on."""
    n = num_layers(target)
    if n < 3:
        return SkipSearch((), 1.0, 0, 1.0, 0)
    harm = layer_harm(target, text_ids, start)
    order = sorted(harm, key=harm.get)
    half = max(1, min(len(order), n // 2))
    step_half = drafter_step_s(skip_view(target, order[:half]), text_ids[:, :start])
    per_layer = max(0.0, (verify_s[1] - step_half) / half)
    best = None
    for k in range(1, half + 1):
        layers = tuple(sorted(order[:k]))
        agree = agreement(target, skip_view(target, layers), text_ids, start)
        costs = CostModel(draft_step_s=max(verify_s[1] - k * per_layer, 1e-6), verify_s=dict(verify_s))
        gamma, speedup = best_gamma([agree], costs)
        if best is None or speedup > best.predicted:
            best = SkipSearch(layers, speedup, gamma, agree, 0)
    return SkipSearch(best.layers, best.predicted, best.gamma, best.agreement, len(harm) + half + 1)
