"""The accept rule on hand-built distributions: exact counts and exact tokens."""

import pytest
import torch

from generation.accept import accept_drafts, residual_distributions
from sampling import GreedyProcessor, MultinomialProcessor

V = 10
NEG = float("-inf")


def logits_for(*argmaxes):
    """One row of logits per position: large at the given token, -inf elsewhere."""
    rows = torch.full((len(argmaxes), V), NEG)
    for i, token in enumerate(argmaxes):
        rows[i, token] = 10.0
    return rows


GREEDY = GreedyProcessor()


@pytest.mark.parametrize("target, draft, n, token", [
    ((3, 4, 5, 6), (3, 4, 5), 3, 6),   # all accepted: bonus token from the last row
    ((3, 4, 5, 6), (3, 9, 5), 1, 4),   # first rejection at 1: the target's token there
    ((3, 4, 5, 6), (7, 4, 5), 0, 3),   # nothing accepted
    ((3, 4, 5, 6), (3, 4, 1), 2, 5),
    ((8,), (), 0, 8),                  # no drafts: a plain target step
])
def test_greedy_accepts_matching_prefix_and_adds_target_token(target, draft, n, token):
    p = GREEDY(logits_for(*target))
    d = torch.tensor(draft, dtype=torch.long)
    q = GREEDY(logits_for(*draft)) if draft else None
    for drafts_q in (q, None):         # model drafter (one-hot q) and deterministic drafter
        got_n, got_token = accept_drafts(p, drafts_q, d, GREEDY.sample)
        assert (got_n.item(), got_token.item()) == (n, token)


def test_rejection_after_acceptance_is_not_reconsidered():
    # Position 2 would match, but position 1 was rejected: only 1 accepted.
    p = GREEDY(logits_for(3, 4, 5, 6))
    n, token = accept_drafts(p, None, torch.tensor([3, 0, 5]), GREEDY.sample)
    assert (n.item(), token.item()) == (1, 4)


def test_certain_and_impossible_drafts_under_sampling():
    # p puts all its mass on the draft at row 0 and none at row 1.
    p = torch.zeros(3, V)
    p[0, 2] = 1.0
    p[1, 5] = 0.25
    p[1, 6] = 0.75
    p[2, 1] = 1.0
    draft = torch.tensor([2, 7])
    q = torch.zeros(2, V)
    q[0, 2] = 0.5
    q[0, 3] = 0.5
    q[1, 7] = 1.0
    gen = torch.Generator().manual_seed(0)
    sampler = MultinomialProcessor().sample
    results = {tuple(t.item() for t in accept_drafts(p, q, draft, sampler, gen)) for _ in range(200)}
    # Row 0 always accepted (p/q = 2 >= 1); row 1 always rejected; resample from residual {5, 6}.
    assert results == {(1, 5), (1, 6)}


def test_residual_is_positive_part_of_p_minus_q():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0]])
    q = torch.tensor([[0.2, 0.3, 0.5, 0.0]])
    assert residual_distributions(p, q, torch.tensor([2])).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    # Deterministic draft: p with the draft removed, renormalised.
    assert residual_distributions(p, None, torch.tensor([0]))[0].tolist() == pytest.approx(
        [0.0, 0.6, 0.4, 0.0])


def test_single_draft_output_distribution_is_p():
    """One draft from q, accepted w.p. min(1, p/q), else resampled: the token
    (draft if accepted, else the resample) is distributed as p exactly."""
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    gen = torch.Generator().manual_seed(1)
    sampler = MultinomialProcessor().sample
    trials = 15000
    drafts = torch.multinomial(q, trials, replacement=True, generator=gen)
    counts = torch.zeros(4)
    for x in drafts.tolist():
        n, token = accept_drafts(torch.stack([p, p]), q.view(1, -1), torch.tensor([x]), sampler, gen)
        counts[x if n.item() == 1 else token.item()] += 1
    # Standard error <= 0.0041; resampling from p instead would give p(0) = 0.35.
    assert torch.allclose(counts / trials, p, atol=0.02)
