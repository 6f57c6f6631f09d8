"""NASD: n-gram assisted speculative decoding."""

from ngram_assisted.drafter import NGramDrafter
from ngram_assisted.hybrid import HybridDrafter
from ngram_assisted.match_drafter import MatchDrafter
from ngram_assisted.sam import SAMStorage, SuffixAutomaton
from ngram_assisted.storage import NGramStorage, OneLevelNGramStorage, RecyclingStorage
from ngram_assisted.suffix import SuffixStorage, SuffixTrie

__all__ = [
    "HybridDrafter",
    "MatchDrafter",
    "NGramDrafter",
    "NGramStorage",
    "OneLevelNGramStorage",
    "RecyclingStorage",
    "SAMStorage",
    "SuffixAutomaton",
    "SuffixStorage",
    "SuffixTrie",
]
