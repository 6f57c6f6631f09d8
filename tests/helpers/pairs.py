"""One way for tests to make a pair: a real ``utils.models.ModelPair``, never a stand-in.

``model_pair(target, drafter, ...)`` starts from ``engine.pair_of`` (the facts read from the
models: their shared vocabulary, the target's context length and device) and sets any other
field as given. Without a target (a front-end test that decodes nothing) the pair holds no
models and the fields given.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from engine import pair_of
from utils.models import ModelPair

_FIELDLESS = dict(target=None, drafter=None, tokenizer=None, target_name="target", drafter_name="drafter",
                  end_tokens=[], device=torch.device("cpu"), vocab_size=0, context_length=None,
                  self_draft_demo=False)


def model_pair(target=None, drafter=None, *, end_tokens=None, vocab_size: int | None = None, tokenizer=None,
               **fields) -> ModelPair:
    """A ``ModelPair`` over ``target`` and ``drafter``; ``fields`` set what ``pair_of`` does not
    (names, ``drafter_tokenizer``, ``context_length``, ``self_draft_demo``, ...)."""
    if target is None:
        given = {"end_tokens": list(end_tokens or ()), "vocab_size": vocab_size or 0, "tokenizer": tokenizer}
        return ModelPair(**{**_FIELDLESS, "drafter": drafter, **given, **fields})
    pair = pair_of(target, drafter, end_tokens=end_tokens, vocab_size=vocab_size, tokenizer=tokenizer)
    return replace(pair, **fields)


# The self-drafters a test that loads the default pair measures on a cold cache (model_drafters.selfdraft.
# default.candidates_here): two measured for real, not every one a machine has (the same loop; five took
# about a minute of the suite's time on an AVX-512 EPYC). Whichever test loads the pair first measures.
FEW_SELF_DRAFTERS = ("self:bf16", "self:int8")


def few_self_drafters(monkeypatch) -> None:
    """Make a cold start of the default pair measure :data:`FEW_SELF_DRAFTERS` only."""
    import model_drafters.selfdraft.default as default

    monkeypatch.setattr(default, "candidates_here", lambda device: FEW_SELF_DRAFTERS)
