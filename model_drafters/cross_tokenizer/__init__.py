"""Drafters whose tokenizer differs from the target's: SLEM and TLI (universal assisted generation).

Names are imported lazily, so importing the package stays cheap.
"""

from utils.lazy import lazy_exports

_EXPORTS = {
    "CrossTokenizerOptions": "model_drafters.cross_tokenizer.options",
    "METHODS": "model_drafters.cross_tokenizer.drafter",
    "CrossTokenizerDrafter": "model_drafters.cross_tokenizer.drafter",
    "VocabMap": "model_drafters.cross_tokenizer.vocab_map",
    "build_vocab_map": "model_drafters.cross_tokenizer.vocab_map",
    "cross_tokenizer_drafter": "model_drafters.cross_tokenizer.factory",
    "drafter_ends": "model_drafters.cross_tokenizer.factory",
    "drafter_inputs": "model_drafters.cross_tokenizer.factory",
    "has_own_tokenizer": "model_drafters.cross_tokenizer.factory",
    "vocab_map_of": "model_drafters.cross_tokenizer.factory",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_exports(__name__, _EXPORTS)
