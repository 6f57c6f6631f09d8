"""How a drafter model with a tokenizer of its own drafts (``engine.CrossTokenizerOptions``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CrossTokenizerOptions:
    """How a drafter model with a tokenizer of its own drafts (the ``cross_tokenizer`` drafter).

    ``method`` is ``slem`` (drafts decoded to text and re-tokenised for the
    target, any processor) or ``tli`` (drafts sampled over the vocabulary both
    tokenizers share). The ``model`` drafter takes these options too: it hands
    a pair whose tokenizers differ to the ``cross_tokenizer`` drafter, and
    ignores them when the pair shares one tokenizer.
    """

    method: str = "slem"
