"""What a benchmark runs: a strategy, and its gamma when it drafts.

Ours: ``target`` and ``drafter`` (autoregressive), ``speculative`` (drafter
model) and ``ngram`` (NASD). Peers, transformers' own decoders on the same
models: ``hf_generate``, ``hf_assisted`` (assisted generation with the drafter)
and ``hf_prompt_lookup`` (prompt lookup decoding).
"""

from __future__ import annotations

from dataclasses import dataclass

OURS = ("speculative", "ngram", "target", "drafter")
PEERS = ("hf_generate", "hf_assisted", "hf_prompt_lookup")
DRAFTING = frozenset({"speculative", "ngram", "hf_assisted", "hf_prompt_lookup"})
# Each of our strategies and the transformers decoder it is compared with.
PEER_OF = {"target": "hf_generate", "speculative": "hf_assisted", "ngram": "hf_prompt_lookup"}
BASELINE = "target"

LABELS = {
    "target": "target AR",
    "drafter": "drafter AR",
    "speculative": "speculative",
    "ngram": "NASD",
    "hf_generate": "HF generate",
    "hf_assisted": "HF assisted",
    "hf_prompt_lookup": "HF prompt lookup",
}


@dataclass(frozen=True)
class Variant:
    strategy: str
    gamma: int | None = None

    @property
    def name(self) -> str:
        """A stable key: ``target``, ``speculative@4``..."""
        return self.strategy if self.gamma is None else f"{self.strategy}@{self.gamma}"

    @property
    def label(self) -> str:
        base = LABELS.get(self.strategy, self.strategy)
        return base if self.gamma is None else f"{base} γ={self.gamma}"

    @property
    def family(self) -> str:
        return "peer" if self.strategy in PEERS else "ours"

    @property
    def peer(self) -> Variant | None:
        """The transformers decoder this one is compared with, at the same gamma."""
        other = PEER_OF.get(self.strategy)
        return None if other is None else Variant(other, self.gamma)


def parse_variant_name(name: str) -> Variant:
    strategy, _, gamma = name.partition("@")
    return Variant(strategy, int(gamma) if gamma else None)


def plan_variants(strategies: list[str], gammas: list[int], *, peers: bool) -> list[Variant]:
    """Every variant to run, in the interleaving order of one prompt.

    The baseline (target autoregressive) is always run: speedups need it. Each of
    our variants is followed by its peer, so a pair is measured back to back.
    """
    unknown = [s for s in strategies if s not in OURS]
    if unknown:
        raise ValueError(f"unknown strategy {unknown[0]!r} (choose from {', '.join(OURS)})")
    chosen = [BASELINE] + [s for s in OURS if s in strategies and s != BASELINE]
    out: list[Variant] = []
    for strategy in chosen:
        for gamma in (gammas if strategy in DRAFTING else [None]):
            variant = Variant(strategy, gamma)
            out.append(variant)
            if peers and variant.peer is not None:
                out.append(variant.peer)
    return out
