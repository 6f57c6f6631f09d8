"""Tiny random causal LMs for tests: no downloads, milliseconds per forward."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int, *, vocab_size: int = 64, hidden: int = 32, layers: int = 2,
               max_positions: int = 256, logit_scale: float = 1.0,
               dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """A random Llama in eval mode. ``logit_scale`` sharpens its distributions
    (random init gives nearly uniform next-token probabilities)."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=max_positions, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=None, pad_token_id=None,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model.to(dtype)


class RecordingModel(torch.nn.Module):
    """Wraps a model and records, for every forward, the cache length it was
    given and how many new tokens it was fed.

    The engine probes a model's cached forward on first use (``utils.probe``);
    the wrapper is probed here, up front, so ``calls`` holds a run's forwards only.
    """

    def __init__(self, model):
        super().__init__()
        from utils.probe import probe_of

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
