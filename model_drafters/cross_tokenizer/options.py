"""How a drafter model with a tokenizer of its own drafts (``engine.CrossTokenizerOptions``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CrossTokenizerOptions:
    """How a drafter model with a tokenizer of its own drafts: ``method`` ``slem`` (through text, any
    processor) or ``tli`` (over the shared vocabulary). The ``model`` drafter takes them too and ignores
    them when the pair shares one tokenizer."""

    method: str = "slem"
