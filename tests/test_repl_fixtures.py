"""A tiny local model pair for the REPL tests (no downloads, no tests here).

Two random 2-layer Llamas over a word-level vocabulary of a few hundred words,
saved with a fast tokenizer that has a chat template. The end and special
tokens get a zero output row, so greedy decoding practically never stops
early and a long generation really is long (for the Ctrl-C test).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INFER = REPO / "infer.py"

SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>"]
WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this "
    "from or had by hot word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like so "
    "these her long make thing see him two has look more day could go come did number sound no "
    "most people my over know water than call first who may down side been now find any new work "
    "part take get place made live where after back little only round man year came show every "
    "good me give our under name very through just form sentence great think say help low line "
    "differ turn cause much mean before move right boy old too same tell does set three want air "
    "well also play small end put home read hand port large spell add even land here must big "
    "high such follow act why ask men change went light kind off need house picture try us again "
    "animal point mother world near build self earth father head stand own page should country "
    "found answer school grow study still learn plant cover food sun four between state keep eye "
    "never last let thought city tree cross farm hard start might story saw far sea draw left late "
    "run while press close night real life few north"
).split() + list(".,!?:;'\"()[]")
CHAT_TEMPLATE = (
    "{% for message in messages %}<|user|> {{ message['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + list(dict.fromkeys(WORDS)))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
        additional_special_tokens=["<|user|>", "<|assistant|>"],
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(seed: int, vocab_size: int, *, context: int, noise: float = 0.0):
    """A random Llama; ``noise`` > 0 perturbs its output layer (a drafter that
    agrees with the target most of the time)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[: len(SPECIALS)] = 0.0  # specials (end token included) never win argmax
        model.lm_head.weight.mul_(4.0)  # sharper distributions
        if noise:
            gen = torch.Generator().manual_seed(seed + 1000)
            model.lm_head.weight.add_(noise * torch.randn(model.lm_head.weight.shape, generator=gen))
    return model


def build_pair(root: Path, *, context: int = 65536) -> tuple[Path, Path]:
    """Save a target and a drafter under ``root``; return their directories."""
    tokenizer = build_tokenizer()
    dirs = []
    for name, noise in (("target", 0.0), ("drafter", 0.03)):
        path = root / name
        build_model(1, len(tokenizer), context=context, noise=noise).save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs.append(path)
    return dirs[0], dirs[1]


def child_env(tmp: Path) -> dict:
    """Environment for an infer.py child: offline, quiet, own history file."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
        SPECDEC_HISTORY=str(tmp / "history"), TERM="xterm-256color",
        COLUMNS="200", LINES="50", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1",
    )
    env.pop("NO_COLOR", None)
    return env


PYTHON = sys.executable
