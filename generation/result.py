"""The one result shape every decoding strategy returns.

Strategies never print: they return a :class:`GenerationResult`, and the REPL,
the benchmark or a test decides what to show.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from analysis.divergence import Row
from analysis.trees import tree_summary
from generation.inspection import Inspection


@dataclass(frozen=True)
class Round:
    """One draft-and-verify round (or one plain target step when nothing was drafted).

    ``drafted``: the drafts proposed; ``accepted``: how many were kept (a prefix); ``token``: the
    target's token after them (a resample at the first rejection, or the bonus token; ``bonus`` says
    which), None when an end token or the length budget came first; ``gamma``: the length asked for
    (``drafted`` may be shorter); ``draft_s`` / ``verify_s``: device-timed seconds.

    A tree round (``generation.tree``) keeps ``tree_tokens`` and ``tree_parents`` (parents first; -1
    is the last committed token), ``path`` (the accepted nodes) and ``ranks`` (each one's rank among
    its siblings); its ``drafted`` is the path followed by the first-choice line below it, so
    ``accepted`` stays a prefix. ``inspection``: what both models thought at each drafted position
    (``generation.inspection``), or None. ``note``: the drafter's JSON-ready note on the round (a
    match drafter's ``source`` and ``match``), or None.
    """

    drafted: tuple[int, ...]
    accepted: int
    token: int | None
    bonus: bool
    gamma: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    tree_tokens: tuple[int, ...] = ()
    tree_parents: tuple[int, ...] = ()
    path: tuple[int, ...] = ()
    ranks: tuple[int, ...] = ()
    inspection: Inspection | None = None
    note: dict | None = None

    @property
    def tree_size(self) -> int:
        """Draft nodes verified this round (0 for a chain round)."""
        return len(self.tree_tokens)

    @property
    def rejected(self) -> tuple[int, ...]:
        return self.drafted[self.accepted:]


@dataclass
class GenerationResult:
    """What a strategy produced and what it cost.

    ``tokens``: the generated ids only, ending with the end token when one was produced, never longer
    than the length budget. ``drafted`` / ``accepted``: draft tokens over all rounds (with trees, every
    node verified). ``target_calls`` / ``drafter_calls``: forward passes. ``seconds``: wall time of the
    whole generation, prefill included, behind a device sync; ``phases`` splits it into ``draft``,
    ``verify`` and ``other``. ``first_token_s`` / ``first_tokens``: time to first token and what the
    first round appended (None and 0 when no round ended). ``stop_reason``: ``"eos"``, ``"length"``,
    ``"rounds"`` or ``"interrupted"``. ``trace``: the per-round record.

    ``decisions``: per emitted token, the top-k row that decided it (``analysis.divergence.Row``), kept
    for greedy target runs. ``compile``: how the forwards ran (``kvcache.static``; None for a served
    target; ``drafter_reason``: why the drafter's path is not the one asked). ``rollback``: per model,
    how its cache was rolled back and what it cost.
    ``gamma_policy``, ``tree`` (0: chains), ``tree_fallback``, ``tree_rule`` (``top`` or ``sampled``),
    ``verify_rule`` (``""`` for AR and trees): what ran. ``cross_tokenizer``, ``hybrid``, ``width_fill``,
    ``network``: the numbers of a drafter with another tokenizer, a hybrid drafter, filled verify widths
    and a served target, empty otherwise.
    """

    tokens: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    drafter_calls: int = 0
    rounds: int = 0
    seconds: float = 0.0
    stop_reason: str = "length"
    trace: list[Round] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=lambda: {"draft": 0.0, "verify": 0.0, "other": 0.0})
    rollback: dict[str, dict] = field(default_factory=dict)
    gamma_policy: str = ""
    tree: int = 0
    tree_fallback: str = ""
    tree_rule: str = ""
    verify_rule: str = ""
    cross_tokenizer: dict = field(default_factory=dict)
    hybrid: dict = field(default_factory=dict)
    width_fill: dict = field(default_factory=dict)
    network: dict = field(default_factory=dict)   # a served target's requests and their times (remote.transport.RequestTimes)
    first_token_s: float | None = None
    first_tokens: int = 0
    compile: dict | None = None   # how the forwards ran (kvcache.static.compile_report); None: served
    decisions: list[Row] | None = None

    @property
    def acceptance_rate(self) -> float:
        """Accepted drafts over drafted tokens; 0.0 when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else 0.0

    @property
    def decode_seconds(self) -> float | None:
        """Seconds after the first round (the whole run less the time to first token)."""
        return None if self.first_token_s is None else max(0.0, self.seconds - self.first_token_s)

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Tokens after the first round over :attr:`decode_seconds`: tokens/s with the prefill left
        out. None when unknown or when the first round made every token."""
        return decode_rate(len(self.tokens), self.seconds, self.first_token_s, self.first_tokens)

    @property
    def tokens_per_target_call(self) -> float:
        """Mean generated tokens per target forward pass (1.0 for plain decoding)."""
        return len(self.tokens) / self.target_calls if self.target_calls else 0.0

    @property
    def interrupted(self) -> bool:
        return self.stop_reason == "interrupted"

    def to_dict(self, *, with_trace: bool = False) -> dict:
        """A JSON-ready summary (metrics included, trace only when asked)."""
        out = asdict(self)
        out.pop("trace")
        rows = out.pop("decisions")
        out.update(
            n_tokens=len(self.tokens),
            acceptance_rate=self.acceptance_rate,
            tokens_per_s=self.tokens_per_second,
            tokens_per_target_call=self.tokens_per_target_call,
            decode_tokens_per_s=self.decode_tokens_per_second,
        )
        if self.tree and self.trace:
            out["tree_stats"] = tree_summary(self.trace, tokens=len(self.tokens), target_calls=self.target_calls)
        if with_trace:
            out["trace"] = [asdict(r) for r in self.trace]
            out["decisions"] = None if rows is None else [row.to_list() for row in self.decisions]
        return out


def decode_rate(tokens: int, seconds: float, first_token_s: float | None, first_tokens: int) -> float | None:
    """Tokens after the first round per second after it, or None when the time to first token is
    unknown, nothing came after the first round, or no time passed after it."""
    if first_token_s is None:
        return None
    rest, after = tokens - first_tokens, seconds - first_token_s
    return rest / after if rest > 0 and after > 0 else None


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first position where two token lists differ (the shorter one's length when one is
    a prefix of the other), or None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
