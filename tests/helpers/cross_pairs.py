"""Offline pairs of models whose tokenizers differ, for the cross-tokenizer tests.

Tokenizers are trained in memory with the ``tokenizers`` library on a small
corpus with accents, CJK and emoji:

- ``byte_bpe()``: byte-level BPE (GPT-2 style: ``Ġthe``, every byte a token);
- ``metaspace_bpe()``: SentencePiece style (``▁the``, a space prepended to the
  first word) with byte fallback (``<0xE6>``) for characters it did not learn,
  and a BOS added on encoding;
- ``permuted(tokenizer)``: the same tokenizer with its ids shuffled, so a model
  can be the target's exact twin in another id space (drafts are then mostly
  accepted, and a misaligned TLI map shows at once);
- ``tiny_target_tokenizer()`` / ``tiny_metaspace()``: an 8-token target
  vocabulary over the letters a, b, c and space (the sampling tests enumerate the
  target's exact distribution over it) and a byte-fallback drafter over the same
  text.

Models are tiny random Llamas with a wide output layer (decisive argmax). The
cross drafter is initialised independently of the target.
"""

from __future__ import annotations

import json
import random
from collections import Counter

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from tests.helpers.models import tiny_llama

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! Hello there, world. Hello again.",
    "The café serves a naïve résumé of the day.",
    "日本語のテキストです。中文文本也在这里。",
    "emoji 😀 and 🎉 and 👍 in the text",
    "def add(x, y):\n    return x + y\n\n",
    "one two three four, one two three four",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}"
)


def _corpus(repeat: int = 30) -> list[str]:
    return CORPUS * repeat


def byte_bpe(vocab_size: int = 320) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(_corpus(), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _bytes_as_pieces(backend: Tokenizer) -> Tokenizer:
    """Byte-fallback pieces as ordinary vocabulary entries (the trainer made them special)."""
    state = json.loads(backend.to_str())
    state["added_tokens"] = [t for t in state["added_tokens"] if not t["content"].startswith("<0x")]
    return Tokenizer.from_str(json.dumps(state))


ALPHABET = 40   # characters the metaspace tokenizer keeps; the rest fall back to bytes


def _alphabet(pre_tokenizer, n: int) -> list[str]:
    """The n characters most frequent in the pre-tokenised corpus, ties broken by the character."""
    counts = Counter(char for line in _corpus() for word, _ in pre_tokenizer.pre_tokenize_str(line)
                     for char in word)
    return sorted(counts, key=lambda char: (-counts[char], char))[:n]


def metaspace_bpe(vocab_size: int = 360) -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    backend.decoder = decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="first"),
                                         decoders.ByteFallback(), decoders.Fuse()])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    # A small alphabet: CJK and emoji fall back to bytes. It is chosen here, not by the trainer's
    # limit_alphabet alone, which breaks ties between equally frequent characters in a hash map's
    # order: a new one in every process, so every process trained another tokenizer (and the tests
    # on it saw other counts; one CI run failed on that).
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, limit_alphabet=ALPHABET,
                                  initial_alphabet=_alphabet(backend.pre_tokenizer, ALPHABET))
    backend.train_from_iterator(_corpus(), trainer)
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    backend = _bytes_as_pieces(backend)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = LLAMA_TEMPLATE
    return tok


def permuted(tokenizer: PreTrainedTokenizerFast, seed: int = 7) -> tuple[PreTrainedTokenizerFast, list[int]]:
    """The same BPE tokenizer with its ids shuffled; returns (tokenizer, new_id_of_old)."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = state["model"]["vocab"]
    size = len(vocab)
    order = list(range(size))
    random.Random(seed).shuffle(order)
    state["model"]["vocab"] = {token: order[i] for token, i in vocab.items()}
    for added in state["added_tokens"]:
        added["id"] = order[added["id"]]
    backend = Tokenizer.from_str(json.dumps(state))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=tokenizer.bos_token,
                                  eos_token=tokenizer.eos_token,
                                  additional_special_tokens=["<|im_start|>"])
    tok.chat_template = tokenizer.chat_template
    return tok, order


def tiny_target_tokenizer() -> PreTrainedTokenizerFast:
    """8 tokens: a b c ' ' ab ca ' a' bc (plain BPE, no pre-tokenizer, pieces concatenated)."""
    vocab = {"a": 0, "b": 1, "c": 2, " ": 3, "ab": 4, "ca": 5, " a": 6, "bc": 7}
    merges = [("a", "b"), ("c", "a"), (" ", "a"), ("b", "c")]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


def tiny_metaspace() -> PreTrainedTokenizerFast:
    """A byte-fallback Metaspace tokenizer over a, b, c and space (about 270 ids)."""
    backend = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
    backend.decoder = decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="first"),
                                         decoders.ByteFallback(), decoders.Fuse()])
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=specials)
    backend.train_from_iterator(["ab ca bc abc cab a b c " * 5, "cc aa bb ab ba"] * 20, trainer)
    backend = _bytes_as_pieces(backend)
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


def learned_pieces_bias(tokenizer, size: int) -> torch.Tensor:
    """-1e3 on byte-fallback pieces and specials: a drafter that writes only learned pieces."""
    bias = torch.zeros(size)
    for token_id, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(size)))):
        if piece is None or piece.startswith("<"):
            bias[token_id] = -1e3
    return bias


def with_bias(model, bias: torch.Tensor):
    """Give ``model``'s output layer a bias (e.g. -1e3 on ids it must never pick)."""
    head = model.lm_head
    new = torch.nn.Linear(head.in_features, head.out_features, bias=True, dtype=head.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(head.weight)
        new.bias.copy_(bias.to(head.weight.dtype))
    model.lm_head = new
    return model


def whole_character_bias(tokenizer, size: int) -> torch.Tensor:
    """-1e3 on ids that decode to no whole character on their own (lone bytes) and on specials."""
    from model_drafters.cross_tokenizer.vocab_map import special_ids, token_surfaces

    bias = torch.zeros(size)
    specials = special_ids(tokenizer)
    for token_id, surface in enumerate(token_surfaces(tokenizer, size)):
        if token_id in specials or surface is None:
            bias[token_id] = -1e3
            continue
        try:
            surface.decode("utf-8")
        except UnicodeDecodeError:
            bias[token_id] = -1e3
    return bias


def permute_model(model, order: list[int]):
    """A copy of ``model`` whose token ids are renumbered: old id i becomes order[i]."""
    import copy

    twin = copy.deepcopy(model)
    index = torch.tensor(order)
    with torch.no_grad():
        emb = twin.get_input_embeddings().weight
        emb[index] = model.get_input_embeddings().weight.clone()
        twin.lm_head.weight[index] = model.lm_head.weight.clone()
        if twin.lm_head.bias is not None:
            twin.lm_head.bias[index] = model.lm_head.bias.clone()
    return twin


def make_pair(target, drafter, target_tok, drafter_tok, end_tokens=()):
    """A ``utils.models.ModelPair`` whose drafter has a tokenizer of its own."""
    from tests.helpers.pairs import model_pair
    from utils.vocab import logits_width

    return model_pair(target, drafter, tokenizer=target_tok, drafter_tokenizer=drafter_tok,
                      vocab_size=min(len(target_tok), logits_width(target)), end_tokens=list(end_tokens))


def tiny_models(target_tok, drafter_tok, *, target_seed=1, drafter_seed=2, scale=12.0, hidden=32):
    """An independent random target and drafter sized to their tokenizers."""
    target = tiny_llama(target_seed, vocab_size=len(target_tok), hidden=hidden, logit_scale=scale)
    drafter = tiny_llama(drafter_seed, vocab_size=len(drafter_tok), hidden=hidden, logit_scale=scale)
    return target, drafter
