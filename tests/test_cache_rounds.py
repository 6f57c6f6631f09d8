"""The KV cache after every round holds exactly the kept sequence (minus its last
token), and each forward feeds only unseen tokens."""

import pytest
import torch

from ngram_assisted import NGramStorage
from sampling import GreedyProcessor, NucleusProcessor
from tests.helpers.decode import autoregressive, nasd, speculative
from tests.helpers.models import RecordingModel, tiny_llama
from kvcache.probe import cached_model
from kvcache.cache import cache_length, drop_last

PROMPT = [1, 5, 7, 9, 5, 7, 9, 5, 7, 2]


def check_target_calls(calls, trace, prompt_len):
    """Round i's forward starts from a cache of exactly the kept sequence minus
    one token and feeds that last token plus the round's drafts."""
    length = prompt_len
    for i, ((seen, fed), rnd) in enumerate(zip(calls, trace)):
        expected_seen = 0 if i == 0 else length - 1
        assert seen == expected_seen, f"round {i}: cache holds {seen}, expected {expected_seen}"
        assert fed == length - seen + len(rnd.drafted), f"round {i}: fed {fed} tokens"
        length += rnd.accepted + (rnd.token is not None)
    assert len(calls) == len(trace)


@pytest.mark.parametrize("processor", [GreedyProcessor(), NucleusProcessor(1.0, 0.9)], ids=repr)
def test_speculative_cache_pinned_every_round(processor):
    target = RecordingModel(tiny_llama(0, logit_scale=5.0))
    drafter = RecordingModel(tiny_llama(1, logit_scale=5.0))
    with torch.inference_mode():
        result = speculative(PROMPT, drafter, target, processor=processor, gamma=3, max_gen_len=30,
                             generator=torch.Generator().manual_seed(0))
    assert len(result.tokens) == 30
    check_target_calls(target.calls, result.trace, len(PROMPT))
    # The drafter too only ever sees unseen tokens: one or two per step after the first.
    assert drafter.calls[0] == (0, len(PROMPT))
    assert all(fed <= 2 for _, fed in drafter.calls[1:])
    assert result.drafter_calls == len(drafter.calls)


def test_nasd_cache_pinned_every_round():
    target = RecordingModel(tiny_llama(0, logit_scale=20.0))
    with torch.inference_mode():
        result = nasd(PROMPT, NGramStorage(3, 64), target, gamma=4, filler_top_k=3,
                      processor=GreedyProcessor(), max_gen_len=30)
    check_target_calls(target.calls, result.trace, len(PROMPT))
    assert result.drafter_calls == 0


def test_autoregressive_feeds_one_token_per_step():
    model = RecordingModel(tiny_llama(0))
    with torch.inference_mode():
        autoregressive(PROMPT, model, processor=GreedyProcessor(), max_gen_len=10)
    assert model.calls == [(0, len(PROMPT))] + [(len(PROMPT) + i, 1) for i in range(9)]


def test_without_cache_the_whole_sequence_is_fed():
    model = RecordingModel(tiny_llama(0))
    with torch.inference_mode():
        autoregressive(PROMPT, model, processor=GreedyProcessor(), max_gen_len=4, use_cache=False)
    assert model.calls == [(0, len(PROMPT) + i) for i in range(4)]


def test_drop_last_goes_through_the_public_crop():
    model = tiny_llama(0)
    cached = cached_model(model)
    with torch.inference_mode():
        cached.begin(PROMPT)
        cached.forward(torch.tensor([PROMPT[:7]]), keep=1)
    cache = cached.cache
    before = [layer.keys.clone() for layer in cache.layers]
    assert cache_length(cache) == 7
    drop_last(cache, 3)
    assert cache_length(cache) == 4
    assert all(torch.equal(layer.keys, old[..., :4, :]) for layer, old in zip(cache.layers, before))
    assert cache_length(None) == 0


def test_forward_refuses_when_nothing_is_new():
    model = tiny_llama(0)
    ids = torch.tensor([PROMPT])
    cached = cached_model(model)
    with torch.inference_mode():
        cached.begin(PROMPT)
        logits = cached.forward(ids, keep=2)
        assert logits.shape == (2, 64) and cached.length == len(PROMPT)
        with pytest.raises(ValueError, match="nothing new"):
            cached.forward(ids, keep=1)
