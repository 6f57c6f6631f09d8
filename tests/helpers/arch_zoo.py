"""A zoo of tiny random models, one target and one drafter per architecture family,
and the checks that hold every decoding strategy to transformers' own ``generate``.

Everything is built offline from configs (no downloads): hidden size 32 (64 for xLSTM),
2-4 layers, a vocabulary of 96, so one forward takes milliseconds. Weights are
initialised wide (``WIDE_INIT``, ten times transformers' default) and the
output layer is scaled up (``LOGIT_SCALE``), so the argmax is decisive (the
median gap between the top two logits is several units, see
``tests/test_architectures.py``): near-flat logits would hide a wrong cached
state, since it would rarely flip an argmax. Sliding-window families get a
window of 8, shorter than every prompt here, and generation runs long enough to
cross it again.

Each family has two drafters: ``"drafter"``, the target's weights blended
towards an independent random initialisation (it agrees with the target often
enough that rounds accept some drafts and reject others), and
``"independent"``, initialised from another seed alone (drafts are mostly
rejected, so every rollback path runs).

Every model is probed by the engine (``kvcache.probe``) on first use; the
``logits`` check holds the cached logits of a whole speculative run against
uncached forwards, whatever path the probe chose.

A family whose classes a transformers version lacks is reported as
unavailable (``FamilyUnavailable``), never silently dropped.

The check functions return an :class:`Outcome` (pass, refused, fail or skip
with a one-line detail); ``tests/test_architectures.py`` asserts on them and
``scripts/support_table.py`` tabulates them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import transformers

from checks.stats import goodness_of_fit
from engine import NGramOptions, Strategy, run_strategy
from kvcache.cache import TRANSFORMERS_RELEASE, UnsupportedCacheError
from kvcache.probe import cached_model
from tests.helpers.devices import seeded_on_cpu
from tests.helpers.pairs import model_pair

VOCAB = 96
HIDDEN = 32
LOGIT_SCALE = 12.0
WIDE_INIT = 0.2             # initializer_range (transformers' default: 0.02)
WINDOW = 8
DRAFT_BLEND = 0.1           # drafter = (1 - b) * target + b * independent init
ROLES = ("target", "drafter", "independent")
TARGET_SEED, DRAFTER_SEED = 1000, 2000
MAX_POSITIONS = 256

# Prompts longer than WINDOW, with repeats so that n-gram drafts exist.
PROMPTS: tuple[tuple[int, ...], ...] = (
    (5, 17, 33, 8, 41, 5, 17, 33, 8, 41, 5, 17, 60, 72, 9, 5, 17, 33, 8, 23),
    (11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 11, 12, 13, 14, 15, 30, 31, 11, 12, 13, 14, 3, 4, 5),
)
LENGTH = 24
GAMMAS = (1, 3, 5)


class FamilyUnavailable(RuntimeError):
    """This transformers version cannot build the family (its classes are missing)."""


# ------------------------------------------------------------------ families

@dataclass(frozen=True)
class Family:
    """How to build one architecture family's tiny model.

    ``config`` returns the keyword arguments of ``config_class`` (vocabulary and
    special tokens are added by :func:`build`). ``window``: the sliding window
    of its sliding layers, if any. ``kind`` is "attention", "sliding",
    "recurrent", "hybrid" or "encoder-decoder", for the documentation.
    """

    name: str
    config_class: str
    model_class: str
    config: Callable[[], dict]
    kind: str = "attention"
    window: int | None = None
    attn_implementation: str | None = None
    encoder_decoder: bool = False
    may_refuse: bool = False    # only static caches may be refused by the engine
    special: dict = field(default_factory=lambda: {"bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1})
    note: str = ""
    new: bool = False           # a family added in 2026: fewer gammas, to keep the suite fast


def _gqa(layers: int = 2) -> dict:
    return dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=MAX_POSITIONS,
                tie_word_embeddings=False)


def _alternating(layers: int, first: str, second: str) -> list[str]:
    return [first if i % 2 == 0 else second for i in range(layers)]


def _mamba2() -> dict:
    # heads * head_dim must equal expand * hidden; chunk_size below the prompt length
    # so the chunked scan runs over several chunks.
    return dict(hidden_size=HIDDEN, num_hidden_layers=2, expand=2, num_heads=4, head_dim=16,
                n_groups=1, state_size=16, conv_kernel=4, chunk_size=8, time_step_rank=8,
                tie_word_embeddings=False)


def _jamba() -> dict:
    # Layers 0..3: mamba, attention, mamba, attention; experts on layers 1 and 3.
    return dict(**_gqa(4), attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
                expert_layer_offset=1, num_experts=2, num_experts_per_tok=1, mamba_d_state=8,
                mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4, use_mamba_kernels=False)


def _qwen3_next() -> dict:
    # Linear-attention (gated delta net: conv + recurrent state) and full-attention layers.
    return dict(**_gqa(4), head_dim=16, layer_types=_alternating(4, "linear_attention", "full_attention"),
                linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
                linear_num_key_heads=2, linear_num_value_heads=4, num_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, shared_expert_intermediate_size=32, decoder_sparse_step=1)


def _falcon_h1() -> dict:
    # Every layer runs attention and a mamba2 mixer in parallel.
    return dict(**_gqa(2), head_dim=8, mamba_d_ssm=64, mamba_n_heads=4, mamba_d_head=16,
                mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
                mamba_chunk_size=8, mamba_rms_norm=True)


def _gpt_oss() -> dict:
    # Attention sinks; sliding and full layers alternate; every MLP a mixture of experts.
    return dict(**_gqa(2), head_dim=8, sliding_window=WINDOW, num_local_experts=4, num_experts_per_tok=2,
                layer_types=_alternating(2, "sliding_attention", "full_attention"))


def _deepseek_v3() -> dict:
    # Multi-head latent attention (low-rank q and kv); layer 0 dense, layer 1 MoE.
    return dict(**{**_gqa(2), "num_key_value_heads": 4}, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, v_head_dim=8,
                qk_nope_head_dim=8, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
                moe_intermediate_size=16, first_k_dense_replace=1, n_group=1, topk_group=1)


def _gemma4() -> dict:
    return dict(**_gqa(3), head_dim=16, sliding_window=WINDOW, hidden_size_per_layer_input=0,
                vocab_size_per_layer_input=VOCAB, num_kv_shared_layers=0,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"])


def _bamba() -> dict:
    # Mamba2 layers and one attention layer. The scan chunk (4) divides every
    # prompt here: transformers' own generate is right only then (see docs/engine.md).
    return dict(**_gqa(3), attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_n_groups=1,
                mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4)


def _nemotron_h() -> dict:
    # M = mamba2, * = attention, - = MLP, E = MoE.
    return dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=False,
                layers_block_type=["mamba", "attention", "mlp", "mamba"], ssm_state_size=16,
                mamba_num_heads=4, mamba_head_dim=16, n_groups=1, conv_kernel=4, expand=2, chunk_size=4)


def _zamba2() -> dict:
    # Mamba2 layers with a shared attention block between them.
    return dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=3,
                layers_block_type=["mamba", "hybrid", "mamba"], num_attention_heads=4, num_key_value_heads=4,
                mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_ngroups=1, n_mamba_heads=4,
                chunk_size=4, num_mem_blocks=1, adapter_rank=8, max_position_embeddings=MAX_POSITIONS,
                tie_word_embeddings=False)


def _granite_hybrid() -> dict:
    return dict(**_gqa(3), layer_types=["mamba", "attention", "mamba"], num_local_experts=4,
                num_experts_per_tok=2, shared_intermediate_size=32, mamba_n_heads=4, mamba_d_head=16,
                mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=4)


def _recurrent_gemma() -> dict:
    return dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, lru_width=32, attention_window_size=WINDOW, conv1d_width=4,
                block_types=["recurrent", "recurrent", "attention"], w_init_variance_scale=0.1,
                tie_word_embeddings=False)


def _lfm2_moe() -> dict:
    return dict(**_gqa(3), moe_intermediate_size=16, num_dense_layers=1, num_experts=4, num_experts_per_tok=2,
                conv_L_cache=3, layer_types=["conv", "full_attention", "conv"])


def _olmo_hybrid() -> dict:
    # Gated delta-net linear attention (conv + recurrent state, negative eigenvalues
    # allowed) and full-attention layers; the linear layers take no rotary positions.
    return dict(**_gqa(2), layer_types=["linear_attention", "full_attention"],
                linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
                linear_value_head_dim=8, linear_conv_kernel_dim=4)


def _kimi_linear() -> dict:
    # A Kimi delta attention layer (conv + recurrent state), then a multi-head latent
    # attention one; layer 0 a dense MLP, layer 1 MoE.
    return dict(**{**_gqa(2), "num_key_value_heads": 4}, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                v_head_dim=8, qk_nope_head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=16, linear_head_dim=8, linear_num_heads=4, linear_conv_kernel_dim=4,
                layer_types=["linear_attention", "full_attention"], mlp_layer_types=["dense", "sparse"])


def _minimax() -> dict:
    # A full attention layer, then a lightning (blockwise linear) attention one, full first as in
    # MiniMax's own default (the cache counts positions in layer 0); blocks of 4 tokens, so
    # a prompt spans several; every MLP a mixture of experts.
    return dict(**_gqa(2), head_dim=8, block_size=4, num_local_experts=4, num_experts_per_tok=2,
                layer_types=["full_attention", "linear_attention"])


def _xlstm() -> dict:
    # mLSTM blocks (matrix memory: C, n, m per head); chunk 4 so the chunkwise kernel
    # runs over several chunks of a prompt. The cache sizes its state from the qk and v
    # widths rounded up to 64, the layers from the unrounded ones: hidden 64 with
    # factors 1 makes them agree. On 4.57 the chunkwise kernel raises on any sequence
    # as long as its chunk (a reshape error, uncached too): there the chunk (128) is
    # longer than every sequence here.
    chunk = 4 if TRANSFORMERS_RELEASE >= (5,) else 128
    return dict(hidden_size=2 * HIDDEN, num_hidden_layers=2, num_heads=4, chunk_size=chunk, qk_dim_factor=1.0,
                v_dim_factor=1.0, ffn_round_up_to_multiple_of=16, autocast_kernel_dtype="float32",
                tie_word_embeddings=False)


def _cohere2() -> dict:
    # Three sliding layers with rotary positions, then a global one without;
    # logit_scale 1 (the zoo scales the output layer itself).
    return dict(**_gqa(4), sliding_window=WINDOW, logit_scale=1.0,
                layer_types=["sliding_attention"] * 3 + ["full_attention"])


def _deepseek_v32() -> dict:
    # Multi-head latent attention whose keys are chosen per query by a lightning indexer
    # (its own key cache in the layer): each query attends to its top 6 positions only,
    # fewer than any prompt, so the selection matters; layer 0 dense, layer 1 MoE. An index
    # score is a weighted sum of ReLUs over the indexer heads: with 2 heads, exact zeros tie
    # at the top-6 cut, and which one is kept depends on the length of the tensor topk
    # sees (transformers' own uncached forward of 7 and of 14 tokens then disagree at
    # position 6); with 8 heads such ties are improbable.
    return dict(**_deepseek_v3(), head_dim=8, index_topk=6, index_head_dim=8, index_n_heads=8)


def _lfm3() -> dict:
    # Short-convolution layers, a sliding and a full attention layer (gated, sandwich norms).
    return dict(**_gqa(4), head_dim=8, conv_L_cache=3, sliding_window=WINDOW,
                layer_types=["conv", "sliding_attention", "full_attention", "conv"])


def _longcat_flash() -> dict:
    # Each of the 2 layers runs two MLA attentions and two MLPs, and MoE with zero-compute
    # experts (a token routed there passes through unchanged).
    return dict(hidden_size=HIDDEN, num_layers=2, num_attention_heads=4, num_key_value_heads=4,
                max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=False, ffn_hidden_size=2 * HIDDEN,
                q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, head_dim=8,
                v_head_dim=8, moe_topk=2, n_routed_experts=4, zero_expert_num=2, expert_ffn_hidden_size=16)


def _exaone4() -> dict:
    # Three sliding layers with rotary positions, then a global one without; QK norms.
    return dict(**_gqa(4), sliding_window=WINDOW, layer_types=["sliding_attention"] * 3 + ["full_attention"])


def _ministral3() -> dict:
    # YaRN rotary positions and a query scale that steps up with the position (Llama-4
    # style: 1 + beta * log(1 + floor(position / original length))); an original length
    # of 16 makes the scale step several times within every run here.
    rope = dict(rope_type="yarn", rope_theta=10000.0, factor=MAX_POSITIONS / 16, original_max_position_embeddings=16,
                max_position_embeddings=MAX_POSITIONS, beta_fast=32.0, beta_slow=1.0, mscale=1.0,
                mscale_all_dim=1.0, llama_4_scaling_beta=0.5)
    return dict(**_gqa(2), head_dim=8, rope_parameters=rope)


def _glm4_moe() -> dict:
    # Rotary positions on half of each head (partial_rotary_factor 0.5), QK norms,
    # sigmoid-routed MoE with a shared expert after a dense layer.
    return dict(**_gqa(2), head_dim=16, use_qk_norm=True, moe_intermediate_size=16, n_routed_experts=4,
                num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1)


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("llama", "LlamaConfig", "LlamaForCausalLM", lambda: _gqa()),
    Family("qwen2", "Qwen2Config", "Qwen2ForCausalLM",
           lambda: dict(**_gqa(3), use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
           kind="sliding", window=WINDOW,
           note="use_sliding_window with max_window_layers=1: layer 0 full attention, layers 1-2 sliding"),
    Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM", lambda: dict(**_gqa(), head_dim=16)),
    Family("mistral", "MistralConfig", "MistralForCausalLM", lambda: dict(**_gqa(), sliding_window=WINDOW),
           kind="sliding", window=WINDOW, note="every layer sliding"),
    Family("mixtral", "MixtralConfig", "MixtralForCausalLM",
           lambda: dict(**_gqa(), num_local_experts=4, num_experts_per_tok=2, sliding_window=None),
           note="mixture of experts"),
    Family("gemma2", "Gemma2Config", "Gemma2ForCausalLM",
           lambda: dict(**_gqa(), head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16,
                        attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                        layer_types=_alternating(2, "sliding_attention", "full_attention")),
           kind="sliding", window=WINDOW, attn_implementation="eager",
           note="sliding and full layers alternate; logit soft-capping needs eager attention"),
    Family("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM",
           lambda: dict(**_gqa(3), head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
           kind="sliding", window=WINDOW, attn_implementation="eager",
           note="two sliding layers, then a full one"),
    Family("phi3", "Phi3Config", "Phi3ForCausalLM",
           lambda: dict(**_gqa(), sliding_window=None, original_max_position_embeddings=MAX_POSITIONS)),
    Family("gpt2", "GPT2Config", "GPT2LMHeadModel",
           lambda: dict(n_embd=HIDDEN, n_layer=2, n_head=4, n_positions=MAX_POSITIONS, tie_word_embeddings=False),
           note="learned absolute positions"),
    Family("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM",
           lambda: dict(hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=MAX_POSITIONS, rotary_pct=0.5,
                        tie_word_embeddings=False)),
    Family("opt", "OPTConfig", "OPTForCausalLM",
           lambda: dict(hidden_size=HIDDEN, ffn_dim=2 * HIDDEN, num_hidden_layers=2, num_attention_heads=4,
                        word_embed_proj_dim=HIDDEN, max_position_embeddings=MAX_POSITIONS,
                        tie_word_embeddings=False)),
    Family("lfm2", "Lfm2Config", "Lfm2ForCausalLM",
           lambda: dict(**_gqa(3), conv_L_cache=3, block_auto_adjust_ff_dim=False,
                        layer_types=["conv", "full_attention", "conv"]),
           kind="hybrid", note="short-convolution layers (conv state) and attention layers"),
    Family("qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM", _qwen3_next, kind="hybrid",
           note="gated delta-net linear attention (conv + recurrent state) and full attention, MoE"),
    Family("qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM",
           lambda: {k: v for k, v in _qwen3_next().items()
                    if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                 "shared_expert_intermediate_size", "decoder_sparse_step")},
           kind="hybrid", note="linear attention (conv + recurrent state) and full attention"),
    Family("mamba", "MambaConfig", "MambaForCausalLM",
           lambda: dict(hidden_size=HIDDEN, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4,
                        time_step_rank=4, use_mambapy=False, tie_word_embeddings=False),
           kind="recurrent", note="pure recurrent (conv + SSM state)"),
    Family("mamba2", "Mamba2Config", "Mamba2ForCausalLM", _mamba2, kind="recurrent",
           note="pure recurrent (conv + SSM state), chunked scan"),
    Family("jamba", "JambaConfig", "JambaForCausalLM", _jamba, kind="hybrid",
           note="mamba and attention layers alternate, MoE on odd layers"),
    Family("falcon_h1", "FalconH1Config", "FalconH1ForCausalLM", _falcon_h1, kind="hybrid",
           note="attention and mamba2 in parallel in every layer"),
    Family("gpt_oss", "GptOssConfig", "GptOssForCausalLM", _gpt_oss, kind="sliding", window=WINDOW,
           attn_implementation="eager", note="attention sinks, sliding and full layers alternate, MoE", new=True),
    Family("deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM", _deepseek_v3,
           note="multi-head latent attention, MoE after a dense layer", new=True),
    Family("gemma4", "Gemma4TextConfig", "Gemma4ForCausalLM", _gemma4, kind="sliding", window=WINDOW,
           attn_implementation="eager", note="text model: two sliding layers, then a full one", new=True),
    Family("smollm3", "SmolLM3Config", "SmolLM3ForCausalLM",
           lambda: dict(**_gqa(4), no_rope_layer_interval=2), note="every other layer without rotary positions",
           new=True),
    Family("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
           lambda: dict(**_gqa(), head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        decoder_sparse_step=1), note="mixture of experts", new=True),
    Family("nemotron_h", "NemotronHConfig", "NemotronHForCausalLM", _nemotron_h, kind="hybrid",
           note="mamba2, attention and MLP blocks", new=True),
    Family("bamba", "BambaConfig", "BambaForCausalLM", _bamba, kind="hybrid",
           note="mamba2 layers and an attention layer", new=True),
    Family("zamba2", "Zamba2Config", "Zamba2ForCausalLM", _zamba2, kind="hybrid",
           note="mamba2 layers and a shared attention block", new=True),
    Family("granitemoehybrid", "GraniteMoeHybridConfig", "GraniteMoeHybridForCausalLM", _granite_hybrid,
           kind="hybrid", note="mamba2 and attention layers, MoE", new=True),
    Family("recurrent_gemma", "RecurrentGemmaConfig", "RecurrentGemmaForCausalLM", _recurrent_gemma,
           kind="hybrid", note="RG-LRU recurrent blocks (state kept in the modules) and local attention",
           new=True),
    Family("lfm2_moe", "Lfm2MoeConfig", "Lfm2MoeForCausalLM", _lfm2_moe, kind="hybrid",
           note="short-convolution and attention layers, MoE after a dense layer", new=True),
    Family("olmo_hybrid", "OlmoHybridConfig", "OlmoHybridForCausalLM", _olmo_hybrid, kind="hybrid",
           note="gated delta-net linear attention (conv + recurrent state) and full attention", new=True),
    Family("kimi_linear", "KimiLinearConfig", "KimiLinearForCausalLM", _kimi_linear, kind="hybrid",
           note="Kimi delta attention (conv + recurrent state) and multi-head latent attention, MoE", new=True),
    Family("minimax", "MiniMaxConfig", "MiniMaxForCausalLM", _minimax, kind="hybrid",
           note="lightning attention (blockwise linear attention, its state in the model's own cache) "
                "and full attention, MoE", new=True),
    Family("xlstm", "xLSTMConfig", "xLSTMForCausalLM", _xlstm, kind="recurrent",
           note="mLSTM blocks (matrix memory) in a cache class of the model's own", new=True),
    Family("falcon_mamba", "FalconMambaConfig", "FalconMambaForCausalLM",
           lambda: dict(hidden_size=HIDDEN, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=4,
                        time_step_rank=4, use_mambapy=False, tie_word_embeddings=False),
           kind="recurrent", note="mamba with RMS-normalised B, C and dt", new=True),
    Family("cohere2", "Cohere2Config", "Cohere2ForCausalLM", _cohere2, kind="sliding", window=WINDOW,
           note="three sliding layers with rotary positions, then a global one without", new=True),
    Family("deepseek_v32", "DeepseekV32Config", "DeepseekV32ForCausalLM", _deepseek_v32,
           note="sparse attention: an indexer (keys cached beside the layer's) picks each query's top 6 "
                "positions; MLA, MoE after a dense layer", new=True),
    Family("lfm3", "Lfm3Config", "Lfm3ForCausalLM", _lfm3, kind="hybrid", window=WINDOW,
           note="short-convolution layers, a sliding and a full gated attention layer", new=True),
    Family("longcat_flash", "LongcatFlashConfig", "LongcatFlashForCausalLM", _longcat_flash,
           note="two MLA attentions per layer, MoE with zero-compute experts", new=True),
    Family("exaone4", "Exaone4Config", "Exaone4ForCausalLM", _exaone4, kind="sliding", window=WINDOW,
           note="three sliding layers with rotary positions, then a global one without; QK norms", new=True),
    Family("ministral3", "Ministral3Config", "Ministral3ForCausalLM", _ministral3,
           note="YaRN positions and a query scale that steps with the position", new=True),
    Family("glm4_moe", "Glm4MoeConfig", "Glm4MoeForCausalLM", _glm4_moe,
           note="rotary positions on half of each head, QK norms, sigmoid-routed MoE after a dense layer", new=True),
    Family("olmo3", "Olmo3Config", "Olmo3ForCausalLM",
           lambda: dict(**_gqa(3), sliding_window=WINDOW,
                        layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
           kind="sliding", window=WINDOW, note="two sliding layers, then a full one; norms after each block",
           new=True),
    Family("ernie4_5", "Ernie4_5Config", "Ernie4_5ForCausalLM", lambda: dict(**_gqa(), head_dim=8),
           note="interleaved rotary positions computed in float32", new=True),
    Family("hunyuan_v1_dense", "HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM",
           lambda: dict(**_gqa(), head_dim=8), note="QK norms after the rotary positions", new=True),
    Family("seed_oss", "SeedOssConfig", "SeedOssForCausalLM",
           lambda: dict(**_gqa(), head_dim=8, attention_dropout=0.0, residual_dropout=0.0),
           note="biases on q, k and v", new=True),
    Family("t5", "T5Config", "T5ForConditionalGeneration",
           lambda: dict(d_model=HIDDEN, d_kv=8, d_ff=2 * HIDDEN, num_layers=2, num_decoder_layers=2,
                        num_heads=4, relative_attention_num_buckets=8, decoder_start_token_id=0,
                        initializer_factor=3.0,
                        tie_word_embeddings=False),
           kind="encoder-decoder", encoder_decoder=True,
           special={"pad_token_id": 0, "eos_token_id": 1}, note="decoder starts from the pad token (0)"),
    Family("bart", "BartConfig", "BartForConditionalGeneration",
           lambda: dict(d_model=HIDDEN, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=2 * HIDDEN, decoder_ffn_dim=2 * HIDDEN,
                        max_position_embeddings=MAX_POSITIONS, decoder_start_token_id=2,
                        forced_eos_token_id=None, forced_bos_token_id=None, tie_word_embeddings=False),
           kind="encoder-decoder", encoder_decoder=True, note="decoder starts from the end token (2)"),
]}


# -------------------------------------------------------------------- build

def family(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]


def _classes(fam: Family):
    missing = [c for c in (fam.config_class, fam.model_class) if not hasattr(transformers, c)]
    if missing:
        raise FamilyUnavailable(f"transformers {transformers.__version__} has no {' or '.join(missing)}")
    return getattr(transformers, fam.config_class), getattr(transformers, fam.model_class)


def _random_model(fam: Family, seed: int):
    config_cls, model_cls = _classes(fam)
    config = config_cls(vocab_size=VOCAB, **fam.special, **fam.config())
    for attr in ("initializer_range", "init_std"):      # T5 sets its own initializer_factor
        if hasattr(config, attr):
            setattr(config, attr, WIDE_INIT)
    if fam.attn_implementation:
        config._attn_implementation = fam.attn_implementation
    return seeded_on_cpu(lambda: model_cls(config).eval(), seed)


def _untied_output(model) -> torch.nn.Module:
    """The output layer, given its own weights when it shares the embeddings'
    (T5 on transformers 5 ties them whatever the config says)."""
    out = model.get_output_embeddings()
    if out.weight is model.get_input_embeddings().weight:
        out.weight = torch.nn.Parameter(out.weight.detach().clone())
    return out


def _neutral_generation_config(model, fam: Family) -> None:
    """No end token, no forced tokens, plain greedy: what ``generate`` does is
    then exactly argmax decoding for LENGTH tokens, like the engine with no end token."""
    cfg = transformers.GenerationConfig(
        pad_token_id=fam.special.get("pad_token_id"),
        bos_token_id=fam.special.get("bos_token_id"),
        eos_token_id=None,
        decoder_start_token_id=getattr(model.config, "decoder_start_token_id", None),
    )
    model.generation_config = cfg


@functools.lru_cache(maxsize=None)
def build(name: str, role: str = "target"):
    """The family's tiny target, its blended drafter (``role="drafter"``) or its
    independently initialised drafter (``"independent"``), in eval mode.

    Raises FamilyUnavailable when this transformers version lacks the classes, and on a
    release between the CI ends whose own forward of the family raises (transformers 5.2's
    Zamba2, 5.14's Nemotron-H): no reference can be made there. On the ends it must run.
    """
    fam = family(name)
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    model = _random_model(fam, DRAFTER_SEED if role == "independent" else TARGET_SEED)
    if BETWEEN_THE_ENDS:
        _own_forward_runs(name, model)
    if role == "drafter":
        other = _random_model(fam, DRAFTER_SEED)
        with torch.no_grad():
            for mine, theirs in zip(model.parameters(), other.parameters()):
                mine.mul_(1 - DRAFT_BLEND).add_(theirs, alpha=DRAFT_BLEND)
    with torch.no_grad():
        _untied_output(model).weight.mul_(LOGIT_SCALE)
    _neutral_generation_config(model, fam)
    return model


def inputs(name: str, ids: torch.Tensor, decoder_tokens: int = 12) -> dict:
    """A plain forward's inputs for the family: ``ids`` (and, for an encoder-decoder, the
    first ``decoder_tokens`` of them as decoder inputs)."""
    if FAMILIES[name].encoder_decoder:
        return {"input_ids": ids, "decoder_input_ids": ids[:, :decoder_tokens]}
    return {"input_ids": ids}


_OWN_FORWARD_ERRORS: dict[str, str] = {}      # family -> what its own forward raised ("" if nothing)


def _own_forward_runs(name: str, model) -> None:
    """Raise FamilyUnavailable when transformers' own cached forward of the family raises
    (tried once per family: what fails is the release's code, not the weights)."""
    if name not in _OWN_FORWARD_ERRORS:
        error = ""
        try:
            with torch.inference_mode():
                model(**inputs(name, torch.tensor([PROMPTS[0][:6]]), 2), use_cache=True)
        except Exception as e:  # noqa: BLE001  (whatever transformers raises)
            text = str(e).strip().splitlines()
            error = f"{type(e).__name__}: {text[0] if text else ''}"
        _OWN_FORWARD_ERRORS[name] = error
    if _OWN_FORWARD_ERRORS[name]:
        raise FamilyUnavailable(f"transformers {transformers.__version__}: {type(model).__name__}'s own forward "
                                f"raises {_OWN_FORWARD_ERRORS[name]}")


def decoder_start(model) -> int:
    """The first decoder token of an encoder-decoder model."""
    start = model.config.decoder_start_token_id
    if start is None:
        raise ValueError(f"{type(model).__name__} has no decoder_start_token_id")
    return start


# ------------------------------------------------------------------ outcomes

@dataclass(frozen=True)
class Outcome:
    """One check's result: status "pass", "refused", "fail" or "skip", and one line."""

    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def cell(self) -> str:
        """A markdown table cell: a tick, or the status and its reason."""
        if self.passed:
            return "✓"
        return f"{self.status}: {self.detail}".replace("|", "\\|")


PASS = Outcome("pass")


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else ""


def guarded(check: Callable[[], Outcome]) -> Outcome:
    """Run a check; turn a missing family into skip, a refusal into refused,
    any other exception into fail (its type and first line)."""
    try:
        return check()
    except FamilyUnavailable as e:
        return Outcome("skip", str(e))
    except UnsupportedCacheError as e:
        text = str(e).strip()
        if "\n" in text:
            return Outcome("fail", f"refusal message is not one line: {_first_line(e)}")
        return Outcome("refused", text)
    except Exception as e:  # noqa: BLE001  (a check reports, it never raises)
        return Outcome("fail", f"{type(e).__name__}: {_first_line(e)}")


def compare(got: list[int], want: list[int], where: str, reference: str = "generate") -> Outcome:
    """pass, or fail naming the first differing position."""
    from generation.result import first_divergence

    index = first_divergence(got, want)
    if index is None:
        return PASS
    if index >= len(got) or index >= len(want):
        return Outcome("fail", f"{where}: {len(got)} tokens, {reference} gave {len(want)}")
    return Outcome("fail", f"{where}: token {index} is {got[index]}, {reference} gave {want[index]}")


# --------------------------------------------------------- greedy reference

# Families whose cached ``generate`` gave other tokens than the uncached one on some prompt
# (transformers computing over its own cache wrongly); their reference is the uncached one.
GENERATE_CACHE_WRONG: set[str] = set()


def _generate(model, ids: torch.Tensor, use_cache: bool) -> torch.Tensor:
    with torch.inference_mode():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=LENGTH,
                              min_new_tokens=LENGTH, do_sample=False, use_cache=use_cache)


# Releases before the newest tested (5.23/5.24): the floor, and those the tests run on demand
# (``SPECDEC_RELEASES``). There a family's forward may be measured not causal, and refused
# (Zamba2 on 4.57 and 5.10, Nemotron-H on 5.10). Between the ends (not the floor either),
# transformers may not run a family at all (5.2's Zamba2, 5.14's Nemotron-H).
BEFORE_THE_NEWEST = TRANSFORMERS_RELEASE < (5, 23)
BETWEEN_THE_ENDS = BEFORE_THE_NEWEST and TRANSFORMERS_RELEASE >= (5,)
NOT_CAUSAL = "forward is not causal in transformers"


def refusal_allowed(name: str, detail: str) -> bool:
    """Whether refusing ``name``'s cache with ``detail`` is what the engine should do here: a static
    cache; on 4.57 a model keeping its state in a cache class of its own; before the newest
    releases, a forward the probe measured not causal (Zamba2 on 4.57 and 5.10). On the newest
    every family's forward must be causal, so the last one fails a test there."""
    own_cache = TRANSFORMERS_RELEASE < (5,) and "keeps its state in its own" in detail
    return FAMILIES[name].may_refuse or own_cache or (BEFORE_THE_NEWEST and NOT_CAUSAL in detail)


@functools.lru_cache(maxsize=None)
def reference(name: str, prompt: tuple[int, ...]) -> tuple[int, ...]:
    """transformers' own greedy ``generate`` on a prompt: LENGTH new tokens
    (for an encoder-decoder, the decoder tokens after the start token).

    For recurrent and hybrid families ``generate`` also runs without a cache; where
    the two differ, transformers' cached path is wrong (Bamba after a prompt that is
    not a multiple of its scan chunk; several models on 4.57), and the uncached
    tokens -- the model's own definition -- are the reference (``GENERATE_CACHE_WRONG``).
    """
    model = build(name)
    ids = torch.tensor([prompt])
    skip = 1 if family(name).encoder_decoder else ids.shape[1]
    out = _generate(model, ids, use_cache=True)
    if family(name).kind in ("recurrent", "hybrid"):
        uncached = _generate(model, ids, use_cache=False)
        if not torch.equal(out, uncached):
            GENERATE_CACHE_WRONG.add(name)
            out = uncached
    return tuple(out[0, skip:].tolist())


@functools.lru_cache(maxsize=None)
def echo_prompt(name: str) -> tuple[int, ...]:
    """The first prompt, the first half of the target's own continuation of it,
    and the first prompt again: the n-gram storage then holds text the target is
    likely to produce, so NASD drafts get accepted for a while and then rejected."""
    first = PROMPTS[0]
    return (*first, *reference(name, first)[:LENGTH // 2], *first)


def _greedy():
    from sampling import GreedyProcessor

    return GreedyProcessor()


def _each_prompt(name: str, run: Callable[[list[int]], object], label: str,
                 after: Callable[[object, str], Outcome] | None = None,
                 prompts: tuple[tuple[int, ...], ...] = PROMPTS) -> Outcome:
    for i, prompt in enumerate(prompts):
        want = list(reference(name, tuple(prompt)))
        result = run(list(prompt))
        outcome = compare(result.tokens, want, f"{label}, prompt {i}")
        if not outcome.passed:
            return outcome
        if after is not None and not (extra := after(result, f"{label}, prompt {i}")).passed:
            return extra
    return PASS


def _pair(target, drafter=None, vocab_size: int | None = None):
    """What ``engine.run_strategy`` needs of a pair: no end tokens (``generate`` runs to the length)."""
    return model_pair(target, drafter, vocab_size=vocab_size)


def _run(strategy: Strategy, pair, generator=None) -> Callable[[list[int]], object]:
    return lambda p: run_strategy(strategy, pair, p, generator=generator)


def check_ar(name: str, use_cache: bool) -> Outcome:
    """Greedy autoregressive decoding equals ``generate``."""
    strategy = Strategy("target", processor=_greedy(), max_gen_len=LENGTH, use_cache=use_cache)
    label = f"AR (cache {'on' if use_cache else 'off'})"
    return _each_prompt(name, _run(strategy, _pair(build(name))), label)


def _all_accepted(result, where: str) -> Outcome:
    if result.accepted == result.drafted:
        return PASS
    return Outcome("fail", f"{where}: the target drafting for itself had {result.drafted - result.accepted} "
                           f"of {result.drafted} drafts rejected (its draft cache went wrong)")


def check_speculative(name: str, drafter: str, gamma: int, use_cache: bool = True,
                      verify: str = "residual") -> Outcome:
    """Greedy speculative decoding equals ``generate``, with the family's blended
    drafter (``drafter="drafter"``), its independent one (``"independent"``) or
    the target itself (``"self"``, which must then accept every draft), verified
    by the chain rule ``verify`` (``generation.verify_rules``)."""
    target = build(name)
    draft_model = target if drafter == "self" else build(name, drafter)
    rule = "" if verify == "residual" else f", {verify} rule"
    label = f"speculative ({drafter}, gamma {gamma}, cache {'on' if use_cache else 'off'}{rule})"
    strategy = Strategy("speculative", drafter="model", gamma=gamma, processor=_greedy(),
                        max_gen_len=LENGTH, use_cache=use_cache, verify=verify)
    return _each_prompt(name, _run(strategy, _pair(target, draft_model)), label,
                        after=_all_accepted if drafter == "self" else None)


def check_gemma4_assistant(name: str, gamma: int = 3) -> Outcome:
    """Greedy speculative decoding with a random Gemma 4 assistant (``--drafter gemma4-assistant:``,
    ``tests.helpers.gemma4_assistant``: independent weights, its sizes read from the target), drafting
    from the target's cached keys and values, equals ``generate``."""
    from model_drafters.gemma4_assistant import mark_assistant
    from model_drafters.gemma4_assistant.model import has_assistant_model
    from tests.helpers.gemma4_assistant import tiny_assistant

    if not has_assistant_model():
        return Outcome("skip", f"transformers {transformers.__version__}: no Gemma 4 assistant before 5.24")
    target = build(name)
    assistant = mark_assistant(tiny_assistant(target), target)
    strategy = Strategy("speculative", drafter="model", gamma=gamma, processor=_greedy(), max_gen_len=LENGTH)
    return _each_prompt(name, _run(strategy, _pair(target, assistant)), f"speculative (Gemma 4 assistant, gamma {gamma})")


def check_nasd(name: str, gamma: int, use_cache: bool = True) -> Outcome:
    """Greedy NASD equals ``generate`` (a fresh 3-gram storage per prompt, filler top-2),
    on the shared prompts and the family's echo prompt."""
    label = f"NASD (gamma {gamma}, cache {'on' if use_cache else 'off'})"
    strategy = Strategy("ngram", drafter="ngram", drafter_options=NGramOptions(n=3, top_k_filler=2),
                        gamma=gamma, processor=_greedy(), max_gen_len=LENGTH, use_cache=use_cache)
    return _each_prompt(name, _run(strategy, _pair(build(name), vocab_size=VOCAB)), label,
                        prompts=(*PROMPTS, echo_prompt(name)))


def check_model_free(name: str, gamma: int = 3) -> Outcome:
    """Greedy decoding with the match drafters equals ``generate``: NASD over the ``suffix`` and
    ``sam`` storages, and the hybrid (the family's blended drafter, the ``sam`` storage where its
    match is at least 2 tokens), on the shared prompts and the family's echo prompt. The echo
    prompt must make each of them draft from the storage, or the check proves nothing."""
    from engine import HybridOptions

    target = build(name)
    draft_model = build(name, "drafter")
    runs = [(f"NASD {kind} (gamma {gamma})", Strategy("ngram", drafter="ngram", drafter_options=NGramOptions(storage=kind),
                                                     gamma=gamma, processor=_greedy(), max_gen_len=LENGTH),
             _pair(target, vocab_size=VOCAB)) for kind in ("suffix", "sam")]
    runs.append((f"hybrid sam L2 (gamma {gamma})",
                 Strategy("speculative", drafter="model", gamma=gamma, processor=_greedy(), max_gen_len=LENGTH,
                          drafter_options=HybridOptions(2, NGramOptions(storage="sam"))),
                 _pair(target, draft_model)))
    echo = echo_prompt(name)
    for label, strategy, pair in runs:
        last = []      # the echo prompt's run (the last one), whose rounds say where drafts came from
        outcome = _each_prompt(name, _run(strategy, pair), label, prompts=(*PROMPTS, echo),
                               after=lambda result, where: last.append(result) or PASS)
        if not outcome.passed:
            return outcome
        notes = [r.note for r in last[-1].trace if r.note]
        if not any(n.get("source") not in ("", "model") and n.get("match", 0) > 0 for n in notes):
            return Outcome("fail", f"{label}: the echo prompt drafted nothing from the storage")
    return PASS


# Token trees: every family runs them; the engine decides per model
# (``kvcache.cache.tree_support``) whether a tree is verified or a chain with one line.
TREE_STRATEGIES = ("speculative", "nasd", "recycling", "lookahead")


def tree_reason(name: str) -> str | None:
    """Why the family's target verifies chains instead of trees (None: it takes trees),
    as ``kvcache.cache.tree_support`` says once the cache has begun on the first prompt.

    Raises UnsupportedCacheError where the cache is refused outright (no chain either).
    """
    from kvcache import cache

    cached = cached_model(build(name))
    cached.begin(list(PROMPTS[0]))
    return cache.tree_support(cached)


def _tree_kept(result, where: str) -> Outcome:
    if result.tree_fallback:
        return Outcome("fail", f"{where}: fell back to chains ({result.tree_fallback})")
    return PASS


def _tree_fell_back(reason: str):
    def check(result, where: str) -> Outcome:
        want = f"chain instead of a tree: {reason}"
        if result.tree_fallback != want or "\n" in want or any(r.tree_size for r in result.trace):
            return Outcome("fail", f"{where}: expected a chain with the line {want!r}, got {result.tree_fallback!r}")
        return PASS
    return check


def check_tree(name: str, strategy: str, nodes: int = 12, branch: int = 3) -> Outcome:
    """Greedy decoding with token trees equals ``generate``: speculative (the
    family's drafter), NASD with a filled 3-gram storage, NASD with a
    token-recycling table. A family whose target ``tree_support`` refuses runs
    chains and says so in exactly its one line; the others keep their trees and
    must verify a tree of more than one node on some prompt (a prompt may offer
    one continuation only). Lookahead decoding (W 4, N 3, G 4: its candidates
    from the Jacobi window fed beside the tree) must verify some candidate."""
    target = build(name)
    reason = tree_reason(name)
    after = _tree_kept if reason is None else _tree_fell_back(reason)
    label = f"{strategy} tree {nodes}"
    results = []

    def kept(run):
        return lambda p: results.append(run(p)) or results[-1]

    common = dict(gamma=4, processor=_greedy(), max_gen_len=LENGTH, tree=nodes, tree_branch=branch)
    if strategy == "speculative":
        pair = _pair(target, build(name, "drafter"))
        outcome = _each_prompt(name, kept(lambda p: run_strategy(
            Strategy("speculative", drafter="model", **common), pair, p)), label, after=after)
    elif strategy in ("nasd", "recycling"):
        from ngram_assisted import NGramStorage, RecyclingStorage
        from tests.helpers.decode import state_holding

        # A fresh storage per prompt, handed to the engine as it is (reset=False keeps it).
        make = (lambda: NGramStorage(3, VOCAB)) if strategy == "nasd" else (lambda: RecyclingStorage(2, VOCAB, width=4))
        pair = _pair(target, vocab_size=VOCAB)

        def run(p):
            storage = make()
            options = NGramOptions(storage=strategy if strategy == "recycling" else "basic", n=storage.n,
                                   top_k_filler=3, reset=False)
            return run_strategy(Strategy("ngram", drafter="ngram", drafter_options=options, **common), pair, p,
                                state=state_holding(storage, VOCAB))
        outcome = _each_prompt(name, kept(run), label, after=after, prompts=(*PROMPTS, echo_prompt(name)))
    elif strategy == "lookahead":
        from engine import LookaheadOptions, lookahead_strategy

        la = lookahead_strategy(LookaheadOptions(window=4, ngram=3, guesses=4), processor=_greedy(),
                                max_gen_len=LENGTH)
        pair = _pair(target, vocab_size=VOCAB)
        outcome = _each_prompt(name, kept(lambda p: run_strategy(la, pair, p)), label, after=after,
                               prompts=(*PROMPTS, echo_prompt(name)))
        if outcome.passed and reason is None and not any(r.tree_size for res in results for r in res.trace):
            return Outcome("fail", f"{label}: no prompt verified a candidate n-gram")
        return outcome
    else:
        raise ValueError(f"unknown tree strategy {strategy!r}; known: {', '.join(TREE_STRATEGIES)}")
    if outcome.passed and reason is None and not any(r.tree_size > 1 for res in results for r in res.trace):
        return Outcome("fail", f"{label}: no prompt verified a tree of more than one node")
    return outcome


# ------------------------------------------------------------------ logits

@dataclass(frozen=True)
class _Forward:
    """One cached forward the engine made: the model, the ids it held, the logits it returned."""

    model: object
    ids: torch.Tensor           # (1, L): the whole (decoder) sequence
    seen: int                   # positions the cache held before
    logits: torch.Tensor        # (keep, V)
    encoder_outputs: object
    path: str


def _recorded(run: Callable[[], object]) -> tuple[object, list[_Forward]]:
    """Run ``run()`` and record every forward any CachedModel makes during it."""
    from kvcache import cache

    forwards: list[_Forward] = []
    original = cache.CachedModel.forward

    def recording(self, ids, keep):
        seen = self.length
        logits = original(self, ids, keep)
        forwards.append(_Forward(self.model, ids.clone(), seen, logits.clone(), self.encoder_outputs, self.path))
        return logits

    cache.CachedModel.forward = recording
    try:
        return run(), forwards
    finally:
        cache.CachedModel.forward = original


def _uncached_logits(f: _Forward) -> torch.Tensor:
    keep = f.logits.shape[0]
    if f.encoder_outputs is not None:
        out = f.model(encoder_outputs=f.encoder_outputs, decoder_input_ids=f.ids, use_cache=False)
    else:
        out = f.model(input_ids=f.ids, use_cache=False)
    return out.logits[0, -keep:]


def check_logits(name: str, gamma: int = 3) -> Outcome:
    """Speculative decoding with the family's independent drafter (drafts mostly
    rejected, so every rollback runs) equals ``generate``, and every logit any
    cached forward returned during it -- target and drafter, after every crop or
    restore -- equals an uncached forward of the same ids, within the dtype's
    tolerance (``kvcache.probe.tolerance``)."""
    from kvcache.probe import probe_of, tolerance

    target, drafter = build(name), build(name, "independent")
    probe_of(target), probe_of(drafter)     # probed first: the probe's own trial forwards are not the run's
    for i, prompt in enumerate(PROMPTS[:1]):        # one prompt: every forward is checked twice over
        want = list(reference(name, prompt))
        label = f"logits (independent drafter, gamma {gamma}), prompt {i}"
        with torch.inference_mode():
            result, forwards = _recorded(lambda: run_strategy(
                Strategy("speculative", drafter="model", gamma=gamma, processor=_greedy(), max_gen_len=LENGTH),
                _pair(target, drafter), list(prompt)))
            for n, f in enumerate(forwards):
                want_logits = _uncached_logits(f).float()
                scale = max(1.0, float(want_logits.abs().max()))
                error = float((f.logits.float() - want_logits).abs().max()) / scale
                if not error <= tolerance(f.model):
                    role = "target" if f.model is target else "drafter"
                    fed = f.ids.shape[1] - f.seen
                    return Outcome("fail", f"{label}: {role} forward {n} ({fed} tokens over a cache of {f.seen}, "
                                           f"{f.path}) is off by {error:.2g} of the logit range")
        outcome = compare(result.tokens, want, label)
        if not outcome.passed:
            return outcome
        if i == 0 and not any(r.accepted < len(r.drafted) for r in result.trace):
            return Outcome("fail", f"{label}: no draft was rejected, so no rollback ran")
    return PASS


# ---------------------------------------------------------------- sampling

# Families whose sampling is checked against the exact distribution: one with
# sliding windows, one recurrent, one encoder-decoder.
SAMPLING_FAMILIES = ("mistral", "mamba2", "bart")
SAMPLING_TOP_K = 3
SAMPLING_TEMPERATURE = 4.0    # undoes part of LOGIT_SCALE: no top-k token is negligible
SAMPLING_STEPS = 2            # the distribution of the first two tokens: 3 x 3 outcomes
SAMPLING_RUNS = 300
SAMPLING_SEED = 4321
# A p-value below this fails the check: a false alarm about once in 10^6 runs.
SAMPLING_ALPHA = 1e-6
# Longer than the window; its last token also follows SAMPLING_LEAD[0] early on,
# so a 2-gram storage drafts from the start (see sampling_prompt).
SAMPLING_BASE = [5, 17, 33, 8, 41, 5, 17, 33, 8, 41, 5, 17, 33, 8, 41]
SAMPLING_LAST = 9


def sampling_processor():
    from sampling import TopKProcessor

    return TopKProcessor(SAMPLING_TEMPERATURE, SAMPLING_TOP_K)


@functools.lru_cache(maxsize=None)
def sampling_prompt(name: str) -> tuple[int, ...]:
    """``[L, t] + SAMPLING_BASE + [L]`` with t among the target's top-k after it.

    A 2-gram storage then drafts t first, and the target accepts it with a fair
    probability: NASD's accept and resample paths both run. t is the smallest id
    that works.
    """
    model, processor = build(name), sampling_processor()
    encoder_decoder = family(name).encoder_decoder
    with torch.inference_mode():
        for t in range(VOCAB):
            prompt = [SAMPLING_LAST, t, *SAMPLING_BASE, SAMPLING_LAST]
            if _next_distributions(model, prompt, [()], processor, encoder_decoder)[0, t] > 0:
                return tuple(prompt)
    raise RuntimeError(f"{name}: no token is in the target's top-{SAMPLING_TOP_K} after itself")


def _next_distributions(model, prompt: list[int], prefixes: list[tuple[int, ...]], processor,
                        encoder_decoder: bool) -> torch.Tensor:
    """Processed next-token distributions after each prefix, (len(prefixes), V), no cache."""
    if encoder_decoder:
        start = decoder_start(model)
        decoder = torch.tensor([[start, *p] for p in prefixes])
        encoder = torch.tensor([prompt] * len(prefixes))
        logits = model(input_ids=encoder, decoder_input_ids=decoder).logits[:, -1, :]
    else:
        logits = model(torch.tensor([prompt + list(p) for p in prefixes])).logits[:, -1, :]
    return processor(logits[:, :VOCAB])


def exact_distribution(model, prompt: list[int], processor, steps: int, *,
                       encoder_decoder: bool = False) -> dict[tuple[int, ...], float]:
    """P(first ``steps`` tokens) under the processed target, by enumeration."""
    probs = {(): 1.0}
    with torch.inference_mode():
        for _ in range(steps):
            prefixes = [p for p, mass in probs.items() if mass > 0]
            step = _next_distributions(model, prompt, prefixes, processor, encoder_decoder)
            probs = {p + (t,): probs[p] * step[i, t].item()
                     for i, p in enumerate(prefixes) for t in step[i].nonzero().flatten().tolist()}
    return probs


def sampled_counts(run: Callable[[torch.Generator], object], runs: int, steps: int) -> tuple[dict, int, int]:
    """Counts of the first ``steps`` tokens over ``runs`` generations from one seeded
    generator; also the drafts proposed and accepted in all of them."""
    generator = torch.Generator().manual_seed(SAMPLING_SEED)
    counts: dict = {}
    drafted = accepted = 0
    with torch.inference_mode():
        for _ in range(runs):
            result = run(generator)
            key = tuple(result.tokens[:steps])
            counts[key] = counts.get(key, 0) + 1
            drafted += result.drafted
            accepted += result.accepted
    return counts, drafted, accepted


def _sampling_run(name: str, strategy: str, processor):
    target, prompt = build(name), list(sampling_prompt(name))
    common = dict(gamma=SAMPLING_STEPS, processor=processor, max_gen_len=SAMPLING_STEPS + 1)
    if strategy == "speculative":
        pair = _pair(target, build(name, "drafter"))
        return lambda g: run_strategy(Strategy("speculative", drafter="model", **common), pair, prompt, generator=g)
    if strategy == "nasd":
        options = NGramOptions(n=2, top_k_filler=1)
        pair = _pair(target, vocab_size=VOCAB)
        return lambda g: run_strategy(Strategy("ngram", drafter="ngram", drafter_options=options, **common),
                                      pair, prompt, generator=g)
    raise ValueError(f"unknown sampling strategy {strategy!r}")


def check_sampling(name: str, strategy: str, runs: int = SAMPLING_RUNS) -> Outcome:
    """Under top-k sampling, the first tokens of ``strategy`` ("speculative" or
    "nasd") follow the target's exact distribution (chi-square, fixed seed).

    Fails too when no draft was both proposed and rejected, or none accepted:
    then the accept and resample paths were not exercised.
    """
    processor = sampling_processor()
    exact = exact_distribution(build(name), list(sampling_prompt(name)), processor, SAMPLING_STEPS,
                               encoder_decoder=family(name).encoder_decoder)
    counts, drafted, accepted = sampled_counts(_sampling_run(name, strategy, processor), runs,
                                               SAMPLING_STEPS)
    fit = goodness_of_fit(counts, exact)
    label = f"{strategy} sampling (top-{SAMPLING_TOP_K}, {runs} runs)"
    if fit.p_value < SAMPLING_ALPHA:
        return Outcome("fail", f"{label}: {fit.describe()}")
    if not 0 < accepted < drafted:
        return Outcome("fail", f"{label}: {accepted} of {drafted} drafts accepted, "
                               "so the accept/resample paths were not both exercised")
    return PASS


# ------------------------------------------------------------ the check list

@dataclass(frozen=True)
class CheckSpec:
    """One check on a family: a stable id (used in test ids), the support-table
    column it counts towards, and the function that runs it."""

    id: str
    column: str
    run: Callable[[str], Outcome]
    families: tuple[str, ...] | None = None     # None: every family
    core: bool = True           # False: not run on the families added in 2026 (fewer gammas there)

    def applies(self, name: str) -> bool:
        if self.families is not None:
            return name in self.families
        return self.core or not family(name).new


COLUMNS = ("AR cache on", "AR cache off", "speculative", "speculative cache off",
           "NASD", "NASD cache off", "sampling")


def _specs() -> list[CheckSpec]:
    specs = [
        CheckSpec("ar-cache", "AR cache on", lambda n: check_ar(n, True)),
        CheckSpec("ar-nocache", "AR cache off", lambda n: check_ar(n, False)),
        CheckSpec("logits", "speculative", check_logits),
    ]
    for g in GAMMAS:
        specs.append(CheckSpec(f"speculative-g{g}", "speculative",
                               lambda n, g=g: check_speculative(n, "drafter", g), core=g == 3))
    specs.append(CheckSpec("speculative-self-g3", "speculative", lambda n: check_speculative(n, "self", 3)))
    specs.append(CheckSpec("speculative-g3-rules", "speculative", lambda n: _check_other_rules(n)))
    specs.append(CheckSpec("speculative-gemma4-assistant-g3", "speculative", check_gemma4_assistant,
                           families=("gemma4",)))
    specs.append(CheckSpec("speculative-g3-nocache", "speculative cache off",
                           lambda n: check_speculative(n, "drafter", 3, use_cache=False)))
    for g in GAMMAS:
        specs.append(CheckSpec(f"nasd-g{g}", "NASD", lambda n, g=g: check_nasd(n, g), core=g == 3))
    specs.append(CheckSpec("nasd-g3-nocache", "NASD cache off", lambda n: check_nasd(n, 3, use_cache=False)))
    specs.append(CheckSpec("model-free-g3", "NASD", check_model_free))
    for strategy in ("speculative", "nasd"):
        specs.append(CheckSpec(f"sampling-{strategy}", "sampling",
                               lambda n, s=strategy: check_sampling(n, s), families=SAMPLING_FAMILIES))
    return specs


CHECKS: tuple[CheckSpec, ...] = tuple(_specs())

# Checks whose result follows from the others on the same family: the block and strict rules and
# the model-free drafters change which drafts are judged and how, not how the model is fed or
# rolled back, which the greedy, cache-off and logits checks hold on every release. They run on
# the newest only (pytest marker ``any_release``, left out of test.sh's floor and release runs).
ANY_RELEASE_CHECKS = frozenset({"speculative-g3-rules", "model-free-g3"})


def _check_other_rules(name: str) -> Outcome:
    """The block and strict verify rules, greedy at γ 3: the same tokens as ``generate``."""
    for rule in ("block", "strict"):
        outcome = check_speculative(name, "drafter", 3, verify=rule)
        if not outcome.passed:
            return outcome
    return outcome


def run_check(name: str, spec: CheckSpec) -> Outcome:
    """One check on one family, never raising."""
    return guarded(lambda: spec.run(name))


# test.sh runs each test file whole in one process (--dist loadfile), so the family checks are
# split over PARTS files (tests/test_architectures.py, tests/test_architectures_2.py), each with
# every PARTS-th family: one file held them all and kept one core busy for 3.5 minutes of the
# floor run while the other had finished (measured on the floor: 105 s and 102 s a half).
PARTS = 2


def family_cases(part: int) -> list:
    """The ``(name, spec)`` parameters of the family checks of file ``part`` (0 to PARTS-1),
    the checks in ``ANY_RELEASE_CHECKS`` marked ``any_release``."""
    import pytest

    return [pytest.param(name, spec, id=f"{name}-{spec.id}",
                         marks=[pytest.mark.any_release] if spec.id in ANY_RELEASE_CHECKS else [])
            for name in list(FAMILIES)[part::PARTS] for spec in CHECKS if spec.applies(name)]


def family_test(name: str, spec) -> None:
    """One family check as a test: a skip or an allowed refusal skips, anything else must pass."""
    import pytest

    outcome = run_check(name, spec)
    if outcome.status == "skip":
        pytest.skip(outcome.detail)
    if outcome.status == "refused":
        assert refusal_allowed(name, outcome.detail), (
            f"refused a dynamic cache (only static caches may be): {outcome.detail}")
        pytest.skip(f"refused: {outcome.detail}")
    assert outcome.passed, outcome.detail
