"""The per-token inspector's numbers: what both models thought at each drafted position.

For each drafted position i (Leviathan et al. 2023, Algorithm 1; p the target, q the drafter):
p_i(x_i), q_i(x_i), the acceptance probability min(1, p_i(x_i) / q_i(x_i)), both entropies and top
tokens, and at the first rejection the top of the residual norm(max(0, p_n - q_n)). Under the
``block`` rule (Sun et al. 2025) also the running ratio b_i and threshold h_i, and the scaled
residual norm(max(0, b_n p_n - q_n)); under ``strict`` the acceptance is p_i(x_i) and no residual.

Computed on the device, top-k only, and returned as one flat integer tensor that rides the round's
single host sync (floats as their float32 bits, so nothing is rounded); :func:`decode` reads it.
Under greedy the processed p and q are one-hot, so the models' own softmax at temperature 1 is
shown, while ``accept`` stays the rule's. torch is imported only where needed.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from generation.verify_names import VERIFY_RULE_NAMES

TOP = 5  # top tokens kept per distribution

Tops = tuple[tuple[int, float], ...]  # (token id, probability), most likely first


@dataclass(frozen=True)
class Position:
    """One drafted position: the draft x, p(x), q(x), the acceptance probability, entropies (nats),
    top tokens. ``accept``: min(1, p/q), p(x) under strict. ``ratio`` / ``threshold``: under block
    only, b_i and h_i."""

    p: float
    q: float
    accept: float
    entropy_p: float
    entropy_q: float
    p_top: Tops
    q_top: Tops
    ratio: float | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class Inspection:
    """What both models thought in one round.

    ``positions``: one per drafted token (those after the first rejection scored, never judged).
    ``token_p`` / ``token_entropy`` / ``token_top``: the target's row its own token came from.
    ``residual``: at a rejection, the top of the distribution ``Round.token`` was drawn from (None under
    strict). ``shown``: ``"rule"`` (the processed p and q) or ``"softmax"`` (greedy: temperature 1).
    ``one_hot_q``: deterministic drafts. ``rule``: the chain verify rule.
    """

    positions: tuple[Position, ...]
    token_p: float | None = None
    token_entropy: float | None = None
    token_top: Tops = ()
    residual: Tops | None = None
    shown: str = "rule"
    one_hot_q: bool = False
    rule: str = "residual"

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
            rule=self.rule,
        )

    @staticmethod
    def from_dict(data: dict) -> "Inspection":
        """Back from JSON (``dataclasses.asdict``); KeyError/TypeError/ValueError when damaged. Older traces
        lack ``ratio``, ``threshold`` and ``rule``: they read as the residual rule's numbers."""
        def tops(rows) -> Tops:
            return tuple((int(t), float(v)) for t, v in rows)

        number = lambda v: None if v is None else float(v)  # noqa: E731
        positions = tuple(Position(
            p=float(d["p"]), q=float(d["q"]), accept=float(d["accept"]),
            entropy_p=float(d["entropy_p"]), entropy_q=float(d["entropy_q"]),
            p_top=tops(d["p_top"]), q_top=tops(d["q_top"]),
            ratio=number(d.get("ratio")), threshold=number(d.get("threshold")),
        ) for d in data["positions"])
        residual = data.get("residual")
        return Inspection(
            positions=positions,
            token_p=number(data.get("token_p")),
            token_entropy=number(data.get("token_entropy")),
            token_top=tops(data.get("token_top") or ()),
            residual=None if residual is None else tops(residual),
            shown=str(data.get("shown", "rule")),
            one_hot_q=bool(data.get("one_hot_q", False)),
            rule=str(data.get("rule", "residual")),
        )


# ------------------------------------------------------------- on the device

def entropy(dist):
    """-sum p log p in nats over the last dimension, 0 log 0 = 0: (..., V) -> (...). Twice as fast on
    a CPU as ``torch.special.entr``."""
    import torch

    return -dist.clamp(min=torch.finfo(dist.dtype).tiny).log_().mul_(dist).sum(-1)


def residual_at_stop(p_row, q_row, draft_x, scale):
    """The distribution the token after a rejection was drawn from: (1, V), norm(max(0, scale * p_n -
    q_n)) with scale b_n under block, 1 otherwise. p_row, q_row (or None): (1, V); draft_x: (1,);
    scale: (1, 1)."""
    from generation.accept import residual_distributions

    return residual_distributions(p_row * scale, q_row, draft_x)


def _check_rule(rule: str, block) -> None:
    """A one-line ValueError for a rule the recorder does not know, or block without its numbers."""
    if rule not in VERIFY_RULE_NAMES:
        raise ValueError(f"unknown verify rule {rule!r} for the inspector; "
                         f"choose one of: {', '.join(VERIFY_RULE_NAMES)}")
    if (rule == "block") != (block is not None):
        raise ValueError("the inspector takes block_details' (ratios, thresholds) exactly when the rule is block")


def record_round(p_rule, q_rule, draft, n, token, *, p_view, q_view, rule: str = "residual", block=None,
                 top: int = TOP):
    """The round's numbers as one flat int64 tensor (no host sync).

    p_rule: (k+1, V) and q_rule: (k, V) or None, the distributions the rule used; draft: (k,); n,
    token: 0-d. p_view / q_view: the distributions to show. block: under block,
    ``verify_rules.block_details``. Layout: see :func:`decode`.
    """
    import torch

    _check_rule(rule, block)
    k = draft.shape[0]
    t = min(top, p_view.shape[-1])
    rows = torch.arange(k, device=draft.device)
    p_top = p_view.topk(t, dim=-1)                                    # (k+1, t)
    ids = [p_top.indices.flatten()]
    floats = [p_top.values.flatten(), entropy(p_view)]               # (k+1)t, k+1
    # p_n(token): the target's probability of the token it put in, at row n. Rows are picked
    # with (1,) index tensors throughout: indexing with a 0-d tensor reads it back (.item()).
    floats.append(p_view[n.view(1), token.view(1)])                    # (1,)
    if k:
        p_x_rule = p_rule[rows, draft]                                # (k,)
        if rule == "strict":
            accept = p_x_rule                                         # kept iff the target's draw equals x
        else:
            q_x_rule = torch.ones_like(p_x_rule) if q_rule is None else q_rule[rows, draft]
            accept = (p_x_rule / q_x_rule).clamp(max=1.0)             # (k,)
        floats += [p_view[rows, draft], accept]
        if rule != "strict":
            # the residual only at the stop (row n; row k-1 when every draft was kept, then unused)
            row = n.clamp(max=k - 1).view(1)                          # (1,)
            q_row = None if q_rule is None else q_rule.index_select(0, row)  # (1, V)
            # b_n: 1 for the token rule; block's running ratio before row n (b_0 = 1)
            scale = p_rule.new_ones(1) if block is None else torch.cat([block[0].new_ones(1), block[0]])[row]
            residual = residual_at_stop(p_rule.index_select(0, row), q_row, draft[row], scale.view(1, 1))
            residual = residual.topk(t, dim=-1)
            ids.append(residual.indices.flatten())                    # (t,)
            floats.append(residual.values.flatten())
        if q_view is not None:
            q_top = q_view.topk(t, dim=-1)                            # (k, t)
            ids.append(q_top.indices.flatten())
            floats += [q_view[rows, draft], entropy(q_view), q_top.values.flatten()]
        if block is not None:
            floats += [block[0], block[1]]                            # b_1..b_k, h_1..h_k
    bits = torch.cat([f.float() for f in floats]).view(torch.int32).long()
    return torch.cat([torch.cat(ids).long(), bits])


# ------------------------------------------------------------- on the host

def _floats(ints: list[int]) -> list[float]:
    """float32 bit patterns (as signed ints) back to floats, exactly."""
    return array("f", array("i", ints).tobytes()).tolist()


def _tops(ids: list[int], probs: list[float]) -> Tops:
    """(id, probability) pairs, zero-probability entries dropped."""
    return tuple((i, p) for i, p in zip(ids, probs) if p > 0.0)


def decode(flat: list[int], draft: list[int], n: int, *, vocab: int, has_q: bool,
           shown: str, rule: str = "residual", top: int = TOP) -> Inspection:
    """The host list from :func:`record_round` as an Inspection.

    Layout: the ids (p's top tokens per row, the residual's, q's per draft), then the float32 bits
    (p's top probabilities, entropies, p_n(token), p(x) and acceptance per draft, the residual's
    probabilities, q(x), q's entropies and top probabilities, then block's ratios and thresholds).
    """
    k = len(draft)
    t = min(top, vocab)
    residual_in = bool(k) and rule != "strict"
    n_ids = (k + 1) * t + (t if residual_in else 0) + (k * t if k and has_q else 0)
    ids, values = flat[:n_ids], _floats(flat[n_ids:])
    cursor = 0

    def take(count: int, source: list) -> list:
        nonlocal cursor
        out = source[cursor:cursor + count]
        cursor += count
        return out

    p_top_ids = take((k + 1) * t, ids)
    res_ids = take(t, ids) if residual_in else []
    q_top_ids = take(k * t, ids) if k and has_q else []
    cursor = 0
    p_top_probs = take((k + 1) * t, values)
    entropy_p = take(k + 1, values)
    token_p = take(1, values)[0]
    p_x = accept = res_probs = q_x = entropy_q = q_top_probs = []
    ratios = thresholds = [None] * k
    if k:
        p_x, accept = take(k, values), take(k, values)
        res_probs = take(t, values) if residual_in else []
        if has_q:
            q_x, entropy_q, q_top_probs = take(k, values), take(k, values), take(k * t, values)
        if rule == "block":
            ratios, thresholds = take(k, values), take(k, values)

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
        ratio=ratios[i],
        threshold=thresholds[i],
    ) for i in range(k))
    return Inspection(
        positions=positions,
        token_p=token_p,
        token_entropy=entropy_p[n],
        token_top=row(p_top_ids, p_top_probs, n),
        residual=_tops(res_ids, res_probs) if residual_in and n < k else None,
        shown=shown,
        one_hot_q=not has_q,
        rule=rule,
    )
