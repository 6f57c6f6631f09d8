"""The one way from a method's name (``utils.method_name.MethodName``) to the ``Strategy`` that runs
it: the REPL (its settings), the benchmark (each variant) and the advisor (its grid) all come here."""

from __future__ import annotations

from engine.kinds import variant_drafter
from engine.strategy import HybridOptions, LookaheadOptions, NGramOptions, Strategy, lookahead_strategy
from utils.method_name import MethodName

# Each drafting strategy (and each peer that drafts through our verify loop) and its engine drafter.
DRAFTER_OF = {"speculative": "model", "ngram": "ngram", "arctic_suffix": "arctic_suffix"}
NAMED = (*DRAFTER_OF, "target", "drafter", "lookahead")
# The Strategy fields lookahead's W, N and G decide (its trees and γ).
SHAPED = frozenset({"tree_branch", "tree_sample", "gamma_threshold"})


def named_strategy(method: MethodName, *, ngram: NGramOptions = NGramOptions(), cross=None, arctic=None,
                   fresh: bool = True, key: str | None = None, **fields) -> Strategy:
    """The strategy ``method`` names, keyed ``key`` (default: its name). ``ngram``, ``cross`` and
    ``arctic``: the storage's, the drafter model's and the ``arctic_suffix`` peer's options; lookahead's
    pool is emptied when ``fresh``; ``fields``: other ``Strategy`` fields, less :data:`SHAPED`."""
    if method.strategy not in NAMED:
        raise ValueError(f"unknown strategy {method.strategy!r}")
    key = method.name if key is None else key
    if method.strategy == "lookahead":
        window, ngram_size, guesses = method.lookahead_shape
        fields = {name: value for name, value in fields.items() if name not in SHAPED}
        return lookahead_strategy(LookaheadOptions(window, ngram_size, guesses, reset=fresh), key=key, **fields)
    drafter = DRAFTER_OF.get(method.strategy)
    options = {"ngram": ngram, "model": cross, "arctic_suffix": arctic}.get(drafter)
    if method.hybrid and drafter == "model":
        options = HybridOptions(method.hybrid, ngram, cross)
    if method.drafter:
        drafter, options = variant_drafter(method.drafter), method.drafter
    return Strategy(key, drafter=drafter, drafter_options=options,
                    model="drafter" if method.strategy == "drafter" else "target", gamma=method.gamma or 1,
                    gamma_policy=method.policy, tree=method.tree, verify=method.verify, **fields)
