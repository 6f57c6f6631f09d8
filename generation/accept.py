"""The speculative accept/resample rule, on whole tensors.

Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023: draft token x_i,
drawn from q_i, is accepted with probability min(1, p_i(x_i) / q_i(x_i)); at the
first rejected position the token is resampled from norm(max(0, p_i - q_i));
when every draft is accepted one more token is drawn from p_{k}.

Deterministic drafts (an n-gram storage) are the special case q_i = one-hot(x_i):
accept with probability p_i(x_i), and on rejection sample from p_i with x_i
removed and renormalised. Both keep the output distribution exactly p.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Sampler = Callable[[torch.Tensor, "torch.Generator | None"], torch.Tensor]


def residual_distributions(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p_i - q_i)) for each drafted position.

    p: (k, V) target probabilities at the drafted positions; q: (k, V) draft
    probabilities, or None for deterministic drafts (q_i = one-hot(draft_i));
    draft: (k,). Returns (k, V). A row whose residual has no mass (p_i == q_i,
    where rejection cannot happen) falls back to p_i.
    """
    if q is None:
        residual = p.scatter(-1, draft.unsqueeze(-1), 0.0)
    else:
        residual = (p - q).clamp_(min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(p.dtype).tiny), p)


def accept_drafts(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft: torch.Tensor,
    sample: Sampler,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify k drafts against the target; return (n_accepted, next_token) as 0-d tensors.

    p: (k + 1, V) target probabilities; row i is the distribution of the token
    after the first i drafts (row k is for the bonus token).
    q: (k, V) draft probabilities, or None for deterministic drafts.
    draft: (k,) drafted ids. ``sample`` draws one id per row of a (rows, V) tensor.

    Nothing here leaves the device: the caller pays one host sync per round.
    """
    k = draft.shape[0]
    rows = torch.arange(k, device=draft.device)
    p_x = p[rows, draft]                                  # (k,)
    q_x = torch.ones_like(p_x) if q is None else q[rows, draft]
    u = torch.rand(k, generator=generator, device=p.device, dtype=p.dtype)
    accepted = u * q_x < p_x                              # u < p/q without dividing by q
    n = accepted.to(torch.long).cumprod(dim=0).sum()      # length of the accepted prefix
    # One candidate per position: residual draws at 0..k-1, a plain draw from p_k.
    candidates = torch.cat([residual_distributions(p[:k], q, draft), p[k:]], dim=0)  # (k+1, V)
    tokens = sample(candidates, generator)                # (k+1,)
    return n, tokens[n]
