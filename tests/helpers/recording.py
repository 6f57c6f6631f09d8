"""Record what a drafter the engine builds proposes, for tests that recompute its logits.

``record_chains(monkeypatch, "MtpDrafter")`` makes the MTP kind (``model_drafters.mtp.kind``) build a
subclass of its ``MtpDrafter`` that keeps every chain it proposed as (committed ids, drafts, draft
logits), and returns that list (filled as the test decodes).
"""

from __future__ import annotations

import model_drafters.eagle3.kind
import model_drafters.gemma4_assistant.kind
import model_drafters.mtp.kind

# The kind module that builds each head drafter class.
KIND_MODULES = {"MtpDrafter": model_drafters.mtp.kind, "Eagle3Drafter": model_drafters.eagle3.kind,
                "AssistantDrafter": model_drafters.gemma4_assistant.kind}


def record_chains(monkeypatch, name: str) -> list:
    """Chains the drafter class ``name`` its kind builds proposes from now on in the test."""
    chains: list = []
    module = KIND_MODULES[name]
    base = getattr(module, name)

    class Recorded(base):
        def propose(self, ids, k, stop_below=None):
            drafts, q = super().propose(ids, k, stop_below)
            if drafts.numel():
                chains.append((ids[0].tolist(), drafts.tolist(), self.draft_logits()))
            return drafts, q

    monkeypatch.setattr(module, name, Recorded)
    return chains
