"""The chain verify rules, by name: residual (token by token), block, strict.

Every rule has the signature of :func:`generation.accept.accept_drafts`::

    rule(p, q, draft, sample, generator=None) -> (n, token)

p: (k + 1, V) target probabilities (row k is for the bonus token). q: (k, V) draft probabilities,
or None for deterministic drafts (one-hot). draft: (k,) drafted ids, with q_i(draft_i) > 0.
``sample(rows, generator)`` draws one id per row. Returns two 0-d long tensors on p's device: n
drafts kept and the token after them. Nothing leaves the device: the caller pays the one host
sync per round.

All three keep the target's distribution exactly, for any q; under greedy (one-hot p) they return
the same (n, token), and :func:`on_greedy_columns` runs a rule there on the few columns that carry
p's mass or a draft instead of the whole vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from generation import accept
from generation.accept import Sampler, accept_drafts
from generation.verify_names import VERIFY_RULE_NAMES

Rule = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _draft_rows(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor) -> torch.Tensor:
    """q itself, or one-hot(draft) rows in p's dtype for a deterministic drafter: (k, V)."""
    if q is not None:
        return q
    one_hot = torch.zeros(draft.shape[0], p.shape[-1], device=p.device, dtype=p.dtype)
    return one_hot.scatter_(-1, draft.unsqueeze(-1), 1.0)


def _running_ratios(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """b_i = min(1, b_{i-1} * p_i(x_i) / q_i(x_i)) for i = 1..k, with b_0 = 1: (k,).

    p_x, q_x: (k,). The clipped running product is a walk reflected below 0 in log space,
    log b_i = S_i - max_{0<=j<=i} S_j (S_j the sum of the first j log ratios), so a cumsum and a
    cummax replace the loop over positions. p_x = 0 gives b = 0 from there on.
    """
    log_ratio = p_x.log() - q_x.log()                                        # (k,)
    walk = torch.cat([log_ratio.new_zeros(1), log_ratio.cumsum(dim=0)])     # (k+1,) S_0..S_k
    return (walk - walk.cummax(dim=0).values)[1:].exp()


def _scaled_residuals(p: torch.Tensor, q: torch.Tensor, ratios: torch.Tensor) -> torch.Tensor:
    """max(0, b_i * p_i - q_i) for rows i = 0..k-1, with b_0 = 1: (k, V). p: (k + 1, V) or (k, V);
    q: (k, V); ratios: (k,) = b_1..b_k."""
    k = q.shape[0]
    scale = torch.cat([ratios.new_ones(1), ratios])[:k]                      # (k,) b_0..b_{k-1}
    return (scale.unsqueeze(-1) * p[:k] - q).clamp_(min=0.0)


def _thresholds(ratios: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    """Block verification's h_1..h_k, the probabilities its coins are compared with: (k,).

    h_i = m_i / (m_i + 1 - b_i) for i < k, with m_i the mass of row i of the scaled residual; h_k = b_k.
    The denominator is 0 only where b_i = 1 and p_i = q_i, where every later b is 1 and h_k = 1, so
    the limit 1 is taken.
    """
    after = mass[1:]                                                         # (k-1,) m_1..m_{k-1}
    denominator = after + (1.0 - ratios[:-1])
    inner = torch.where(denominator > 0, after / denominator.clamp(min=torch.finfo(mass.dtype).tiny),
                        torch.ones_like(after))
    return torch.cat([inner, ratios[-1:]])


def _last_pass(passed: torch.Tensor) -> torch.Tensor:
    """The last position i (1-based) whose coin passed, or 0: 0-d long. passed: (k,) bool. Block
    verification keeps the longest sub-block whose test passed."""
    positions = torch.arange(1, passed.shape[0] + 1, device=passed.device)  # (k,)
    kept = torch.where(passed, positions, torch.zeros_like(positions))
    return torch.cat([kept.new_zeros(1), kept]).max()


def _corrections(p: torch.Tensor, residuals: torch.Tensor) -> torch.Tensor:
    """The emitted token's distribution for each stop: (k + 1, V): the scaled residual for i < k, p_k
    for the bonus. A residual with no mass (a stop of probability 0) falls back to p_i."""
    k = residuals.shape[0]
    mass = residuals.sum(dim=-1, keepdim=True)                               # (k, 1)
    rows = torch.where(mass > 0, residuals / mass.clamp(min=torch.finfo(p.dtype).tiny), p[:k])
    return torch.cat([rows, p[k:]], dim=0)


def _block_terms(
    p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ratios b (k,), thresholds h (k,), scaled residuals (k, V)) of one block."""
    k = draft.shape[0]
    q_rows = _draft_rows(p, q, draft)                                        # (k, V)
    positions = torch.arange(k, device=draft.device)
    ratios = _running_ratios(p[positions, draft], q_rows[positions, draft])  # (k,)
    residuals = _scaled_residuals(p, q_rows, ratios)                         # (k, V)
    return ratios, _thresholds(ratios, residuals.sum(dim=-1)), residuals


def block_details(
    p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's deterministic part, for an inspector: (ratios (k,), thresholds (k,)),
    b_i and h_i after draft i."""
    ratios, thresholds, _ = _block_terms(p, q, draft)
    return ratios, thresholds


def accept_block(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft: torch.Tensor,
    sample: Sampler,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification (Sun et al., ICLR 2025, arXiv 2403.10444, Algorithm 2).

    Position i passes when its coin eta_i ~ U[0, 1) is below h_i (:func:`_thresholds`); n is the
    *last* position that passed. The token is drawn from norm(max(0, b_n p_n - q_n)), or p_k when
    n = k. Exact, and keeps at least as many drafts in expectation as :func:`accept_drafts` (proved in
    the paper; optimal among rules that see only the drafted path's probabilities).
    """
    k = draft.shape[0]
    _, thresholds, residuals = _block_terms(p, q, draft)
    n = _last_pass(accept.uniforms(k, p, generator) < thresholds)
    tokens = sample(_corrections(p, residuals), generator)                  # (k+1,)
    return n, accept.pick(tokens, n)


def accept_strict(
    p: torch.Tensor,
    q: torch.Tensor | None,
    draft: torch.Tensor,
    sample: Sampler,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep draft i while it equals the target's own draw y_i ~ p_i (k + 1 draws); the token is y_n;
    q is ignored. Each emitted token is the target's draw given the tokens before it, so the output
    follows p for drafts independent of the draws (SpecInfer's naive verification; Miao et al. 2024).
    With p = q a draft is kept with probability sum_x p(x)^2, below the residual rule's 1."""
    k = draft.shape[0]
    draws = sample(p, generator)                                             # (k+1,)
    n = (draws[:k] == draft).to(torch.long).cumprod(dim=0).sum()
    return n, accept.pick(draws, n)


VERIFY_RULES: dict[str, Rule] = dict(zip(VERIFY_RULE_NAMES, (accept_drafts, accept_block, accept_strict)))


def on_greedy_columns(rule: Rule, target_ids: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor,
                      sample: Sampler, generator: torch.Generator | None, dtype: torch.dtype
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """``rule(p, q, draft, ...)`` where p is one-hot at ``target_ids`` (k + 1,) (a greedy processor's
    rows, in ``dtype``), worked on the columns of the ids in ``target_ids`` and ``draft`` alone.

    Every rule here reads p and q only where p has mass or at the drafts: a ratio at a draft, a
    residual max(0, b p - q) that is 0 wherever p is, the residual's mass, and draws from rows that
    are 0 off those columns. Narrowed to those ids in sorted order (a repeated id's later columns
    left at 0 in p and q, as the vocabulary's other ids are; q's columns gathered, the drafts
    renumbered), the rule returns the same n, draws the same coins (k, in p's dtype), and its token
    is the column's id: (k + 1, V) rows become (k + 1, 2k + 1) on every round under greedy. Nothing
    is read back to the host (a sort and a search, no ``unique``).
    """
    k = draft.shape[0]
    columns = torch.sort(torch.cat([target_ids, draft])).values                         # (2k + 1,) ids
    first = torch.ones_like(columns, dtype=torch.bool)
    first[1:] = columns[1:] != columns[:-1]                                                # an id's own column
    p = ((columns.view(1, -1) == target_ids.view(-1, 1)) & first).to(dtype)               # (k + 1, 2k + 1)
    narrowed_q = None if q is None else q[:, columns] * first.to(q.dtype)
    n, token = rule(p, narrowed_q, torch.searchsorted(columns, draft), sample, generator)
    return n, accept.pick(columns, token)


def verify_rule(name: str) -> Rule:
    """The rule called ``name``; a one-line ValueError for an unknown name."""
    try:
        return VERIFY_RULES[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown verify rule {name!r}; choose one of: {', '.join(VERIFY_RULES)}") from None
