"""What lookahead decoding's rounds say about it (``ngram_assisted.lookahead``), from the notes
its drafter leaves on each round: ``{"candidates": g, "pool": n}``. Torch-free, so a replayed
trace shows the same numbers."""

from __future__ import annotations

from analysis.acceptance import _get


def lookahead_summary(rounds, *, tokens: int = 0, target_calls: int = 0) -> dict | None:
    """Tokens per target call; the accepted n-gram length (drafts kept per round that verified
    candidates); how many rounds had candidates; the pool's size after the last round. None
    when no round carries a lookahead note."""
    notes = [(_get(r, "note"), r) for r in rounds or []]
    notes = [(n, r) for n, r in notes if isinstance(n, dict) and "pool" in n]
    if not notes:
        return None
    with_candidates = [r for n, r in notes if n.get("candidates", 0) > 0]
    accepted = sum(int(_get(r, "accepted", 0)) for r in with_candidates)
    return dict(
        rounds=len(notes),
        rounds_with_candidates=len(with_candidates),
        mean_candidates=sum(n.get("candidates", 0) for n, _ in notes) / len(notes),
        accepted_ngram_length=accepted / len(with_candidates) if with_candidates else 0.0,
        pool=int(notes[-1][0]["pool"]),
        tokens_per_target_call=tokens / target_calls if target_calls else 0.0,
    )
