"""One timed decode of one prompt by one variant: the unit every number is built from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from generation.result import decode_rate


@dataclass
class RunRecord:
    """What one run produced and cost.

    ``seconds`` is the benchmark's own timer (device sync on both sides), the
    same for ours and the peers'. ``engine_seconds`` is the engine's own
    measurement, kept for reference (None for peers). ``drafted``/``accepted``
    are None where the decoder does not report them (the peers). ``overshoot``
    counts tokens a decoder produced beyond the length budget; they are cut from
    ``tokens`` and not counted (transformers' prompt lookup can overshoot
    ``max_new_tokens``: its candidate length cap does not bind).
    ``gamma_policy``: the draft-length policy (``constant``, ``heuristic``,
    ``confidence 0.4``, ``model``; "" for autoregressive decoding).
    ``phases``: our engine's split of its time into ``draft``, ``verify`` and
    ``other`` seconds (None for peers). ``rounds`` and ``mean_gamma``: draft
    rounds and the mean draft length they asked for (ours, drafting only).
    ``tree_fallback``: why a tree variant verified chains instead ("" otherwise).
    ``decisions``: our greedy run of the target's rows that decided each token
    (``GenerationResult.decisions``), from which a difference from target AR is judged a
    near-tie or unexplained (``analysis.divergence``); first repeat only (the one the identity
    counts read); None for peers and under sampling; kept in memory only (not in ``row``).
    ``acceptance``: the run's acceptance counters (``AcceptanceCounts.to_dict`` of
    ``analysis.acceptance``: drafting rounds, accepted and reached per position,
    the histograms), pooled over runs for the summary; None where the decoder
    does not report rounds (the peers).
    ``hybrid``: a hybrid variant's rounds, drafts and acceptance per kind (``model``,
    ``retrieval``; ``GenerationResult.hybrid``); None for every other run.
    ``session`` and ``position``: the session the run belongs to (a conversation,
    or K prompts of one category in a row) and its 1-based step there (for a
    conversation, the turn); "" and 0 for a prompt run alone.
    ``first_token_s`` and ``first_tokens``: our engine's time to first token (seconds from its
    start until the first round's tokens were on the host) and the tokens that round made
    (``GenerationResult``); None for peers. The rest of the run is its decode part
    (:attr:`decode_tokens_per_s`).
    ``other_load``: cores' worth of CPU that other processes used while the run ran
    (``utils.machine_load.other_load``; None where unknown); ``busy``: above
    ``utils.machine_load.BUSY_CORES``, so its time is slower than this machine's own.
    ``compile``: the compile path our run took (``GenerationResult.compile``: requested, path,
    reason, captures...); None for peers.
    """

    variant: str
    strategy: str
    gamma: int | None
    family: str
    prompt_id: str
    category: str
    repeat: int
    prompt_tokens: int
    tokens: list[int] = field(default_factory=list)
    decisions: list | None = field(default=None, repr=False)
    prompt_ids: list[int] | None = field(default=None, repr=False)   # with decisions: the ids it decoded from
    evidence: Any = field(default=None, repr=False)   # analysis.divergence.Evidence at a difference (judge_records)
    seconds: float = 0.0
    drafted: int | None = None
    accepted: int | None = None
    target_calls: int = 0
    drafter_calls: int = 0
    stop_reason: str = "length"
    engine_seconds: float | None = None
    overshoot: int = 0
    gamma_policy: str = ""
    phases: dict[str, float] | None = None
    rounds: int | None = None
    mean_gamma: float | None = None
    tree_fallback: str = ""
    acceptance: dict | None = None
    hybrid: dict | None = None
    session: str = ""
    position: int = 0
    first_token_s: float | None = None
    first_tokens: int | None = None
    other_load: float | None = None
    busy: bool = False
    compile: dict | None = None

    @property
    def key(self) -> tuple:
        """The prompt the run decoded (within its session) and its repeat: runs of two variants
        with one key are a pair."""
        return (self.session, self.prompt_id, self.position, self.repeat)

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_seconds(self) -> float | None:
        """The engine's seconds after the first round (None without a time to first token)."""
        if self.first_token_s is None or self.engine_seconds is None:
            return None
        return max(0.0, self.engine_seconds - self.first_token_s)

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first round over the engine's seconds after it (prefill left out;
        ``generation.result.decode_rate``); None for peers, or when the first round made every token."""
        if self.first_token_s is None or self.engine_seconds is None:
            return None
        return decode_rate(self.n_tokens, self.engine_seconds, self.first_token_s, self.first_tokens or 0)

    def row(self) -> dict:
        """A flat, JSON/CSV-ready dict without the token ids."""
        out = asdict(self)
        out.pop("tokens")
        out.pop("decisions")
        out.pop("prompt_ids")
        out.pop("evidence")
        out.update(n_tokens=self.n_tokens, tokens_per_s=self.tokens_per_s,
                   decode_tokens_per_s=self.decode_tokens_per_s)
        return out
