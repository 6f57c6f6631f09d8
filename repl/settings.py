"""The one settings object of a REPL session.

Slash commands and command-line flags both write into :class:`Settings`
through the command table in :mod:`repl.commands`; nothing else changes it.
This module imports nothing heavy, so ``infer.py --help`` stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from sampling.spec import PROCESSOR_ARGS, ProcessorSpec, fmt_number
from utils.defaults import DEFAULTS

# The decoding strategies, in the order a prompt runs them.
STRATEGIES: tuple[str, ...] = ("speculative", "ngram", "lookahead", "target", "drafter")
STRATEGY_LABELS: dict[str, str] = {
    "speculative": "Speculative",
    "ngram": "NASD",
    "lookahead": "Lookahead",
    "target": "Target AR",
    "drafter": "Drafter AR",
}

@dataclass
class Settings:
    """Everything a prompt run depends on, with the documented defaults (those the benchmark
    shares come from ``utils.defaults``)."""

    gamma: int = DEFAULTS.gamma
    length: int = DEFAULTS.length
    processor: ProcessorSpec = field(default_factory=ProcessorSpec)
    speculative: bool = True
    ngram: bool = True
    lookahead: bool = False       # lookahead decoding (Fu et al. 2024): docs/lookahead.md
    target: bool = True
    drafter: bool = False
    cache: bool = True
    chat: bool = DEFAULTS.chat
    debug: bool = False
    ngram_storage: str = DEFAULTS.ngram_storage
    ngram_n: int = DEFAULTS.ngram_n
    top_k_filler: int = DEFAULTS.top_k_filler
    reset_in_between: bool = True
    suffix_pattern: int = DEFAULTS.suffix_pattern  # suffix storage: the longest tail matched (P)
    suffix_outputs: int = 64      # suffix storage: earlier outputs its global trie keeps (M)
    match_factor: float = 1.0     # suffix and sam: drafts up to this times the match length (α)
    corpus: str = ""              # sam: a text file matched beside the context ("" = none)
    fill_width: bool = False      # suffix and sam: fill a round's verify to a cheaper wider width
    hybrid: int = 0               # speculative: storage drafts in a round whose match is >= this (0 = off)
    # Lookahead decoding's window W, n-gram size N and guesses G (engine.LookaheadOptions has the
    # same defaults; docs/lookahead.md says why they are small on a CPU).
    lookahead_window: int = 5
    lookahead_ngram: int = 3
    lookahead_guesses: int = 5
    seed: int = DEFAULTS.seed
    gamma_policy: str = "constant"
    gamma_threshold: float = 0.4  # used by the "confidence" policy only
    live: bool = True  # draw each strategy's rounds as they happen (off for JSON and pipes)
    rtt: float = 0.0  # ms: what-if network round trip per target call, in the speedup model
    rtt_inject: float = 0.0  # ms: really wait this long before every target forward
    tree: int = 0                 # draft nodes per round verified as a token tree (0: a chain)
    tree_branch: int = DEFAULTS.tree_branch  # children per expanded tree node
    tree_sample: bool = DEFAULTS.tree_sample  # under sampling: children drawn from q, recursive rejection sampling
    uag: str = DEFAULTS.uag  # a drafter with another tokenizer: "slem" or "tli"
    # The chain verify rule, one of VERIFY_RULE_NAMES. Block: never fewer drafts kept in
    # expectation than the token rule (Sun et al. 2025, Theorem 2), the same under greedy,
    # and measured not slower (docs/results.md#verify-rules-2026-11-25).
    verify: str = DEFAULTS.verify
    # How the forwards run (utils.options.COMPILE_PATHS; engine.Strategy.compile): infer.py sets the
    # target device's default after loading (kvcache.static.default_compile: graphs on CUDA, off on a CPU)
    # unless --compile names one.
    compile: str = "off"

    def gamma_policy_text(self) -> str:
        """``constant``, or ``confidence 0.4`` with its threshold."""
        if self.gamma_policy == "confidence":
            return f"confidence {fmt_number(self.gamma_threshold)}"
        return self.gamma_policy

    def enabled_strategies(self) -> list[str]:
        return [s for s in STRATEGIES if getattr(self, s)]

    def to_dict(self) -> dict:
        """A JSON-ready copy (the processor as its command text and parts)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        p = self.processor
        out["processor"] = {"name": p.name, **dict(zip(PROCESSOR_ARGS[p.name], p.args()))}
        return out


def settings_from_dict(data: dict) -> Settings:
    """The inverse of :meth:`Settings.to_dict`, for a trace file: unknown keys
    are ignored and missing ones keep their defaults. Raises ValueError or
    TypeError on values of the wrong shape."""
    if not isinstance(data, dict):
        raise TypeError("settings must be an object")
    known = {f.name for f in fields(Settings)}
    values = {k: v for k, v in data.items() if k in known and k != "processor"}
    processor = data.get("processor")
    if processor is not None:
        if not isinstance(processor, dict) or processor.get("name") not in PROCESSOR_ARGS:
            raise ValueError(f"unknown processor {processor!r}")
        values["processor"] = ProcessorSpec(**processor)
    return Settings(**values)
