"""The tiny random models every test builds (no downloads, milliseconds per forward):
``tiny_llama`` for causal LMs, ``tiny_t5`` and ``tiny_bart`` for encoder-decoders, and a
wrapper that records what each forward was fed."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tests.helpers.devices import seeded_on_cpu


def tiny_llama(seed: int, *, vocab_size: int = 64, hidden: int = 32, layers: int = 2,
               max_positions: int = 256, logit_scale: float = 1.0, tie: bool = False,
               dtype: torch.dtype = torch.float32, **config) -> LlamaForCausalLM:
    """A random Llama in eval mode, the one tiny causal LM the tests build.

    Weights depend only on ``seed`` and the shape (the same arguments give the
    same model, on every device). ``logit_scale`` multiplies the output layer, sharpening its
    distributions (random init gives nearly uniform next-token probabilities);
    ``tie`` ties it to the input embedding (then it scales both). ``config``
    overrides the special token ids (``bos_token_id=0``, ``eos_token_id=None``,
    ``pad_token_id=None`` unless given; a pad id also zeroes that embedding row)
    or sets any other ``LlamaConfig`` field.
    """
    config = LlamaConfig(**{
        "vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 2 * hidden,
        "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": max_positions, "tie_word_embeddings": tie,
        "bos_token_id": 0, "eos_token_id": None, "pad_token_id": None, **config,
    })
    model = seeded_on_cpu(lambda: LlamaForCausalLM(config).eval(), seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.to(dtype)


def word_llama(vocab_size: int, seed: int = 0, hidden: int = 64, tie: bool = True) -> LlamaForCausalLM:
    """The loading tests' model over the word tokenizer (``tests.helpers.tokenizers``): a tied
    head, 128 positions, ``<s>`` = 1 and ``</s>`` = 2, as a saved checkpoint would say."""
    return tiny_llama(seed, vocab_size=vocab_size, hidden=hidden, tie=tie, max_positions=128,
                      bos_token_id=1, eos_token_id=2)


def tiny_t5(seed: int, d_model: int = 32):
    """A random two-layer T5 over the word vocabulary (255 tokens)."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=255, d_model=d_model, d_kv=8, d_ff=2 * d_model, num_layers=2, num_decoder_layers=2,
        num_heads=4, pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
    )
    return T5ForConditionalGeneration(config).eval()


def tiny_bart(seed: int):
    """A random one-layer BART over the word vocabulary (255 tokens)."""
    from transformers import BartConfig, BartForConditionalGeneration

    torch.manual_seed(seed)
    config = BartConfig(
        vocab_size=255, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=128,
        pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
    )
    return BartForConditionalGeneration(config).eval()


class RecordingModel(torch.nn.Module):
    """Wraps a model and records, for every forward, the cache length it was
    given and how many new tokens it was fed.

    The engine probes a model's cached forward on first use (``kvcache.probe``);
    the wrapper is probed here, up front, so ``calls`` holds a run's forwards only.
    """

    def __init__(self, model):
        super().__init__()
        from kvcache.probe import probe_of

        self.inner = model
        self.config = model.config
        self.calls: list[tuple[int, int]] = []
        probe_of(self)
        self.calls.clear()

    def forward(self, input_ids, past_key_values=None, use_cache=None, logits_to_keep=0, **kwargs):
        seen = past_key_values.get_seq_length() if past_key_values is not None else 0
        self.calls.append((seen, input_ids.shape[1]))
        return self.inner(input_ids=input_ids, past_key_values=past_key_values,
                          use_cache=use_cache, logits_to_keep=logits_to_keep, **kwargs)
