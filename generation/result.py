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

    ``drafted``: the draft tokens proposed this round (possibly empty).
    ``accepted``: how many of them the target accepted (a prefix of ``drafted``).
    ``token``: the token the target put in after the accepted drafts (a resample
    at the first rejected position, or the bonus token when every draft was
    accepted); ``None`` when the round ended inside the accepted drafts
    (an end token or the length budget came first).
    ``bonus``: True when ``token`` is the bonus token after a fully accepted round
    with at least one draft.
    ``gamma``: the draft length the round asked for (its gamma policy's choice,
    capped by the length budget); ``len(drafted)`` can be shorter (a drafter
    stopped early: unknown n-gram context, low confidence).
    ``draft_s`` / ``verify_s``: seconds spent drafting and in the target's
    verify forward this round (device-timed, see ``generation.phases``).

    A tree round (see ``generation.tree``) also keeps its tree: ``tree_tokens``
    and ``tree_parents`` (one entry per node, parents first; -1 is the last
    committed token), ``path`` (the accepted nodes, one per accepted depth) and
    ``ranks`` (each accepted node's rank among its siblings: 0 is the drafter's
    first choice). Its ``drafted`` is the accepted path followed by the
    first-choice line below where it stopped, so ``accepted`` stays a prefix.
    Chain rounds leave these empty.

    ``inspection``: what both models thought at each drafted position (top
    tokens, p, q, acceptance probability, entropies; ``generation.inspection``),
    or None when it was not recorded (plain decoding, tree rounds, old traces).

    ``note``: what the drafter said about this round's drafts (``Drafter.report().round_notes``),
    a small JSON-ready dict, or None. The model-free drafters say which text the drafts
    were copied from (``source``: ``prompt`` or ``global`` for SuffixDecoding's tries,
    ``context`` or ``corpus`` for the suffix automaton, ``""`` when nothing matched) and
    how many tail tokens matched there (``match``).
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

    ``tokens`` holds the generated ids only (no prompt), ending with the end token
    when one was produced, never longer than the length budget.
    ``drafted`` / ``accepted`` count draft tokens proposed / accepted over all rounds.
    ``target_calls`` / ``drafter_calls`` count forward passes of each model.
    ``seconds`` is wall time of the whole generation (prefill included), measured
    behind a device synchronisation.
    ``decisions``: per emitted token, the top-k of the target logits row that decided it
    (``analysis.divergence.Row``; ``generation.decisions``), kept for greedy runs of the
    target; None when not recorded. ``analysis.divergence.explain`` reads them.
    ``first_token_s``: seconds from the start until the first round's tokens were on
    the host (time to first token: the prefill and, when drafting, the first round's
    drafts and verify); ``first_tokens``: how many tokens that round appended. The
    rest is the decode part (:attr:`decode_seconds`, :attr:`decode_tokens_per_second`).
    None and 0 when no round ended (an empty budget, an interrupted prefill, old traces).
    ``stop_reason`` is ``"eos"``, ``"length"``, ``"rounds"`` (``LoopOptions.max_rounds``) or
    ``"interrupted"``.
    ``compile`` (None for a served target): ``requested`` (the strategy's compile path),
    ``path`` (what the target ran: off, static or graphs), ``reason`` (why it fell back,
    "" when it did not), ``drafter_path`` (the drafter model's, None when none ran),
    ``drafter_reason`` (why the drafter's path is not the one asked, "" when it is),
    ``widths`` (the widths run captured), ``buckets`` (the capture widths they ran in, padded),
    ``captures`` (``model_captures``: per model), ``capture_s`` (seconds capturing, left out of
    ``seconds``), ``recompiles`` (0 is right) and ``eager`` (forwards no bucket held);
    ``kvcache.static``.
    ``trace`` is the per-round record (always kept: a few ints per round).
    ``phases`` splits ``seconds`` into ``draft`` (drafter forwards or n-gram
    look-ups), ``verify`` (target forwards) and ``other`` (host work between
    them); the three add up to ``seconds``.
    ``rollback`` says, per model (``"target"``, ``"drafter"``), how its cache
    was rolled back and what that cost (see ``kvcache.cache.RollbackStats``).
    ``gamma_policy`` names the draft-length policy of the run ("" for AR).
    ``tree``: the tree budget the run verified with (0: chains);
    ``tree_fallback``: why a run asked for trees verified chains (one line, "" otherwise);
    ``tree_rule``: how its trees were drafted and verified: "top" (each node's top
    children, the target's draw followed) or "sampled" (children drawn from q,
    recursive rejection sampling); "" without trees.
    ``verify_rule``: the chain verify rule that ran (``residual``, ``block`` or
    ``strict``; ``generation.verify_rules``); "" for AR and for tree rounds.
    With trees, ``drafted`` counts every node verified.
    ``cross_tokenizer`` (empty unless the drafter has another tokenizer): the
    method (``slem``/``tli``), the shared vocabulary (``shared_tokens``,
    ``shared_of_drafter``, ``shared_of_target``), ``retokenize_s`` (seconds of
    host work moving text between the vocabularies, part of the draft phase)
    and ``sync_misses`` (rounds whose text the drafter could not spell exactly).
    ``hybrid`` (empty unless speculative decoding ran a hybrid drafter,
    ``engine.strategy.HybridOptions``): its ``L`` and, per kind of round
    (``model``, ``retrieval``), the ``rounds``, ``drafted`` and ``accepted``
    counts and the ``acceptance`` (``analysis.hybrid.hybrid_summary``).
    ``width_fill`` (empty unless NASD's suffix or sam storage filled verify widths,
    ``engine.strategy.NGramOptions.fill_width``): the ``rounds`` filled, the ``drafts``
    added and ``accepted`` of them, and the measured ``verify_ms`` by width
    (``analysis.sources.fill_summary``).
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
    """Index of the first position where two token lists differ, or None if equal.

    When one list is a strict prefix of the other, the divergence is at the
    shorter one's length.
    """
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
