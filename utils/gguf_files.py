"""GGUF specifics: is the ``gguf`` package there, what its tokenizer metadata says, and a quiet conversion.

transformers dequantises a GGUF file into a float model when it loads it. Two things need help:
its loader draws a tqdm bar of its own, and (in transformers 4.57) its llama tokenizer converter
takes the eos token from the bos id, so ``tokenizer.eos_token`` comes out wrong. The special
tokens are therefore set again from the file's own metadata.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path

# GGUF metadata key -> tokenizer attribute it names (by token id).
_SPECIAL_ID_KEYS = {
    "tokenizer.ggml.bos_token_id": "bos_token",
    "tokenizer.ggml.eos_token_id": "eos_token",
    "tokenizer.ggml.padding_token_id": "pad_token",
    "tokenizer.ggml.unknown_token_id": "unk_token",
}
# GGUF metadata key -> boolean tokenizer attribute.
_FLAG_KEYS = {
    "tokenizer.ggml.add_bos_token": "add_bos_token",
    "tokenizer.ggml.add_eos_token": "add_eos_token",
}


def gguf_available() -> bool:
    """True when the ``gguf`` package can be imported."""
    try:
        import gguf  # noqa: F401
    except ImportError:
        return False
    return True


def _scalar(field):
    """The single value of a GGUF reader field (a one-element numpy array inside ``parts``)."""
    return field.parts[field.data[0]][0].item()


def read_tokenizer_metadata(path: str | Path) -> dict:
    """Special-token ids and add-bos/eos flags present in a GGUF file's metadata, e.g.
    ``{"bos_token": 1, "eos_token": 2, "add_bos_token": False}``."""
    from gguf import GGUFReader

    fields = GGUFReader(str(path)).fields
    found = {}
    for key, name in {**_SPECIAL_ID_KEYS, **_FLAG_KEYS}.items():
        if key in fields:
            value = _scalar(fields[key])
            found[name] = bool(value) if key in _FLAG_KEYS else int(value)
    return found


def repair_tokenizer(tokenizer, metadata: dict):
    """Set a GGUF-loaded tokenizer's special tokens and add-bos/eos flags from ``metadata`` (ids outside
    the vocabulary ignored), in place; returns it."""
    size = len(tokenizer)
    for name in _SPECIAL_ID_KEYS.values():
        token_id = metadata.get(name)
        if token_id is not None and 0 <= token_id < size:
            setattr(tokenizer, name, tokenizer.convert_ids_to_tokens(token_id))
    for name in _FLAG_KEYS.values():
        if name in metadata and hasattr(tokenizer, name):
            setattr(tokenizer, name, metadata[name])
    return tokenizer


@contextlib.contextmanager
def quiet_gguf_loader() -> Iterator[None]:
    """Silence the tqdm bar that transformers' GGUF loader draws (it ignores the HF progress switch)."""
    import transformers.modeling_gguf_pytorch_utils as loader

    original = getattr(loader, "tqdm", None)
    if original is None:
        yield
        return
    loader.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        loader.tqdm = original
