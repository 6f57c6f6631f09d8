"""Record what a drafter the engine builds proposes, for tests that recompute its logits.

``record_chains(monkeypatch, "MtpDrafter")`` makes ``engine.drafters`` build a subclass of its
``MtpDrafter`` that keeps every chain it proposed as (committed ids, drafts, draft logits), and
returns that list (filled as the test decodes).
"""

from __future__ import annotations

import engine.drafters


def record_chains(monkeypatch, name: str) -> list:
    """Chains the engine's drafter class ``engine.drafters.<name>`` proposes from now on in the test."""
    chains: list = []
    base = getattr(engine.drafters, name)

    class Recorded(base):
        def propose(self, ids, k, stop_below=None):
            drafts, q = super().propose(ids, k, stop_below)
            if drafts.numel():
                chains.append((ids[0].tolist(), drafts.tolist(), self.draft_logits()))
            return drafts, q

    monkeypatch.setattr(engine.drafters, name, Recorded)
    return chains
