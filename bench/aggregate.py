"""From run records to the numbers in the table. Pure functions, no I/O.

The definitions are docs/benchmark.md's. Ratios (speedup, "vs peer", decode speedup) are paired
per repeat, so drift between repeats cancels, and each takes only the runs both sides finished
(:func:`common_runs`), so a benchmark stopped part-way compares like with like. The engines'
acceptance numbers pool the drafting rounds of every run, as an engine pools its requests.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from analysis.acceptance import AcceptanceCounts
from analysis.divergence import Divergence, explain, held_to_target, identity_counts
from utils.builtin_prompts import GROUNDED_CATEGORIES
from generation.result import first_divergence
from bench.margin import ratio_margin
from bench.records import RunRecord
from bench.variants import BASELINE, matching_peer, parse_variant_name

ALL = "all"
GROUNDED = "grounded"


@dataclass
class SummaryRow:
    variant: str
    strategy: str
    gamma: int | None
    family: str
    category: str
    prompts: int
    tokens_per_s: float
    speedup: float | None
    peer: str | None = None
    vs_peer: float | None = None
    speedup_margin: float | None = None
    vs_peer_margin: float | None = None
    acceptance_rate: float | None = None
    tokens_per_target_call: float | None = None
    call_cost: float | None = None
    target_calls: float | None = None
    mean_tokens: float | None = None
    identical: float | None = None
    identical_count: int | None = None
    first_divergence: float | None = None
    divergences: list[int] = field(default_factory=list)
    ties: int | None = None
    unexplained: int | None = None
    unjudged: int | None = None
    gamma_policy: str = ""
    mean_gamma: float | None = None
    mean_acceptance_length: float | None = None
    acceptance_rate_per_position: list[float] | None = None
    conditional_acceptance_per_position: list[float] | None = None
    acceptance_histogram: list[int] | None = None
    acceptance_histogram_by_draft_length: dict[str, list[int]] | None = None
    position: int | None = None
    ttft_ms: float | None = None
    decode_tokens_per_s: float | None = None
    decode_speedup: float | None = None


def median(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def throughput(records: Iterable[RunRecord]) -> float:
    """Total tokens over total seconds."""
    records = list(records)
    seconds = sum(r.seconds for r in records)
    return sum(r.n_tokens for r in records) / seconds if seconds > 0 else 0.0


def per_repeat_throughput(records: Iterable[RunRecord]) -> dict[int, float]:
    return _per_repeat(records, throughput)


def paired_ratio(mine: dict[int, float], base: dict[int, float]) -> float | None:
    """Median over repeats of mine[r] / base[r], over the repeats both have."""
    ratios = [mine[r] / base[r] for r in mine if r in base and base[r] > 0]
    return median(ratios)


def common_runs(mine: Sequence[RunRecord], other: Sequence[RunRecord]) -> tuple[list[RunRecord], list[RunRecord]]:
    """The runs of ``mine`` and of ``other`` on the prompts and repeats (``RunRecord.key``) both
    finished: a run whose partner is missing (a benchmark stopped part-way) is left out of both."""
    keys = {r.key for r in mine} & {r.key for r in other}
    return [r for r in mine if r.key in keys], [r for r in other if r.key in keys]


def paired_speed(mine: Sequence[RunRecord], other: Sequence[RunRecord], rate=None) -> float | None:
    """``mine``'s speed over ``other``'s, paired per repeat on their common runs: the median over
    repeats of the per-repeat ratio of ``rate`` (default :func:`throughput`) of each side."""
    a, b = common_runs(mine, other)
    rate = rate or throughput
    return paired_ratio(_per_repeat(a, rate), _per_repeat(b, rate))


def _per_repeat(records: Iterable[RunRecord], rate) -> dict[int, float]:
    """``rate`` of ``records`` per repeat, the repeats where it is known."""
    by_repeat: dict[int, list[RunRecord]] = defaultdict(list)
    for r in records:
        by_repeat[r.repeat].append(r)
    values = {repeat: rate(rs) for repeat, rs in sorted(by_repeat.items())}
    return {repeat: v for repeat, v in values.items() if v is not None}


def decode_throughput(records: Iterable[RunRecord]) -> float | None:
    """Tokens after each run's first round over the engine's seconds after it, both summed over
    the runs that know their time to first token (None without such a run or such time)."""
    known = [r for r in records if r.decode_seconds is not None]
    tokens = sum(r.n_tokens - (r.first_tokens or 0) for r in known)
    seconds = sum(r.decode_seconds for r in known)
    return tokens / seconds if tokens > 0 and seconds > 0 else None


def ttft_ms(records: Iterable[RunRecord]) -> float | None:
    """The median time to first token of ``records``, in ms (None for peers)."""
    return median(1000 * r.first_token_s for r in records if r.first_token_s is not None)


def seconds_per_call(records: Iterable[RunRecord]) -> float | None:
    """Seconds over target forward passes, both summed (None without a pass)."""
    records = list(records)
    calls = sum(r.target_calls for r in records)
    return sum(r.seconds for r in records) / calls if calls else None


def call_cost(records: Sequence[RunRecord], base: Sequence[RunRecord]) -> float | None:
    """``records``' seconds per target call over ``base``'s (target AR's), on the runs both finished."""
    records, base = common_runs(records, base)
    mine, theirs = seconds_per_call(records), seconds_per_call(base)
    return mine / theirs if mine is not None and theirs else None


def category_groups(categories: Iterable[str]) -> dict[str, set[str]]:
    """Each category alone, the input-grounded ones together, and all of them."""
    present = sorted(set(categories))
    groups = {c: {c} for c in present}
    grounded = {c for c in present if c in GROUNDED_CATEGORIES}
    if grounded:
        groups[GROUNDED] = grounded
    groups[ALL] = set(present)
    return groups


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator else None


def _mean_of_rounds(records: Sequence[RunRecord]) -> float | None:
    """The mean draft length asked for over every round of ``records`` (None if unknown)."""
    known = [r for r in records if r.mean_gamma is not None and r.rounds]
    rounds = sum(r.rounds for r in known)
    return sum(r.mean_gamma * r.rounds for r in known) / rounds if rounds else None


def pooled_acceptance(records: Sequence[RunRecord]) -> tuple[AcceptanceCounts | None, bool]:
    """(the acceptance counters of ``records`` pooled, whether every run carried them); None when no
    run reports drafts. A run with totals only adds to the acceptance rate alone."""
    known = [r for r in records if r.drafted is not None]
    if not known:
        return None, False
    total = AcceptanceCounts()
    for r in known:
        total = total + (AcceptanceCounts.from_dict(r.acceptance) if r.acceptance is not None
                         else AcceptanceCounts(drafted=r.drafted, accepted=r.accepted or 0))
    return total, all(r.acceptance is not None for r in known)


def _acceptance_fields(records: Sequence[RunRecord]) -> dict:
    """The summary row's acceptance numbers (all None for the peers)."""
    counts, per_round = pooled_acceptance(records)
    if counts is None:
        return {}
    out = dict(acceptance_rate=counts.draft_acceptance_rate if counts.drafted else None)
    if per_round:
        out.update(mean_acceptance_length=counts.mean_acceptance_length,
                   acceptance_rate_per_position=counts.acceptance_rate_per_position,
                   conditional_acceptance_per_position=counts.conditional_acceptance_per_position,
                   acceptance_histogram=counts.histogram,
                   acceptance_histogram_by_draft_length={str(n): h for n, h in counts.by_draft_length.items()})
    return out


def first_repeat(records: Sequence[RunRecord]) -> list[RunRecord]:
    """The runs of ``records``' first repeat."""
    first = min((r.repeat for r in records), default=0)
    return [r for r in records if r.repeat == first]


def output_agreement(records: Sequence[RunRecord],
                     reference: dict[str, list[int]]) -> tuple[int, list[int]]:
    """(prompts identical to the reference, first divergences of the others); first repeat, the
    prompts the reference has."""
    identical, divergences = 0, []
    for r in first_repeat(records):
        if r.prompt_id not in reference:
            continue
        position = first_divergence(r.tokens, reference[r.prompt_id])
        if position is None:
            identical += 1
        else:
            divergences.append(position)
    return identical, divergences


def output_verdicts(records: Sequence[RunRecord], reference: dict[str, list[int]],
                    base: Sequence[RunRecord]) -> list[Divergence]:
    """The differences :func:`output_agreement` counts, each judged from the rows both runs kept
    (``analysis.divergence``); ``base``: target AR's runs, whose first repeat is the reference."""
    rows = {r.prompt_id: r.decisions for r in first_repeat(base)}
    judged = (explain(reference[r.prompt_id], rows.get(r.prompt_id), r.tokens, r.decisions, evidence=r.evidence)
              for r in first_repeat(records) if r.prompt_id in reference)
    return [d for d in judged if d is not None]


def summarize_group(variant: str, records: Sequence[RunRecord], base: Sequence[RunRecord],
                    peer: Sequence[RunRecord], category: str, *,
                    reference: dict[str, list[int]] | None, peer_name: str | None = None) -> SummaryRow:
    """One table row: a variant on one group of prompts; ``peer_name``: the peer ``peer`` holds
    the runs of (default: the variant's eager peer)."""
    v = parse_variant_name(variant)
    if peer_name is None:
        peer_name = v.peer.name if v.peer is not None else None
    tps = per_repeat_throughput(records)
    prompts = len({r.prompt_id for r in records})
    tokens = sum(r.n_tokens for r in records)
    calls = sum(r.target_calls for r in records)
    row = SummaryRow(
        variant=variant, strategy=v.strategy, gamma=v.gamma, family=v.family, category=category,
        prompts=prompts, tokens_per_s=median(tps.values()) or 0.0,
        speedup=paired_speed(records, base) if base else None,
        peer=peer_name,
        vs_peer=paired_speed(records, peer) if peer else None,
        speedup_margin=ratio_margin(records, base) if base and variant != BASELINE else None,
        vs_peer_margin=ratio_margin(records, peer) if peer else None,
        tokens_per_target_call=_ratio(tokens, calls),
        call_cost=call_cost(records, base) if base else None,
        target_calls=calls / len(records) if records else None,
        mean_tokens=tokens / len(records) if records else None,
        gamma_policy=v.policy if v.gamma is not None else "",
        mean_gamma=_mean_of_rounds(records),
        ttft_ms=ttft_ms(records),
        decode_tokens_per_s=median(_per_repeat(records, decode_throughput).values()),
        decode_speedup=paired_speed(records, base, decode_throughput) if base else None,
        **_acceptance_fields(records),
    )
    if reference is not None and held_to_target(v.strategy):
        same, divergences = output_agreement(records, reference)
        row.identical_count = same
        compared = same + len(divergences)
        row.identical = same / compared if compared else None
        row.divergences = sorted(divergences)
        row.first_divergence = median(divergences)
        counts = identity_counts(output_verdicts(records, reference, base))
        row.ties, row.unexplained, row.unjudged = counts["ties"], counts["unexplained"], counts["unjudged"]
    return row


def reference_outputs(records: Sequence[RunRecord], variant: str = BASELINE) -> dict[str, list[int]]:
    """Outputs of ``variant`` (target autoregressive) in its first repeat, by prompt."""
    return {r.prompt_id: r.tokens for r in first_repeat([r for r in records if r.variant == variant])}


def judge_records(records: Sequence[RunRecord], reference) -> None:
    """Compute the reference at each first-repeat difference from target AR and keep it on the record,
    while the target is loaded (``reference``: a ``Referee``, or None for a served target)."""
    if reference is None:
        return
    outputs = reference_outputs(records)
    rows = {r.prompt_id: r.decisions for r in first_repeat([r for r in records if r.variant == BASELINE])}
    for r in records:
        if r.decisions is None or r.prompt_ids is None or r.prompt_id not in outputs or r.variant == BASELINE:
            continue
        judged = explain(outputs[r.prompt_id], rows.get(r.prompt_id), r.tokens, r.decisions,
                         reference=reference.for_prompt(r.prompt_ids))
        r.evidence = None if judged is None else judged.evidence


def summarize(records: Sequence[RunRecord], *, greedy: bool, compile: str = "off") -> list[SummaryRow]:
    """Every variant on every category group, in first-seen order; with sessions, also at each position.
    ``compile`` chooses the peer ours are paired with (``bench.variants.matching_peer``)."""
    reference = reference_outputs(records) if greedy else None
    rows = []
    for category, members in category_groups(r.category for r in records).items():
        rows += _group_rows([r for r in records if r.category in members], category, reference, compile)
    for position in sorted({r.position for r in records if r.position}):
        for row in _group_rows([r for r in records if r.position == position], ALL, reference, compile):
            row.position = position
            rows.append(row)
    return rows


def _group_rows(records: Sequence[RunRecord], category: str,
                reference: dict[str, list[int]] | None, compile: str = "off") -> list[SummaryRow]:
    """One row per variant of ``records``, each of ours paired with the peer matching ``compile``, or its
    eager peer where that one did not run."""
    by_variant: dict[str, list[RunRecord]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r.category):   # the group's categories in name order
        by_variant[r.variant].append(r)
    base = by_variant.get(BASELINE, [])
    rows = []
    for variant in dict.fromkeys(r.variant for r in records):
        v = parse_variant_name(variant)
        match = matching_peer(v, compile)
        if match is not None and match.name not in by_variant:
            match = v.peer
        peer = by_variant.get(match.name, []) if match is not None else []
        rows.append(summarize_group(variant, by_variant[variant], base, peer, category, reference=reference,
                                    peer_name=match.name if match is not None else None))
    return rows
