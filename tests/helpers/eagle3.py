"""Tiny random EAGLE-3 heads saved in the published layout, and an independent recomputation of their logits.

A head's weights are drawn from their own seed, wide (``WIDE_INIT``), so its drafts are
often rejected; its draft vocabulary is smaller than the target's and maps to a scattered
subset of target ids (``d2t``), so a missing map shows. ``save_head`` writes config.json and
the weights under the names EAGLE's releases use (``fc``, ``midlayer.*``, ``norm``,
``lm_head``, ``d2t``, ``t2d``); the tests load it back with ``engine.load_pair(DIR,
"eagle3:HEAD")``, a user's path. ``reference_logits`` recomputes a drafted chain from
nothing with plain tensor operations (no cache, eager attention, its own rotary table),
following the EAGLE-3 recursion: the target run uncached for its hidden states at the
head's three layers, then the head over every slot, its own outputs standing in for the
target's hidden states at the draft slots.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.helpers.models import tiny_llama
from utils.hf_load import text_config

WIDE_INIT = 0.2
HEADS, KV_HEADS = 4, 2


def tiny_target(seed: int = 0, *, layers: int = 8, vocab_size: int = 16, hidden: int = 32, logit_scale=8.0):
    """A random Llama target (eight layers: the default rule reads hidden states 2, 4 and 5)."""
    return tiny_llama(seed, vocab_size=vocab_size, hidden=hidden, layers=layers, logit_scale=logit_scale)


def head_config(target, draft_vocab: int, **extra) -> dict:
    """config.json of a head for ``target``, as SpecForge writes it (EAGLE's own trainer names
    ``LlamaForCausalLM`` in ``architectures``; the loader reads neither name)."""
    text = target.config
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "hidden_size": text.hidden_size, "intermediate_size": 2 * text.hidden_size,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "num_hidden_layers": 1,
            "vocab_size": text.vocab_size, "draft_vocab_size": draft_vocab, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "max_position_embeddings": getattr(text, "max_position_embeddings", 256),
            "hidden_act": "silu", "tie_word_embeddings": False, "bos_token_id": 0, **extra}


def head_weights(target, draft_vocab: int, seed: int = 1, *, own_embeddings: bool = False) -> dict:
    """Random head weights (from ``seed`` alone, wide) under the checkpoint names."""
    hidden, vocab = target.config.hidden_size, target.config.vocab_size
    head_dim = hidden // HEADS
    cpu = torch.device("cpu")                # drawn and kept on the CPU: the same head on every device
    g = torch.Generator(device=cpu).manual_seed(seed)

    def wide(*shape):
        return torch.randn(*shape, generator=g, device=cpu) * WIDE_INIT

    def norm():
        return 1.0 + 0.1 * torch.randn(hidden, generator=g, device=cpu)

    chosen = torch.randperm(vocab, generator=g, device=cpu)[:draft_vocab].sort().values     # target ids of the draft vocabulary
    t2d = torch.zeros(vocab, dtype=torch.bool, device=cpu)
    t2d[chosen] = True
    weights = {
        "fc.weight": wide(hidden, 3 * hidden),
        "midlayer.input_layernorm.weight": norm(), "midlayer.hidden_norm.weight": norm(),
        "midlayer.self_attn.q_proj.weight": wide(HEADS * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": wide(KV_HEADS * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": wide(KV_HEADS * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": wide(hidden, HEADS * head_dim),
        "midlayer.post_attention_layernorm.weight": norm(),
        "midlayer.mlp.gate_proj.weight": wide(2 * hidden, hidden),
        "midlayer.mlp.up_proj.weight": wide(2 * hidden, hidden),
        "midlayer.mlp.down_proj.weight": wide(hidden, 2 * hidden),
        "norm.weight": norm(), "lm_head.weight": wide(draft_vocab, hidden) * 20,
        "d2t": chosen - torch.arange(draft_vocab, device=cpu), "t2d": t2d,
    }
    if own_embeddings:
        weights["embed_tokens.weight"] = wide(vocab, hidden) * 5
    return weights


def save_head(folder: Path, config: dict, weights: dict, *, file: str = "model.safetensors") -> Path:
    """Write ``config`` and ``weights`` as a published head is laid out (safetensors or pytorch_model.bin)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {name: t.contiguous() for name, t in weights.items()}
    if file.endswith(".safetensors"):
        from safetensors.torch import save_file

        save_file(tensors, str(folder / file), metadata={"format": "pt"})
    else:
        torch.save(tensors, folder / file)
    return folder


# ------------------------------------------------------------------ the recomputation


def _rms(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate(x, positions, theta):
    """Rotary embedding of x (m, heads, d) at ``positions`` (m,), halves rotated (Llama's layout)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = positions.float()[:, None] * inv[None]                    # (m, d/2)
    cos, sin = torch.cat([angles, angles], -1).cos()[:, None], torch.cat([angles, angles], -1).sin()[:, None]
    rotated = torch.cat([-x[..., d // 2:], x[..., :d // 2]], dim=-1)
    return x * cos + rotated * sin


def _layer(w, config, embeds, hidden):
    """The midlayer over m slots at positions 0..m-1, no cache, eager causal attention: (m, H)."""
    m, heads, kv = hidden.shape[0], config["num_attention_heads"], config["num_key_value_heads"]
    d = config["hidden_size"] // heads
    x = torch.cat([_rms(embeds, w["midlayer.input_layernorm.weight"]),
                   _rms(hidden, w["midlayer.hidden_norm.weight"])], dim=-1)
    positions = torch.arange(m)
    q = _rotate((x @ w["midlayer.self_attn.q_proj.weight"].T).view(m, heads, d), positions, config["rope_theta"])
    k = _rotate((x @ w["midlayer.self_attn.k_proj.weight"].T).view(m, kv, d), positions, config["rope_theta"])
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(m, kv, d)
    k, v = k.repeat_interleave(heads // kv, dim=1), v.repeat_interleave(heads // kv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / d ** 0.5
    scores = scores.masked_fill(torch.ones(m, m, dtype=torch.bool).triu(1), float("-inf"))
    attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(m, heads * d)
    x = hidden + attn @ w["midlayer.self_attn.o_proj.weight"].T
    y = _rms(x, w["midlayer.post_attention_layernorm.weight"])
    gate, up = y @ w["midlayer.mlp.gate_proj.weight"].T, y @ w["midlayer.mlp.up_proj.weight"].T
    return x + (torch.nn.functional.silu(gate) * up) @ w["midlayer.mlp.down_proj.weight"].T


def reference_logits(target, weights: dict, config: dict, layers, committed: list[int], drafts: list[int],
                     vocab_size: int) -> torch.Tensor:
    """The head's logits of a chain from ``committed`` recomputed from nothing, over the target
    vocabulary (-inf at ids the head cannot draft); row d drew ``drafts[d]``: (len(drafts), V)."""
    n, seq = len(committed), torch.tensor(committed + drafts)
    table = weights.get("embed_tokens.weight", target.get_input_embeddings().weight)
    targets = torch.arange(weights["lm_head.weight"].shape[0]) + weights["d2t"]
    rows = []
    with torch.inference_mode():
        states = target(seq[None, :n - 1], output_hidden_states=True).hidden_states
        fused = torch.cat([states[i][0] for i in layers], dim=-1) @ weights["fc.weight"].T     # (n-1, H)
        hidden = fused
        for d in range(len(drafts)):
            out = _layer(weights, config, table[seq[1:n + d]], hidden)                      # (n-1+d, H)
            logits = _rms(out[-1], weights["norm.weight"]) @ weights["lm_head.weight"].T   # (D,)
            row = torch.full((vocab_size,), float("-inf"))
            row[targets] = logits
            rows.append(row)
            hidden = torch.cat([fused, out[n - 2:]])                                        # the head's own outputs
    return torch.stack(rows)


def worst_logit_error(target, weights, config, layers, chains, vocab_size) -> float:
    """The largest |drafter logit - recomputed logit| over every chain, relative to the chain's
    largest finite logit; inf where the two place their finite logits at different ids."""
    assert chains, "no chain was recorded: nothing to compare"
    worst = 0.0
    for committed, drafts, logits in chains:
        want = reference_logits(target, weights, config, layers, committed, drafts, vocab_size)
        finite = torch.isfinite(want)
        if not torch.equal(finite, torch.isfinite(logits)):
            return float("inf")
        error = (logits[finite] - want[finite]).abs().max() / want[finite].abs().max()
        worst = max(worst, error.item())
    return worst


def zoo_head(name: str, folder: Path, *, draft_vocab: int = 64, seed: int = 5):
    """(target, head): the architecture zoo's target of family ``name`` and a random head for it,
    saved to ``folder`` in the published layout and loaded back; the head reads the embeddings,
    the middle layer and the last layer's input (named in its config: the zoo's targets have
    two to four layers)."""
    from model_drafters.eagle3 import load_eagle3
    from model_drafters.eagle3.load import target_layers
    from tests.helpers.arch_zoo import build

    target = build(name)
    text = text_config(target.config)
    layers = target_layers(target)
    shape = type("Shape", (), {"config": text})
    config = head_config(shape, draft_vocab, eagle_aux_hidden_state_layer_ids=[0, layers // 2, layers - 1])
    save_head(folder, config, head_weights(shape, draft_vocab, seed=seed))
    return target, load_eagle3(target, f"eagle3:{folder}")
