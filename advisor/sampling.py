"""Under sampling: a drafter model's acceptance estimated from the target's and its distributions.

With the rejection rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023) a draft
from q is kept with probability α = Σ_x min(p(x), q(x)), both under the session's processor. A
round from position t then makes 1 + Σ_{i=1..γ} Π_{j<i} α_{t+j} tokens, averaged over every start
along target AR's greedy path, and priced with the greedy advice's cost model. An estimate: a
sampled run walks its own path. Only a drafter model with a forward of its own is estimated; the
others are left out with the reason.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

@dataclass
class SamplingEstimate:
    """One chain's estimate under sampling: ``alpha`` the mean overlap along the path, ``rates``
    the chance of keeping each draft position (all the earlier ones kept), ``tokens_per_call``
    and the ``predicted_speedup`` (steady state) priced from them."""

    alpha: float
    rates: list[float]
    tokens_per_call: float
    predicted_speedup: float

    def to_dict(self) -> dict:
        return {"alpha": round(self.alpha, 4), "rates": [round(r, 4) for r in self.rates],
                "tokens_per_call": round(self.tokens_per_call, 4),
                "predicted_speedup": round(self.predicted_speedup, 4), "estimate": True}


def refusal(pair) -> str | None:
    """Why the pair's drafter cannot be estimated under sampling (one line), or None."""
    from engine.kinds import kind_of_pair

    if pair.drafter is None:
        return "the pair has no drafter model"
    kind = kind_of_pair(pair)
    if kind is not None and kind.rows is not None:
        return f"a {kind.name} drafter {kind.rows}"
    return None


def overlaps(pair, processor, prompt: Sequence[int], output: Sequence[int], vocab_size: int | None) -> list[float]:
    """Per output position, Σ_x min(p(x), q(x)) of the target's and the drafter's distributions
    under ``processor``, given the prompt and the output before it."""
    if not output:
        return []
    from advisor.teacher import rows_along

    p = processor(rows_along(pair.target, prompt, output, vocab_size).float())
    q = processor(rows_along(pair.drafter, prompt, output, vocab_size).float().to(p.device))
    width = min(p.shape[-1], q.shape[-1])
    return torch.minimum(p[:, :width], q[:, :width]).sum(dim=-1).clamp(0.0, 1.0).tolist()


def chain_tokens(alphas: Sequence[Sequence[float]], gamma: int) -> tuple[float, list[float]]:
    """(tokens per round, the chance of keeping each draft position) for rounds of ``gamma``
    drafts starting anywhere along each path of overlaps ``alphas``: a round from t keeps draft i
    with the product of the overlaps at t..t+i-1, and makes one token more than it keeps (the
    target's own); positions past a path's end keep nothing."""
    starts, kept = 0, [0.0] * gamma
    for path in alphas:
        for t in range(len(path)):
            chance = 1.0
            for i in range(gamma):
                chance *= path[t + i] if t + i < len(path) else 0.0
                kept[i] += chance
            starts += 1
    if not starts:
        return 1.0, [0.0] * gamma
    rates = [k / starts for k in kept]
    return 1.0 + sum(rates), rates


def estimate_chains(pair, processor, recorded, ranked, costs, step: float | None, vocab_size: int | None) -> str:
    """Fill ``sampling`` on each ranked advice that is a chain of the pair's drafter model at a
    constant γ (``advisor.rank.Advice``); returns "" or why nothing was estimated (one line)."""
    from advisor.rank import price_chain

    chains = [a for a in ranked if a.entry is not None and _plain_chain(a.entry.method)]
    if not chains:
        return ""
    reason = refusal(pair)
    if reason is not None:
        return f"no estimate under sampling: {reason}"
    try:
        alphas = [overlaps(pair, processor, r.prompt, r.output, vocab_size) for r in recorded]
    except Exception as e:          # a drafter module that cannot run alone: the greedy advice stands
        return f"no estimate under sampling: the drafter's forward failed ({type(e).__name__}: {e})"
    flat = [a for path in alphas for a in path]
    alpha = sum(flat) / len(flat) if flat else 0.0
    for advice in chains:
        gamma = advice.entry.method.gamma
        tokens, rates = chain_tokens(alphas, gamma)
        advice.sampling = SamplingEstimate(alpha, rates, tokens, price_chain(gamma, tokens, costs, step))
    return ""


def _plain_chain(method) -> bool:
    return method.drafter == "model" and method.options is None and method.tree == 0 \
        and method.gamma_policy == "constant"
