"""The calls into transformers that read a model from disk or the hub: config, tokenizer and weights.

A GGUF file inside ``location`` gets its tokenizer's special tokens repaired from its metadata.
The same on transformers 4.57 and 5.x: GGUF weights load dequantised (5.x would keep them packed
behind a quantizer that refuses ``save_pretrained`` and casts), encoder-decoder checkpoints go to
``AutoModelForSeq2SeqLM``.
"""

from __future__ import annotations

import os
from typing import Any

from utils.gguf_files import quiet_gguf_loader, read_tokenizer_metadata, repair_tokenizer
from utils.progress import quiet_hf_warnings


def load_config(location: str, gguf_file: str | None = None, subfolder: str | None = None):
    """``AutoConfig`` for a hub id or directory (or a GGUF file inside it): small, read before any weights."""
    from transformers import AutoConfig

    kwargs: dict[str, Any] = {}
    if gguf_file is not None:
        kwargs["gguf_file"] = gguf_file
    if subfolder:
        kwargs["subfolder"] = subfolder
    with quiet_hf_warnings():
        return AutoConfig.from_pretrained(location, **kwargs)


def is_encoder_decoder(config) -> bool:
    """True for sequence-to-sequence checkpoints (T5, BART, ...)."""
    return bool(getattr(config, "is_encoder_decoder", False))


def text_config(config, *, decoder: bool = False):
    """The part of ``config`` that describes the text model (a multimodal config nests it; a
    Gemma 4 assistant's too), or ``config`` itself; ``decoder=True``: the decoder's, for a seq2seq one."""
    if not hasattr(config, "get_text_config"):
        return config
    return config.get_text_config(decoder=True) if decoder else config.get_text_config()


def model_class(config):
    """The auto class that builds a generating model for ``config``: seq2seq or causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM if is_encoder_decoder(config) else AutoModelForCausalLM


def load_tokenizer(location: str, gguf_file: str | None = None):
    """``AutoTokenizer`` for a hub id or directory, or for ``gguf_file`` inside directory ``location``."""
    from transformers import AutoTokenizer

    with quiet_hf_warnings():
        if gguf_file is None:
            return AutoTokenizer.from_pretrained(location)
        tokenizer = AutoTokenizer.from_pretrained(location, gguf_file=gguf_file)
    return repair_tokenizer(tokenizer, read_tokenizer_metadata(os.path.join(location, gguf_file)))


def _dequantised_gguf_option() -> dict[str, Any]:
    """``from_pretrained`` arguments that load a GGUF as a plain float model.

    transformers 4.57 always dequantises GGUF files. 5.x may keep the blocks packed (``GgufConfig``,
    ``dequantize=False`` by default); asking for ``dequantize=True`` gives the 4.57 behaviour: dense
    weights in the requested dtype and no quantizer attached to the model.
    """
    import transformers

    gguf_config = getattr(transformers, "GgufConfig", None)
    return {} if gguf_config is None else {"quantization_config": gguf_config(dequantize=True)}


def load_weights(location: str, gguf_file: str | None = None, *, config=None, **kwargs):
    """``from_pretrained(location, **kwargs)`` on the right auto class, quietly, GGUF files included.

    ``config`` (from ``load_config``) picks seq2seq or causal LM; without it the config is read here.
    """
    if config is None:
        config = load_config(location, gguf_file, kwargs.get("subfolder"))
    auto_class = model_class(config)
    with quiet_hf_warnings():
        if gguf_file is None:
            return auto_class.from_pretrained(location, **kwargs)
        with quiet_gguf_loader():
            options = {**_dequantised_gguf_option(), **kwargs}
            return auto_class.from_pretrained(location, gguf_file=gguf_file, **options)
