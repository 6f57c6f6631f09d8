"""The SGLang client against a fake SGLang answered by a tiny model (tests/helpers/served.py,
``FakeSglang``, its shapes from SGLang's source): what is particular to SGLang (detection, the
vocabulary read from SGLang's own refusal, every sampling field sent, a mutation of its parsing,
a seed per position, refusals one line). What holds for every engine that scores a round in one
request is in tests/test_scoring_engines.py. No real SGLang runs here (it needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from engine import Strategy, run_strategy
from remote.connect import connect
from remote.dialect import SamplerFields
from remote.sglang import SglangClient
from remote.transport import ServerError
from sampling import GreedyProcessor
from tests.helpers.models import tiny_llama
from tests.helpers.served import (FAKE_LENGTH, FAKE_PROMPTS, FAKE_VOCAB, FakeServer, FakeSglang, fake_engine_fixture,
                                   fast_backoff, served_pair_at, target, tokenizer)  # noqa: F401 (fixtures)

FAST = fast_backoff()
VOCAB, LENGTH, PROMPTS = FAKE_VOCAB, FAKE_LENGTH, FAKE_PROMPTS


fake = fake_engine_fixture(FakeSglang)


def test_the_kind_is_detected_and_the_vocabulary_read(fake, tokenizer):
    client = connect(fake.url, backoff=FAST)
    assert isinstance(client, SglangClient)
    info = client.info()
    assert (info.vocab_size, info.context_length, info.name) == (VOCAB, 128, "tiny")
    assert client.tokenize("the cat") == tokenizer("the cat", add_special_tokens=False).input_ids


def test_an_sglang_without_v1_models_is_detected_by_its_model_info(target, tokenizer):
    def no_models(method, path, body):
        return (404, {"detail": "Not Found"}) if path == "/v1/models" else FakeSglang(target, tokenizer)(method, path, body)
    with FakeServer(no_models) as server:
        assert isinstance(connect(server.url, backoff=FAST), SglangClient)


def test_every_sampling_field_is_sent_and_a_verify_request_is_greedy(fake, target, tokenizer):
    """SGLang fills what a request leaves out from --preferred-sampling-params: all are sent."""
    pair = served_pair_at(fake.url, target, tokenizer)
    pair.target.bound(GreedyProcessor()).session().forward(torch.tensor([PROMPTS[0]]), keep=3)
    body = fake.handler.bodies[-1]
    assert body["input_ids"] == PROMPTS[0]
    assert (body["return_logprob"], body["logprob_start_len"], body["top_logprobs_num"]) == (True, 2, 20)
    assert body["sampling_params"]["temperature"] == 0.0 and body["sampling_params"]["max_new_tokens"] == 1
    assert {"top_k", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
            "min_new_tokens", "ignore_eos", "skip_special_tokens", "no_stop_trim",
            "sampling_seed"} <= set(body["sampling_params"])


def test_reading_one_position_late_gives_other_rows(fake, target, tokenizer):
    """The shared tests (tests/test_scoring_engines.py) check the rows; here, that they would
    catch input_top_logprobs read one position late."""
    pair = served_pair_at(fake.url, tiny_llama(9, vocab_size=VOCAB), tokenizer)
    sequence = PROMPTS[1]
    rows = pair.target.bound(GreedyProcessor()).session().forward(torch.tensor([sequence]), keep=4)

    def one_late(self, sequence, keep, n_probs):
        meta = self._generate(sequence, SamplerFields(), logprob_start=len(sequence) - keep - 1,
                              n_probs=n_probs)["meta_info"]
        inside = [self._checked(e, n_probs, 0.0, 0.0) for e in meta["input_top_logprobs"][1:keep]]
        return inside + [self._last_row(meta, n_probs, 0.0, 0.0)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(SglangClient, "rows", one_late)
        mutated = pair.target.bound(GreedyProcessor()).session().forward(torch.tensor([sequence]), keep=4)
    assert not torch.equal(mutated, rows)


def test_target_autoregressive_sends_a_seed_per_position(fake, target, tokenizer):
    pair = served_pair_at(fake.url, target, tokenizer)
    got = run_strategy(Strategy("target", processor=GreedyProcessor(), max_gen_len=LENGTH), pair, PROMPTS[0])
    assert got.tokens == fake.handler.greedy(PROMPTS[0], LENGTH)
    seeds = [b["sampling_params"]["sampling_seed"] for b in fake.handler.bodies[-LENGTH:]]
    assert len(set(seeds)) == LENGTH                       # a seed per position


def _altered(target, tokenizer, change):
    """A FakeSglang whose /generate answers are passed through ``change(body, answer)``."""
    def handler(method, path, body):
        status, answer = FakeSglang(target, tokenizer)(method, path, body)
        if path == "/generate" and status == 200:
            change(body, answer)
        return status, answer
    return handler


def _one_line(caught) -> None:
    assert "\n" not in str(caught.value)


def test_faults_are_one_line(target, tokenizer):
    def no_input_logprobs(body, answer):
        answer["meta_info"].pop("input_top_logprobs", None)

    def no_output_logprobs(body, answer):
        answer["meta_info"].pop("output_top_logprobs", None)

    def fewer(body, answer):
        for entries in answer["meta_info"].get("output_top_logprobs") or []:
            del entries[1:]

    def sampled_anyway(body, answer):
        tops = answer["meta_info"].get("output_top_logprobs")
        if tops:
            answer["meta_info"]["output_token_logprobs"][0][1] = tops[0][-1][1]

    def shifted(body, answer):                       # input entries one position early
        meta = answer["meta_info"]
        if meta.get("input_token_logprobs"):
            meta["input_token_logprobs"] = [[None, 0, None]] + meta["input_token_logprobs"][:-1]
            meta["input_top_logprobs"] = [None] + meta["input_top_logprobs"][:-1]

    cases = [(no_input_logprobs, "ignored logprob_start_len"), (no_output_logprobs, "ignored return_logprob"),
             (fewer, "returned 1 logprobs, not the 5"), (sampled_anyway, "ignored the greedy settings"),
             (shifted, "scored the tokens")]
    for change, message in cases:
        with FakeServer(_altered(target, tokenizer, change)) as server:
            with pytest.raises(ServerError, match=message) as caught:
                connect(server.url, "sglang", backoff=FAST).rows(PROMPTS[0], 3, 5)
            _one_line(caught)


def test_an_unreadable_vocabulary_or_model_list_is_one_line(target, tokenizer):
    def no_bound(method, path, body):                # an SGLang without logit_bias checks
        if path == "/generate" and (body.get("sampling_params") or {}).get("logit_bias"):
            return 200, {"text": "", "output_ids": [], "meta_info": {"prompt_tokens": 1}}
        return FakeSglang(target, tokenizer)(method, path, body)

    def other_message(method, path, body):
        if path == "/generate":
            return 400, {"error": {"message": "bad request"}}
        return FakeSglang(target, tokenizer)(method, path, body)

    def no_models(method, path, body):
        return (200, {"object": "list", "data": []}) if path == "/v1/models" else \
            FakeSglang(target, tokenizer)(method, path, body)

    for handler, message in [(no_bound, "accepted a logit_bias key"), (other_message, "does not state its vocabulary"),
                             (no_models, "lists no model")]:
        with FakeServer(handler) as server:
            with pytest.raises(ServerError, match=message) as caught:
                connect(server.url, "sglang", backoff=FAST).info()
            _one_line(caught)


def test_a_verify_request_skips_no_cache_before_the_scored_positions(fake, target, tokenizer):
    """logprob_start_len is the first position the round scores minus one, not 0: SGLang reuses its
    radix cache up to it, so a round recomputes only what it scores."""
    client = connect(fake.url, backoff=FAST)
    client.rows(PROMPTS[2], 2, 5)
    assert fake.handler.bodies[-1]["logprob_start_len"] == len(PROMPTS[2]) - 2


def test_the_vocabulary_is_read_from_a_flat_error_too(target, tokenizer):
    """SGLang's OpenAI routes answer errors flat ({"object": "error", "message"}); the bound is read
    from either shape."""
    def flat(method, path, body):
        status, answer = FakeSglang(target, tokenizer)(method, path, body)
        if status == 400:
            answer = {"object": "error", "message": answer["error"]["message"], "type": "BadRequestError", "code": 400}
        return status, answer
    with FakeServer(flat) as server:
        assert connect(server.url, "sglang", backoff=FAST).info().vocab_size == VOCAB
