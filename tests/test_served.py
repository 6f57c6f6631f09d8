"""A target behind llama.cpp's server (``xllamacpp``, the offline model's GGUF, on 127.0.0.1):
speculative decoding and NASD token-identical to the server's own greedy decode, top-k exact
from the returned log-probabilities, nucleus only where certified, and every fault one line.

Faults the real server cannot produce come from a fake one (tests/helpers/served.py).
"""

from __future__ import annotations

import json
import math
import urllib.request

import pytest
import torch

from engine import NGramOptions, Strategy, run_strategy, served_pair_of
from engine.served_pair import check_same_vocabulary
from generation import first_divergence
from remote import rules
from remote.connect import connect
from remote.transport import Backoff, ServerError
from remote.rules import nucleus_certified, plan_for, row_of
from sampling import GreedyProcessor
from sampling.processors import MultinomialProcessor, NucleusProcessor, TopKNucleusProcessor, TopKProcessor
from tests.helpers.models import tiny_llama
from tests.helpers.served import FakeServer, llama_server
from utils.builtin_prompts import BUILTIN
from utils.models import ModelLoadError

pytest.importorskip("xllamacpp", reason="the served-target tests need xllamacpp (requirements-dev.txt)")
pytestmark = pytest.mark.slow        # the real offline model, behind a real server

LENGTH = 12
FAST = Backoff(retries=2, first_s=0.01, timeout_s=5.0)
PROMPTS = [text for category, text in BUILTIN if category in ("qa_over_text", "code_editing", "translation")][:3]


@pytest.fixture(scope="module")
def url():
    from utils.default_model import default_gguf_path
    with llama_server(default_gguf_path()) as address:
        yield address


@pytest.fixture(scope="module")
def local():
    """The offline model here: the drafter that shares the server's tokenizer, and that tokenizer."""
    from utils.models import load_model
    return load_model(None)


@pytest.fixture(scope="module")
def pair(url, local):
    client = connect(url, backoff=FAST)
    model, tokenizer = local
    check_same_vocabulary(client, client.info().vocab_size, tokenizer, model, "the local copy", named=True)
    return served_pair_of(client, client.info(), model, tokenizer, drafter_name="local copy")


@pytest.fixture(scope="module")
def prompts(pair):
    from utils.vocab import encode_prompt
    return [encode_prompt(pair.tokenizer, text) for text in PROMPTS]


def post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def server_greedy(url: str, prompt: list[int], n: int) -> list[int]:
    """The server's own greedy decode in one request (the identity reference), written out here;
    it stops after an end token, which it returns."""
    answer = post(url, "/completion", {"prompt": prompt, "n_predict": n, "cache_prompt": False, "temperature": 0,
                                       "top_k": 1, "samplers": ["top_k", "temperature"], "return_tokens": True})
    return answer["tokens"]


def decode(pair, prompt, key, processor=GreedyProcessor(), **fields):
    return run_strategy(Strategy(key, processor=processor, max_gen_len=LENGTH, **fields), pair, prompt)


def same_as_reference(tokens: list[int], reference: list[int], eos) -> bool:
    """Equal to the reference; where one stopped early, at an end token, the other's prefix."""
    if len(tokens) == len(reference):
        return tokens == reference
    shorter = tokens if len(tokens) < len(reference) else reference
    return tokens[:len(shorter)] == reference[:len(shorter)] and shorter[-1] in set(eos)


# ------------------------------------------------------------------ greedy identity

@pytest.fixture(scope="module")
def references(url, prompts):
    return [server_greedy(url, p, LENGTH) for p in prompts]


def test_what_n_probs_returns_is_the_raw_distribution(url, prompts):
    """llama.cpp's n_probs: the model's softmax before the sampler chain (same at every temperature),
    top-1 first. The first request evaluates the whole prompt in one batch, later ones only its last
    token, and the numbers differ slightly between the two (up to 0.07 seen): compare two of the latter."""
    body = {"prompt": prompts[0], "n_predict": 1, "n_probs": 5, "cache_prompt": True, "top_k": 0, "top_p": 1.0,
            "min_p": 0.0, "samplers": ["temperature"], "return_tokens": True}

    def top(temperature: float) -> list[dict]:
        # llama.cpp sends no probabilities with a sampled token whose text ends inside a UTF-8
        # character; such a token is banned and the position asked again, as the client does
        # (remote.llamacpp): a bias acts in the sampler, n_probs stays the raw softmax.
        banned: list[int] = []
        for _ in range(8):
            answer = post(url, "/completion", {**body, "temperature": temperature,
                                               "logit_bias": [[t, False] for t in banned]})
            if answer.get("completion_probabilities"):
                return answer["completion_probabilities"][0]["top_logprobs"]
            banned.append(int(answer["tokens"][0]))
        raise AssertionError(f"no probabilities after banning {banned}")

    top(1.0)
    hot, cold = top(1.5), top(0.3)
    assert [e["id"] for e in hot] == [e["id"] for e in cold]
    assert [e["logprob"] for e in hot] == pytest.approx([e["logprob"] for e in cold], abs=1e-6)
    assert sorted((e["logprob"] for e in hot), reverse=True) == [e["logprob"] for e in hot]


def test_target_autoregressive_is_the_servers_greedy(pair, prompts, references):
    for prompt, reference in zip(prompts, references):
        got = decode(pair, prompt, "target")
        assert same_as_reference(got.tokens, reference, pair.end_tokens), first_divergence(got.tokens, reference)
        assert got.network["requests"] == len(got.tokens)


def test_speculative_with_the_local_copy_matches_the_servers_greedy(pair, prompts, references):
    for prompt, reference in zip(prompts, references):
        got = decode(pair, prompt, "speculative", drafter="model", gamma=3)
        assert same_as_reference(got.tokens, reference, pair.end_tokens), first_divergence(got.tokens, reference)
        assert got.accepted > 0
        # A round of γ drafts is γ+1 requests: one per position it scores.
        assert got.network["requests"] == sum(len(r.drafted) + 1 for r in got.trace)
        assert got.network["server_s"] > 0 and got.network["request_s"] >= got.network["server_s"]
        per_call = got.network["per_call"]
        assert [c[0] for c in per_call] == [len(r.drafted) + 1 for r in got.trace]
        assert all(request >= server > 0 for _, request, server in per_call)


def test_speculative_with_an_independent_drafter_rejects_and_still_matches(pair, prompts, references, local):
    """A random drafter over the same vocabulary: nearly every draft is rejected, every rollback runs."""
    drafter = tiny_llama(7, vocab_size=local[0].config.vocab_size, hidden=16, layers=1, logit_scale=20.0)
    independent = served_pair_of(pair.target.client, pair.target.info, drafter, pair.tokenizer)
    got = decode(independent, prompts[0], "speculative", drafter="model", gamma=2)
    assert same_as_reference(got.tokens, references[0], pair.end_tokens)
    assert got.drafted - got.accepted > 0


def test_nasd_matches_the_servers_greedy(pair, prompts, references):
    rejected = 0
    for prompt, reference in zip(prompts, references):
        got = decode(pair, prompt, "ngram", drafter="ngram", gamma=3, drafter_options=NGramOptions(n=2))
        assert same_as_reference(got.tokens, reference, pair.end_tokens), first_divergence(got.tokens, reference)
        rejected += got.drafted - got.accepted
    assert rejected > 0


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_an_end_token_ranked_first_ends_the_run(url, pair, monkeypatch, ignore_eos):
    """llama.cpp's ignore_eos is a -inf bias on end tokens, so its sampler would never pick the end
    token its n_probs ranks first; the requests leave it off. Mutation: turned on, the runs fail."""
    from remote.llamacpp import LlamaCppClient

    text = "<|im_start|>user\nSay yes.<|im_end|>\n<|im_start|>assistant\nYes"
    prompt = pair.tokenizer(text, add_special_tokens=False).input_ids
    reference = server_greedy(url, prompt, LENGTH)
    assert reference[-1] in pair.end_tokens and len(reference) < LENGTH
    if ignore_eos:
        real = LlamaCppClient._body
        monkeypatch.setattr(LlamaCppClient, "_body", lambda *a: {**real(*a), "ignore_eos": True})
    outcomes = []
    for key, fields in (("target", {}), ("speculative", {"drafter": "model", "gamma": 3})):
        try:
            got = decode(pair, prompt, key, **fields)
            outcomes.append(got.tokens == reference and got.stop_reason == "eos")
        except ServerError:
            outcomes.append(False)
    assert outcomes == [not ignore_eos] * 2


def test_a_row_for_the_wrong_prefix_is_caught(pair, prompts, references, monkeypatch):
    """Mutation: each position scored one token short (an off-by-one in the prefixes sent)."""
    from remote.dialect import ServerClient

    real = ServerClient.rows
    monkeypatch.setattr(ServerClient, "rows", lambda self, sequence, keep, n: real(self, sequence[:-1], keep, n))
    got = decode(pair, prompts[0], "speculative", drafter="model", gamma=3)
    assert not same_as_reference(got.tokens, references[0], pair.end_tokens)


# ------------------------------------------------------------------ sampling rules

def whole_and_top(pair, prefix, n):
    """The server's whole distribution after ``prefix`` as a row, and the row from its top ``n``."""
    client, vocab = pair.target.client, pair.target.info.vocab_size
    whole = client.next_token(prefix, vocab)
    top = client.next_token(prefix, n)
    full = row_of(whole.ids, whole.logprobs, plan_for(MultinomialProcessor(), vocab, vocab))
    return full, top


def test_top_k_from_the_returned_logprobs_is_exact(pair, prompts):
    vocab = pair.target.info.vocab_size
    full, top = whole_and_top(pair, prompts[1], 20)
    for processor in (TopKProcessor(1.0, 20), TopKProcessor(0.7, 5), TopKNucleusProcessor(1.3, 20, 0.8)):
        plan = plan_for(processor, 20, vocab)
        assert plan.mode == "topk" and plan.n_probs == 20
        exact = processor(full.view(1, -1))
        served = processor(row_of(top.ids, top.logprobs, plan).view(1, -1))
        assert torch.allclose(served, exact, atol=1e-6)
    # Mutation: plain multinomial over the top-20, renormalised: far from the whole distribution.
    plain = MultinomialProcessor()
    wrong = plain(row_of(top.ids, top.logprobs, plan_for(TopKProcessor(1.0, 20), 20, vocab)).view(1, -1))
    assert (wrong - plain(full.view(1, -1))).abs().sum() > 1e-3


def test_a_top_k_above_n_asks_for_k_and_plain_multinomial_is_refused(pair):
    vocab = pair.target.info.vocab_size
    assert plan_for(TopKProcessor(1.0, 50), 20, vocab).n_probs == 50
    with pytest.raises(ServerError, match="whole vocabulary"):
        plan_for(MultinomialProcessor(), 20, vocab)
    assert plan_for(MultinomialProcessor(), vocab, vocab).mode == "full"
    with pytest.raises(ServerError, match="--server-probs"):
        decode(pair, [1, 2, 3], "speculative", processor=MultinomialProcessor(), drafter="model", gamma=2)
    # a refusal, not a failure: the REPL's runner says "refused: ..." (it said "failed: ServerError: ...")
    from generation import StrategyRefused
    from repl.runner import Runner
    from repl.settings import Settings
    from sampling.spec import ProcessorSpec

    runner = Runner(pair)
    run = runner.run_strategy("speculative", [1, 2, 3], Settings(chat=False, processor=ProcessorSpec("multinomial")))
    assert run.error.startswith("refused: plain multinomial sampling needs the server's whole vocabulary")
    with pytest.raises(StrategyRefused):
        plan_for(MultinomialProcessor(), 20, vocab)


def test_nucleus_rows_are_exact_where_certified(pair, prompts):
    """A certified top-20 row gives the whole distribution's nucleus, temperature included."""
    full, top = whole_and_top(pair, prompts[1], 20)
    vocab = pair.target.info.vocab_size
    checked = 0
    for temperature, top_p in ((1.0, 0.5), (0.7, 0.6), (1.4, 0.3)):
        processor = NucleusProcessor(temperature, top_p)
        if not nucleus_certified(top.logprobs, temperature, top_p, vocab):
            continue
        checked += 1
        served = processor(row_of(top.ids, top.logprobs, plan_for(processor, 20, vocab)).view(1, -1))
        assert torch.allclose(served, processor(full.view(1, -1)), atol=1e-5)
    assert checked >= 2
    # Mutation: without the tail mass the cumulative mass is inflated by 1/S: a top_p between the
    # top two's true and inflated mass drops the third token, which the whole distribution keeps.
    no_tail = rules.ServedPlan("topk", 20, vocab)
    probs = [math.exp(v) for v in top.logprobs]
    two, returned = probs[0] + probs[1], math.fsum(probs)
    processor = NucleusProcessor(1.0, two * (1 + 1 / returned) / 2)
    assert nucleus_certified(top.logprobs, 1.0, processor.top_p, vocab)
    wrong = processor(row_of(top.ids, top.logprobs, no_tail).view(1, -1))
    assert not torch.allclose(wrong, processor(full.view(1, -1)), atol=1e-5)


def test_nucleus_certification_by_hand():
    """Hand-built log-probabilities over a 100-token vocabulary."""
    lp = [math.log(p) for p in (0.5, 0.3, 0.1)]      # 0.1 left for 97 others
    assert nucleus_certified(lp, 1.0, 0.75, 100)      # 0.5 + 0.3 reaches 0.75: the third is dropped
    assert not nucleus_certified(lp, 1.0, 0.95, 100)  # the kept set reaches past what was returned
    assert not nucleus_certified(lp, 3.0, 0.75, 100)  # hot: the tail's tempered mass is too uncertain
    assert nucleus_certified(lp, 0.5, 0.75, 100)      # cold: the top two hold more still


def test_an_uncertified_nucleus_row_asks_for_more(pair, prompts):
    processor = NucleusProcessor(1.0, 0.999)
    got = decode(pair, prompts[1], "speculative", processor=processor, drafter="model", gamma=2, seed=3)
    rounds_positions = sum(len(r.drafted) + 1 for r in got.trace)
    assert got.network["requests"] > rounds_positions       # each position asked again, with more
    assert len(got.tokens) == LENGTH


# ------------------------------------------------------------------ faults

def test_server_down_is_one_line_after_bounded_retries():
    from tests.helpers.served import free_port
    with pytest.raises(ServerError) as caught:
        connect(f"http://127.0.0.1:{free_port()}", "llamacpp", FAST).info()
    assert "cannot reach the server" in str(caught.value) and "after 3 tries" in str(caught.value)
    assert "\n" not in str(caught.value)


def fake_llamacpp(vocab=49152, tokens=None, completion=None):
    def handler(method, path, body):
        if path == "/props":
            return 200, {"default_generation_settings": {}}
        if path == "/v1/models":
            return 200, {"data": [{"id": "fake.gguf", "meta": {"n_vocab": vocab, "n_ctx": 512}}]}
        if path == "/tokenize":
            return 200, {"tokens": tokens(body["content"]) if tokens else [1, 2, 3]}
        if path == "/completion":
            return completion(body)
        return 404, {"error": {"message": "not found"}}
    return handler


def test_a_timeout_is_retried_then_one_line():
    with FakeServer(lambda m, p, b: (200, ("sleep", 0.6))) as fake:
        client = connect(fake.url, "llamacpp", Backoff(retries=1, first_s=0.01, timeout_s=0.2))
        with pytest.raises(ServerError, match="no answer within 0.2 s .after 2 tries"):
            client.info()
        assert client.times.retries == 1


def test_http_errors_5xx_retried_4xx_not():
    with FakeServer(fake_llamacpp(completion=lambda b: (503, {"error": {"message": "loading model"}}))) as fake:
        client = connect(fake.url, backoff=FAST)
        with pytest.raises(ServerError, match="HTTP 503: loading model .after 3 tries"):
            client.next_token([1, 2], 5)
        assert fake.hits.count("/completion") == 3
    with FakeServer(fake_llamacpp(completion=lambda b: (400, {"error": {"message": "bad prompt"}}))) as fake:
        client = connect(fake.url, backoff=FAST)
        with pytest.raises(ServerError, match="HTTP 400: bad prompt"):
            client.next_token([1, 2], 5)
        assert fake.hits.count("/completion") == 1


def test_a_field_ignored_is_refused():
    without = fake_llamacpp(completion=lambda b: (200, {"tokens": [5], "timings": {}}))
    fewer = fake_llamacpp(completion=lambda b: (200, {"tokens": [5], "completion_probabilities": [
        {"id": 5, "top_logprobs": [{"id": 5, "logprob": -0.1}]}]}))
    sampled = fake_llamacpp(completion=lambda b: (200, {"tokens": [9], "completion_probabilities": [
        {"id": 9, "top_logprobs": [{"id": 5, "logprob": -0.1}, {"id": 9, "logprob": -3.0}]}]}))
    for handler, message in ((without, "ignored n_probs"), (fewer, "returned 1 logprobs, not the 2"),
                             (sampled, "ignored the greedy settings")):
        with FakeServer(handler) as fake:
            with pytest.raises(ServerError, match=message):
                connect(fake.url, backoff=FAST).next_token([1, 2], 2)


def test_a_token_outside_the_vocabulary_is_refused(pair):
    answer = {"tokens": [60000], "completion_probabilities": [
        {"id": 60000, "top_logprobs": [{"id": 60000, "logprob": -0.1}, {"id": 5, "logprob": -3.0}]}]}
    with FakeServer(fake_llamacpp(completion=lambda b: (200, answer))) as fake:
        client = connect(fake.url, backoff=FAST)
        fake_pair = served_pair_of(client, client.info(), pair.drafter, pair.tokenizer, n_probs=2)
        with pytest.raises(ServerError, match="token id 60000 outside its 49152-token vocabulary"):
            decode(fake_pair, [1, 2, 3], "speculative", drafter="ngram", gamma=2)


def test_another_vocabulary_or_tokenizer_is_refused(local):
    model, tokenizer = local
    with FakeServer(fake_llamacpp(vocab=32000)) as fake:
        client = connect(fake.url, backoff=FAST)
        with pytest.raises(ModelLoadError, match="32000 tokens"):
            check_same_vocabulary(client, client.info().vocab_size, tokenizer, model, "the local copy", named=True)
    with FakeServer(fake_llamacpp(tokens=lambda text: [1, 2, 3])) as fake:
        client = connect(fake.url, backoff=FAST)
        with pytest.raises(ModelLoadError, match="tokenizes .* differently .*first at token 0"):
            check_same_vocabulary(client, client.info().vocab_size, tokenizer, model, "the local copy", named=True)


def test_unknown_kind_and_bad_url_are_one_line():
    with pytest.raises(ServerError, match="not a server address"):
        connect("localhost:8080")
    with pytest.raises(ServerError, match="'tgi' is unknown"):
        connect("http://127.0.0.1:1", "tgi")
    with FakeServer(lambda m, p, b: (404, {})) as fake:
        with pytest.raises(ServerError, match="neither a llama.cpp server .* nor an SGLang one .*llamacpp, vllm, sglang"):
            connect(fake.url, backoff=FAST)


def test_a_failing_server_leaves_the_session_and_its_settings(pair, prompts, monkeypatch):
    """The REPL's runner turns the fault into one error line; the settings are untouched."""
    from repl.runner import Runner
    from repl.settings import Settings

    runner = Runner(pair, notify=lambda m: None)
    settings = Settings(length=4, gamma=2)
    before = repr(settings)
    transport = pair.target.client.transport
    monkeypatch.setattr(transport, "url", "http://127.0.0.1:9")     # nothing listens on the discard port
    run = runner.run_strategy("speculative", prompts[0], settings)
    assert run.result is None and "cannot reach the server" in run.error and "\n" not in run.error
    assert repr(settings) == before


@pytest.mark.parametrize("key,fields", [("target", {}), ("speculative", {"drafter": "model", "gamma": 2})])
def test_ctrl_c_during_a_request_keeps_what_was_generated(pair, prompts, references, monkeypatch, key, fields):
    transport = pair.target.client.transport
    real, calls = transport._once, []

    def interrupt_later(path, data):
        calls.append(path)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real(path, data)

    monkeypatch.setattr(transport, "_once", interrupt_later)
    strategy = Strategy(key, processor=GreedyProcessor(), max_gen_len=LENGTH, **fields)
    got = run_strategy(strategy, pair, prompts[0], interruptible=True)
    assert got.stop_reason == "interrupted"
    assert 0 < len(got.tokens) < LENGTH and got.tokens == references[0][:len(got.tokens)]


def test_the_self_test_sees_a_served_target(pair, prompts):
    """The cache probe does not run a served target; the sampling checks' exact distribution comes
    from the server (a top-3 from the top-20 row equals the one from the whole vocabulary)."""
    from checks.selftest import exact_first_tokens
    from kvcache.probe import probe_model

    assert probe_model(pair.target).path == "served"
    processor = TopKProcessor(1.0, 3)
    exact = exact_first_tokens(pair.target, prompts[2], processor, 1, pair.vocab_size)
    full, _ = whole_and_top(pair, prompts[2], 20)
    whole = processor(full.view(1, -1))[0]
    assert exact == pytest.approx({(t,): whole[t].item() for t in whole.nonzero().flatten().tolist()}, abs=1e-6)


def test_the_rtt_what_if_prices_a_round_trip_per_position(pair, prompts, monkeypatch):
    """/rtt on a served run: each verify round of width w pays w more round trips, not one.
    Mutation: priced as one trip per call, the prediction is higher. The /rtt asked for is 20 ms
    above the measured round trip (below it, more trips would take more time away)."""
    from analysis import report
    from analysis.report import measured_round_trip_s
    from repl.runs import PromptRun, StrategyRun

    spec = decode(pair, prompts[0], "speculative", drafter="model", gamma=3)
    target = decode(pair, prompts[0], "target")
    prompt_run = PromptRun("", prompts[0], greedy=True,
                           runs=[StrategyRun("speculative", spec), StrategyRun("target", target)])
    rtt_ms = 1000 * measured_round_trip_s(spec) + 20.0
    served = prompt_run.why(prompt_run.runs[0], rtt_ms=rtt_ms).what_if
    monkeypatch.setattr(report, "replace", lambda costs, **changes: costs)   # the per-position pricing skipped
    one_trip = prompt_run.why(prompt_run.runs[0], rtt_ms=rtt_ms).what_if
    assert served.predicted_steady < one_trip.predicted_steady


@pytest.mark.parametrize("drafter", ["self:int8", "mtp", "eagle3:/some/head", "gemma4-assistant:/some/dir"])
def test_a_drafter_made_from_or_reading_the_target_is_refused_before_connecting(drafter):
    """Those drafters need the target's weights, hidden states or keys, which stay on the server:
    one line, and no connection is tried (the address is never reached)."""
    from engine import load_served_pair
    from utils.models import ModelLoadError

    with pytest.raises(ModelLoadError, match="on the server|does not return") as caught:
        load_served_pair("http://127.0.0.1:9", None, drafter)
    assert "\n" not in str(caught.value)


def test_each_run_pays_its_own_prompt_on_the_server(pair, prompts, monkeypatch):
    """The server keeps the last prompt cached; a run must not reuse what the run before it left
    there (the strategy that went first would pay every other's prefill). Each run's first request
    evaluates the whole prompt (llama.cpp's own count, ``timings.prompt_n``), the next ones a few
    tokens. Mutation: without the per-run reset the second run evaluates almost nothing."""
    from remote.llamacpp import LlamaCppClient

    client = pair.target.client
    evaluated: list[tuple[int, int]] = []
    real = client.transport.post

    def counting(path, body):
        answer, wall = real(path, body)
        evaluated.append((len(body["prompt"]), int(answer["timings"]["prompt_n"])))
        return answer, wall
    monkeypatch.setattr(client.transport, "post", counting)

    def first_requests():
        evaluated.clear()
        decode(pair, prompts[0], "speculative", drafter="model", gamma=2)
        spec = evaluated[0]
        evaluated.clear()
        decode(pair, prompts[0], "target")
        return spec, evaluated[0], evaluated[1]
    spec, target, after = first_requests()
    assert spec == (len(prompts[0]), len(prompts[0])) and target == (len(prompts[0]), len(prompts[0]))
    assert after[1] <= 2
    monkeypatch.setattr(LlamaCppClient, "new_run", lambda self: None)
    _, target, _ = first_requests()
    assert target[1] < len(prompts[0])


def test_a_greedy_token_inside_a_utf8_character_is_still_scored(pair, url, monkeypatch):
    """llama.cpp sends no probabilities with a token whose text ends inside a UTF-8 character; the
    third built-in translation prompt's greedy output has one. The position is asked again with
    that token banned, and speculative decoding and NASD stay identical to the server's greedy.
    Mutation: with no ban allowed the run fails on that position."""
    from remote.llamacpp import LlamaCppClient
    from utils.vocab import encode_prompt

    text = [t for category, t in BUILTIN if category == "translation"][2]
    prompt = encode_prompt(pair.tokenizer, text)
    reference = server_greedy(url, prompt, 48)
    bodies = []
    real = pair.target.client.transport.post
    monkeypatch.setattr(pair.target.client.transport, "post", lambda path, body: (bodies.append(body), real(path, body))[1])
    for key, fields in (("speculative", dict(drafter="model", gamma=3)),
                        ("ngram", dict(drafter="ngram", gamma=3, drafter_options=NGramOptions(n=2)))):
        got = run_strategy(Strategy(key, processor=GreedyProcessor(), max_gen_len=48, **fields), pair, prompt)
        assert same_as_reference(got.tokens, reference, pair.end_tokens), first_divergence(got.tokens, reference)
    assert any(body.get("logit_bias") for body in bodies)
    monkeypatch.setattr(LlamaCppClient, "MAX_BANNED", 0)
    with pytest.raises(ServerError, match="ignored n_probs"):
        run_strategy(Strategy("ngram", processor=GreedyProcessor(), max_gen_len=48, drafter="ngram", gamma=3,
                              drafter_options=NGramOptions(n=2)), pair, prompt)


def test_the_server_kind_asked_for_is_the_one_used(capsys):
    """``--server-kind KIND`` reaches the connection: an unknown kind is refused in one line before
    any address is tried (the address here is never reached), through the engine and through
    ``infer.py``. Mutation (the bug this guards): the drafter's kind read into the same name, so
    the server's was dropped and detection tried the address instead."""
    import infer
    from engine import load_served_pair
    from utils.models import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"--server-kind 'bogus' is unknown \(supported: llamacpp, vllm, sglang\)"):
        load_served_pair("http://127.0.0.1:9", "bogus", None)
    with pytest.raises(SystemExit) as exited:
        infer.main(["--target-server", "http://127.0.0.1:9", "--server-kind", "bogus", "--prompt", "x"])
    err = capsys.readouterr()
    text = err.out + err.err
    assert exited.value.code == 1 and "--server-kind 'bogus' is unknown" in text and "Traceback" not in text
    assert "cannot reach" not in text
