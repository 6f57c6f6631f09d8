"""The copy ceiling: the most any drafter that copies from the text could have made of an output.

Under greedy the output does not depend on the drafter. At each output position, every earlier
occurrence of the sequence's last ``match`` tokens offers its continuation; a round there may keep
up to the longest one the target would keep (at most k) and adds one target token. The rounds are
then placed for the least total ``cost`` of their verify widths (default 1 a round: the fewest target
calls), a shortest path over output positions; the first round (the prefill) is counted, not priced.

Hindsight three times over, so a bound, not a method: it bounds drafters that continue an earlier
occurrence of the tail in the same text (the suffix trie's chains, the suffix automaton, prompt
lookup), not the n-gram tables (whose chained look-ups can join two occurrences) nor drafts copied
from other texts. Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from utils.options import check_int

# The REPL computes the ceiling only for a prompt and output of at most this many tokens
# together: the search looks at every earlier occurrence of the last token at every position.
MAX_TOKENS = 16384


@dataclass(frozen=True)
class CopyCeiling:
    """The ceiling's rounds: target ``calls`` (the prefill round included), the ``tokens`` made,
    the drafts ``kept`` (all accepted), and the priced rounds by verify width (``widths``)."""

    calls: int
    tokens: int
    kept: int
    widths: dict[int, int] = field(default_factory=dict)

    @property
    def tokens_per_call(self) -> float:
        return self.tokens / self.calls if self.calls else 0.0


def accepted_prefix(draft: Sequence[int], output: Sequence[int], at: int) -> int:
    """How many of ``draft`` match ``output`` from position ``at`` on: what a greedy target whose
    output is ``output`` keeps of a draft proposed at ``at``."""
    n = 0
    while n < len(draft) and at + n < len(output) and draft[n] == output[at + n]:
        n += 1
    return n


def _cheaper(option: tuple, current: tuple) -> bool:
    """Whether ``option`` (cost, calls, ...) beats ``current``: less cost, or as much (to rounding:
    sums of the same costs in another order) in fewer calls."""
    tie = 1e-9 * max(1.0, abs(current[0]))
    return option[0] < current[0] - tie or (abs(option[0] - current[0]) <= tie and option[1] < current[1])


def copy_ceiling(prompt: Sequence[int], output: Sequence[int], gamma: int, max_gen_len: int,
                 cost: Callable[[int], float] | None = None, *, match: int = 1) -> CopyCeiling:
    """The ceiling of one output (module docstring): rounds ask for k = min(γ, ``max_gen_len`` -
    tokens so far - 1) drafts, as the verify loop's do; a round of width w costs ``cost(w)``
    (None: 1, so the ceiling makes the fewest target calls)."""
    for name, value, low in (("gamma", gamma, 0), ("match length", match, 1)):
        check_int(value, f"the {name}", low)
    price = cost if cost is not None else (lambda width: 1.0)
    n = len(output)
    sequence = list(prompt)
    # each match-gram and the token after it -> the indices of that token: a copy that keeps
    # anything starts with the token the target says next
    ends: dict[tuple[int, ...], list[int]] = {}
    most, indexed = [], match                       # per position: (the most drafts kept, k)
    for at in range(n):
        for end in range(indexed, len(sequence)):
            ends.setdefault(tuple(sequence[end - match:end + 1]), []).append(end)
        indexed = max(indexed, len(sequence))
        k = min(gamma, max_gen_len - at - 1)
        kept = 0
        if k > 0 and len(sequence) >= match:
            for end in ends.get((*sequence[len(sequence) - match:], output[at]), ()):
                kept = max(kept, 1 + accepted_prefix(sequence[end + 1:end + k], output, at + 1))
        most.append((kept, k))
        sequence.append(output[at])
    # best[q]: (cost, calls, previous position, drafts kept, width) of the cheapest way to reach q
    best: list[tuple[float, int, int, int, int] | None] = [None] * (n + 1)
    best[0] = (0.0, 0, -1, 0, 0)
    for at in range(n):                      # every position is reached: a round may keep nothing
        spent, calls = best[at][0], best[at][1]
        kept_most, k = most[at]
        for kept in range(kept_most + 1):
            width = min(range(kept + 1, k + 2), key=lambda w: (price(w), w)) if k > 0 else 1
            option = (spent + (0.0 if at == 0 else price(width)), calls + 1, at, kept, width)
            land = min(n, at + kept + 1)
            if best[land] is None or _cheaper(option, best[land]):
                best[land] = option
    calls = kept_total = 0
    widths: dict[int, int] = {}
    q = n
    while q > 0:
        _, _, at, kept, width = best[q]
        calls += 1
        kept_total += min(kept, q - at)
        if at > 0:
            widths[width] = widths.get(width, 0) + 1
        q = at
    return CopyCeiling(calls, n, kept_total, widths)
