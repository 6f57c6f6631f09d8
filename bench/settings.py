"""The benchmark's settings as one value: its flags parsed once (``bench.cli.parse_settings``), never
changed; what the session decides after loading is a new value (:meth:`BenchSettings.but`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields, replace
from pathlib import Path

from advisor import CONFIRM
from sampling.spec import ProcessorSpec


@dataclass(frozen=True)
class BenchSettings:
    """Everything one benchmark runs with, a field per flag (named as the flag's ``dest``)."""

    # models (passed to the loader)
    target: str | None
    drafter: str | None
    device: str
    dtype: str
    drafter_dtype: str | None
    threads: int | None
    # prompts
    prompts: str
    categories: list[str] | None
    limit: int | None
    turn: int
    chat: bool
    multi_turn: bool
    session_size: int | None
    # decoding
    strategies: list[str]
    peers: bool
    length: int
    gamma: list[int]
    policies: list[tuple[str, int]]
    processor: ProcessorSpec
    trees: list[int]
    hybrid: list[int]
    tree_branch: int
    tree_sample: bool
    self_drafters: list[str]
    ngram_storage: list[str]
    arctic_suffix: bool
    lookahead: list[tuple[int, int, int]]
    ngram_n: int
    suffix_pattern: int
    top_k_filler: int
    lookup_ngram: int | None
    assisted_confidence: float
    verify: list[str]
    uag: str
    # how our forwards run (utils.options.COMPILE_PATHS); None until the session resolves the
    # target device's default (kvcache.static.default_compile) after loading
    compile: str | None
    # measurement and output
    repeats: int
    until_decided: int | None
    warmup: int
    seed: int
    out: Path
    chart: bool
    expect: list
    # the advisor (bench.advise)
    advise: bool = False
    costs: str | None = None
    confirm: int = CONFIRM
    whatif: str | None = None

    @classmethod
    def from_namespace(cls, namespace: argparse.Namespace) -> BenchSettings:
        """The parsed flags as settings; a flag without a field (or a field without a flag) is a
        KeyError or TypeError here, so the two cannot drift apart."""
        values = vars(namespace)
        unknown = set(values) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"flags without a BenchSettings field: {', '.join(sorted(unknown))}")
        return cls(**values)

    def but(self, **changes) -> BenchSettings:
        """A copy with ``changes`` (the session's decisions after loading)."""
        return replace(self, **changes)

