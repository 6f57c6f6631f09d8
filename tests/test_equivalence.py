"""Greedy losslessness on tiny random models:
speculative == NASD == autoregressive == transformers' own generate."""

import pytest
import torch

from ngram_assisted import NGramStorage, OneLevelNGramStorage
from sampling import GreedyProcessor
from tests.helpers.decode import autoregressive, nasd, speculative
from tests.helpers.models import tiny_llama

GREEDY = GreedyProcessor()
LENGTH = 40
# Repeated patterns so that n-gram drafts get accepted as well as rejected.
PROMPTS = [[1, 5, 7, 9, 5, 7, 9, 5, 7], [3, 14, 15, 9, 26, 5, 35, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]]


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0, logit_scale=20.0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_llama(1, logit_scale=20.0)


@pytest.fixture(scope="module")
def reference(target):
    """Greedy autoregressive output per prompt, checked against HF generate."""
    out = {}
    with torch.inference_mode():
        for i, prompt in enumerate(PROMPTS):
            hf = target.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=LENGTH, do_sample=False, pad_token_id=0)
            out[i] = hf[0, len(prompt):].tolist()
    return out


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("prompt_index", range(len(PROMPTS)))
def test_autoregressive_matches_transformers_generate(target, reference, prompt_index, use_cache):
    with torch.inference_mode():
        got = autoregressive(PROMPTS[prompt_index], target, processor=GREEDY, max_gen_len=LENGTH,
                             use_cache=use_cache)
    assert got.tokens == reference[prompt_index]
    assert got.target_calls == LENGTH


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("gamma", range(1, 9))
def test_speculative_matches_autoregressive(target, drafter, reference, gamma, use_cache):
    with torch.inference_mode():
        for i, prompt in enumerate(PROMPTS):
            for draft_model in (drafter, target):   # a poor drafter and a perfect one
                got = speculative(prompt, draft_model, target, processor=GREEDY, gamma=gamma, max_gen_len=LENGTH,
                                  use_cache=use_cache)
                assert got.tokens == reference[i], f"prompt {i}, drafter {'self' if draft_model is target else 'other'}"
    # The self-drafting run accepts everything: ceil(LENGTH / (gamma + 1)) target calls.
    assert got.acceptance_rate == 1.0
    assert got.target_calls == -(-LENGTH // (gamma + 1))


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("storage_cls", [NGramStorage, OneLevelNGramStorage])
@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_nasd_matches_autoregressive(target, reference, storage_cls, n, use_cache):
    accepted = 0
    with torch.inference_mode():
        for gamma in range(1, 9):
            for filler in (1, 3):
                for i, prompt in enumerate(PROMPTS):
                    got = nasd(prompt, storage_cls(n, 64), target, gamma=gamma, filler_top_k=filler,
                               processor=GREEDY, max_gen_len=LENGTH, use_cache=use_cache)
                    assert got.tokens == reference[i], f"gamma {gamma}, filler {filler}, prompt {i}"
                    accepted += got.accepted
    assert accepted > 0   # the equivalence was exercised with accepted drafts too
