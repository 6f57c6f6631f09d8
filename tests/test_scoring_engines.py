"""What holds for every engine that scores a whole verify round in one request (vLLM, SGLang),
each against its fake answered by a tiny model (tests/helpers/served.py): each row is the model's
own distribution at the right position, speculative decoding (accepting and rejecting drafters)
and NASD are token-identical to the server's greedy, target AR is the server's decode, top-k is
exact from the returned top N, and each run keys the server's prefix cache on its own. What is
particular to one engine (its fields, its refusals, mutations of its parsing) is in
tests/test_vllm_client.py and tests/test_sglang_client.py."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from engine import NGramOptions, Strategy, run_strategy
from generation import first_divergence
from sampling import GreedyProcessor
from sampling.processors import MultinomialProcessor, TopKProcessor
from tests.helpers.models import tiny_llama
from tests.helpers.served import (FAKE_LENGTH, FAKE_PROMPTS, FAKE_VOCAB, FakeServer, FakeSglang, FakeVllm,
                                   fast_backoff, served_pair_at, target, tokenizer)  # noqa: F401 (fixtures)

FAST = fast_backoff()
VOCAB, LENGTH, PROMPTS = FAKE_VOCAB, FAKE_LENGTH, FAKE_PROMPTS


@dataclass
class Engine:
    """A fake engine on 127.0.0.1: its URL, its handler (``log_softmax``, ``bodies``), how its own
    greedy decode is asked for, and the request field that keys its prefix cache."""

    name: str
    url: str
    handler: object
    hits: list
    cache_key: str

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """The server's own greedy decode in one request (the identity reference)."""
        return self.handler.greedy(prompt, n)

    def pair(self, drafter, tokenizer):
        return served_pair_at(self.url, drafter, tokenizer)


@pytest.fixture(scope="module", params=["vllm", "sglang"])
def engine(request, target, tokenizer):
    fake, key = {"vllm": (FakeVllm, "cache_salt"), "sglang": (FakeSglang, "extra_key")}[request.param]
    handler = fake(target, tokenizer)
    with FakeServer(handler) as server:
        yield Engine(request.param, server.url, handler, server.hits, key)


def test_a_round_is_one_request_and_each_row_is_the_models_distribution(engine, tokenizer):
    pair = engine.pair(tiny_llama(9, vocab_size=VOCAB), tokenizer)
    sequence = PROMPTS[1]
    before = len(engine.hits)
    rows = pair.target.bound(GreedyProcessor()).session().forward(torch.tensor([sequence]), keep=4)
    assert len(engine.hits) - before == 1
    whole = engine.handler.log_softmax(sequence)
    for j, row in enumerate(rows):
        position = len(sequence) - 4 + j
        top = torch.topk(whole[position], 20).indices
        assert torch.allclose(row[top], whole[position][top], atol=1e-5), j
        assert torch.isinf(row).sum() == VOCAB - 20


@pytest.mark.parametrize("key", ["speculative", "ngram"])
def test_drafting_matches_the_servers_greedy_with_accepts_and_rejects(engine, target, tokenizer, key):
    """Drafters: the target's own weights (every draft accepted: positions must line up) and an
    independent tiny model (most rejected: every rollback runs); NASD's tables. Each round is one
    request."""
    drafters = [target, tiny_llama(11, vocab_size=VOCAB, logit_scale=8.0)] if key == "speculative" else [target]
    accepted = rejected = 0
    for drafter in drafters:
        pair = engine.pair(drafter, tokenizer)
        for prompt in PROMPTS:
            reference = engine.greedy(prompt, LENGTH)
            options = dict(drafter="model") if key == "speculative" else dict(
                drafter="ngram", drafter_options=NGramOptions(n=2))
            got = run_strategy(Strategy(key, processor=GreedyProcessor(), max_gen_len=LENGTH, gamma=3, **options),
                               pair, prompt)
            assert got.tokens == reference[:len(got.tokens)] and len(got.tokens) == LENGTH, \
                first_divergence(got.tokens, reference)
            assert [c[0] for c in got.network["per_call"]] == [1] * len(got.trace)
            accepted += got.accepted
            rejected += got.drafted - got.accepted
    assert accepted > 0 and (key == "ngram" or rejected > 0)


def test_target_autoregressive_is_the_servers_decode(engine, target, tokenizer):
    pair = engine.pair(target, tokenizer)
    got = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=LENGTH), pair, PROMPTS[0])
    assert got.tokens == engine.greedy(PROMPTS[0], LENGTH)
    assert got.network["requests"] == LENGTH
    assert got.network["server_s"] == pytest.approx(LENGTH * 0.0011)     # the fakes report 1.1 ms a request


def test_top_k_from_the_top_n_is_exact(engine, target, tokenizer):
    """Top-k (K <= N) from a top-20 row: the distribution of the model's whole row. Mutation:
    plain multinomial over the same top-20 row is far from it."""
    pair = engine.pair(target, tokenizer)
    whole = engine.handler.log_softmax(PROMPTS[2])[-1].view(1, -1)
    for processor in (TopKProcessor(0.8, 5), TopKProcessor(1.0, 20)):
        row = pair.target.bound(processor).session().forward(torch.tensor([PROMPTS[2]]), keep=1)
        assert torch.allclose(processor(row.clone()), processor(whole.clone()), atol=1e-6)
    plain = MultinomialProcessor()
    assert (plain(row.clone()) - plain(whole.clone())).abs().sum() > 1e-3


def test_each_run_keys_the_prefix_cache_on_its_own(engine, target, tokenizer):
    """vLLM shares cached prefixes among requests of one ``cache_salt``, SGLang among those of one
    ``extra_key``: every request of a run carries the run's own, and no two runs share one (a run
    never reads another's prompt from the cache)."""
    pair = engine.pair(target, tokenizer)
    keys = []
    for key, fields in (("speculative", dict(drafter="model", gamma=2)), ("target", {}),
                        ("speculative", dict(drafter="model", gamma=2))):
        first = len(engine.handler.bodies)
        run_strategy(Strategy(key, processor=GreedyProcessor(), max_gen_len=6, **fields), pair, PROMPTS[0])
        run_keys = {body.get(engine.cache_key) for body in engine.handler.bodies[first:]}
        assert len(run_keys) == 1 and None not in run_keys
        keys.append(run_keys.pop())
    assert len(set(keys)) == 3
