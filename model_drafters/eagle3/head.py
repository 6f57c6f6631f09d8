"""The EAGLE-3 head (Li et al., NeurIPS 2025): one decoder layer over the target's fused hidden states.

Its parameters carry the published checkpoints' names (EAGLE, SpecForge, vLLM's and SGLang's
``llama_eagle3``), so a state dict loads as it is: ``fc`` (H x 3T) fuses three target layers;
``midlayer``'s attention reads [embedding; hidden] (2H wide); ``norm`` and ``lm_head`` give the draft
logits; ``d2t`` maps a draft id to its target id (target = draft + d2t[draft]). One step at slot j
returns the layer's output before ``norm``: the logits of token j+2, and the hidden state the next
slot reads while the target's is not known.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class _Attention(nn.Module):
    """Grouped-query attention whose q, k and v read 2H inputs; rotary positions; keys in ``cache``."""

    def __init__(self, config):
        super().__init__()
        hidden = config.hidden_size
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or hidden // self.heads
        bias = bool(getattr(config, "attention_bias", False))
        self.q_proj = nn.Linear(2 * hidden, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(2 * hidden, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(2 * hidden, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)

    def forward(self, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor], cache,
                visible: torch.Tensor) -> torch.Tensor:
        """x (1, m, 2H); ``visible`` (m, keys) bool over the cache's keys then the m new ones."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        m = x.shape[1]
        q = self.q_proj(x).view(1, m, self.heads, self.head_dim).transpose(1, 2)        # (1, h, m, d)
        k = self.k_proj(x).view(1, m, self.kv_heads, self.head_dim).transpose(1, 2)     # (1, kv, m, d)
        v = self.v_proj(x).view(1, m, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rotary
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = cache.update(k, v, 0)                                                     # (1, kv, keys, d)
        groups = self.heads // self.kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=visible[None, None], scale=self.head_dim ** -0.5)
        return self.o_proj(out.transpose(1, 2).reshape(1, m, self.heads * self.head_dim))


class _MidLayer(nn.Module):
    """The head's one decoder layer (``midlayer.*`` in a checkpoint)."""

    def __init__(self, config, norm_before_residual: bool):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.hidden_norm = LlamaRMSNorm(hidden, eps=eps)
        self.self_attn = _Attention(config)
        self.post_attention_layernorm = LlamaRMSNorm(hidden, eps=eps)
        self.mlp = LlamaMLP(config)
        self.norm_before_residual = norm_before_residual

    def forward(self, embeds, hidden, rotary, cache, visible):
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden      # vLLM's norm_before_residual option
        x = torch.cat([self.input_layernorm(embeds), normed], dim=-1)   # (1, m, 2H): [embedding; hidden]
        x = residual + self.self_attn(x, rotary, cache, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(nn.Module):
    """An EAGLE-3 head; ``config`` a ``LlamaConfig`` of its own fields (``vocab_size`` is the target's)."""

    def __init__(self, config, *, draft_vocab_size: int, target_hidden_size: int, own_embeddings: bool,
                 norm_before_residual: bool = False):
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

        hidden = config.hidden_size
        self.config = config
        self.draft_vocab_size = draft_vocab_size
        self.fc = nn.Linear(3 * target_hidden_size, hidden, bias=False)
        self.midlayer = _MidLayer(config, norm_before_residual)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(config.vocab_size, dtype=torch.bool))
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden) if own_embeddings else None
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.target_embeddings: torch.Tensor | None = None   # the target's table, set by eagle3.load when the head has none

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """The rows of the embedding table, unscaled (what the engines read: a target that scales
        its embeddings in its own forward, as Gemma does, is read without that scale)."""
        table = self.embed_tokens.weight if self.embed_tokens is not None else self.target_embeddings
        return F.embedding(tokens, table)

    def step(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, cache, *,
             fused: bool, visible: torch.Tensor | None = None) -> torch.Tensor:
        """Run m slots over ``cache`` and append their keys; returns their outputs before ``norm``, (1, m, H).

        ``hidden`` (1, m, 3T) with ``fused`` (the target's three layers, through ``fc``), else
        (1, m, H) (the head's own outputs); ``tokens`` (1, m) the embedded tokens (token j+1 at
        slot j); ``positions`` (1, m); ``visible`` (m, cached + m) bool, causal when None.
        """
        if fused:
            hidden = self.fc(hidden)
        m = tokens.shape[1]
        past = cache.get_seq_length()
        if visible is None:
            keys = torch.arange(past + m, device=tokens.device)
            visible = keys[None, :] <= (past + torch.arange(m, device=tokens.device))[:, None]   # (m, past + m)
        embeds = self.embed(tokens).to(hidden.dtype)
        rotary = self.rotary_emb(hidden, positions)
        return self.midlayer(embeds, hidden, rotary, cache, visible)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary, (..., draft vocabulary), from ``step``'s outputs."""
        return self.lm_head(self.norm(out))

    def target_ids(self) -> torch.Tensor:
        """The target id of each draft id, (draft vocabulary,)."""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t
