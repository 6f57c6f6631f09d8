"""The facts about options both front ends share: each setting's range, the names it chooses among,
and the word checks that enforce them.

``repl.commands`` and ``bench.cli`` read them, and the engine takes its own limits from here, so a
range can never end elsewhere than where the engine refuses. Torch-free.
"""

from __future__ import annotations

import difflib
import math

# The most drafts a round may ask for, and the longest match a hybrid may ask for.
MAX_GAMMA = 128  # generation.common.check_gamma refuses more
MAX_HYBRID_MATCH = 64  # engine.HybridOptions refuses more

GAMMA_RANGE = (1, MAX_GAMMA)
LENGTH_RANGE = (1, 1_000_000)
NGRAM_N_RANGE = (2, 16)
FILLER_RANGE = (1, 1000)
SEED_RANGE = (0, 2**63 - 1)
RTT_RANGE = (0.0, 10_000.0)  # milliseconds
TREE_RANGE = (0, 256)
TREE_BRANCH_RANGE = (1, 16)
SUFFIX_PATTERN_RANGE = (1, 64)
SUFFIX_OUTPUTS_RANGE = (0, 100_000)
MATCH_FACTOR_RANGE = (0.1, 16.0)
HYBRID_RANGE = (0, MAX_HYBRID_MATCH)  # L; 0 = off
LOOKAHEAD_WINDOW_RANGE = (1, 64)
LOOKAHEAD_NGRAM_RANGE = (3, 16)
LOOKAHEAD_GUESSES_RANGE = (1, 64)

# NASD's storages (engine.state builds them by these names).
NGRAM_STORAGES: tuple[str, ...] = ("basic", "onelevel", "recycling", "suffix", "sam")
# The storages that match the sequence's tail instead of counting n-grams: they take no N.
MATCH_STORAGES: tuple[str, ...] = ("suffix", "sam")

# Draft-length policies (generation.gamma_policies builds them); "confidence"
# alone takes a threshold T in (0, 1).
GAMMA_POLICIES: tuple[str, ...] = ("constant", "heuristic", "confidence", "model")

# How a drafter with another tokenizer drafts (cross_tokenizer): through text
# (string-level exact match) or over the shared vocabulary (token-level intersection).
UAG_METHODS: tuple[str, ...] = ("slem", "tli")

# How the target's (and a drafter model's) forwards run (engine.Strategy.compile): "off", today's
# eager dynamic-cache path; "static", a preallocated cache rolled back by resetting lengths, eager
# forwards; "graphs", the static path with its fixed-width forwards compiled (CUDA graphs on CUDA).
# The default is the device's (kvcache.static.default_compile: "graphs" on CUDA, "off" elsewhere).
COMPILE_PATHS: tuple[str, ...] = ("off", "static", "graphs")

ON_WORDS = ("on", "true", "yes", "1")
OFF_WORDS = ("off", "false", "no", "0")


class OptionError(ValueError):
    """An option's words were rejected; the message says why (one line)."""


def check_int(value, what: str, low: int) -> int:
    """``value`` when it is an int (not a bool) of at least ``low``; else a one-line ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{what} must be an integer >= {low}, got {value!r}")
    return value


def whole_number(word: str, what: str, lo: int, hi: int) -> int:
    """``word`` as an integer from ``lo`` to ``hi``; else OptionError naming ``what``."""
    try:
        value = int(word)
    except ValueError:
        raise OptionError(f"{what} must be a whole number, got {word!r}") from None
    if not lo <= value <= hi:
        raise OptionError(f"{what} must be between {lo} and {hi}, got {value}")
    return value


def finite_number(word: str, what: str) -> float:
    """``word`` as a finite float; else OptionError naming ``what``."""
    try:
        value = float(word)
    except ValueError:
        raise OptionError(f"{what} must be a number, got {word!r}") from None
    if not math.isfinite(value):
        raise OptionError(f"{what} must be a finite number, got {word!r}")
    return value


def compile_path(word: str) -> str:
    """``word`` as one of :data:`COMPILE_PATHS` (any case); else OptionError naming the three."""
    path = word.lower()
    if path not in COMPILE_PATHS:
        raise OptionError(f"unknown compile path {word!r}{closest(path, COMPILE_PATHS)}; "
                          f"choose {', '.join(COMPILE_PATHS[:-1])} or {COMPILE_PATHS[-1]}")
    return path


def closest(word: str, choices, prefix: str = "") -> str:
    """`` (did you mean X?)`` for the nearest choice, or the empty string."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {prefix}{match[0]}?)" if match else ""
