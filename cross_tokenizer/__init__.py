"""Drafters whose tokenizer differs from the target's: SLEM and TLI (universal assisted generation).

Names are imported lazily, so importing the package stays cheap.
"""

from importlib import import_module

_EXPORTS = {
    "METHODS": "cross_tokenizer.drafter",
    "CrossTokenizerDrafter": "cross_tokenizer.drafter",
    "VocabMap": "cross_tokenizer.vocab_map",
    "build_vocab_map": "cross_tokenizer.vocab_map",
    "cross_tokenizer_drafter": "cross_tokenizer.factory",
    "drafter_ends": "cross_tokenizer.factory",
    "drafter_inputs": "cross_tokenizer.factory",
    "has_own_tokenizer": "cross_tokenizer.factory",
    "vocab_map_of": "cross_tokenizer.factory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cross_tokenizer' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
