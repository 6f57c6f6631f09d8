"""The inspector check the inspection tests share: every number a round recorded
(``generation.inspection``) against the two models re-run uncached on the round's prefix."""

from __future__ import annotations

import pytest
import torch

from generation.accept import residual_distributions

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


def check_rounds(result, prompt, target, drafter, processor) -> int:
    """Compare every recorded round with the models re-run uncached; returns the rejections seen."""
    greedy = processor.is_greedy
    shown = (lambda logits: logits.softmax(-1)) if greedy else processor
    rejections = 0
    for rnd, prefix in zip(result.trace, _prefixes(prompt, result.trace)):
        ins = rnd.inspection
        assert ins is not None and ins.shown == ("softmax" if greedy else "rule")
        k = len(rnd.drafted)
        target_logits = _logits(target, prefix + list(rnd.drafted))[len(prefix) - 1:]   # (k+1, V)
        p_rule, p_view = processor(target_logits), shown(target_logits)
        assert len(ins.positions) == k
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
            assert pos.accept == pytest.approx(min(1.0, float(p_rule[i, x]) / q_x_rule), abs=TOL)
        if rnd.token is None:
            continue
        n = rnd.accepted
        assert ins.token_p == pytest.approx(float(p_view[n, rnd.token]), abs=TOL)
        assert ins.token_entropy == pytest.approx(_entropy(p_view[n]), abs=1e-3)
        _same_tops(ins.token_top, _tops(p_view[n]))
        if n < k:
            rejections += 1
            q_n = None
            if drafter is not None:
                q_n = processor(_logits(drafter, prefix + list(rnd.drafted[:n]))[-1]).unsqueeze(0)
            residual = residual_distributions(p_rule[n:n + 1], q_n, torch.tensor(rnd.drafted[n:n + 1]))[0]
            _same_tops(ins.residual, _tops(residual))
            assert residual[rnd.token] > 0                        # the drawn token came from it
            if greedy:  # the target's top-1 at the rejected position is the token it emitted
                assert ins.token_top[0][0] == rnd.token and ins.residual[0][0] == rnd.token
        else:
            assert ins.residual is None
    return rejections
