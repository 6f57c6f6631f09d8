"""Logits processors shared by every decoding strategy."""

from sampling.processors import (
    GreedyProcessor,
    LogitsProcessor,
    MultinomialProcessor,
    NucleusProcessor,
    TopKNucleusProcessor,
    TopKProcessor,
)

__all__ = [
    "GreedyProcessor",
    "LogitsProcessor",
    "MultinomialProcessor",
    "NucleusProcessor",
    "TopKNucleusProcessor",
    "TopKProcessor",
]
