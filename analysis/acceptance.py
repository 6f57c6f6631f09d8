"""Acceptance statistics from a run's rounds, as the serving engines count them.

Rounds are :class:`generation.result.Round` objects or their trace-file dicts, so a replay gives
the live run's numbers. The engines' numbers (vLLM, llama.cpp, SGLang; docs/why.md) come from one
:class:`AcceptanceCounts`: mean acceptance length = 1 + accepted / drafting rounds; draft acceptance
rate = accepted / drafted; per position (unconditional and conditional); histograms.

A *drafting round* drafted at least one token. A round cut by an end token or the length budget
counts the drafts it kept, all accepted (only a run's last round can be cut). A tree round counts
every node verified as drafted; its positions are depths along the accepted path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping


def _get(rnd: Any, name: str, default=None):
    if isinstance(rnd, Mapping):
        return rnd.get(name, default)
    return getattr(rnd, name, default)


def round_counts(rnd: Any) -> tuple[int, int]:
    """(drafted, accepted) counts of one round, from a Round or its dict."""
    drafted = _get(rnd, "drafted", ()) or ()
    return len(drafted), int(_get(rnd, "accepted", 0) or 0)


def window_rows(rnd: Any) -> int:
    """Rows the round's verify fed besides its drafts and the last committed token: lookahead's
    Jacobi window (its note's ``rows``; 0 for every other drafter)."""
    note = _get(rnd, "note", None)
    return int(note.get("rows", 0) or 0) if isinstance(note, dict) else 0


def verify_width(rnd: Any) -> int:
    """Tokens the target's verify forward took in this round: its drafts (a tree: every node) plus
    the last committed token, and lookahead's window rows (:func:`window_rows`)."""
    tree = _get(rnd, "tree_tokens", ()) or ()
    drafts = len(tree) if tree else len(_get(rnd, "drafted", ()) or ())
    return drafts + 1 + window_rows(rnd)


def position_counts(rounds: Iterable[Any], *, missing_is_rejection: bool = False) -> list[tuple[int, int]]:
    """(passed, reached) per draft position.

    Position i is reached when the target judged draft i (drafted, and 0..i-1 accepted; a round cut
    short never judged the drafts after the cut); it passed when draft i was accepted.
    ``missing_is_rejection``: a position the round asked for (``gamma``) but the drafter did not fill
    counts as reached and not passed, the chance the speedup model needs.
    """
    reached: list[int] = []
    passed: list[int] = []
    for rnd in rounds:
        drafted, accepted = round_counts(rnd)
        cut = _get(rnd, "token", 0) is None and accepted < drafted
        length = drafted
        if missing_is_rejection and not cut:
            length = max(drafted, int(_get(rnd, "gamma", 0) or 0))
        judged = accepted if cut else min(length, accepted + 1)
        while len(reached) < judged:
            reached.append(0)
            passed.append(0)
        for i in range(judged):
            reached[i] += 1
            passed[i] += i < accepted
    return list(zip(passed, reached))


def yield_by_position(rounds: Iterable[Any]) -> list[float]:
    """:func:`conditional_acceptance_per_position` over the drafting rounds, a draft asked for and not
    made counted as rejected: the rates the speedup model uses."""
    drafting = [rnd for rnd in rounds if round_counts(rnd)[0] > 0]
    return [p / n for p, n in position_counts(drafting, missing_is_rejection=True) if n]


def draft_share(rounds: Iterable[Any]) -> float:
    """The share of rounds that drafted at least one token (1.0 when there are no rounds)."""
    counts = [round_counts(rnd)[0] > 0 for rnd in rounds]
    return sum(counts) / len(counts) if counts else 1.0



# ------------------------------------------------------------ the engines' numbers

def drafted_count(rnd: Any) -> int:
    """Draft tokens the target verified in this round, as the engines count them: a chain round's
    drafts, every node of a tree, the kept drafts of a cut round. Summed: ``GenerationResult.drafted``."""
    tree = _get(rnd, "tree_tokens", ()) or ()
    if tree and _get(rnd, "token", 0) is not None:
        return len(tree)
    return round_counts(rnd)[0]


def _pad(counts: list[int], length: int) -> list[int]:
    """``counts`` with zeros appended up to ``length`` entries."""
    return list(counts) + [0] * (length - len(counts))


def _add(a: list[int], b: list[int]) -> list[int]:
    """Entry-wise sum of two count lists of any lengths."""
    n = max(len(a), len(b))
    return [x + y for x, y in zip(_pad(a, n), _pad(b, n))]


def _bump(counts: list[int], k: int) -> None:
    """counts[k] += 1, growing ``counts`` with zeros as needed."""
    counts.extend([0] * (k + 1 - len(counts)))
    counts[k] += 1


@dataclass
class AcceptanceCounts:
    """The counters behind every acceptance number, over one run's drafting rounds or, added (``+``),
    many runs' (pooled, as the engines do).

    ``accepted_by_position[i]`` / ``reached_by_position[i]``: rounds that accepted / judged draft i
    (depth i along a tree's path), up to the longest chain offered. ``histogram[k]``: rounds that
    accepted exactly k drafts; ``by_draft_length[n]``: the same over rounds that drafted n tokens.
    """

    drafting_rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_by_position: list[int] = field(default_factory=list)
    reached_by_position: list[int] = field(default_factory=list)
    histogram: list[int] = field(default_factory=list)
    by_draft_length: dict[int, list[int]] = field(default_factory=dict)

    def __add__(self, other: "AcceptanceCounts") -> "AcceptanceCounts":
        """Both sets of counters pooled (lists of different lengths padded with zeros)."""
        lengths = sorted(set(self.by_draft_length) | set(other.by_draft_length))
        return AcceptanceCounts(
            drafting_rounds=self.drafting_rounds + other.drafting_rounds,
            drafted=self.drafted + other.drafted,
            accepted=self.accepted + other.accepted,
            accepted_by_position=_add(self.accepted_by_position, other.accepted_by_position),
            reached_by_position=_add(self.reached_by_position, other.reached_by_position),
            histogram=_add(self.histogram, other.histogram),
            by_draft_length={n: _add(self.by_draft_length.get(n, []), other.by_draft_length.get(n, []))
                             for n in lengths},
        )

    @property
    def mean_acceptance_length(self) -> float:
        """1 + accepted / drafting rounds: tokens per drafting round, the target's own
        (bonus or correction) token included; 1.0 when no round drafted (as vLLM)."""
        return 1.0 + (self.accepted / self.drafting_rounds if self.drafting_rounds else 0.0)

    @property
    def draft_acceptance_rate(self) -> float:
        """accepted / drafted; 0.0 when nothing was drafted (as ``GenerationResult.acceptance_rate``)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        """Unconditional: rounds that accepted draft i / drafting rounds (vLLM, llama.cpp)."""
        n = self.drafting_rounds
        return [a / n for a in self.accepted_by_position] if n else []

    @property
    def conditional_acceptance_per_position(self) -> list[float]:
        """Rounds that accepted draft i / rounds that reached it (SGLang), over the positions some round
        reached (an unobserved position is never a rejection)."""
        return [a / r for a, r in zip(self.accepted_by_position, self.reached_by_position) if r]

    def to_dict(self) -> dict:
        """The counters, JSON-ready (draft lengths as string keys)."""
        return dict(drafting_rounds=self.drafting_rounds, drafted=self.drafted, accepted=self.accepted,
                    accepted_by_position=list(self.accepted_by_position),
                    reached_by_position=list(self.reached_by_position),
                    acceptance_histogram=list(self.histogram),
                    acceptance_histogram_by_draft_length={str(n): list(h)
                                                          for n, h in sorted(self.by_draft_length.items())})

    @classmethod
    def from_dict(cls, data: Mapping) -> "AcceptanceCounts":
        """The inverse of :meth:`to_dict`."""
        def ints(values) -> list[int]:
            return [int(v) for v in values or []]

        return cls(
            drafting_rounds=int(data.get("drafting_rounds", 0)), drafted=int(data.get("drafted", 0)),
            accepted=int(data.get("accepted", 0)),
            accepted_by_position=ints(data.get("accepted_by_position")),
            reached_by_position=ints(data.get("reached_by_position")),
            histogram=ints(data.get("acceptance_histogram")),
            by_draft_length={int(n): ints(h)
                             for n, h in (data.get("acceptance_histogram_by_draft_length") or {}).items()},
        )


def acceptance_counts(rounds: Iterable[Any]) -> AcceptanceCounts:
    """The counters of a run's drafting rounds (what counts: the module docstring)."""
    drafting = [rnd for rnd in rounds if drafted_count(rnd) > 0]
    longest = max((round_counts(rnd)[0] for rnd in drafting), default=0)
    passed_reached = position_counts(drafting)
    counts = AcceptanceCounts(
        drafting_rounds=len(drafting),
        drafted=sum(drafted_count(rnd) for rnd in drafting),
        accepted=sum(round_counts(rnd)[1] for rnd in drafting),
        accepted_by_position=_pad([p for p, _ in passed_reached], longest),
        reached_by_position=_pad([n for _, n in passed_reached], longest),
        histogram=[0] * (longest + 1) if drafting else [],
    )
    for rnd in drafting:
        accepted, length = round_counts(rnd)[1], drafted_count(rnd)
        _bump(counts.histogram, accepted)
        _bump(counts.by_draft_length.setdefault(length, [0] * (length + 1)), accepted)
    counts.by_draft_length = dict(sorted(counts.by_draft_length.items()))
    return counts


def mean_acceptance_length(rounds: Iterable[Any]) -> float:
    """1 + accepted / drafting rounds (vLLM's "mean acceptance length"; llama.cpp's too)."""
    return acceptance_counts(rounds).mean_acceptance_length


def draft_acceptance_rate(rounds: Iterable[Any]) -> float:
    """Accepted drafts over drafted tokens (a tree round drafted all its nodes)."""
    return acceptance_counts(rounds).draft_acceptance_rate


def acceptance_rate_per_position(rounds: Iterable[Any]) -> list[float]:
    """Per position i: drafting rounds that accepted draft i over all drafting rounds."""
    return acceptance_counts(rounds).acceptance_rate_per_position


def conditional_acceptance_per_position(rounds: Iterable[Any]) -> list[float]:
    """Per position i: rounds that accepted draft i over the rounds that reached it."""
    return acceptance_counts(rounds).conditional_acceptance_per_position


def acceptance_histogram(rounds: Iterable[Any]) -> list[int]:
    """Index k: drafting rounds that accepted exactly k drafts, k = 0 .. the longest
    draft (empty when no round drafted); it sums to the drafting rounds."""
    return acceptance_counts(rounds).histogram


def acceptance_histogram_by_draft_length(rounds: Iterable[Any]) -> dict[int, list[int]]:
    """{draft length n: the histogram over the rounds that drafted n tokens}: one entry under a
    constant γ, several when γ adapts."""
    return acceptance_counts(rounds).by_draft_length


def engine_numbers(counts: AcceptanceCounts) -> dict:
    """Every engine number of ``counts``, JSON-ready (``--json``, traces, the benchmark); the draft
    acceptance rate keeps the project's name, ``acceptance_rate``."""
    return dict(
        mean_acceptance_length=counts.mean_acceptance_length,
        acceptance_rate=counts.draft_acceptance_rate,  # the engines' "draft acceptance rate"
        acceptance_rate_per_position=counts.acceptance_rate_per_position,
        conditional_acceptance_per_position=counts.conditional_acceptance_per_position,
        acceptance_histogram=list(counts.histogram),
        acceptance_histogram_by_draft_length={str(n): list(h) for n, h in counts.by_draft_length.items()},
        drafting_rounds=counts.drafting_rounds,
    )
