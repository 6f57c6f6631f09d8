"""The incremental detokenizer on real tokenizers: multi-byte characters and merged pieces.

Two byte-level BPE tokenizers: one trained here, offline, with the
``tokenizers`` library on a tiny corpus (so CJK characters and emoji are split
into byte tokens), and SmolLM2's (the default pair's) when its converted copy
is in the cache.
"""

from __future__ import annotations

import pytest

from repl import stream
from repl.stream import IncrementalDecoder

TEXTS = [
    "Hello 😀 world! 🇫🇷 👩‍👩‍👧 done",
    "你好，世界。今天天气很好。",
    "naïve café — Ünïcödé déjà vu",
    "mixed: tea 茶 and 🍵, then `code()` and spaces   here\nnew line",
]


@pytest.fixture(scope="module")
def trained_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    core.train_from_iterator(["the cafe is naive and the tea is hot"] * 20 + ["hello world"] * 20, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|end|>")


@pytest.fixture(scope="module")
def smollm_tokenizer():
    from transformers import AutoTokenizer

    from utils.models import ModelLoadError
    from utils.default_model import default_model_dir

    try:
        return AutoTokenizer.from_pretrained(default_model_dir())
    except (ModelLoadError, OSError) as e:
        pytest.skip(f"the default model is not converted here: {e}")


@pytest.fixture(params=["trained", "smollm"])
def tokenizer(request):
    return request.getfixturevalue(f"{request.param}_tokenizer")


def decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=False)


def streamed(tokenizer, context, ids, step):
    """Push ``ids`` in steps of ``step`` tokens (a round); return what each step emitted."""
    decoder = IncrementalDecoder(tokenizer, context)
    return ["".join(decoder.extend(ids[i:i + step])) for i in range(0, len(ids), step)], decoder


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("step", [1, 2, 3, 5])
def test_streamed_text_is_the_decoded_text_and_never_broken(tokenizer, text, step):
    ids = tokenizer.encode(text, add_special_tokens=False)
    steps, decoder = streamed(tokenizer, [], ids, step)
    assert "".join(steps) == decode(tokenizer, ids)
    assert not any(stream.REPLACEMENT in s for s in steps)
    assert decoder.held() == ""


@pytest.mark.parametrize("text", TEXTS[:2])
def test_emoji_and_cjk_really_are_split_over_tokens(tokenizer, text):
    """What gives the test above its power: decoded alone, some tokens are broken."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any(stream.REPLACEMENT in decode(tokenizer, [i]) for i in ids)


def test_context_gives_leading_spaces_and_merges(tokenizer):
    context = tokenizer.encode("The tea is", add_special_tokens=False)
    ids = tokenizer.encode("The tea is hot 🍵 in 東京", add_special_tokens=False)[len(context):]
    steps, _ = streamed(tokenizer, context, ids, 2)
    whole = decode(tokenizer, context + ids)
    assert "".join(steps) == whole[len(decode(tokenizer, context)):]


def test_an_incomplete_character_is_held_then_released(tokenizer):
    ids = tokenizer.encode("a😀", add_special_tokens=False)
    decoder = IncrementalDecoder(tokenizer, [])
    pieces = decoder.extend(ids[:-1])
    assert "".join(pieces) == "a" and stream.REPLACEMENT in decoder.held()
    preview = decoder.preview(ids[-1:])
    assert preview == ["😀"] and decoder.held() != ""  # previewing changes nothing
    assert decoder.push(ids[-1]) == "😀" and decoder.held() == ""


def test_without_the_hold_back_the_check_fails(tokenizer, monkeypatch):
    """Mutation check: a decoder that emits U+FFFD-ended text is caught by the test above."""
    monkeypatch.setattr(stream, "REPLACEMENT", "\x00")  # never hold anything back
    ids = tokenizer.encode(TEXTS[1], add_special_tokens=False)
    decoder = IncrementalDecoder(tokenizer, [])
    steps = decoder.extend(ids)
    assert any("\ufffd" in s for s in steps)


def test_the_window_stays_short():
    """Each push decodes the last emitted chunk and the held tokens, not the whole output."""

    class Counting:
        longest = 0

        def decode(self, ids, skip_special_tokens=False):
            Counting.longest = max(Counting.longest, len(ids))
            return "".join(f" w{i}" for i in ids)

    decoder = IncrementalDecoder(Counting(), list(range(50)))
    assert "".join(decoder.extend(range(100, 400))) == "".join(f" w{i}" for i in range(100, 400))
    assert Counting.longest <= 9 and len(decoder.ids) <= 9
