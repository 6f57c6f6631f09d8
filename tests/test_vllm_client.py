"""The vLLM client against a fake vLLM answered by a tiny model (tests/helpers/served.py): what is
particular to vLLM (detection, the vocabulary read with ``logprobs: -1``, refusals, a mutation of
its parsing, the /rtt what-if priced one trip a round, the network in the JSON and HTML). What
holds for every engine that scores a round in one request is in tests/test_scoring_engines.py.
The real vLLM runs in scripts/vllm_check.py (opt-in; docs/server.md has its figures)."""

from __future__ import annotations

import pytest
import torch

from engine import Strategy, run_strategy
from remote.connect import connect
from remote.dialect import SamplerFields
from remote.transport import ServerError
from remote.vllm import VllmClient
from sampling import GreedyProcessor
from tests.helpers.models import tiny_llama
from tests.helpers.served import (FAKE_LENGTH, FAKE_PROMPTS, FAKE_VOCAB, FakeServer, FakeVllm, fake_engine_fixture,
                                   fast_backoff, served_pair_at, target, tokenizer)  # noqa: F401 (fixtures)

FAST = fast_backoff()
VOCAB, LENGTH, PROMPTS = FAKE_VOCAB, FAKE_LENGTH, FAKE_PROMPTS


fake = fake_engine_fixture(FakeVllm)


def test_the_kind_is_detected_and_the_vocabulary_read(fake):
    client = connect(fake.url, backoff=FAST)
    assert isinstance(client, VllmClient)
    info = client.info()
    assert (info.vocab_size, info.context_length) == (VOCAB, 128)


def test_reading_one_position_off_gives_other_rows(fake, target, tokenizer):
    """The shared tests (tests/test_scoring_engines.py) check the rows; here, that a client reading
    prompt_logprobs one position early would give other rows."""
    pair = served_pair_at(fake.url, tiny_llama(9, vocab_size=VOCAB), tokenizer)
    sequence = PROMPTS[1]
    rows = pair.target.bound(GreedyProcessor()).session().forward(torch.tensor([sequence]), keep=4)

    def one_early(self, sequence, keep, n_probs):
        choice = self._choice(self._complete(sequence, 1, SamplerFields(), logprobs=n_probs,
                                             prompt_logprobs=n_probs))
        inside = [self._prompt_row(choice["prompt_logprobs"][p - 1], n_probs, 0.0, 0.0)
                  for p in range(len(sequence) - keep + 1, len(sequence))]
        return inside + [self._last_row(choice, n_probs, 0.0, 0.0)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(VllmClient, "rows", one_early)
        mutated = pair.target.bound(GreedyProcessor()).session().forward(torch.tensor([sequence]), keep=4)
    assert not torch.equal(mutated, rows)


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
    position (as on llama.cpp), the prediction is lower. The /rtt asked for is 20 ms above the
    round trip the run measured (below it, the what-if takes time away, and more trips would
    take away more: a loaded machine's slow loopback once made the fixed 20 ms such a case)."""
    from analysis import report
    from analysis.report import measured_round_trip_s, per_position_requests
    from repl.runs import PromptRun, StrategyRun

    pair = served_pair_at(fake.url, target, tokenizer)
    spec = run_strategy(Strategy("speculative", processor=GreedyProcessor(), max_gen_len=LENGTH, gamma=3,
                                 drafter="model"), pair, PROMPTS[0])
    base = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=LENGTH), pair, PROMPTS[0])
    assert not per_position_requests(spec)
    prompt_run = PromptRun("", PROMPTS[0], greedy=True, runs=[StrategyRun("speculative", spec),
                                                               StrategyRun("target", base)])
    rtt_ms = 1000 * measured_round_trip_s(spec) + 20.0
    per_round = prompt_run.why(prompt_run.runs[0], rtt_ms=rtt_ms).what_if
    monkeypatch.setattr(report, "per_position_requests", lambda result: True)
    per_position = prompt_run.why(prompt_run.runs[0], rtt_ms=rtt_ms).what_if
    assert per_position.predicted_steady < per_round.predicted_steady


def test_on_a_served_run_rtt_is_the_whole_round_trip(fake, target, tokenizer):
    """A served run measured its round trip: /rtt at exactly that value changes nothing, a larger
    one moves the prediction. Mutation: /rtt added on top of the measured round trip (a local
    target's reading) moves it at the measured value."""
    from analysis.report import measured_round_trip_s
    from repl.runs import PromptRun, StrategyRun

    pair = served_pair_at(fake.url, tiny_llama(11, vocab_size=VOCAB, logit_scale=8.0), tokenizer)
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




def test_the_json_and_html_report_show_the_network_and_the_what_if(fake, target, tokenizer):
    """A served run's requests and their times reach /save's JSON (``network``) and HTML (the
    panel's server line, and the /rtt what-if with the measured round trip beside it)."""
    from repl.report import report_html
    from repl.runs import PromptRun, StrategyRun

    pair = served_pair_at(fake.url, target, tokenizer)
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
