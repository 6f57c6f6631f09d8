"""What one generation is run with: the decoding loops take this one value, not a list of keywords.

``engine.run_strategy`` builds it from a ``Strategy`` (the processor built, the γ
policy taken from the engine's state, the run's generator and end tokens added).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sampling import LogitsProcessor


@dataclass(frozen=True)
class LoopOptions:
    """The settings a decoding loop reads.

    ``processor``: turns logits into the distributions both models draw from.
    ``max_gen_len``: the length budget in new tokens. ``eos``: ids that end the
    output (kept in it). ``use_cache``: False recomputes the whole sequence each
    step (same tokens). ``vocab_size``: compare distributions over the first
    ``vocab_size`` ids (the vocabulary both models share; None: the whole
    logits). ``generator``: every random draw (drafts and the accept rule)
    comes from it. ``gamma_policy``: the object that picks each round's draft
    length (``generation.gamma_policies``). ``inspect``: record the inspector's
    numbers in each round. ``target_delay_s``: wait that long before every
    target forward (an injected network round trip, booked as verify).
    ``compile``: the forwards' path, ``off``, ``static`` or ``graphs``
    (``kvcache.static``).
    ``tree`` > 0: verify token trees of at most that many nodes
    (``tree_branch`` children per expanded node; ``tree_sample``: children
    drawn from q, verified by recursive rejection sampling). ``verify``: the
    chain verify rule, a name of ``generation.verify_rules.VERIFY_RULES``
    (``residual``, ``block``, ``strict``; trees keep their own rules). ``prefills``:
    ``kvcache.cache.Prefill`` s a model begins from when one is of it and the
    prompt (many generations from one prompt share its prefill). ``decisions``:
    keep the top-k of the target logits row that decided each emitted token
    (``generation.decisions``; read back once when the run ends) in
    ``GenerationResult.decisions``. ``max_rounds`` > 0: the verify loop stops after that many
    rounds (``stop_reason`` ``"rounds"``).
    """

    processor: LogitsProcessor
    max_gen_len: int
    gamma_policy: object = None
    eos: frozenset[int] = field(default_factory=frozenset)
    use_cache: bool = True
    vocab_size: int | None = None
    generator: torch.Generator | None = None
    inspect: bool = True
    target_delay_s: float = 0.0
    tree: int = 0
    tree_branch: int = 2
    tree_sample: bool = False
    verify: str = "residual"
    prefills: tuple = ()
    compile: str = "off"
    decisions: bool = False
    max_rounds: int = 0
