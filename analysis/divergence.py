"""Why a strategy's greedy output differs from target AR's: a near-tie, or unexplained.

In bfloat16 a verify pass over k tokens rounds differently from a one-token step, so where the
target's top two logits are nearly equal the outputs may part without a bug. Each run records,
per emitted position, the top-k of the logits row that decided it (:class:`Row`). At the first
differing position, with a = AR's token and b = the strategy's, it is a ``near-tie`` when

- each computation ranked its own token first;
- (i) each row matches the reference (the model's uncached forward over the committed prefix in the
  run's dtype) within the rounding correct computations show (``analysis.reference``);
- (ii) the float32 reference's margin between a and b is within that rounding.

Otherwise ``unexplained``, the note saying which failed; without a reference, no verdict.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

NEAR_TIE = "near-tie"
UNEXPLAINED = "unexplained"


@dataclass(frozen=True)
class Row:
    """The top-k of one target logits row: ``values`` descending, ``indices`` their token ids."""

    values: tuple[float, ...]
    indices: tuple[int, ...]

    def logit(self, token: int) -> float | None:
        """``token``'s logit, or None when it is outside the recorded top-k (below :attr:`floor`)."""
        for value, index in zip(self.values, self.indices):
            if index == token:
                return value
        return None

    @property
    def floor(self) -> float:
        """The k-th value: every token outside the record has a logit at most this."""
        return self.values[-1]

    def ranks_first(self, token: int) -> bool:
        """Whether ``token``'s logit is the row's largest (an exact tie counts: argmax picks one)."""
        value = self.logit(token)
        return value is not None and value >= self.values[0]

    def to_list(self) -> list:
        """``[values, indices]`` (a trace file's form; :func:`row_of` reads it back)."""
        return [list(self.values), list(self.indices)]


def row_of(data) -> Row:
    """A :class:`Row` from its :meth:`Row.to_list` form (or a dict with ``values`` and ``indices``)."""
    values, indices = (data["values"], data["indices"]) if isinstance(data, dict) else data
    return Row(tuple(float(v) for v in values), tuple(int(i) for i in indices))


@dataclass(frozen=True)
class Evidence:
    """The reference's numbers at a difference (``analysis.reference.evidence``): the largest
    |recorded - reference| of AR's row (``ar_deviation``) and the strategy's (``deviation``), the
    ``tolerance`` of that ``dtype``, and the float32 |logit(a) - logit(b)| (``margin32``, or None)."""

    ar_deviation: float
    deviation: float
    tolerance: float
    margin32: float | None
    dtype: str = ""

    def to_dict(self) -> dict:
        return {"ar_deviation": self.ar_deviation, "deviation": self.deviation, "tolerance": self.tolerance,
                "margin32": self.margin32, "dtype": self.dtype}

    @classmethod
    def from_dict(cls, data: dict) -> "Evidence":
        margin = data.get("margin32")
        return cls(float(data["ar_deviation"]), float(data["deviation"]), float(data["tolerance"]),
                   None if margin is None else float(margin), str(data.get("dtype", "")))


@dataclass(frozen=True)
class Divergence:
    """Where and why a strategy's output first differs from target AR's.

    ``ar_token`` (a) and ``token`` (b) at ``position``; ``ar_logits`` / ``logits``: (logit of a, logit
    of b) in each row, None outside the recorded top-k (at most ``ar_floor`` / ``floor``);
    ``ar_margin`` = logit_AR(a) - logit_AR(b); ``margin`` = logit_S(b) - logit_S(a); ``difference`` =
    max over t in {a, b} of |logit_AR(t) - logit_S(t)|. ``verdict``: ``near-tie``, ``unexplained`` or
    None; ``note`` says why; ``evidence``: :class:`Evidence` or None.
    """

    position: int
    ar_token: int | None
    token: int | None
    verdict: str | None
    note: str
    ar_logits: tuple[float | None, float | None] = (None, None)
    logits: tuple[float | None, float | None] = (None, None)
    ar_floor: float | None = None
    floor: float | None = None
    ar_margin: float | None = None
    margin: float | None = None
    difference: float | None = None
    evidence: Evidence | None = None

    @property
    def tie(self) -> bool:
        return self.verdict == NEAR_TIE

    @property
    def short(self) -> str:
        """The identical column's word: ``tie@37`` for a near-tie, ``no@37`` otherwise."""
        return f"{'tie' if self.tie else 'no'}@{self.position}"

    def to_dict(self) -> dict:
        """JSON-ready: position, tokens, logits (null: outside the top-k, at most the floor),
        margins, difference, verdict and note."""
        return {
            "position": self.position,
            "tokens": {"target_ar": self.ar_token, "strategy": self.token},
            "logits": {"target_ar": list(self.ar_logits), "strategy": list(self.logits)},
            "floors": {"target_ar": self.ar_floor, "strategy": self.floor},
            "margins": {"target_ar": self.ar_margin, "strategy": self.margin},
            "difference": self.difference,
            "verdict": self.verdict,
            "note": self.note,
            "reference": None if self.evidence is None else self.evidence.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Divergence":
        """The inverse of :meth:`to_dict` (a JSON record read back)."""
        tokens, logits = data.get("tokens") or {}, data.get("logits") or {}
        floors, margins = data.get("floors") or {}, data.get("margins") or {}
        reference = data.get("reference")
        return cls(int(data["position"]), tokens.get("target_ar"), tokens.get("strategy"), data.get("verdict"),
                   str(data.get("note", "")), tuple(logits.get("target_ar") or (None, None)),
                   tuple(logits.get("strategy") or (None, None)), floors.get("target_ar"), floors.get("strategy"),
                   margins.get("target_ar"), margins.get("strategy"), data.get("difference"),
                   None if reference is None else Evidence.from_dict(reference))


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token lists differ (the shorter one's length when
    one is a strict prefix of the other), or None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# reference(p, ar_tokens, a, b, ar_row, row) -> Evidence: the reference at a difference
# (``analysis.reference.Referee.for_prompt``), or None where none can be computed.
Reference = Callable[[int, Sequence[int], int, int, Row, Row], "Evidence | None"]


def held_to_target(strategy: str) -> bool:
    """Whether a strategy's greedy output is compared with target AR's and judged: every one but
    drafter AR, another model's output, which no lossless method promises to equal."""
    return strategy != "drafter"


def explain(ar_tokens: Sequence[int], ar_rows: Sequence[Row] | None, tokens: Sequence[int],
            rows: Sequence[Row] | None, *, greedy: bool = True, reference: Reference | None = None,
            evidence: Evidence | None = None) -> Divergence | None:
    """The first divergence of ``tokens`` (with its decision ``rows``) from ``ar_tokens`` (``ar_rows``),
    with its verdict; None when equal. No verdict when ``greedy`` is False or without ``reference``
    (computed here) or ``evidence`` (read back)."""
    p = first_difference(ar_tokens, tokens)
    if p is None:
        return None
    a = ar_tokens[p] if p < len(ar_tokens) else None
    b = tokens[p] if p < len(tokens) else None
    if not greedy:
        return Divergence(p, a, b, None, "sampling: the runs draw their tokens, no verdict applies")
    if a is None or b is None:
        return Divergence(p, a, b, None, f"{'target AR' if a is None else 'the strategy'}'s output ends first")
    if ar_rows is None or rows is None or p >= len(ar_rows) or p >= len(rows):
        return Divergence(p, a, b, None, "the deciding logits were not recorded")
    if evidence is None and reference is not None and ar_rows[p].ranks_first(a) and rows[p].ranks_first(b):
        evidence = reference(p, ar_tokens, a, b, ar_rows[p], rows[p])
    return judge(p, a, b, ar_rows[p], rows[p], evidence)


def judge(position: int, a: int, b: int, ar_row: Row, row: Row, evidence: Evidence | None = None) -> Divergence:
    """The verdict at ``position`` where target AR emitted ``a`` from ``ar_row`` and the strategy
    ``b`` from ``row``, against the reference ``evidence`` (see the module's docstring)."""
    ar_logits, logits = (ar_row.logit(a), ar_row.logit(b)), (row.logit(a), row.logit(b))
    known = None not in ar_logits + logits
    ar_margin = ar_logits[0] - ar_logits[1] if known else None
    margin = logits[1] - logits[0] if known else None
    difference = max(abs(ar_logits[0] - logits[0]), abs(ar_logits[1] - logits[1])) if known else None
    facts = dict(ar_logits=ar_logits, logits=logits, ar_floor=ar_row.floor, floor=row.floor,
                 ar_margin=ar_margin, margin=margin, difference=difference, evidence=evidence)
    if not row.ranks_first(b):
        note = f"the strategy emitted {b}, which its own verify row did not rank first (a bug under greedy)"
        return Divergence(position, a, b, UNEXPLAINED, note, **facts)
    if not ar_row.ranks_first(a):
        note = f"target AR emitted {a}, which its own step row did not rank first"
        return Divergence(position, a, b, UNEXPLAINED, note, **facts)
    if evidence is None:
        return Divergence(position, a, b, None, "no reference forward was computed for this difference", **facts)
    tol = evidence.tolerance
    off = [(name, dev) for name, dev in (("target AR", evidence.ar_deviation), ("the strategy", evidence.deviation))
           if dev > tol]
    if off:
        where = " and ".join(f"{name}'s row is {dev:.4g} from the reference" for name, dev in off)
        note = f"(i) fails: {where}, more than {evidence.dtype} rounding ({tol:.3g})"
        return Divergence(position, a, b, UNEXPLAINED, note, **facts)
    if evidence.margin32 is None:
        return Divergence(position, a, b, None, "both rows match the reference, but no float32 margin could be "
                          "computed (the model cannot be cast, or its float32 copy would not fit)", **facts)
    if evidence.margin32 > tol:
        note = (f"(ii) fails: the float32 margin between {a} and {b} is {evidence.margin32:.4g}, more than "
                f"{evidence.dtype} rounding ({tol:.3g}): no tie a correct computation could flip")
        return Divergence(position, a, b, UNEXPLAINED, note, **facts)
    note = (f"both rows within {evidence.dtype} rounding ({tol:.3g}) of the reference "
            f"({evidence.ar_deviation:.3g}, {evidence.deviation:.3g}); float32 margin {evidence.margin32:.3g}")
    return Divergence(position, a, b, NEAR_TIE, note, **facts)


def identity_counts(divergences: Sequence[Divergence | None]) -> dict[str, int]:
    """Of runs compared with target AR: ``identical``, ``ties``, ``unexplained`` and ``unjudged`` (no
    rows recorded, as for a peer)."""
    verdicts = [None if d is None else d.verdict or "" for d in divergences]
    return {"identical": verdicts.count(None), "ties": verdicts.count(NEAR_TIE),
            "unexplained": verdicts.count(UNEXPLAINED), "unjudged": verdicts.count("")}
