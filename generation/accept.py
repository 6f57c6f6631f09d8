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


def uniforms(k: int, like: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """k independent U[0, 1) coins on ``like``'s device and dtype: (k,).

    Every chain rule draws its coins here, so a test can put known coins in
    their place and integrate over them exactly (tests/test_verify_rules.py).
    """
    return torch.rand(k, generator=generator, device=like.device, dtype=like.dtype)


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
    """Verify a token tree; return (accepted depth, deepest accepted node, next token).

    p: (n + 1, V) target probabilities; row 0 is the root's (the last committed
    token), row 1 + i node i's. tokens, parents: (n,) the nodes' ids and parent
    nodes (-1: the root). ancestors: (n, n) bool, [i, j] when j is i or above it.
    The deepest node is -1 when nothing was accepted.

    The rule draws the target's own token at every node, then walks down from
    the root following the child equal to the draw, and stops at the first
    draw no child carries: that draw is the round's token. Along the walk each
    token is drawn from p given the path so far, so the output is distributed
    exactly as p for any tree that does not depend on the draws (SpecInfer's
    "naive" multi-candidate verification; Miao et al. 2024). Under greedy the
    draw is the argmax: the longest path of argmaxes, plus the target's next
    token. Siblings must carry distinct tokens, so at most one child matches.
    Nothing leaves the device.
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
    """Verify a sampled token tree by recursive rejection sampling; return
    (accepted depth, deepest accepted node, next token) as ints.

    p, q: (n + 1, V) target and draft probabilities; row 0 is the root's, row
    1 + i node i's (q only matters at nodes with children). ``tree``: a
    ``generation.tree.Tree`` whose children of each node were drawn from that
    node's q *without replacement*, in rank order (``generation.tree_draft.sample_tree``).

    At each node, starting from the root, with r = p and q' = q: the children are
    tried in the order they were drawn; child t is kept with probability
    min(1, r(t) / q'(t)), and the walk goes on below it; on a rejection
    r becomes norm(max(0, r - q')) and q' loses t (renormalised), as the next
    child was drawn from q without the ones before it. When every child is
    rejected the next token is drawn from r; below a leaf, from p. Each step is
    standard speculative sampling with the residual carried over, so the token
    at each depth follows p exactly (multi-draft speculative sampling: Jeon et
    al. 2024; SpecInfer, Miao et al. 2024), and a second child is tried where
    the first was rejected, which the draw-and-follow rule of :func:`accept_tree`
    cannot do with children drawn at random. Several small host syncs per round.
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
