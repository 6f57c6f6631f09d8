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


def pick(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``values[index]`` for a 0-d index tensor, on the device: indexing with a tensor
    would read the index back to the host (a sync). values: (m,) -> 0-d."""
    return values.gather(0, index.view(1)).squeeze(0)


def residual_distributions(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p_i - q_i)) for each drafted position: (k, V).

    p: (k, V); q: (k, V), or None for deterministic drafts (one-hot); draft: (k,). A row with no
    residual mass (p_i == q_i, where rejection cannot happen) falls back to p_i.
    """
    if q is None:
        residual = p.scatter(-1, draft.unsqueeze(-1), 0.0)
    else:
        residual = (p - q).clamp_(min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(p.dtype).tiny), p)


def uniforms(k: int, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """k independent U[0, 1) coins on ``like``'s device and dtype: (k,). Every chain rule draws here,
    so a test can substitute known coins (tests/test_verify_rules.py)."""
    return torch.rand(k, generator=generator, device=like.device, dtype=like.dtype)


def accept_drafts(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft: torch.Tensor,
    sample: Sampler,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify k drafts against the target: (n_accepted, next_token) as 0-d tensors; shapes and
    contract as ``generation.verify_rules``'s."""
    k = draft.shape[0]
    rows = torch.arange(k, device=draft.device)
    p_x = p[rows, draft]                                  # (k,)
    q_x = torch.ones_like(p_x) if q is None else q[rows, draft]
    u = uniforms(k, p, generator)                         # (k,)
    accepted = u * q_x < p_x                              # u < p/q without dividing by q
    n = accepted.to(torch.long).cumprod(dim=0).sum()      # length of the accepted prefix
    # One candidate per position: residual draws at 0..k-1, a plain draw from p_k.
    candidates = torch.cat([residual_distributions(p[:k], q, draft), p[k:]], dim=0)  # (k+1, V)
    tokens = sample(candidates, generator)                # (k+1,)
    return n, pick(tokens, n)


def accept_tree(
    p: torch.Tensor,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    ancestors: torch.Tensor,
    sample: Sampler,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify a token tree; return (accepted depth, deepest accepted node or -1, next token).

    p: (n + 1, V), row 0 the root's, row 1 + i node i's. tokens, parents: (n,) (-1: the root).
    ancestors: (n, n) bool, [i, j] when j is i or above it.

    The target's token is drawn at every node; the walk follows the child equal to the draw and stops
    at the first draw no child carries, which is the round's token. Each token is drawn from p given
    the path, so the output follows p for any tree independent of the draws (SpecInfer's naive
    multi-candidate verification; Miao et al. 2024). Siblings carry distinct tokens. On the device.
    """
    draws = sample(p, generator)                                   # (n + 1,)
    if tokens.numel() == 0:
        none = torch.zeros((), dtype=torch.long, device=p.device)
        return none, none - 1, draws[0]
    match = draws[parents + 1] == tokens                           # (n,) node i is the draw at its parent
    on_path = ~(ancestors & ~match.view(1, -1)).any(dim=-1)        # (n,) every node down to i matched
    depth = ancestors.sum(dim=-1)                                  # (n,) 1 + depth
    score = torch.where(on_path, depth, torch.zeros_like(depth))
    accepted = score.max()
    deepest = torch.where(accepted > 0, score.argmax(), accepted.new_tensor(-1))
    return accepted, deepest, pick(draws, deepest + 1)


def accept_tree_rrs(
    p: torch.Tensor,
    q: torch.Tensor,
    tree,
    sample: Sampler,
    generator: torch.Generator | None = None,
) -> tuple[int, int, int]:
    """Verify a sampled token tree by recursive rejection sampling; return (accepted depth, deepest
    accepted node, next token) as ints.

    p, q: (n + 1, V), row 0 the root's. ``tree``: each node's children drawn from its q *without
    replacement*, in rank order (``generation.tree_draft.sample_tree``). At each node, with r = p and
    q' = q, child t is kept with probability min(1, r(t) / q'(t)); on a rejection r becomes
    norm(max(0, r - q')) and q' loses t (renormalised); every child rejected: draw from r (below a
    leaf, from p). So each depth follows p exactly (Jeon et al. 2024; SpecInfer, Miao et al. 2024),
    and a second child is tried where the first was rejected. Several small host syncs per round.
    """
    node, depth = -1, 0
    while True:
        kids = tree.children(node)
        r = p[node + 1]
        if not kids:
            return depth, node, int(sample(r.view(1, -1), generator)[0])
        q_left = q[node + 1].clone()
        kept = None
        for child in kids:
            token = tree.tokens[child]
            ratio = (r[token] / q_left[token]).clamp(max=1.0)
            u = torch.rand((), generator=generator, device=p.device)
            if bool(u < ratio):
                kept = child
                break
            residual = (r - q_left).clamp(min=0.0)
            total = residual.sum()
            # r == q' leaves nothing: then the child was kept with probability 1 (never here).
            r = residual / total if bool(total > 0) else r
            q_left[token] = 0.0
            left = q_left.sum()
            if bool(left > 0):
                q_left = q_left / left
        if kept is None:
            return depth, node, int(sample(r.view(1, -1), generator)[0])
        node, depth = kept, depth + 1
