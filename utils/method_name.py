"""A method's name, the one grammar the REPL, the benchmark and the advisor write and read:
``strategy[source]+cache+treeN+hybridL:policy@gamma~rule``, all but the strategy optional
(``speculative[self:int8]+tree16@4``, ``speculative+hybrid4:heuristic@8``, ``ngram[suffix+fill]@4``,
``lookahead[5,3,5]@2``, ``hf_assisted+static@4``, ``ngram@4~strict``). :class:`MethodName` is the
value, its ``name`` the text, :func:`parse_method_name` the way back. Torch-free (tables and charts)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from utils.defaults import DEFAULTS
from utils.options import MATCH_STORAGES, NGRAM_STORAGES

CONSTANT = "constant"
DEFAULT_RULE = DEFAULTS.verify  # the rule a plain name stands for (the REPL's default)
STATIC = "static"               # the cache word of a peer on transformers' static cache
# A storage name's ending that makes the suffix or sam storage fill its verify widths
# (NGramOptions.fill_width, the REPL's /fill_width): ``suffix+fill``, a name ``ngram[suffix+fill]@16``.
FILL = "+fill"
STORAGE_NAMES = (*NGRAM_STORAGES, *(f"{kind}{FILL}" for kind in MATCH_STORAGES))

_SOURCE = re.compile(r"^([^\[@:+]+)\[([^\]]*)\](.*)$")  # strategy[source]rest


def policy_key(policy: str) -> str:
    """The policy as it appears in a name: ``confidence 0.4`` -> ``confidence=0.4``."""
    return "=".join(policy.split())


def policy_kind(policy: str) -> str:
    """``confidence 0.4`` -> ``confidence``."""
    return policy.split()[0] if policy else CONSTANT


def storage_kind(storage: str) -> tuple[str, bool]:
    """A storage name's kind and whether it fills its verify widths: ``suffix+fill`` -> ``("suffix", True)``."""
    kind, fill, _ = storage.partition(FILL)
    return kind, bool(fill)


@dataclass(frozen=True)
class MethodName:
    """``gamma`` None: no drafts; ``policy`` with its threshold (``confidence 0.4``); ``tree``: most
    nodes a round verifies (0: chains); the source is ``drafter`` (a self-drafter spec), ``storage``
    (NASD's, "": the run's one; :data:`STORAGE_NAMES`) or ``shape`` (lookahead's ``W,N,G``);
    ``verify``: the chain rule; ``hybrid``: L (0: off); ``cache``: ``static`` for a peer on one."""

    strategy: str
    gamma: int | None = None
    policy: str = CONSTANT
    tree: int = 0
    drafter: str = ""
    verify: str = DEFAULT_RULE
    hybrid: int = 0
    storage: str = ""
    shape: str = ""
    cache: str = ""

    @property
    def name(self) -> str:
        source = self.drafter or self.storage or self.shape
        head = self.strategy + (f"[{source}]" if source else "") + (f"+{self.cache}" if self.cache else "")
        if self.gamma is None:
            return head
        tree = f"+tree{self.tree}" if self.tree else ""
        hybrid = f"+hybrid{self.hybrid}" if self.hybrid else ""
        policy = "" if self.policy == CONSTANT else ":" + policy_key(self.policy)
        rule = f"~{self.verify}" if self.verify != DEFAULT_RULE else ""
        return f"{head}{tree}{hybrid}{policy}@{self.gamma}{rule}"

    @property
    def constant(self) -> bool:
        return self.policy == CONSTANT

    @property
    def lookahead_shape(self) -> tuple[int, int, int]:
        """``(W, N, G)`` of a lookahead method."""
        window, ngram, guesses = (int(x) for x in self.shape.split(","))
        return window, ngram, guesses


def parse_method_name(name: str, into: type[MethodName] = MethodName) -> MethodName:
    """The inverse of ``MethodName.name``, as an ``into`` (a subclass adds views, never fields)."""
    name, _, rule = name.partition("~")
    source = ""
    if (found := _SOURCE.match(name)) is not None:
        name, source = found.group(1) + found.group(3), found.group(2)
    head, _, gamma = name.partition("@")
    strategy, _, key = head.partition(":")
    strategy, static, _ = strategy.partition("+" + STATIC)
    strategy, _, hybrid = strategy.partition("+hybrid")
    strategy, _, tree = strategy.partition("+tree")
    where = {"ngram": "storage", "lookahead": "shape"}.get(strategy, "drafter")
    return into(strategy, int(gamma) if gamma else None, " ".join(key.split("=")) if key else CONSTANT,
                int(tree) if tree else 0, verify=rule or DEFAULT_RULE, hybrid=int(hybrid) if hybrid else 0,
                cache=STATIC if static else "", **({where: source} if source else {}))
