"""The vLLM client against a fake vLLM answered by a tiny model (tests/helpers/served.py): a verify
round is one request, each row is the model's own distribution at the right position, speculative
decoding and NASD are token-identical to the server's greedy, top-k is exact from the returned
top N, and what vLLM can refuse or ignore is one line. The real vLLM runs in scripts/vllm_check.py
(opt-in; docs/server.md has its figures)."""

from __future__ import annotations

import pytest
import torch

from engine import NGramOptions, Strategy, run_strategy, served_pair_of
from generation import first_divergence
from remote.client import Backoff, SamplerFields, ServerError, VllmClient, connect
from sampling import GreedyProcessor
from sampling.processors import MultinomialProcessor, TopKProcessor
from tests.helpers.models import tiny_llama
from tests.helpers.served import FakeServer, FakeVllm
from tests.helpers.tokenizers import word_tokenizer

FAST = Backoff(retries=1, first_s=0.01, timeout_s=5.0)
VOCAB = 255          # the word tokenizer's
LENGTH = 16


@pytest.fixture(scope="module")
def target():
    return tiny_llama(3, vocab_size=VOCAB, hidden=32, logit_scale=8.0, max_positions=128)


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


@pytest.fixture(scope="module")
def fake(target, tokenizer):
    handler = FakeVllm(target, tokenizer)
    with FakeServer(handler) as server:
        server.vllm = handler
        yield server


def pair_with(fake, drafter, tokenizer):
    client = connect(fake.url, backoff=FAST)
    return served_pair_of(client, client.info(), drafter, tokenizer, drafter_name="tiny")


def server_greedy(fake, prompt: list[int], n: int) -> list[int]:
    """The fake server's own greedy decode, in one request (the identity reference)."""
    status, answer = fake.vllm.complete({"prompt": prompt, "max_tokens": n, "temperature": 0})
    return answer["choices"][0]["token_ids"]


PROMPTS = [[1, 7, 9, 30, 41], [1, 100, 101, 102, 17, 100, 101], [1, 5, 5, 5, 5, 5, 5, 6]]


def test_the_kind_is_detected_and_the_vocabulary_read(fake):
    client = connect(fake.url, backoff=FAST)
    assert isinstance(client, VllmClient)
    info = client.info()
    assert (info.vocab_size, info.context_length) == (VOCAB, 128)


def test_a_round_is_one_request_and_each_row_is_the_models_distribution(fake, target, tokenizer):
    """Mutation: prompt_logprobs read one position late gives other rows."""
    pair = pair_with(fake, tiny_llama(9, vocab_size=VOCAB), tokenizer)
    session = pair.target.bound(GreedyProcessor()).session()
    sequence = PROMPTS[1]
    before = len(fake.hits)
    rows = session.forward(torch.tensor([sequence]), keep=4)
    assert len(fake.hits) - before == 1
    whole = fake.vllm.log_softmax(sequence)
    for j, row in enumerate(rows):
        position = len(sequence) - 4 + j
        top = torch.topk(whole[position], 20).indices
        assert torch.allclose(row[top], whole[position][top], atol=1e-5), j
        assert torch.isinf(row).sum() == VOCAB - 20

    scored = {}

    def one_late(self, sequence, keep, n_probs):
        answer = self._complete(sequence, 1, SamplerFields(), logprobs=n_probs, prompt_logprobs=n_probs)
        choice = self._choice(answer)
        scored["rows"] = [self._prompt_row(choice["prompt_logprobs"][p + 1], n_probs, 0.0, 0.0)
                          for p in range(len(sequence) - keep + 1, len(sequence) - 1)]
        return scored["rows"] + [self._last_row(choice, n_probs, 0.0, 0.0)] * 2
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VllmClient, "rows", one_late)
        mutated = pair.target.bound(GreedyProcessor()).session().forward(torch.tensor([sequence]), keep=4)
    assert not torch.equal(mutated, rows)


@pytest.mark.parametrize("key", ["speculative", "ngram"])
def test_drafting_matches_the_servers_greedy_with_accepts_and_rejects(fake, target, tokenizer, key):
    """Drafters: the target's own weights (every draft accepted: positions must line up) and an
    independent tiny model (most rejected: every rollback runs); NASD's tables. Each round is one
    request."""
    drafters = [target, tiny_llama(11, vocab_size=VOCAB, logit_scale=8.0)] if key == "speculative" else [target]
    accepted = rejected = 0
    for drafter in drafters:
        pair = pair_with(fake, drafter, tokenizer)
        for prompt in PROMPTS:
            reference = server_greedy(fake, prompt, LENGTH)
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


def test_target_autoregressive_is_the_servers_decode(fake, target, tokenizer):
    pair = pair_with(fake, target, tokenizer)
    got = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=LENGTH), pair, PROMPTS[0])
    assert got.tokens == server_greedy(fake, PROMPTS[0], LENGTH)
    assert got.network["requests"] == LENGTH
    assert got.network["server_s"] == pytest.approx(LENGTH * 0.0011)


def test_top_k_from_the_top_n_is_exact(fake, target, tokenizer):
    """Top-k (K <= N) from a top-20 row: the distribution of the model's whole row. Mutation:
    plain multinomial over the same top-20 row is far from it."""
    pair = pair_with(fake, target, tokenizer)
    whole = fake.vllm.log_softmax(PROMPTS[2])[-1].view(1, -1)
    for processor in (TopKProcessor(0.8, 5), TopKProcessor(1.0, 20)):
        row = pair.target.bound(processor).session().forward(torch.tensor([PROMPTS[2]]), keep=1)
        assert torch.allclose(processor(row.clone()), processor(whole.clone()), atol=1e-6)
    plain = MultinomialProcessor()
    assert (plain(row.clone()) - plain(whole.clone())).abs().sum() > 1e-3


def test_a_capped_server_and_ignored_fields_are_one_line(target, tokenizer):
    with FakeServer(FakeVllm(target, tokenizer, max_logprobs=20)) as capped:
        with pytest.raises(ServerError, match="--max-logprobs -1") as caught:
            connect(capped.url, backoff=FAST).info()
        assert "\n" not in str(caught.value)

    def no_prompt_logprobs(method, path, body):
        status, answer = FakeVllm(target, tokenizer)(method, path, body)
        if path == "/v1/completions":
            answer["choices"][0]["prompt_logprobs"] = None
        return status, answer
    with FakeServer(no_prompt_logprobs) as ignoring:
        client = connect(ignoring.url, "vllm", backoff=FAST)
        with pytest.raises(ServerError, match="ignored prompt_logprobs"):
            client.rows(PROMPTS[0], 3, 5)

    def sampled_anyway(method, path, body):
        status, answer = FakeVllm(target, tokenizer)(method, path, body)
        if path == "/v1/completions" and body.get("max_tokens") == 1 and answer["choices"][0]["logprobs"]:
            top = answer["choices"][0]["logprobs"]["top_logprobs"][0]
            worst = min(top, key=top.get)
            answer["choices"][0]["token_ids"] = [int(worst.split(":")[1])]
        return status, answer
    with FakeServer(sampled_anyway) as ignoring:
        client = connect(ignoring.url, "vllm", backoff=FAST)
        with pytest.raises(ServerError, match="ignored the greedy settings"):
            client.next_token(PROMPTS[0], 5)


def test_the_rtt_what_if_prices_one_trip_per_round_on_vllm(fake, target, tokenizer, monkeypatch):
    """One request scores a whole round, so /rtt adds one trip per call. Mutation: priced per
    position (as on llama.cpp), the prediction is lower."""
    from repl import runs
    from repl.runs import PromptRun, StrategyRun, per_position_requests

    pair = pair_with(fake, target, tokenizer)
    spec = run_strategy(Strategy("speculative", processor=GreedyProcessor(), max_gen_len=LENGTH, gamma=3,
                                 drafter="model"), pair, PROMPTS[0])
    base = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=LENGTH), pair, PROMPTS[0])
    assert not per_position_requests(spec)
    prompt_run = PromptRun("", PROMPTS[0], greedy=True, runs=[StrategyRun("speculative", spec),
                                                               StrategyRun("target", base)])
    per_round = prompt_run.why(prompt_run.runs[0], rtt_ms=20.0).what_if
    monkeypatch.setattr(runs, "per_position_requests", lambda result: True)
    per_position = prompt_run.why(prompt_run.runs[0], rtt_ms=20.0).what_if
    assert per_position.predicted_steady < per_round.predicted_steady


def test_on_a_served_run_rtt_is_the_whole_round_trip(fake, target, tokenizer):
    """A served run measured its round trip: /rtt at exactly that value changes nothing, a larger
    one moves the prediction. Mutation: /rtt added on top of the measured round trip (a local
    target's reading) moves it at the measured value."""
    from repl.runs import PromptRun, StrategyRun, measured_round_trip_s

    pair = pair_with(fake, tiny_llama(11, vocab_size=VOCAB, logit_scale=8.0), tokenizer)
    spec = run_strategy(Strategy("speculative", processor=GreedyProcessor(), max_gen_len=LENGTH, gamma=3,
                                 drafter="model"), pair, PROMPTS[1])
    base = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=LENGTH), pair, PROMPTS[1])
    prompt_run = PromptRun("", PROMPTS[1], greedy=True, runs=[StrategyRun("speculative", spec),
                                                               StrategyRun("target", base)])
    measured_ms = 1000 * measured_round_trip_s(spec)
    assert measured_ms > 0
    plain = prompt_run.why(prompt_run.runs[0], rtt_ms=0.0)
    same = prompt_run.why(prompt_run.runs[0], rtt_ms=measured_ms).what_if
    assert same.measured_ms == pytest.approx(measured_ms)
    assert same.predicted_steady == pytest.approx(plain.predicted_steady, rel=1e-9)
    farther = prompt_run.why(prompt_run.runs[0], rtt_ms=measured_ms + 50).what_if
    assert farther.predicted_steady != pytest.approx(plain.predicted_steady, rel=1e-3)


def test_each_run_has_its_own_cache_salt(fake, target, tokenizer):
    """vLLM shares cached prefixes among requests of one ``cache_salt``: every request of a run
    carries the run's salt, and no two runs share one (a run never reads another's prompt)."""
    pair = pair_with(fake, target, tokenizer)
    salts = []
    for key, fields in (("speculative", dict(drafter="model", gamma=2)), ("target", {}), ("speculative",
                                                                                       dict(drafter="model", gamma=2))):
        first = len(fake.vllm.bodies)
        run_strategy(Strategy(key, processor=GreedyProcessor(), max_gen_len=6, **fields), pair, PROMPTS[0])
        run_salts = {body.get("cache_salt") for body in fake.vllm.bodies[first:]}
        assert len(run_salts) == 1 and None not in run_salts
        salts.append(run_salts.pop())
    assert len(set(salts)) == 3


def test_the_json_and_html_report_show_the_network_and_the_what_if(fake, target, tokenizer):
    """A served run's requests and their times reach /save's JSON (``network``) and HTML (the
    panel's server line, and the /rtt what-if with the measured round trip beside it)."""
    from repl.report import report_html
    from repl.runs import PromptRun, StrategyRun

    pair = pair_with(fake, target, tokenizer)
    spec = run_strategy(Strategy("speculative", processor=GreedyProcessor(), max_gen_len=LENGTH, gamma=3,
                                 drafter="model"), pair, PROMPTS[0])
    base = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=LENGTH), pair, PROMPTS[0])
    prompt_run = PromptRun("", PROMPTS[0], greedy=True, settings={"rtt": 40.0},
                           runs=[StrategyRun("speculative", spec), StrategyRun("target", base)])
    entry = prompt_run.strategy_dict(prompt_run.runs[0])
    assert entry["network"]["requests"] == len(spec.trace) and entry["network"]["per_call"]
    assert entry["what_if_rtt"]["measured_rtt_ms"] == pytest.approx(spec.network["round_trip_per_request_ms"])
    page = report_html([prompt_run], {})
    assert page.count('class="meta network"') == 2
    assert "round trip per request (/rtt; measured" in page
