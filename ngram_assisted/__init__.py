"""NASD: n-gram assisted speculative decoding."""

from ngram_assisted.drafter import NGramDrafter
from ngram_assisted.storage import NGramStorage, OneLevelNGramStorage, RecyclingStorage

__all__ = [
    "NGramDrafter",
    "NGramStorage",
    "OneLevelNGramStorage",
    "RecyclingStorage",
]
