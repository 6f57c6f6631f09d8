"""The two calls into transformers that read a model from disk or the hub: tokenizer and weights.

Both accept a GGUF file inside ``location`` (``gguf_file``); for those the tokenizer's special
tokens are repaired from the file's metadata and the loader's own progress bar is silenced.
"""

from __future__ import annotations

import os

from utils.gguf_files import quiet_gguf_loader, read_tokenizer_metadata, repair_tokenizer
from utils.progress import quiet_hf_warnings


def load_tokenizer(location: str, gguf_file: str | None = None):
    """``AutoTokenizer`` for a hub id or directory, or for ``gguf_file`` inside directory ``location``."""
    from transformers import AutoTokenizer

    with quiet_hf_warnings():
        if gguf_file is None:
            return AutoTokenizer.from_pretrained(location)
        tokenizer = AutoTokenizer.from_pretrained(location, gguf_file=gguf_file)
    return repair_tokenizer(tokenizer, read_tokenizer_metadata(os.path.join(location, gguf_file)))


def load_weights(location: str, gguf_file: str | None = None, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(location, **kwargs)``, quietly, GGUF files included."""
    from transformers import AutoModelForCausalLM

    with quiet_hf_warnings():
        if gguf_file is None:
            return AutoModelForCausalLM.from_pretrained(location, **kwargs)
        with quiet_gguf_loader():
            return AutoModelForCausalLM.from_pretrained(location, gguf_file=gguf_file, **kwargs)
