"""A tiny random Gemma 4 target, a tiny random Gemma 4 assistant for it, and the assistant's
draft logits recomputed from nothing.

Both are built from configs (no download) with independent, wide weights
(``WIDE_INIT``, ten times transformers' default; the heads scaled by
``LOGIT_SCALE``), so the argmax is decisive and the assistant's drafts are often
rejected. The target has two sliding layers (window ``WINDOW``, shorter than the
sequences the tests decode, so the sliding keys the assistant reads are cut)
and a full one; the assistant one sliding and one full layer, every one reading
the target's keys and values.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.devices import seeded_on_cpu

WIDE_INIT = 0.2
LOGIT_SCALE = 4.0
WINDOW = 6
VOCAB = 64


def target_config(*, vocab_size: int = VOCAB, hidden: int = 32):
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=16, sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=vocab_size, num_kv_shared_layers=0, max_position_embeddings=256,
        initializer_range=WIDE_INIT, tie_word_embeddings=False, bos_token_id=0, eos_token_id=None,
        pad_token_id=None)


def tiny_target(*, seed: int = 0, vocab_size: int = VOCAB):
    """A random three-layer Gemma 4 text model in eval mode (eager attention, as the architecture matrix's)."""
    import transformers

    config = target_config(vocab_size=vocab_size)
    config._attn_implementation = "eager"
    model = seeded_on_cpu(lambda: transformers.Gemma4ForCausalLM(config).eval(), seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    model.generation_config = transformers.GenerationConfig(bos_token_id=0, eos_token_id=None, pad_token_id=None)
    return model


def assistant_config(target, *, hidden: int = 24, backbone: int | None = None, head_dim: int | None = None):
    """Sizes read from ``target`` (its key/value heads and head sizes per attention type, its
    window and vocabulary) unless ``head_dim`` or ``backbone`` say otherwise (a mismatch)."""
    from transformers import Gemma4AssistantConfig

    from model_drafters.gemma4_assistant.model import kv_shape, producer_layers

    producers = producer_layers(target.config)
    heads, sliding = kv_shape(target.config, producers["sliding_attention"])
    full = kv_shape(target.config, producers["full_attention"])[1]
    text = dict(model_type="gemma4_text", vocab_size=target.config.vocab_size, hidden_size=hidden,
                intermediate_size=2 * hidden, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=heads,
                head_dim=head_dim or sliding, global_head_dim=head_dim or full,
                sliding_window=target.config.sliding_window,
                layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
                vocab_size_per_layer_input=0, max_position_embeddings=256, initializer_range=WIDE_INIT)
    return Gemma4AssistantConfig(text_config=text, backbone_hidden_size=backbone or target.config.hidden_size,
                                 tie_word_embeddings=False)


def tiny_assistant(target, *, seed: int = 1, **sizes):
    """A random Gemma 4 assistant for ``target``, drawn from ``seed`` alone (wide), not marked."""
    from transformers import Gemma4AssistantForCausalLM

    def drawn():
        model = Gemma4AssistantForCausalLM(assistant_config(target, **sizes)).eval()
        with torch.no_grad():
            for weight in model.parameters():
                if weight.dim() >= 2:
                    weight.normal_(0.0, WIDE_INIT)
            model.lm_head.weight.mul_(LOGIT_SCALE)
        return model

    return seeded_on_cpu(drawn, seed)


def save_pair(target, assistant, folder: Path) -> tuple[Path, Path]:
    """Save ``target`` (with a word tokenizer) and ``assistant`` as a user's downloads are laid out:
    each a directory with config.json and safetensors. Returns (target dir, assistant dir)."""
    from tests.helpers.tokenizers import word_tokenizer

    target_dir, assistant_dir = Path(folder) / "target", Path(folder) / "assistant"
    target.save_pretrained(target_dir)
    word_tokenizer(words=[f"w{i}" for i in range(target.config.vocab_size - 5)]).save_pretrained(target_dir)
    assistant.save_pretrained(assistant_dir)
    return target_dir, assistant_dir


def reference_logits(target, assistant, committed: list[int], drafts: list[int]) -> torch.Tensor:
    """The assistant's logits of a chain from ``committed`` recomputed from nothing: the target run
    uncached on all but the last committed token (its shared keys and values, the sliding ones cut
    to the W-1 positions its window keeps for the next position, and its last final hidden
    state), then the assistant step by step at position n-1. Row d drew ``drafts[d]``; (len, V)."""
    n = len(committed)
    window = target.config.sliding_window
    with torch.inference_mode():
        out = target(torch.tensor([committed[:n - 1]]), output_hidden_states=True, return_shared_kv_states=True,
                     use_cache=False)
        kv = {}
        for kind, (keys, values) in out.shared_kv_states.items():
            start = max(0, n - 1 - (window - 1)) if kind == "sliding_attention" else 0
            kv[kind] = (keys[:, :, start:], values[:, :, start:])
        state = out.hidden_states[-1][:, -1:]
        embed = target.get_input_embeddings()
        rows = []
        for token in [committed[-1]] + drafts[:-1]:
            embeds = torch.cat([embed(torch.tensor([[token]])), state], dim=-1)
            step = assistant(inputs_embeds=embeds, position_ids=torch.tensor([[n - 1]]), shared_kv_states=kv)
            rows.append(step.logits[0, -1:])
            state = step.last_hidden_state
    return torch.cat(rows)
