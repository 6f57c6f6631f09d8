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
    """The settings a decoding loop reads (``engine.Strategy`` explains the ones they come from).

    ``eos``: ids that end the output (kept in it). ``use_cache`` False recomputes the whole sequence
    each step (same tokens). ``vocab_size``: compare distributions over the first ``vocab_size`` ids
    (None: the whole logits). ``generator``: every random draw comes from it. ``gamma_policy``: picks
    each round's draft length. ``target_delay_s``: an injected wait before every target forward, booked
    as verify. ``verify``: a name of ``generation.verify_rules.VERIFY_RULES`` (trees keep their own).
    ``prefills``: ``kvcache.cache.Prefill`` s a model may begin from. ``decisions``: keep the deciding
    rows (``generation.decisions``). ``max_rounds`` > 0: stop after that many rounds.
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
