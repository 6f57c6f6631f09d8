"""``self:skip=auto``: search for the layers to skip that maximise the predicted speedup.

SWIFT (Xia et al. 2024) finds the layers to skip on the fly, on the input
itself, by optimising the draft's speed against its agreement with the target.
This is a short, deterministic version of that idea, run once at load time on
the calibration text (the prompt and the target's own greedy continuation):

1. rank the inner layers (the first and the last are always kept) by how
   little they change the hidden state they are given, 1 - cos(h_in, h_out)
   over the text's positions, from one forward of the target with hooks
   (ShortGPT's "block influence", Men et al. 2024): the least influential go first;
2. for k = 2, 4, ... up to n/2, skip the k least influential layers: measure
   the top-1 agreement with the target (one uncached forward each) and price a
   draft step as the target's step less k layers' share (the per-layer cost
   from one timed view with n/2 layers skipped);
3. keep the k with the highest predicted speedup at its best drafting γ
   (``analysis.speedup``), also where none beats target AR.

About n/4 + 2 forward passes over a ~100-token text.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from analysis.speedup import CostModel, best_drafting_gamma
from model_drafters.selfdraft.calibrate import agreement, paired_step_s
from model_drafters.selfdraft import decoder_layers, num_layers, skip_view


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
def block_influence(target, ids: torch.Tensor, start: int) -> dict[int, float]:
    """For each inner layer: 1 - cosine(input, output hidden state), averaged over positions from ``start``."""
    _, layers = decoder_layers(target)
    seen: dict[int, float] = {}

    def hook(index):
        def record(module, args, kwargs, output):
            hidden = (args[0] if args else kwargs["hidden_states"])[0, start:].float()      # (T, H)
            out = (output[0] if isinstance(output, tuple) else output)[0, start:].float()   # (T, H)
            seen[index] = float(1 - torch.nn.functional.cosine_similarity(hidden, out, dim=-1).mean())
        return record

    handles = [layers[i].register_forward_hook(hook(i), with_kwargs=True) for i in range(1, len(layers) - 1)]
    try:
        target(input_ids=ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def search_skip(target, text_ids: torch.Tensor, start: int, verify_s: dict[int, float]) -> SkipSearch:
    """The layer set to skip (see the module docstring); ``text_ids`` (1, L), scored from ``start`` on."""
    n = num_layers(target)
    if n < 3:
        return SkipSearch((), 1.0, 0, 1.0, 0)
    influence = block_influence(target, text_ids, start)
    order = sorted(influence, key=influence.get)
    half = max(1, min(len(order), n // 2))
    # The per-layer share from one view with n/2 layers skipped, timed in turn
    # with the target (a load that drifts since verify_s was taken cancels).
    step_half, target_step = paired_step_s(skip_view(target, order[:half]), target, text_ids[:, :start])
    per_layer = max(0.0, verify_s[1] * (1 - step_half / target_step) / half)
    best = None
    sizes = sorted(set(range(2, half + 1, 2)) | {1, half})
    for k in sizes:
        layers = tuple(sorted(order[:k]))
        agree = agreement(target, skip_view(target, layers), text_ids, start)
        costs = CostModel(draft_step_s=max(verify_s[1] - k * per_layer, 1e-6), verify_s=dict(verify_s))
        # Ranked at the best γ >= 1: where no set pays, the one that loses least
        # (not the first tried, as a tie at γ 0 would give).
        gamma, speedup = best_drafting_gamma([agree], costs)
        if best is None or speedup > best.predicted:
            best = SkipSearch(layers, speedup, gamma, agree, 0)
    return SkipSearch(best.layers, best.predicted, best.gamma, best.agreement, len(sizes))
