"""Expectations a user states about a benchmark's speed, checked on its numbers.

``--expect A/B=X[@CATEGORY]`` (repeatable): variant A runs at least X times as fast as B (``best``:
the fastest constant γ of A's strategy in this run), paired per repeat like every ratio. With two
repeats or more the 95% margin (``bench.margin``) decides: met, missed, or "within the margin". An
expectation whose variants did not run is not checked. No built-in thresholds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bench.aggregate import ALL, category_groups, median, paired_speed, per_repeat_throughput
from bench.margin import LEVEL, interval, ratio_margin
from bench.records import RunRecord
from bench.variants import parse_variant_name

BEST = "best"


@dataclass(frozen=True)
class Expectation:
    """``variant`` at least ``ratio`` times as fast as ``reference`` on ``category``."""

    variant: str
    reference: str
    ratio: float
    category: str = ALL

    @property
    def text(self) -> str:
        where = "" if self.category == ALL else f"@{self.category}"
        return f"{self.variant}/{self.reference}={self.ratio:g}{where}"


def parse_expectation(text: str) -> Expectation:
    """``"speculative@4/target=1.2"`` -> Expectation; ValueError with a one-line message."""
    pair, equals, value = text.strip().rpartition("=")
    variant, slash, reference = pair.partition("/")
    ratio_text, _, category = value.partition("@")
    if not (equals and slash and variant and reference):
        raise ValueError(f"expected VARIANT/REFERENCE=RATIO[@CATEGORY], got {text!r}")
    try:
        ratio = float(ratio_text)
    except ValueError:
        raise ValueError(f"{text!r}: ratio {ratio_text!r} is not a number") from None
    if not ratio > 0:
        raise ValueError(f"{text!r}: the ratio must be > 0")
    return Expectation(variant.strip(), reference.strip(), ratio, category.strip() or ALL)


@dataclass
class Verdict:
    """One expectation checked: the measured ratio (None when the run lacks a side) and its
    95% margin (None with one repeat)."""

    expectation: Expectation
    value: float | None = None
    reference: str | None = None     # the variant measured against (``best`` resolved)
    margin: float | None = None

    @property
    def description(self) -> str:
        e = self.expectation
        where = "" if e.category == ALL else f" ({e.category})"
        against = self.reference or e.reference
        return f"{e.variant} ≥ {e.ratio:g}× {against}{where}"

    @property
    def status(self) -> str:
        if self.value is None:
            return "not checked"
        low, high = interval(self.value, self.margin) or (self.value, self.value)
        if low >= self.expectation.ratio:
            return "met"
        return "missed" if high < self.expectation.ratio else "within the margin"


def unknown_names(expectations: Sequence[Expectation], variants: Sequence[str],
                  categories: Iterable[str]) -> list[str]:
    """One line for each expectation that names a variant or a category the planned run will not
    have (said before the first run: such an expectation can only read "not checked")."""
    groups = category_groups(categories)
    lines = []
    for e in expectations:
        missing = [name for name in (e.variant, e.reference) if name != BEST and name not in variants]
        if missing:
            lines.append(f"--expect {e.text}: this run has no variant {', '.join(missing)} "
                         f"(it runs {', '.join(variants)}); it will read 'not checked'")
        elif e.category not in groups:
            lines.append(f"--expect {e.text}: no prompt of this run is in {e.category!r} "
                         f"({', '.join(groups)}); it will read 'not checked'")
    return lines


def undecided(verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The verdicts more repeats could still settle: measured, and either without a margin yet
    (one repeat) or within it. A verdict not checked (a side missing) is not among them."""
    return [v for v in verdicts if v.value is not None and (v.margin is None or v.status == "within the margin")]


def check_expectations(records: Sequence[RunRecord], expectations: Sequence[Expectation],
                       level: float = LEVEL) -> list[Verdict]:
    """Each expectation, measured on ``records``, its margin at ``level`` (a run that looks
    several times passes ``bench.margin.sequential_level``)."""
    present = list(dict.fromkeys(r.variant for r in records))
    groups = category_groups(r.category for r in records)
    return [_check(records, e, present, groups, level) for e in expectations]


def _check(records, e: Expectation, present: list[str], groups: dict[str, set[str]], level: float) -> Verdict:
    verdict = Verdict(e)
    members = groups.get(e.category)
    if members is None or e.variant not in present:
        return verdict

    def runs(name: str) -> list[RunRecord]:
        return [r for r in records if r.variant == name and r.category in members]

    reference = _best_constant(e.variant, present, runs) if e.reference == BEST else e.reference
    if reference is None or reference not in present:
        return verdict
    verdict.reference = reference
    verdict.value = paired_speed(runs(e.variant), runs(reference))
    verdict.margin = ratio_margin(runs(e.variant), runs(reference), level)
    return verdict


def _best_constant(name: str, present: list[str], runs) -> str | None:
    """The constant-γ variant of ``name``'s strategy (and n-gram storage) with the highest median
    tokens/s, each measured on the runs every one of them finished (``runs(variant)``: its records)."""
    mine = parse_variant_name(name)
    constants = [v for v in present if (p := parse_variant_name(v)).strategy == mine.strategy
                 and p.storage == mine.storage and p.gamma is not None and p.constant and v != name]
    if not constants:
        return None
    shared = set.intersection(*({r.key for r in runs(c)} for c in constants))

    def speed(constant: str) -> float:
        return median(per_repeat_throughput(r for r in runs(constant) if r.key in shared).values()) or 0.0

    return max(constants, key=speed)
