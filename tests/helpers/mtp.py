"""Tiny random targets with MTP layers (DeepSeek-V3, GLM-4.5), their MTP layers, and checkpoints
laid out as the real ones are.

transformers finds a checkpoint's MTP weights by the real models' layer numbers
(``_keys_to_ignore_on_load_unexpected``: ``model.layers.61.*`` for DeepSeek-V3,
``model.layers.46.*`` / ``92.*`` for GLM-4.5-Air / GLM-4.5), so a target that is
loaded from disk here has the real number of main layers (61, 46), each tiny,
and its MTP layers saved right after them. The MTP weights are initialised
independently of the target and wide (``WIDE_INIT``, ten times transformers'
default), so drafts are often rejected and every rollback path runs.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.devices import seeded_on_cpu

WIDE_INIT = 0.2
LOGIT_SCALE = 4.0

# family -> (config class, model class, layers of the real checkpoint, config)
FAMILIES = {
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", 61, dict(
        num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8,
        v_head_dim=8, qk_nope_head_dim=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
        moe_intermediate_size=16, first_k_dense_replace=1, n_group=1, topk_group=1)),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM", 46, dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, use_qk_norm=True, moe_intermediate_size=16,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
        n_group=1, topk_group=1)),
}


def tiny_target(family: str, *, seed: int = 0, layers: int | None = None, vocab_size: int = 64,
                mtp_layers: int | None = 1, hidden: int = 32):
    """A random ``family`` target in eval mode; ``layers`` defaults to the real checkpoint's
    count (what ``MtpModel.from_pretrained`` needs); ``mtp_layers`` None leaves the config's
    num_mtp_layers out (0: declared, none)."""
    import transformers

    config_name, model_name, real_layers, extra = FAMILIES[family]
    fields = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers or real_layers, max_position_embeddings=256,
                  initializer_range=WIDE_INIT, tie_word_embeddings=False, bos_token_id=0, eos_token_id=None,
                  pad_token_id=None, **extra)
    if mtp_layers is not None:
        fields["num_mtp_layers"] = mtp_layers
    config = getattr(transformers, config_name)(**fields)
    model = seeded_on_cpu(lambda: getattr(transformers, model_name)(config).eval(), seed)
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    model.generation_config = transformers.GenerationConfig(bos_token_id=0, eos_token_id=None, pad_token_id=None)
    return model


def mtp_layers_for(target, count: int, *, seed: int = 1):
    """``count`` MTP layers for ``target``, initialised from ``seed`` alone (wide), marked for the
    engine (``mtp.mark_mtp``): what ``--drafter mtp`` builds, without a checkpoint."""
    from transformers.modeling_layers import MtpModel

    from model_drafters.mtp import mark_mtp

    torch.manual_seed(seed)
    model = MtpModel(target, count).eval()
    with torch.no_grad():   # every matrix drawn here: transformers leaves the experts' uninitialised
        for name, weight in model.layers.named_parameters():
            if weight.dim() >= 2:
                weight.normal_(0.0, WIDE_INIT)
            elif not torch.isfinite(weight).all():
                weight.zero_()
    return mark_mtp(model, target)


def save_with_mtp(target, mtp_model, folder: Path) -> Path:
    """Save ``target`` to ``folder`` with ``mtp_model``'s weights laid out as a real checkpoint's:
    MTP layer k at ``model.layers.<num_hidden_layers + k>.*``, its decoder block's weights
    directly under it, its final norm as ``shared_head.norm`` (the target's embeddings and head
    are shared, so not written again)."""
    from safetensors.torch import load_file, save_file

    target.save_pretrained(folder)
    file = Path(folder) / "model.safetensors"
    weights = load_file(str(file))
    first = target.config.num_hidden_layers
    for name, tensor in mtp_model.state_dict().items():
        if not name.startswith("layers."):
            continue                                      # embed_tokens, shared_head: the target's
        _, k, rest = name.split(".", 2)
        rest = rest.removeprefix("mtp_block.").replace("post_norm.", "shared_head.norm.")
        weights[f"model.layers.{first + int(k)}.{rest}"] = tensor.detach().clone().contiguous()
    save_file(weights, str(file), metadata={"format": "pt"})
    return Path(folder)


def reference_logits(target, mtp_model, committed: list[int], drafts: list[int]) -> torch.Tensor:
    """The MTP logits of a chain from ``committed`` recomputed from nothing: the target run
    uncached on all but the last committed token for its final hidden states, then each depth
    over every slot on a fresh cache (depth d >= K runs the last layer). Row d is the logits
    that drew ``drafts[d]``; (len(drafts), V)."""
    from transformers.cache_utils import MtpCache

    n, count = len(committed), len(mtp_model.layers)
    seq = torch.tensor(committed + drafts)
    with torch.inference_mode():
        hidden = target(seq[None, :n - 1], output_hidden_states=True).hidden_states[-1]     # (1, n-1, H)
        rows = []
        for d in range(len(drafts)):
            tokens = seq[d + 1:n + d][None]
            positions = torch.arange(d + 1, n + d)[None]
            hidden = mtp_model.forward_layer(min(d, count - 1), hidden, positions,
                                             MtpCache(config=mtp_model.config), input_ids=tokens)
            rows.append(mtp_model._project_to_logits(hidden[:, -1:])[0])
    return torch.cat(rows)
