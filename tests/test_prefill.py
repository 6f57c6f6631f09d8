"""kvcache.prefill: generations that begin from one prompt's prefill feed the prompt
once, give what a generation from an empty cache gives (tokens and logits), and
leave the prefill as it was."""

import pytest
import torch

from ngram_assisted import NGramStorage
from sampling import GreedyProcessor, TopKProcessor
from tests.helpers import arch_zoo, decode
from tests.helpers.models import RecordingModel, tiny_llama
from kvcache.cache import CachedModel, cache_length, matching_prefill
from kvcache.prefill import prefill

PROMPT = [3, 9, 4, 17, 5, 9, 4, 17, 5, 30, 2, 8, 41, 7, 9]


def pair():
    # Independent weights, sharp logits: the drafter is often rejected.
    return (RecordingModel(tiny_llama(0, logit_scale=8.0)), RecordingModel(tiny_llama(1, logit_scale=8.0)))


def speculative(target, drafter, processor, seed=0, length=12, prefills=()):
    generator = torch.Generator().manual_seed(seed)
    return decode.speculative(PROMPT, drafter, target, processor=processor, gamma=3, max_gen_len=length,
                              generator=generator, prefills=prefills)


@pytest.mark.parametrize("processor", [GreedyProcessor(), TopKProcessor(1.0, 5)], ids=["greedy", "topk"])
def test_speculative_from_a_prefill_matches_a_fresh_start_and_feeds_the_prompt_once(processor):
    target, drafter = pair()
    fresh = [speculative(target, drafter, processor, seed) for seed in range(3)]
    prepared = [prefill(target, PROMPT), prefill(drafter, PROMPT)]
    target.calls.clear()
    drafter.calls.clear()
    reused = [speculative(target, drafter, processor, seed, prefills=prepared) for seed in range(3)]
    for got, want in zip(reused, fresh):
        assert got.tokens == want.tokens
        assert (got.drafted, got.accepted) == (want.drafted, want.accepted)
        assert got.drafted > got.accepted  # rejections happened: the rollback paths ran
    # Every generation's first forward sees the prompt but its last token already cached.
    firsts = [c for c in target.calls if c[0] == len(PROMPT) - 1]
    assert len(firsts) == 3 and all(fed > 1 for _, fed in firsts)
    assert all(seen > 0 for seen, _ in target.calls + drafter.calls)
    assert sum(1 for seen, fed in drafter.calls if (seen, fed) == (len(PROMPT) - 1, 1)) == 3
    # The prefill is untouched: it is copied, never fed.
    assert all(cache_length(p.cache) == p.length == len(PROMPT) - 1 for p in prepared)


def test_first_verify_logits_match_an_uncached_forward():
    model = tiny_llama(2, logit_scale=8.0)
    draft = [12, 40, 7]
    cached = CachedModel(model, path="cached")
    with torch.inference_mode():
        start = cached.begin(PROMPT, (prefill(model, PROMPT),))
        assert cached.length == len(PROMPT) - 1 and start == PROMPT
        got = cached.forward(torch.tensor([start + draft]), keep=len(draft) + 1)
        want = model(input_ids=torch.tensor([PROMPT + draft])).logits[0, -len(draft) - 1:]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_only_that_model_and_prompt_are_served():
    model, other = tiny_llama(0), tiny_llama(1)
    prepared = prefill(model, PROMPT)
    assert matching_prefill((), model, PROMPT) is None
    assert matching_prefill([prepared], model, PROMPT) is prepared
    assert matching_prefill([prepared], model, PROMPT[:-1]) is None
    assert matching_prefill([prepared], other, PROMPT) is None
    without_cache = CachedModel(model, use_cache=False)
    without_cache.begin(PROMPT, (prepared,))
    assert without_cache.cache is None


def test_nasd_sampling_draws_from_a_prefill_match_fresh_draws():
    target = tiny_llama(0, logit_scale=8.0)

    def draws(prefills=()):
        generator = torch.Generator().manual_seed(7)
        return [decode.nasd(PROMPT, NGramStorage(3, 64), target, gamma=2, processor=TopKProcessor(1.0, 4),
                            max_gen_len=3, generator=generator, prefills=prefills).tokens for _ in range(10)]

    fresh = draws()
    assert draws((prefill(target, PROMPT),)) == fresh


def test_a_copy_not_the_prefill_is_fed(monkeypatch):
    """Mutation: beginning on the prefill's own cache (no copy) changes the prefill,
    which the first test's last assertion catches."""
    from types import SimpleNamespace

    import kvcache.cache

    target, drafter = pair()
    prepared = [prefill(target, PROMPT), prefill(drafter, PROMPT)]
    monkeypatch.setattr(kvcache.cache, "copy", SimpleNamespace(deepcopy=lambda x: x))
    speculative(target, drafter, GreedyProcessor(), prefills=prepared)
    assert any(cache_length(p.cache) != p.length for p in prepared)


@pytest.mark.parametrize("name", ["mamba2", "t5"])
def test_snapshotted_and_encoder_decoder_models(name):
    try:
        target, drafter = arch_zoo.build(name), arch_zoo.build(name, "drafter")
    except arch_zoo.FamilyUnavailable as e:
        pytest.skip(str(e))
    prompt = list(arch_zoo.echo_prompt(name))
    processor = TopKProcessor(1.0, 4)

    def run(prefills=()):
        generator = torch.Generator().manual_seed(3)
        return [decode.speculative(prompt, drafter, target, processor=processor, gamma=3, max_gen_len=8,
                                   generator=generator, prefills=prefills).tokens for _ in range(3)]

    fresh = run()
    assert run((prefill(target, prompt), prefill(drafter, prompt))) == fresh


def test_replayed_first_forwards_give_the_tokens_running_them_gives_and_run_each_draft_once():
    """``replay_first``: draws from one prefill whose first forwards feed the same tokens pay that
    forward once; every later forward runs, and every draw's tokens and counts are a fresh run's."""
    target, drafter = pair()
    processor = TopKProcessor(1.0, 5)
    seeds = [0, 1, 2, 0, 1, 2]          # the drafter samples: a seed drafts alike each time
    fresh = [speculative(target, drafter, processor, seed) for seed in seeds]
    prepared = [prefill(target, PROMPT, replay_first=True), prefill(drafter, PROMPT, replay_first=True)]
    target.calls.clear()
    reused = [speculative(target, drafter, processor, seed, prefills=prepared) for seed in seeds]
    for got, want in zip(reused, fresh):
        assert (got.tokens, got.drafted, got.accepted) == (want.tokens, want.drafted, want.accepted)
    firsts = [c for c in target.calls if c[0] == len(PROMPT) - 1]
    assert len(firsts) == len(prepared[0].first_forwards) <= 3      # repeated first drafts were replayed
    assert len(target.calls) > len(firsts)                          # later rounds ran for real
    # What the memory keeps is a copy: the draws went on from it and left it as it was.
    for logits, cache, length in prepared[0].first_forwards.values():
        assert cache_length(cache) == length


def _first_rows(model, prepared, draft):
    cached = CachedModel(model, path="cached")
    with torch.inference_mode():
        start = cached.begin(PROMPT, (prepared,))
        return cached.forward(torch.tensor([start + draft]), keep=len(draft) + 1)


def test_a_replayed_first_forward_returns_the_rows_of_what_it_was_fed():
    """Logits, not tokens: the second generation's first rows, for another draft, are its own
    forward's (an uncached reference), and a repeat of the first draft gets the first's rows exactly."""
    model = tiny_llama(2, logit_scale=8.0)
    prepared = prefill(model, PROMPT, replay_first=True)
    one, other = [12, 40, 7], [12, 41, 7]
    first = _first_rows(model, prepared, one)
    second = _first_rows(model, prepared, other)
    with torch.inference_mode():
        want = model(input_ids=torch.tensor([PROMPT + other])).logits[0, -len(other) - 1:]
    torch.testing.assert_close(second, want, rtol=1e-4, atol=1e-4)
    assert torch.equal(_first_rows(model, prepared, one), first)
    assert len(prepared.first_forwards) == 2


def test_a_replay_keyed_without_the_fed_tokens_is_caught(monkeypatch):
    """Mutation: a memory that ignores which tokens were fed answers the second draft with the
    first one's rows, which the test above catches (its rows differ from the reference)."""
    model = tiny_llama(2, logit_scale=8.0)
    monkeypatch.setattr(CachedModel, "_first_forward_key",
                        lambda self, ids, keep: None if self._prefill is None or self.forwards else keep)
    prepared = prefill(model, PROMPT, replay_first=True)
    first = _first_rows(model, prepared, [12, 40, 7])
    assert torch.equal(_first_rows(model, prepared, [12, 41, 7]), first)
