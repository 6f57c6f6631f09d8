"""A word-level tokenizer built in memory for the loading and benchmark tests: five
specials, then words ``w0`` .. ``w249`` (255 tokens), split on whitespace, with a ChatML template."""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast

SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = [f"w{i}" for i in range(250)]  # 5 specials + 250 words = 255 tokens


def word_tokenizer(words=WORDS, eos="</s>", template=CHATML) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: the specials, then ``words``, split on whitespace."""
    vocab = {token: i for i, token in enumerate(SPECIALS + list(words))}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token=eos,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tokenizer.chat_template = template
    return tokenizer
