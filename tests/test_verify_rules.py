"""The three chain verify rules (generation/verify_rules.py), checked exactly.

The exact oracle. For a fixed draft a rule's outcome depends only on its coins
(k uniforms, drawn through ``generation.accept.uniforms``) and on what
``sample`` returns. The coins enter only through comparisons u_i < t_i with
thresholds the test knows (min(1, p/q) for the token rule, ``block_details``
for block), so the oracle puts one representative coin per cell (t/2 below
the threshold, (1 + t)/2 above it) and weighs the cell by its length. The
sampler's outcomes are either enumerated (every id of every row, weighted by
its probability) or, for rules that fix n before sampling, replaced by a
marker (row r returns r), so the emitted token's law is the row the rule
picked. Drafts are enumerated with their probability under q. Composing two
rounds gives the exact law of the first two emitted tokens, which must equal
the target's. The chi-squared test then checks that the real functions, run
with a ``torch.Generator``, follow the laws the oracle computed.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import pytest
import torch

from generation import accept, verify_rules
from generation.accept import accept_drafts, residual_distributions
from generation.verify_rules import VERIFY_RULES, accept_block, accept_strict, block_details, verify_rule
from sampling import GreedyProcessor, MultinomialProcessor

TOL = 1e-6
DTYPE = torch.float64
Prefix = tuple[int, ...]
Dist = Callable[[Prefix], tuple[float, ...]]


# --------------------------------------------------------------------------- the cases

@dataclass(frozen=True)
class Case:
    """A target and a drafter over a tiny vocabulary, given as conditional tables."""

    name: str
    vocab: int
    gamma: int
    target: Dist                  # P(. | prefix)
    draft: Dist                   # Q(. | prefix); one-hot rows for a deterministic drafter
    q_none: bool = False          # hand the rule q=None (the n-gram drafter's convention)

    def rows(self, prefix: Prefix, draft: Prefix) -> tuple[torch.Tensor, torch.Tensor | None]:
        """p (k + 1, V) and q (k, V) (or None) for this draft after this prefix."""
        k = len(draft)
        p = torch.tensor([self.target(prefix + draft[:i]) for i in range(k + 1)], dtype=DTYPE)
        q = torch.tensor([self.draft(prefix + draft[:i]) for i in range(k)], dtype=DTYPE).view(k, self.vocab)
        return p, (None if self.q_none else q)

    def drafts(self, prefix: Prefix) -> list[tuple[Prefix, float]]:
        """Every draft of length gamma with its probability under Q (zero-probability ones left out)."""
        out = []
        for draft in itertools.product(range(self.vocab), repeat=self.gamma):
            weight = math.prod(self.draft(prefix + draft[:i])[x] for i, x in enumerate(draft))
            if weight > 0:
                out.append((draft, weight))
        return out


def constant(*probs: float) -> Dist:
    """The same distribution after every prefix (context-free)."""
    return lambda prefix: probs


def table(seed: int, vocab: int, zero: bool = False, one_hot: bool = False) -> Dist:
    """A fixed random distribution per prefix; ``zero`` removes one prefix-dependent
    token (so the other model has mass where this one has none); ``one_hot``
    keeps only the argmax (a greedy target, or a deterministic drafter)."""

    @lru_cache(maxsize=None)
    def dist(prefix: Prefix) -> tuple[float, ...]:
        key = seed
        for token in prefix:
            key = key * 31 + token + 1
        gen = torch.Generator().manual_seed(key)
        probs = (1.5 * torch.randn(vocab, generator=gen, dtype=DTYPE)).softmax(dim=-1)
        if one_hot:
            probs = torch.nn.functional.one_hot(probs.argmax(), vocab).to(DTYPE)
        elif zero:
            probs[(seed + len(prefix) + sum(prefix)) % vocab] = 0.0
            probs = probs / probs.sum()
        return tuple(probs.tolist())

    return dist


def half_equal(seed: int, vocab: int) -> tuple[Dist, Dist]:
    """A target equal to its drafter after even-length prefixes (no residual mass there)."""
    drafter = table(seed, vocab)
    other = table(seed + 1, vocab, zero=True)
    return (lambda prefix: drafter(prefix) if len(prefix) % 2 == 0 else other(prefix)), drafter


TOY = Case("toy", 2, 2, constant(1 / 3, 2 / 3), constant(2 / 3, 1 / 3))
_EQ_TARGET, _EQ_DRAFT = half_equal(40, 3)
CASES = [
    TOY,
    Case("q-mass-where-p-none", 4, 2, constant(0.5, 0.3, 0.2, 0.0), constant(0.1, 0.2, 0.3, 0.4)),
    Case("tables-g1-v4", 4, 1, table(1, 4, zero=True), table(2, 4)),
    Case("tables-g2-v4", 4, 2, table(3, 4, zero=True), table(4, 4)),
    Case("tables-g2-v3-zeros-both", 3, 2, table(5, 3, zero=True), table(6, 3, zero=True)),
    Case("tables-g3-v3", 3, 3, table(7, 3, zero=True), table(8, 3)),
    Case("p-equals-q-at-even-depths", 3, 3, _EQ_TARGET, _EQ_DRAFT),
    Case("deterministic-q-none-g3-v4", 4, 3, table(9, 4, zero=True), table(10, 4, one_hot=True), q_none=True),
    Case("deterministic-one-hot-q-g3-v4", 4, 3, table(9, 4, zero=True), table(10, 4, one_hot=True)),
    Case("greedy-target-g2-v3", 3, 2, table(11, 3, one_hot=True), table(12, 3)),
]
CASE_BY_NAME = {case.name: case for case in CASES}


# --------------------------------------------------------------------------- the oracle

@dataclass(frozen=True)
class Spec:
    """A rule and what the oracle needs to integrate over its randomness."""

    rule: Callable
    thresholds: Callable | None   # (p, q, draft) -> (k,) the coins' thresholds; None: no coins
    marker: bool                  # n is fixed before one sample call, token = draws[row]


def token_thresholds(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor) -> torch.Tensor:
    """The token rule's acceptance probabilities min(1, p(x) / q(x)): (k,)."""
    positions = torch.arange(draft.shape[0])
    p_x = p[positions, draft]
    q_x = torch.ones_like(p_x) if q is None else q[positions, draft]
    return torch.where(q_x > 0, (p_x / q_x.clamp(min=1e-300)).clamp(max=1.0), torch.ones_like(p_x))


def block_thresholds(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor) -> torch.Tensor:
    return block_details(p, q, draft)[1]


SPECS = {
    "residual": Spec(accept_drafts, token_thresholds, marker=True),
    "block": Spec(accept_block, block_thresholds, marker=True),
    "strict": Spec(accept_strict, None, marker=False),
}


class OracleError(RuntimeError):
    """The rule did something the oracle was not told about (not an exactness failure)."""


@contextmanager
def fixed_coins(u: list[float] | None):
    """Make ``generation.accept.uniforms`` return ``u`` (None: the rule must draw no coins)."""

    def coins(k, like, generator=None):
        if u is None or k != len(u):
            raise OracleError(f"the rule drew {k} coins; the oracle planned {u}")
        return torch.tensor(u, dtype=like.dtype, device=like.device)

    original, accept.uniforms = accept.uniforms, coins
    try:
        yield
    finally:
        accept.uniforms = original


def coin_cells(spec: Spec, p, q, draft) -> list[tuple[list[float] | None, float]]:
    """One representative coin vector per pass/fail pattern, with the pattern's probability."""
    if spec.thresholds is None:
        return [(None, 1.0)]
    t = spec.thresholds(p, q, draft).tolist()
    cells = []
    for passes in itertools.product((True, False), repeat=len(t)):
        weight = math.prod(ti if ok else 1.0 - ti for ti, ok in zip(t, passes))
        if weight > 0:
            cells.append(([ti / 2 if ok else (1.0 + ti) / 2 for ti, ok in zip(t, passes)], weight))
    return cells


class _Branch(Exception):
    pass


def marker_outcomes(run) -> list[tuple[int, dict[int, float], float]]:
    """(n, law of the token, 1): row r of the one sample call returns r, so the
    token the rule returns names the row it is drawn from."""
    calls = []

    def sample(rows, generator=None):
        calls.append(rows)
        return torch.arange(rows.shape[0])

    n, row = run(sample)
    if len(calls) != 1:
        raise OracleError(f"marker mode expects one sample call, got {len(calls)}")
    law = {v: pv for v, pv in enumerate(calls[0][int(row)].tolist()) if pv > 0}
    return [(int(n), law, 1.0)]


def enumerated_outcomes(run) -> list[tuple[int, dict[int, float], float]]:
    """(n, {token: 1}, probability) for every outcome of every sample call the rule makes."""
    leaves = []

    def explore(script: list[torch.Tensor]) -> None:
        calls = []

        def sample(rows, generator=None):
            calls.append(rows)
            if len(calls) <= len(script):
                return script[len(calls) - 1]
            raise _Branch

        try:
            n, token = run(sample)
        except _Branch:
            choices = [torch.nonzero(row > 0).flatten().tolist() for row in calls[-1]]
            for ids in itertools.product(*choices):
                explore(script + [torch.tensor(ids)])
            return
        weight = math.prod(float(rows[r, i]) for rows, ids in zip(calls, script) for r, i in enumerate(ids.tolist()))
        leaves.append((int(n), {int(token): 1.0}, weight))

    explore([])
    return leaves


def draft_law(spec: Spec, p, q, draft: Prefix) -> dict[Prefix, float]:
    """Exact law of what one round emits (draft[:n] + (token,)) for one fixed draft."""
    law: dict[Prefix, float] = defaultdict(float)
    ids = torch.tensor(draft, dtype=torch.long)
    outcomes = marker_outcomes if spec.marker else enumerated_outcomes
    for u, cell in coin_cells(spec, p, q, ids):
        with fixed_coins(u):
            for n, token_law, weight in outcomes(lambda sample: spec.rule(p, q, ids, sample, None)):
                for token, pt in token_law.items():
                    law[draft[:n] + (token,)] += cell * weight * pt
    return law


def round_law(spec: Spec, case: Case, prefix: Prefix) -> dict[Prefix, float]:
    """Exact law of what one round emits after ``prefix``, drafts drawn from Q."""
    law: dict[Prefix, float] = defaultdict(float)
    for draft, weight in case.drafts(prefix):
        p, q = case.rows(prefix, draft)
        for seq, w in draft_law(spec, p, q, draft).items():
            law[seq] += weight * w
    return law


def emitted_law(spec: Spec, case: Case, length: int = 2) -> dict[Prefix, float]:
    """Exact law of the first ``length`` tokens that rounds of ``spec`` emit from the empty prefix."""
    laws: dict[Prefix, dict] = {}
    out: dict[Prefix, float] = defaultdict(float)

    def go(prefix: Prefix, weight: float) -> None:
        if len(prefix) >= length:
            out[prefix[:length]] += weight
            return
        if prefix not in laws:
            laws[prefix] = round_law(spec, case, prefix)
        for seq, w in laws[prefix].items():
            go(prefix + seq, weight * w)

    go((), 1.0)
    return out


def target_law(case: Case, length: int = 2) -> dict[Prefix, float]:
    """P(t_1..t_length) = prod_j P(t_j | t_<j)."""
    out = {}
    for seq in itertools.product(range(case.vocab), repeat=length):
        out[seq] = math.prod(case.target(seq[:j])[t] for j, t in enumerate(seq))
    return out


def assert_close(got: dict, want: dict, what: str) -> None:
    for key in sorted(set(got) | set(want)):
        g, w = got.get(key, 0.0), want.get(key, 0.0)
        assert abs(g - w) <= TOL, f"{what}: P{key} = {g:.9f}, target {w:.9f}"


def assert_lossless(spec: Spec, case: Case) -> None:
    """The first token's marginal and the first two tokens' joint equal the target's."""
    first: dict[Prefix, float] = defaultdict(float)
    for seq, w in round_law(spec, case, ()).items():
        first[seq[:1]] += w
    assert_close(first, target_law(case, 1), f"{case.name} first token")
    assert_close(emitted_law(spec, case, 2), target_law(case, 2), f"{case.name} two tokens")


def expected_accepted(spec: Spec, case: Case) -> float:
    """E[n]: drafts kept per round, from the empty prefix."""
    return sum(w * (len(seq) - 1) for seq, w in round_law(spec, case, ()).items())


# --------------------------------------------------------------------------- exactness

def test_registry_names_the_three_rules():
    assert VERIFY_RULES == {"residual": accept_drafts, "block": accept_block, "strict": accept_strict}
    assert all(verify_rule(name) is SPECS[name].rule for name in SPECS)
    with pytest.raises(ValueError, match="unknown verify rule 'nope'; choose one of: residual, block, strict"):
        verify_rule("nope")


@pytest.mark.parametrize("rule", sorted(SPECS))
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_rule_keeps_the_target_distribution(rule, case):
    assert_lossless(SPECS[rule], case)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_block_keeps_at_least_as_many_as_the_token_rule(case):
    residual, block, strict = (expected_accepted(SPECS[name], case) for name in ("residual", "block", "strict"))
    assert block >= residual - 1e-12
    assert residual >= strict - 1e-12    # q(x) p(x) <= min(p(x), q(x)) position by position


@pytest.mark.parametrize("name", ["toy", "q-mass-where-p-none", "tables-g2-v4", "tables-g3-v3"])
def test_block_keeps_more_where_ratios_fall_between_0_and_1(name):
    """Where some p(x)/q(x) lies strictly between 0 and 1 the block rule gains."""
    case = CASE_BY_NAME[name]
    assert expected_accepted(SPECS["block"], case) > expected_accepted(SPECS["residual"], case) + 1e-3


def test_paper_toy_example():
    """Sun et al. 2025's motivating example: V = {a, b}, target (1/3, 2/3), drafter (2/3, 1/3),
    gamma 2, context-free. Strict keeps sum p q = 4/9 per position: 4/9 + (4/9)^2."""
    assert expected_accepted(SPECS["residual"], TOY) == pytest.approx(10 / 9, abs=1e-12)
    assert expected_accepted(SPECS["block"], TOY) == pytest.approx(11 / 9, abs=1e-12)
    assert expected_accepted(SPECS["strict"], TOY) == pytest.approx(4 / 9 + 16 / 81, abs=1e-12)


@pytest.mark.parametrize("draft, ratios, thresholds", [
    ((0, 0), (1 / 2, 1 / 4), (0.0, 1 / 4)),    # a a: b_1 = 1/2 leaves no residual mass, h_1 = 0
    ((0, 1), (1 / 2, 1.0), (0.0, 1.0)),        # a b: b_2 = min(1, 1/2 * 2) = 1
    ((1, 0), (1.0, 1 / 2), (1.0, 1 / 2)),      # b a: b_1 = 1, residual mass 1/3, h_1 = 1/3 / (1/3 + 0)
    ((1, 1), (1.0, 1.0), (1.0, 1.0)),
])
def test_block_details_on_the_toy_example(draft, ratios, thresholds):
    p, q = TOY.rows((), draft)
    got_ratios, got_thresholds = block_details(p, q, torch.tensor(draft))
    assert got_ratios.tolist() == pytest.approx(ratios, abs=1e-12)
    assert got_thresholds.tolist() == pytest.approx(thresholds, abs=1e-12)


def test_no_drafts_is_a_plain_target_step():
    p = torch.tensor([[0.0, 0.0, 1.0]])
    empty = torch.zeros(0, dtype=torch.long)
    for rule in VERIFY_RULES.values():
        for q in (None, torch.zeros(0, 3)):
            n, token = rule(p, q, empty, MultinomialProcessor().sample, torch.Generator().manual_seed(0))
            assert (n.item(), token.item()) == (0, 2)
    assert [t.numel() for t in block_details(p, None, empty)] == [0, 0]


# --------------------------------------------------------------------------- the real functions

def chi2_bound(df: int, z: float = 4.75) -> float:
    """Wilson-Hilferty upper quantile of chi-squared(df) at a normal z (4.75: p about 1e-6)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * math.sqrt(c)) ** 3


def chi2_against(counts: dict, law: dict, total: int) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom; outcomes expected < 5 times share one bin."""
    observed, expected = [], []
    rare_o, rare_e = 0.0, 0.0
    for key in set(law) | set(counts):
        o, e = counts.get(key, 0), total * law.get(key, 0.0)
        if e < 5:
            rare_o, rare_e = rare_o + o, rare_e + e
        else:
            observed.append(o)
            expected.append(e)
    if rare_o or rare_e:
        if rare_e == 0:
            return math.inf, len(observed)             # an impossible outcome was seen
        observed.append(rare_o)
        expected.append(rare_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    return stat, len(observed) - 1


def sampled_counts(rule, case: Case, trials: int, seed: int) -> dict[Prefix, int]:
    """What ``trials`` real rounds from the empty prefix emit, drafts drawn from Q in one batch."""
    gen = torch.Generator().manual_seed(seed)
    drafts = case.drafts(())
    picks = torch.multinomial(torch.tensor([w for _, w in drafts]), trials, replacement=True, generator=gen)
    rows = [case.rows((), draft) for draft, _ in drafts]
    ids = [torch.tensor(draft) for draft, _ in drafts]
    sample = MultinomialProcessor().sample
    counts: dict[Prefix, int] = defaultdict(int)
    for i in picks.tolist():
        n, token = rule(*rows[i], ids[i], sample, gen)
        n = int(n)
        counts[drafts[i][0][:n] + (int(token),)] += 1
    return counts


TRIALS = 1500


@pytest.mark.parametrize("rule, name", [
    ("residual", "tables-g2-v4"), ("block", "tables-g2-v4"), ("strict", "tables-g2-v4"),
    ("block", "deterministic-q-none-g3-v4"), ("block", "q-mass-where-p-none"),
])
def test_real_rule_follows_the_exact_law(rule, name):
    case, trials = CASE_BY_NAME[name], TRIALS
    law = round_law(SPECS[rule], case, ())
    stat, df = chi2_against(sampled_counts(SPECS[rule].rule, case, trials, seed=7), law, trials)
    assert stat <= chi2_bound(df), f"{rule} on {name}: chi2 {stat:.1f} with {df} dof"


def test_chi2_check_has_power():
    """Block stopping at the first failure, run for real, is told apart from block's exact law."""
    case, trials = CASE_BY_NAME["tables-g2-v4"], TRIALS
    law = round_law(SPECS["block"], case, ())
    counts = sampled_counts(first_failure_block, case, trials, seed=7)
    stat, df = chi2_against(counts, law, trials)
    assert stat > chi2_bound(df)


# --------------------------------------------------------------------------- greedy

def test_greedy_block_and_strict_equal_the_token_rule():
    """One-hot p (the greedy processor): all three keep the argmax prefix and emit the argmax."""
    gen = torch.Generator().manual_seed(0)
    greedy, vocab = GreedyProcessor(), 8
    for trial in range(240):
        k = trial % 6
        p = greedy(4.0 * torch.randn(k + 1, vocab, generator=gen))
        draft = p.argmax(dim=-1)[:k].clone()
        cut = int(torch.randint(0, k + 2, (), generator=gen))   # first corrupted position (may be none)
        if cut < k:
            draft[cut] = (draft[cut] + 1 + torch.randint(0, vocab - 1, (), generator=gen)) % vocab
            draft[cut + 1:] = torch.randint(0, vocab, (k - cut - 1,), generator=gen)
        soft = (3.0 * torch.randn(k, vocab, generator=gen)).softmax(dim=-1)
        one_hot = torch.nn.functional.one_hot(draft, vocab).float()
        for q in (soft, None, one_hot):
            want = accept_drafts(p, q, draft, greedy.sample, gen)
            for rule in (accept_block, accept_strict):
                got = rule(p, q, draft, greedy.sample, gen)
                assert (got[0].item(), got[1].item()) == (want[0].item(), want[1].item()), (trial, rule.__name__)


# --------------------------------------------------------------------------- mutations

def first_failure(passed: torch.Tensor) -> torch.Tensor:
    """Mutant of ``_last_pass``: keep drafts up to the first failed test (the token rule's stop)."""
    return passed.to(torch.long).cumprod(dim=0).sum()


def first_failure_block(p, q, draft, sample, generator=None):
    """accept_block with mutation (a), for the real-run chi-squared check."""
    original, verify_rules._last_pass = verify_rules._last_pass, first_failure
    try:
        return accept_block(p, q, draft, sample, generator)
    finally:
        verify_rules._last_pass = original


def block_unscaled_correction(p, q, draft, sample, generator=None):
    """Mutant (b): block's tests, but the token drawn from norm(max(0, p_n - q_n)), not scaled by b_n."""
    k = draft.shape[0]
    _, thresholds = block_details(p, q, draft)
    n = verify_rules._last_pass(accept.uniforms(k, p, generator) < thresholds)
    tokens = sample(torch.cat([residual_distributions(p[:k], q, draft), p[k:]]), generator)
    return n, tokens[n]


def strict_fresh_resample(p, q, draft, sample, generator=None):
    """Mutant (d): strict, but at the stop the token is a fresh draw from p, not the draw that stopped it."""
    k = draft.shape[0]
    draws = sample(p, generator)
    n = (draws[:k] == draft).to(torch.long).cumprod(dim=0).sum()
    return n, sample(p, generator)[n]


def strict_counting_matches(p, q, draft, sample, generator=None):
    """Mutant (d'): strict, but n counts every draw equal to its draft, not the matching prefix."""
    k = draft.shape[0]
    draws = sample(p, generator)
    n = (draws[:k] == draft).to(torch.long).sum()
    return n, draws[n]


def residual_fresh_resample(p, q, draft, sample, generator=None):
    """Mutant of the token rule: resample from p at the rejection instead of the residual."""
    n, _ = accept_drafts(p, q, draft, lambda rows, g: torch.zeros(rows.shape[0], dtype=torch.long), generator)
    return n, sample(p, generator)[n]


def test_mutation_block_first_failure_is_caught(monkeypatch):
    monkeypatch.setattr(verify_rules, "_last_pass", first_failure)
    with pytest.raises(AssertionError, match="P"):
        assert_lossless(SPECS["block"], TOY)


@pytest.mark.parametrize("name", ["tables-g2-v4", "q-mass-where-p-none"])
def test_mutation_block_unscaled_residual_is_caught(name):
    # The scale matters only at a stop 0 < n < k with 0 < b_n < 1 and residual mass left,
    # which needs V >= 3 (on the toy b_1 < 1 leaves no mass) and shows in the second token.
    spec = Spec(block_unscaled_correction, block_thresholds, marker=True)
    with pytest.raises(AssertionError, match="P"):
        assert_lossless(spec, CASE_BY_NAME[name])


def test_mutation_block_threshold_without_residual_mass_is_caught(monkeypatch):
    monkeypatch.setattr(verify_rules, "_thresholds", lambda ratios, mass: ratios)
    with pytest.raises(AssertionError, match="P"):
        assert_lossless(SPECS["block"], TOY)


def test_mutation_strict_fresh_resample_is_caught():
    spec = Spec(strict_fresh_resample, None, marker=False)
    with pytest.raises(AssertionError, match="P"):
        assert_lossless(spec, CASE_BY_NAME["tables-g1-v4"])


def test_mutation_strict_counting_matches_is_caught():
    spec = Spec(strict_counting_matches, None, marker=False)
    with pytest.raises(AssertionError, match="P"):
        assert_lossless(spec, CASE_BY_NAME["tables-g2-v3-zeros-both"])


@pytest.mark.parametrize("name", ["tables-g2-v4", "q-mass-where-p-none"])
def test_accepting_with_p_of_x_ignoring_q_is_strict_in_law(name):
    """Not a bug, though it looks like one: accepting x with probability p(x) (the q=None
    rule) while x came from a random q, and resampling from p without x, is the strict rule
    in law (P(draw = x) = p(x); a mismatched draw is p without x), so it is lossless too.
    The oracle says so exactly: both round laws agree to the last digit."""
    case = CASE_BY_NAME[name]
    as_if_deterministic = Spec(lambda p, q, draft, sample, generator=None: accept_drafts(p, None, draft, sample, generator),
                               lambda p, q, draft: token_thresholds(p, None, draft), marker=True)
    assert_close(round_law(as_if_deterministic, case, ()), round_law(SPECS["strict"], case, ()), name)
    assert_lossless(as_if_deterministic, case)


def test_mutation_token_rule_fresh_resample_is_caught():
    spec = Spec(residual_fresh_resample, token_thresholds, marker=False)
    with pytest.raises(AssertionError, match="P"):
        assert_lossless(spec, CASE_BY_NAME["tables-g1-v4"])


@pytest.mark.parametrize("name", ["residual", "block", "strict"])
@pytest.mark.parametrize("q_kind", ["soft", "none"])
def test_a_rule_reads_nothing_back_to_the_host(name, q_kind):
    """On the meta device every read-back raises: a rule that indexes with a tensor (a hidden
    ``.item()``, one more host sync per round on a GPU) fails here."""
    k, V = 3, 5
    p = torch.empty(k + 1, V, device="meta")
    q = torch.empty(k, V, device="meta") if q_kind == "soft" else None
    draft = torch.empty(k, dtype=torch.long, device="meta")
    n, token = VERIFY_RULES[name](p, q, draft, lambda rows, generator=None: rows.argmax(-1))
    assert n.device.type == token.device.type == "meta" and n.dim() == token.dim() == 0


def test_the_read_back_check_catches_tensor_indexing():
    """Mutation for the test above: indexing with a 0-d tensor raises on meta."""
    values, index = torch.empty(4, device="meta"), torch.empty((), dtype=torch.long, device="meta")
    with pytest.raises(Exception):
        values[index]


# --------------------------------------------------------------------------- greedy, on the columns that matter

def _greedy_cases(count: int = 600):
    """Random greedy rounds: integer logits (ties: the first maximum is the draw), half-precision
    logits on every third, and q as None, a greedy drafter's one-hot rows or a soft distribution
    (drafts drawn from it): (logits, q, draft, seed)."""
    g = torch.Generator().manual_seed(7)
    greedy = GreedyProcessor()
    for case in range(count):
        k = int(torch.randint(0, 7, (), generator=g))
        vocab = int(torch.randint(2, 12, (), generator=g))
        logits = torch.randint(-2, 3, (k + 1, vocab), generator=g).float()
        if case % 3 == 0:
            logits = logits.bfloat16()
        kind = case % 3
        draft = torch.randint(0, vocab, (k,), generator=g)
        q = None
        if kind == 1:
            q = greedy(torch.randn(k, vocab, generator=g))
            draft = q.argmax(dim=-1)
        elif kind == 2 and k:
            q = torch.randn(k, vocab, generator=g).softmax(dim=-1)
            draft = torch.multinomial(q, 1, generator=g).flatten()
        yield logits, q, draft, case


def _narrowing_disagreements(narrow) -> list:
    """The greedy cases where ``narrow`` (on_greedy_columns' signature) and the rule on the whole
    one-hot p differ in n, in the token, or in the generator's state after (the coins drawn)."""
    from sampling.processors import probs_dtype

    greedy, out = GreedyProcessor(), []
    for logits, q, draft, seed in _greedy_cases():
        for name, rule in VERIFY_RULES.items():
            whole, narrowed = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
            n, token = rule(greedy(logits), q, draft, greedy.sample, whole)
            m, other = narrow(rule, greedy.greedy_ids(logits), q, draft, greedy.sample, narrowed,
                              probs_dtype(logits.dtype))
            if (int(n), int(token)) != (int(m), int(other)) or not torch.equal(whole.get_state(), narrowed.get_state()):
                out.append((name, seed, (int(n), int(token)), (int(m), int(other))))
    return out


def test_greedy_rules_on_their_columns_equal_the_rules_on_the_whole_vocabulary():
    # Every rule, 600 rounds with ties, bf16 logits and each kind of q: the same n, token and coins.
    assert _narrowing_disagreements(verify_rules.on_greedy_columns) == []


def test_mutation_narrowing_that_keeps_only_the_targets_columns_is_caught():
    # Leaving the drafts' own columns out (a draft off the target's ids lands on a wrong column).
    def targets_only(rule, target_ids, q, draft, sample, generator, dtype):
        k = draft.shape[0]
        columns, inverse = torch.unique(target_ids, return_inverse=True)
        p = torch.zeros(k + 1, columns.shape[0], dtype=dtype).scatter_(-1, inverse.unsqueeze(-1), 1.0)
        narrowed_draft = torch.searchsorted(columns, draft).clamp(max=columns.shape[0] - 1)
        n, token = rule(p, None if q is None else q[:, columns], narrowed_draft, sample, generator)
        return n, accept.pick(columns, token)

    assert len(_narrowing_disagreements(targets_only)) > 50


def test_mutation_narrowing_that_returns_the_column_not_its_id_is_caught():
    def column_index(rule, target_ids, q, draft, sample, generator, dtype):
        k = draft.shape[0]
        columns, inverse = torch.unique(torch.cat([target_ids, draft]), return_inverse=True)
        p = torch.zeros(k + 1, columns.shape[0], dtype=dtype).scatter_(-1, inverse[:k + 1].unsqueeze(-1), 1.0)
        return rule(p, None if q is None else q[:, columns], inverse[k + 1:], sample, generator)

    assert len(_narrowing_disagreements(column_index)) > 50


@pytest.mark.parametrize("q_kind", ["soft", "none"])
def test_greedy_narrowing_reads_nothing_back_to_the_host(q_kind):
    """On the meta device every read-back raises: the narrowing keeps the round's one host sync
    (no ``unique``, whose size a GPU would have to report). Mutation: a narrowing by ``unique``."""
    k, V = 3, 5
    ids = torch.empty(k + 1, dtype=torch.long, device="meta")
    q = torch.empty(k, V, device="meta") if q_kind == "soft" else None
    draft = torch.empty(k, dtype=torch.long, device="meta")
    argmax = lambda rows, generator=None: rows.argmax(-1)      # noqa: E731
    for rule in VERIFY_RULES.values():
        n, token = verify_rules.on_greedy_columns(rule, ids, q, draft, argmax, None, torch.float32)
        assert n.device.type == token.device.type == "meta" and n.dim() == token.dim() == 0
    with pytest.raises(NotImplementedError):
        torch.unique(torch.cat([ids, draft]), return_inverse=True)


def test_the_loop_under_greedy_verifies_on_the_narrowed_columns(monkeypatch):
    """A greedy speculative run without the inspector hands every rule rows of 2k + 1 columns, not
    the vocabulary's 48, and its output is target AR's; with the inspector (it shows
    whole rows) the rule gets the vocabulary's width."""
    from engine import Strategy, run_strategy
    from tests.helpers.models import tiny_llama
    from tests.helpers.pairs import model_pair

    pair = model_pair(tiny_llama(1, vocab_size=48, logit_scale=8.0), tiny_llama(2, vocab_size=48, logit_scale=8.0))
    widths = []
    for name, rule in list(VERIFY_RULES.items()):
        def spy(p, q, draft, sample, generator=None, rule=rule):
            widths.append((p.shape[-1], draft.shape[0]))
            return rule(p, q, draft, sample, generator)
        monkeypatch.setitem(VERIFY_RULES, name, spy)
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    ar = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=24), pair, prompt)
    for drafter in ("model", "ngram"):
        widths.clear()
        out = run_strategy(Strategy("s", drafter=drafter, gamma=4, processor=GreedyProcessor(), max_gen_len=24,
                                    inspect=False), pair, prompt)
        assert out.tokens == ar.tokens and out.accepted < out.drafted and widths     # rejections ran
        assert all(width == 2 * k + 1 for width, k in widths), widths
    widths.clear()
    run_strategy(Strategy("s", drafter="model", gamma=4, processor=GreedyProcessor(), max_gen_len=8), pair, prompt)
    assert widths and all(width == 48 for width, _ in widths)


def test_a_greedy_tree_round_draws_off_the_logits_and_keeps_target_ars_output(monkeypatch):
    """A greedy tree run (its draws read off the logits, no rows of probabilities) makes target AR's
    tokens; the mutation that draws the second-best id instead is caught by the same comparison."""
    import generation.tree_round
    from engine import Strategy, run_strategy
    from tests.helpers.models import tiny_llama
    from tests.helpers.pairs import model_pair

    pair = model_pair(tiny_llama(1, vocab_size=48, logit_scale=8.0), tiny_llama(2, vocab_size=48, logit_scale=8.0))
    prompt = [5, 6, 7, 5, 6, 7, 5, 6]
    ar = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=24), pair, prompt)

    def tree_run():
        return run_strategy(Strategy("s", drafter="model", gamma=3, tree=6, processor=GreedyProcessor(),
                                     max_gen_len=24, inspect=False), pair, prompt)

    out = tree_run()
    assert out.tree_rule == "top" and out.tokens == ar.tokens and out.accepted < out.drafted
    monkeypatch.setattr(generation.tree_round, "_greedy_draws",
                        lambda processor: lambda rows, generator=None: rows.topk(2, dim=-1).indices[..., 1])
    assert tree_run().tokens != ar.tokens
