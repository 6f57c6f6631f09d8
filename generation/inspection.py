"""The per-token inspector's numbers: what both models thought at each drafted position.

For each drafted position i of a round (Leviathan et al. 2023, Algorithm 1;
p the target, q the drafter): p_i(x_i), q_i(x_i), the acceptance probability
min(1, p_i(x_i) / q_i(x_i)), the entropies of p_i and q_i, and the top tokens
of each; at the first rejection, the top tokens of the residual
norm(max(0, p_n - q_n)) the replacement was drawn from.

Everything is computed on the device inside the round, top-k only, and handed
back as one flat integer tensor that rides along with the round's single host
sync (floats travel as their float32 bit patterns, so nothing is rounded on
the way). :func:`decode` turns the host list back into an :class:`Inspection`.

Which distributions are shown: under sampling, the processed p and q the accept
rule used (temperature, top-k, top-p applied). Under greedy those are one-hot
and say nothing, so the top tokens, entropies, p(x) and q(x) are the models'
own softmax at temperature 1, while ``accept`` stays the rule's (1 when the
draft is p's argmax, else 0). N-gram drafts are deterministic: q is one-hot
(q(x) = 1, entropy 0). This file imports torch only inside the functions that
need it, so a trace can be read without it.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

TOP = 5  # top tokens kept per distribution

Tops = tuple[tuple[int, float], ...]  # (token id, probability), most likely first


@dataclass(frozen=True)
class Position:
    """One drafted position: the draft x, p(x), q(x), min(1, p/q), entropies (nats), top tokens."""

    p: float
    q: float
    accept: float
    entropy_p: float
    entropy_q: float
    p_top: Tops
    q_top: Tops


@dataclass(frozen=True)
class Inspection:
    """What both models thought in one round.

    ``positions``: one per drafted token (those after the first rejection
    included: scored, never judged). ``token_p`` / ``token_entropy`` /
    ``token_top``: the target's distribution at the row its own token came
    from (the resample after a rejection, the bonus, or a plain step), with
    that token's probability. ``residual``: at a rejection, the top tokens of
    norm(max(0, p_n - q_n)); the token drawn from it is ``Round.token``.
    ``shown``: ``"rule"`` (the accept rule's processed p and q) or
    ``"softmax"`` (greedy: the models' softmax at temperature 1).
    ``one_hot_q``: the drafts were deterministic (an n-gram storage).
    """

    positions: tuple[Position, ...]
    token_p: float | None = None
    token_entropy: float | None = None
    token_top: Tops = ()
    residual: Tops | None = None
    shown: str = "rule"
    one_hot_q: bool = False

    def trimmed(self, drafted: int, token_in: bool, rejected: bool) -> "Inspection":
        """Only what the round kept: ``drafted`` positions, the token row when a
        target token went in, the residual only after a rejection."""
        return Inspection(
            positions=self.positions[:drafted],
            token_p=self.token_p if token_in else None,
            token_entropy=self.token_entropy if token_in else None,
            token_top=self.token_top if token_in else (),
            residual=self.residual if (token_in and rejected) else None,
            shown=self.shown,
            one_hot_q=self.one_hot_q,
        )

    @staticmethod
    def from_dict(data: dict) -> "Inspection":
        """Back from JSON (``dataclasses.asdict``); raises KeyError/TypeError/ValueError when damaged."""
        def tops(rows) -> Tops:
            return tuple((int(t), float(v)) for t, v in rows)

        positions = tuple(Position(
            p=float(d["p"]), q=float(d["q"]), accept=float(d["accept"]),
            entropy_p=float(d["entropy_p"]), entropy_q=float(d["entropy_q"]),
            p_top=tops(d["p_top"]), q_top=tops(d["q_top"]),
        ) for d in data["positions"])
        number = lambda v: None if v is None else float(v)  # noqa: E731
        residual = data.get("residual")
        return Inspection(
            positions=positions,
            token_p=number(data.get("token_p")),
            token_entropy=number(data.get("token_entropy")),
            token_top=tops(data.get("token_top") or ()),
            residual=None if residual is None else tops(residual),
            shown=str(data.get("shown", "rule")),
            one_hot_q=bool(data.get("one_hot_q", False)),
        )


# ------------------------------------------------------------- on the device

def entropy(dist):
    """-sum p log p in nats over the last dimension, 0 log 0 = 0: (..., V) -> (...).

    Twice as fast on a CPU as ``torch.special.entr`` (which handles each
    element's special cases one by one).
    """
    import torch

    return -dist.clamp(min=torch.finfo(dist.dtype).tiny).log_().mul_(dist).sum(-1)


def record_round(p_rule, q_rule, draft, n, token, *, p_view, q_view, top: int = TOP):
    """The round's numbers as one flat int64 tensor (no host sync).

    p_rule: (k+1, V) the target distributions the accept rule used;
    q_rule: (k, V) the drafter's, or None for deterministic drafts;
    draft: (k,); n, token: 0-d tensors from ``accept_drafts``.
    p_view: (k+1, V) / q_view: (k, V) or None: the distributions to show
    (the rule's under sampling, the models' softmax under greedy).
    Layout: see :func:`decode`.
    """
    import torch

    from generation.accept import residual_distributions

    k = draft.shape[0]
    t = min(top, p_view.shape[-1])
    rows = torch.arange(k, device=draft.device)
    p_top = p_view.topk(t, dim=-1)                                    # (k+1, t)
    ids = [p_top.indices.flatten()]
    floats = [p_top.values.flatten(), entropy(p_view)]               # (k+1)t, k+1
    # p_n(token): the target's probability of the token it put in, at row n
    floats.append(p_view[n, token].view(1))
    if k:
        p_x_rule = p_rule[rows, draft]
        q_x_rule = torch.ones_like(p_x_rule) if q_rule is None else q_rule[rows, draft]
        accept = (p_x_rule / q_x_rule).clamp(max=1.0)                 # (k,)
        # the residual only at the first rejection (row n; row k-1 when none, then unused)
        row = n.clamp(max=k - 1)
        q_row = None if q_rule is None else q_rule[row].unsqueeze(0)  # (1, V)
        residual = residual_distributions(p_rule[row].unsqueeze(0), q_row, draft[row].view(1)).topk(t, dim=-1)
        ids.append(residual.indices.flatten())                        # (t,)
        floats += [p_view[rows, draft], accept, residual.values.flatten()]
        if q_view is not None:
            q_top = q_view.topk(t, dim=-1)                            # (k, t)
            ids.append(q_top.indices.flatten())
            floats += [q_view[rows, draft], entropy(q_view), q_top.values.flatten()]
    bits = torch.cat([f.float() for f in floats]).view(torch.int32).long()
    return torch.cat([torch.cat(ids).long(), bits])


def record_size(k: int, vocab: int, *, has_q: bool, top: int = TOP) -> int:
    """How many ints :func:`record_round` returns for ``k`` drafts."""
    t = min(top, vocab)
    size = (k + 1) * t + (k + 1) * t + (k + 1) + 1
    if k:
        size += t + k + k + t
        if has_q:
            size += k * t + k + k + k * t
    return size


# ------------------------------------------------------------- on the host

def _floats(ints: list[int]) -> list[float]:
    """float32 bit patterns (as signed ints) back to floats, exactly."""
    return array("f", array("i", ints).tobytes()).tolist()


def _tops(ids: list[int], probs: list[float]) -> Tops:
    """(id, probability) pairs, zero-probability entries dropped."""
    return tuple((i, p) for i, p in zip(ids, probs) if p > 0.0)


def decode(flat: list[int], draft: list[int], n: int, *, vocab: int, has_q: bool,
           shown: str, top: int = TOP) -> Inspection:
    """The host list from :func:`record_round` (same k, vocab, has_q) as an Inspection."""
    k = len(draft)
    t = min(top, vocab)
    n_ids = (k + 1) * t + (t if k else 0) + (k * t if k and has_q else 0)
    ids, values = flat[:n_ids], _floats(flat[n_ids:])
    cursor = 0

    def take(count: int, source: list) -> list:
        nonlocal cursor
        out = source[cursor:cursor + count]
        cursor += count
        return out

    p_top_ids = take((k + 1) * t, ids)
    res_ids = take(t, ids) if k else []
    q_top_ids = take(k * t, ids) if k and has_q else []
    cursor = 0
    p_top_probs = take((k + 1) * t, values)
    entropy_p = take(k + 1, values)
    token_p = take(1, values)[0]
    p_x = accept = res_probs = q_x = entropy_q = q_top_probs = []
    if k:
        p_x, accept, res_probs = take(k, values), take(k, values), take(t, values)
        if has_q:
            q_x, entropy_q, q_top_probs = take(k, values), take(k, values), take(k * t, values)

    def row(ids_: list[int], probs: list[float], i: int) -> Tops:
        return _tops(ids_[i * t:(i + 1) * t], probs[i * t:(i + 1) * t])

    positions = tuple(Position(
        p=p_x[i],
        q=q_x[i] if has_q else 1.0,
        accept=accept[i],
        entropy_p=entropy_p[i],
        entropy_q=entropy_q[i] if has_q else 0.0,
        p_top=row(p_top_ids, p_top_probs, i),
        q_top=row(q_top_ids, q_top_probs, i) if has_q else ((draft[i], 1.0),),
    ) for i in range(k))
    return Inspection(
        positions=positions,
        token_p=token_p,
        token_entropy=entropy_p[n],
        token_top=row(p_top_ids, p_top_probs, n),
        residual=_tops(res_ids, res_probs) if n < k else None,
        shown=shown,
        one_hot_q=not has_q,
    )
