"""One timed decode of one prompt by one variant: the unit every number is built from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from generation.result import decode_rate


@dataclass
class RunRecord:
    """What one run produced and cost.

    ``seconds``: the benchmark's own timer (device sync on both sides), the same for ours and the
    peers'; ``engine_seconds`` the engine's (None for peers, as are ``drafted``, ``accepted``,
    ``phases``, ``acceptance``, ``first_token_s`` and ``compile``). ``overshoot``: tokens beyond the
    length budget, cut from ``tokens`` (transformers' prompt lookup can overshoot ``max_new_tokens``).
    ``rounds`` / ``mean_gamma``: draft rounds and the mean length they asked for. ``decisions``: our
    greedy run's deciding rows (first repeat only, in memory only). ``acceptance``:
    ``AcceptanceCounts.to_dict``, pooled for the summary. ``session`` / ``position``: the session and
    1-based step ("" and 0 alone). ``other_load`` / ``busy``: other processes' load while it ran, and
    whether it passed ``utils.machine_load.BUSY_CORES``.
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
