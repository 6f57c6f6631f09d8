"""What a benchmark runs: a strategy, its gamma when it drafts, and its gamma policy.

Ours: ``target``, ``drafter``, ``speculative``, ``ngram`` (NASD), ``lookahead`` (opt-in) and
``arctic_suffix`` (``bench.arctic``). Peers, transformers' own decoders on the same models:
``hf_generate``, ``hf_assisted``, ``hf_prompt_lookup``, ``hf_mtp``, and with ``--peers`` their
static-cache twins (``+static``); :func:`matching_peer` pairs a variant with the peer of the run's
``--compile``. Tree, self-drafter, hybrid, lookahead and strict-rule variants have no peer.

Names: ``speculative@4`` (constant), ``speculative:confidence=0.4@20``, ``speculative+tree16@4``,
``speculative[self:int8]@4``, ``speculative+hybrid4@4``, ``speculative@4~residual`` (a verify rule
other than the default), ``ngram[suffix]@4`` (one of several storages), ``lookahead[5,3,5]@2``
(W, N, G; its γ is N - 1). docs/benchmark.md lists them all.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from utils.method_name import DEFAULT_RULE, STATIC, MethodName, parse_method_name, policy_kind

OURS = ("speculative", "ngram", "target", "drafter", "lookahead")
# What --strategies runs when not given: lookahead decoding is asked for by name.
DEFAULT_STRATEGIES = ("speculative", "ngram", "target", "drafter")
PEERS = ("hf_generate", "hf_assisted", "hf_prompt_lookup", "hf_mtp", "arctic_suffix")
DRAFTING = frozenset({"speculative", "ngram", "lookahead", "hf_assisted", "hf_prompt_lookup", "arctic_suffix"})
# Peers that decode through our verify loop with a drafter of their own (bench.arctic).
LOOP_PEERS = frozenset({"arctic_suffix"})
# Each of our strategies and the transformers decoder it is compared with.
PEER_OF = {"target": "hf_generate", "speculative": "hf_assisted", "ngram": "hf_prompt_lookup"}
# The peers that also run on transformers' static cache, and the cache word their names carry.
STATIC_PEERS = ("hf_generate", "hf_assisted", "hf_prompt_lookup")
BASELINE = "target"
RESIDUAL = "residual"  # the token rule: the one transformers' decoders use
# The rules whose variants keep their transformers peer: the token rule, and the default one
# (under sampling "vs peer" then compares block verification with transformers' token rule).
PEER_RULES = frozenset({RESIDUAL, DEFAULT_RULE})

# Lookahead decoding's (W, N, G) when --lookahead is not given: engine.LookaheadOptions' defaults.
DEFAULT_LOOKAHEAD = (5, 3, 5)

# The policies run besides constant gamma, each with its gamma (start or maximum).
DEFAULT_POLICIES = (("heuristic", 4), ("confidence 0.4", 20), ("model", 16))

LABELS = {
    "target": "target AR",
    "drafter": "drafter AR",
    "speculative": "speculative",
    "ngram": "NASD",
    "lookahead": "lookahead",
    "hf_generate": "HF generate",
    "hf_assisted": "HF assisted",
    "hf_prompt_lookup": "HF prompt lookup",
    "hf_mtp": "HF MTP",
    "arctic_suffix": "Arctic suffix",
}


@dataclass(frozen=True)
class Variant(MethodName):
    """A method's name (``utils.method_name``) with what the benchmark shows of it: ``name`` is the
    stable key (``target``, ``speculative@4``, ``speculative[self:int8]+tree16@4``, ``ngram[suffix]@4``...)."""

    @property
    def label(self) -> str:
        base = LABELS.get(self.strategy, self.strategy)
        if self.drafter or self.storage:
            base = f"{base} {self.drafter or self.storage}"
        if self.cache:
            base = f"{base} {self.cache}"
        if self.shape:
            return "{} W={} N={} G={}".format(base, *self.lookahead_shape)
        if self.tree:
            base = f"{base} tree {self.tree}"
        if self.hybrid:
            base = f"{base} hybrid L{self.hybrid}"
        if self.verify != DEFAULT_RULE:
            base = f"{base} {self.verify}"
        if self.gamma is None:
            return base
        if self.constant:
            return f"{base} γ={self.gamma}"
        if self.strategy == "hf_assisted" and self.policy.startswith("confidence"):
            return f"{base} dynamic ({self.policy})"
        return f"{base} {self.policy}"

    @property
    def gamma_text(self) -> str:
        """The γ column: ``4``, ``4→`` (heuristic start), ``≤16`` (a maximum), or ``—``."""
        if self.gamma is None:
            return "—"
        if self.constant:
            return str(self.gamma)
        if policy_kind(self.policy) == "heuristic":
            return f"{self.gamma}→"
        return f"≤{self.gamma}"

    @property
    def family(self) -> str:
        return "peer" if self.strategy in PEERS else "ours"

    @property
    def peer(self) -> Variant | None:
        """The transformers decoder this one is compared with: the same schedule at the same gamma;
        confidence T as ``assistant_confidence_threshold`` T; the model policy as transformers' dynamic
        default (20 tokens, threshold 0.4). Prompt lookup has only the constant schedule."""
        other = PEER_OF.get(self.strategy)
        if other is None or self.tree or self.drafter or self.hybrid or self.verify not in PEER_RULES:
            return None
        if self.constant or self.gamma is None:
            return Variant(other, self.gamma)
        if other != "hf_assisted":
            return None
        if policy_kind(self.policy) == "model":
            return HF_DYNAMIC
        return Variant(other, self.gamma, self.policy)


def matching_peer(variant: Variant, compile: str = "off") -> Variant | None:
    """The peer ``variant`` is compared with under the run's compile path: its eager peer under ``off``,
    that peer on a static cache under ``static`` and ``graphs`` (where transformers has one)."""
    peer = variant.peer
    if peer is None or compile == "off" or peer.strategy not in STATIC_PEERS:
        return peer
    return replace(peer, cache=STATIC)


# transformers 5.x assisted generation as it comes: at most 20 drafts, stop below 0.4.
HF_DYNAMIC = Variant("hf_assisted", 20, "confidence 0.4")
# transformers' own MTP decoding (generate(use_mtp=True)): one draft per MTP layer each round.
HF_MTP = Variant("hf_mtp")


def parse_variant_name(name: str) -> Variant:
    """The inverse of ``Variant.name``."""
    return parse_method_name(name, Variant)


def lookahead_variant(window: int, ngram: int, guesses: int) -> Variant:
    """Lookahead decoding with window W, n-gram size N and G guesses: γ N - 1 (its trees, of
    G (N - 1) nodes, follow from the shape: ``bench.ours``)."""
    return Variant("lookahead", ngram - 1, shape=f"{window},{ngram},{guesses}")


def plan_variants(strategies: list[str], gammas: list[int], *, peers: bool,
                  policies: list[tuple[str, int]] | None = None,
                  trees: list[int] | None = None, self_drafters: list[str] | None = None,
                  verifies: list[str] | None = None, hybrids: list[int] | None = None,
                  model_peer: str | None = "hf_assisted", storages: list[str] | None = None,
                  arctic: bool = False,
                  lookaheads: list[tuple[int, int, int]] | None = None,
                  static_peers: frozenset[str] | set[str] = frozenset()) -> list[Variant]:
    """Every variant to run, in the interleaving order of one prompt.

    Target AR always runs (speedups need it). Each drafting strategy runs every constant gamma, then
    every ``(policy, gamma)``; each of our variants is followed by its peer (once), so a pair is
    measured back to back. ``self_drafters``, ``hybrids`` and ``verifies`` (default ``DEFAULT_RULE``)
    add speculative variants per spec, L and rule at every constant gamma; ``model_peer`` is the
    pair's kind's ``hf_peer`` (``hf_mtp`` at constant gammas only; None: no peer). Several ``storages``
    run NASD once each, side by side; ``arctic`` follows NASD's suffix storage; ``lookahead`` runs once
    per ``(W, N, G)``; with ``peers`` each of ``static_peers`` also runs on the static cache.
    """
    unknown = [s for s in strategies if s not in OURS]
    if unknown:
        raise ValueError(f"unknown strategy {unknown[0]!r} (choose from {', '.join(OURS)})")
    if arctic and "ngram" not in strategies:
        raise ValueError("the arctic_suffix peer runs beside NASD: add ngram to --strategies")
    storages = list(storages or [""])
    beside = "suffix" if "suffix" in storages else storages[0]   # the storage arctic_suffix sits next to
    chosen = [BASELINE] + [s for s in OURS if s in strategies and s != BASELINE]
    out: list[Variant] = []
    for strategy in chosen:
        if strategy == "lookahead":
            mine = [lookahead_variant(*shape) for shape in (lookaheads or [DEFAULT_LOOKAHEAD])]
        elif strategy in DRAFTING:
            mine = [Variant(strategy, g) for g in gammas]
            mine += [Variant(strategy, g, p) for p, g in (policies or [])]
            mine += [Variant(strategy, g, tree=n) for n in (trees or []) if n > 0 for g in gammas]
            if strategy == "speculative":
                mine += [Variant(strategy, g, hybrid=n) for n in (hybrids or []) if n > 0 for g in gammas]
        else:
            mine = [Variant(strategy)]
        if strategy == "speculative" or (strategy == BASELINE and "speculative" not in chosen):
            mine += [Variant("speculative", g, tree=n, drafter=spec) for spec in (self_drafters or [])
                     for n in [0, *(trees or [])] for g in gammas]
        rules = verifies or [DEFAULT_RULE]    # chains only: trees (and lookahead's) have one rule
        mine = [replace(v, verify=rule)
                for v in mine for rule in (rules if v.gamma is not None and not v.tree and not v.shape
                                           else [DEFAULT_RULE])]
        if strategy == "ngram" and len(storages) > 1:
            mine = [replace(v, storage=kind) for v in mine for kind in storages]
        for variant in mine:
            out.append(variant)
            peer = variant.peer
            if peer is not None and peer.strategy == "hf_assisted" and model_peer != "hf_assisted":
                peer = HF_MTP if model_peer == HF_MTP.strategy and variant.constant else None
            if peers and peer is not None and peer not in out:
                out.append(peer)
                if peer.strategy in static_peers:
                    out.append(replace(peer, cache=STATIC))
            if arctic and variant.strategy == "ngram" and (variant.storage or storages[0]) == beside \
                    and variant.constant and not variant.tree and variant.verify == DEFAULT_RULE:
                out.append(Variant("arctic_suffix", variant.gamma))
    return out
