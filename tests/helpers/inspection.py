"""The inspector check the inspection tests share: every number a round recorded
(``generation.inspection``) against the two models re-run uncached on the round's prefix,
under the chain verify rule the run used (block's ratios and thresholds through
``generation.verify_rules.block_details`` on the recomputed p and q)."""

from __future__ import annotations

import pytest
import torch

from generation.verify_rules import block_details

TOL = 2e-4


def _logits(model, ids: list[int]) -> torch.Tensor:
    """Uncached logits of every position, (L, V)."""
    with torch.no_grad():
        return model(torch.tensor([ids]), use_cache=False).logits[0].float()


def _prefixes(prompt: list[int], trace) -> list[list[int]]:
    """The sequence each round started from."""
    out, seq = [], list(prompt)
    for rnd in trace:
        out.append(list(seq))
        seq += list(rnd.drafted[:rnd.accepted]) + ([rnd.token] if rnd.token is not None else [])
    return out


def _tops(dist: torch.Tensor) -> list[tuple[int, float]]:
    values, ids = dist.topk(5)
    return [(int(i), float(v)) for i, v in zip(ids, values) if v > 0]


def _same_tops(got, want) -> None:
    assert [t for t, _ in got] == [t for t, _ in want]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], abs=TOL)


def _entropy(dist: torch.Tensor) -> float:
    return float(torch.special.entr(dist).sum())


def _q_rules(drafter, processor, prefix: list[int], drafted: tuple) -> torch.Tensor | None:
    """The drafter's processed distribution before each draft, (k, V); None for an n-gram drafter."""
    if drafter is None or not drafted:
        return None
    logits = _logits(drafter, prefix + list(drafted))[len(prefix) - 1:len(prefix) - 1 + len(drafted)]
    return processor(logits)


def _residual(p: torch.Tensor, q: torch.Tensor | None, x: int, scale: float) -> torch.Tensor:
    """norm(max(0, scale * p - q)) written out, q None meaning one-hot(x): (V,)."""
    if q is None:
        q = torch.zeros_like(p).index_fill_(0, torch.tensor([x]), 1.0)
    residual = (scale * p - q).clamp(min=0.0)
    return residual / residual.sum()


def _check_block(ins, rnd, p_rule: torch.Tensor, q_rules: torch.Tensor | None) -> list[float]:
    """Each position's ratio and threshold equal block_details on the recomputed p and q;
    returns b_0..b_k (b_0 = 1), the scales of block's residuals.

    A round an end token ended inside its kept drafts lost the drafts after them, and the
    last kept one's threshold depended on the next row: that one is not compared.
    """
    draft = torch.tensor(rnd.drafted, dtype=torch.long)
    ratios, thresholds = block_details(p_rule, q_rules, draft)
    judged = len(draft) if rnd.token is not None else len(draft) - 1
    assert [pos.ratio for pos in ins.positions] == pytest.approx(ratios.tolist(), abs=TOL)
    assert [pos.threshold for pos in ins.positions][:judged] == pytest.approx(thresholds[:judged].tolist(), abs=TOL)
    return [1.0] + ratios.tolist()


def check_rounds(result, prompt, target, drafter, processor, rule: str = "residual", *,
                 drafters: list | None = None) -> int:
    """Compare every recorded round with the models re-run uncached; returns the rejections seen.

    ``rule``: the chain verify rule the run used (``speculative(..., verify=rule)``).
    ``drafters``: per round, the drafter model that drafted it or None (one-hot q), for a run
    whose rounds drafted from different sides (the hybrid); ``drafter`` for every round otherwise.
    """
    greedy = processor.is_greedy
    shown = (lambda logits: logits.softmax(-1)) if greedy else processor
    rejections = 0
    per_round = drafters if drafters is not None else [drafter] * len(result.trace)
    for rnd, prefix, drafter in zip(result.trace, _prefixes(prompt, result.trace), per_round):
        ins = rnd.inspection
        assert ins is not None and ins.shown == ("softmax" if greedy else "rule") and ins.rule == rule
        k = len(rnd.drafted)
        target_logits = _logits(target, prefix + list(rnd.drafted))[len(prefix) - 1:]   # (k+1, V)
        p_rule, p_view = processor(target_logits), shown(target_logits)
        q_rules = _q_rules(drafter, processor, prefix, rnd.drafted)                     # (k, V) or None
        assert len(ins.positions) == k
        scales = _check_block(ins, rnd, p_rule, q_rules) if rule == "block" and k else [1.0] * (k + 1)
        if rule != "block":
            assert all(pos.ratio is None and pos.threshold is None for pos in ins.positions)
        for i, (x, pos) in enumerate(zip(rnd.drafted, ins.positions)):
            assert pos.p == pytest.approx(float(p_view[i, x]), abs=TOL)
            assert pos.entropy_p == pytest.approx(_entropy(p_view[i]), abs=1e-3)
            _same_tops(pos.p_top, _tops(p_view[i]))
            if drafter is None:                                   # n-gram: q is one-hot
                assert ins.one_hot_q and pos.q == 1.0 and pos.entropy_q == 0.0
                assert pos.q_top == ((x, 1.0),)
                q_x_rule = 1.0
            else:
                draft_logits = _logits(drafter, prefix + list(rnd.drafted[:i]))[-1]
                q_rule, q_view = processor(draft_logits), shown(draft_logits)
                assert pos.q == pytest.approx(float(q_view[x]), abs=TOL)
                assert pos.entropy_q == pytest.approx(_entropy(q_view), abs=1e-3)
                _same_tops(pos.q_top, _tops(q_view))
                q_x_rule = float(q_rule[x])
            # strict keeps x iff the target's draw equals it: probability p(x)
            want = float(p_rule[i, x]) if rule == "strict" else min(1.0, float(p_rule[i, x]) / q_x_rule)
            assert pos.accept == pytest.approx(want, abs=TOL)
        if rnd.token is None:
            continue
        n = rnd.accepted
        assert ins.token_p == pytest.approx(float(p_view[n, rnd.token]), abs=TOL)
        assert ins.token_entropy == pytest.approx(_entropy(p_view[n]), abs=1e-3)
        _same_tops(ins.token_top, _tops(p_view[n]))
        if n < k and rule == "strict":
            rejections += 1
            assert ins.residual is None                           # the token is a plain draw from p_n
        elif n < k:
            rejections += 1
            q_n = None if q_rules is None else q_rules[n]
            # block draws from the residual scaled by its running ratio b_n; the token rule b = 1
            residual = _residual(p_rule[n], q_n, rnd.drafted[n], scales[n])
            _same_tops(ins.residual, _tops(residual))
            assert residual[rnd.token] > 0                        # the drawn token came from it
            if greedy:  # the target's top-1 at the rejected position is the token it emitted
                assert ins.token_top[0][0] == rnd.token and ins.residual[0][0] == rnd.token
        else:
            assert ins.residual is None
    return rejections
