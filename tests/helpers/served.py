"""A llama.cpp server on the offline model (``xllamacpp``, in-process) and a fake one for faults.

Both listen on 127.0.0.1 only, on a port chosen free. ``llama_server()`` is a context manager
yielding the URL; ``FakeServer`` answers with whatever its ``handler(path, body)`` returns:
``(status, json_or_bytes)``, or it sleeps (a timeout) when the handler says so.
"""

from __future__ import annotations

import contextlib
import gc
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def llama_server(gguf_path: str, *, n_ctx: int = 1024):
    """``xllamacpp.Server`` on ``gguf_path``, one slot, one thread, no busy-wait polling."""
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(gguf_path)
    params.hostnames = [HOST]
    params.port = free_port()
    params.n_ctx = n_ctx
    params.n_parallel = 1
    for cpu in (params.cpuparams, params.cpuparams_batch):
        cpu.n_threads = 1
        cpu.poll = 0        # llama.cpp's threads spin 50% by default: a shared 2-core machine stalls
    params.verbosity = -1
    server = xllamacpp.Server(params)
    try:
        yield f"http://{HOST}:{params.port}"
    finally:
        del server
        gc.collect()


class FakeServer:
    """A tiny HTTP server on 127.0.0.1: ``handler(method, path, body) -> (status, payload)``;
    a payload of ``("sleep", seconds)`` answers nothing for that long. ``hits`` counts requests."""

    def __init__(self, handler):
        self.handler = handler
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method):
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"null") if length else None
                outer.hits.append(self.path)
                status, payload = outer.handler(method, self.path, body)
                if isinstance(payload, tuple) and payload[0] == "sleep":
                    time.sleep(payload[1])
                    return
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer("GET")

            def do_POST(self):
                self._answer("POST")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((HOST, free_port()), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{HOST}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


class FakeVllm:
    """The parts of vLLM's OpenAI server the client uses, answered by a local causal LM (a handler
    for :class:`FakeServer`): ``/v1/models`` (owned by vllm), ``/tokenize``, and
    ``/v1/completions`` with a token-id prompt, ``logprobs``/``prompt_logprobs`` (top N of the raw
    model's log-softmax, the prompt token added with its rank; ``-1`` the whole vocabulary),
    ``return_tokens_as_token_ids``, ``return_token_ids`` and ``metrics``. Decoding is greedy at
    temperature 0, else seeded sampling over softmax(logits / T) cut to top-k. ``max_logprobs``
    caps what may be asked, as ``--max-logprobs`` does. Each forward recomputes the whole prompt."""

    def __init__(self, model, tokenizer, *, max_logprobs: int = -1):
        self.model = model
        self.tokenizer = tokenizer
        self.max_logprobs = max_logprobs
        self.bodies: list[dict] = []

    def __call__(self, method, path, body):
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "fake", "owned_by": "vllm", "max_model_len": 128}]}
        if path == "/tokenize":
            return 200, {"tokens": self.tokenizer(body["prompt"], add_special_tokens=False).input_ids}
        if path == "/v1/completions":
            self.bodies.append(body)
            return self.complete(body)
        return 404, {"error": {"message": "not found"}}

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """This server's own greedy decode of ``n`` tokens in one request (the identity reference)."""
        _, answer = self.complete({"prompt": prompt, "max_tokens": n, "temperature": 0})
        return answer["choices"][0]["token_ids"]

    def log_softmax(self, ids: list[int]):
        import torch
        with torch.no_grad():
            return torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), dim=-1)

    def _capped(self, n: int) -> int | None:
        vocab = self.model.config.vocab_size
        n = vocab if n == -1 else n
        cap = vocab if self.max_logprobs == -1 else self.max_logprobs
        return None if n > cap else n

    def complete(self, body: dict):
        import torch
        prompt, wanted = list(body["prompt"]), body.get("logprobs")
        for name in ("logprobs", "prompt_logprobs"):
            if body.get(name) is not None and self._capped(body[name]) is None:
                cap = self.max_logprobs
                return 400, {"error": {"message": f"Requested sample logprobs of {body[name]}, which is "
                                                  f"greater than max allowed: {cap}"}}
        ids, tops, prompt_scores = list(prompt), [], None
        if body.get("prompt_logprobs") is not None:
            rows, n = self.log_softmax(prompt), self._capped(body["prompt_logprobs"])
            prompt_scores = [None] + [self._entry(rows[i - 1], n, prompt[i]) for i in range(1, len(prompt))]
        generator = torch.Generator().manual_seed(int(body.get("seed") or 0))
        for _ in range(int(body.get("max_tokens", 16))):
            row = self.log_softmax(ids)[-1]
            token = self._pick(row, body, generator)
            if wanted is not None:
                n = self._capped(wanted) or 0
                best = torch.topk(row, n).indices.tolist() if n else []
                tops.append({f"token_id:{i}": row[i].item() for i in best + [token]})
            ids.append(token)
        choice = {"index": 0, "text": "", "token_ids": ids[len(prompt):], "prompt_logprobs": prompt_scores,
                  "logprobs": {"top_logprobs": tops} if wanted is not None else None}
        return 200, {"choices": [choice], "metrics": {"queue_time_ms": 0.1, "time_to_first_token_ms": 1.0}}

    @staticmethod
    def _entry(row, n: int, own: int) -> dict:
        import torch
        best = torch.topk(row, n).indices.tolist()
        return {str(i): {"logprob": row[i].item(), "rank": int((row > row[i]).sum()) + 1}
                for i in best + [own]}

    @staticmethod
    def _pick(row, body: dict, generator) -> int:
        import torch
        temperature = float(body.get("temperature") or 0.0)
        if temperature == 0.0:
            return int(row.argmax())
        logits = row / temperature
        k = int(body.get("top_k") or -1)
        if 0 < k < logits.numel():
            logits = logits.masked_fill(logits < torch.topk(logits, k).values[-1], float("-inf"))
        return int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))


class FakeSglang:
    """The parts of SGLang's native server the client uses, answered by a local causal LM (a handler
    for :class:`FakeServer`), in the shapes SGLang's source gives them (sgl-project/sglang):

    - ``/v1/models``: a ``ModelCard`` owned by ``sglang`` with ``max_model_len``
      (entrypoints/openai/protocol.py); ``/get_model_info`` and ``/model_info``: ``model_path``,
      ``is_generation`` and the rest (entrypoints/http_server.py); ``/props``: 404;
    - ``/tokenize``: ``{tokens, count, max_model_len}``;
    - ``/generate`` with ``input_ids``: ``SamplingParams`` semantics (sampling/sampling_params.py:
      temperature 0 is greedy, top_k -1 the whole vocabulary, ``logit_bias`` keys outside the
      vocabulary refused with "logit_bias must has keys in [0, V-1], got K." as a 400
      ``{"error": {"message"}}``); ``output_ids``; and ``meta_info`` with ``prompt_tokens``,
      ``completion_tokens``, ``cached_tokens``, ``e2e_latency`` and, with ``return_logprob``,
      ``input_token_logprobs`` / ``output_token_logprobs`` (``[logprob, token_id, None]``) and, with
      ``top_logprobs_num`` N > 0, ``input_top_logprobs`` / ``output_top_logprobs`` (the top N, best
      first). Input entries run from ``logprob_start_len`` S (-1: the last prompt token) to the last
      prompt token, the first None (managers/scheduler_output_processor_mixin.py).

    Logprobs are the raw model's log-softmax for a greedy request; a sampled one gets them after
    its temperature, as SGLang's sampler does unless ``SGLANG_RETURN_ORIGINAL_LOGPROB`` is set.
    Sampling: softmax(logits / T), top-k then top-p over the tempered distribution, a generator
    seeded with ``sampling_seed``. Each forward recomputes the whole prompt."""

    def __init__(self, model, tokenizer, *, context: int = 128):
        self.model = model
        self.tokenizer = tokenizer
        self.context = context
        self.bodies: list[dict] = []

    def __call__(self, method, path, body):
        info = {"model_path": "fake/tiny", "tokenizer_path": "fake/tiny", "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
                "has_audio_understanding": False, "model_type": "llama", "architectures": ["LlamaForCausalLM"]}
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "fake/tiny", "object": "model", "created": 0,
                                                     "owned_by": "sglang", "root": "fake/tiny",
                                                     "max_model_len": self.context}]}
        if path in ("/get_model_info", "/model_info"):
            return 200, info
        if path == "/tokenize":
            tokens = self.tokenizer(body["prompt"], add_special_tokens=bool(body.get("add_special_tokens"))).input_ids
            return 200, {"tokens": tokens, "count": len(tokens), "max_model_len": self.context}
        if path == "/generate":
            self.bodies.append(body)
            return self.generate(body)
        return 404, {"detail": "Not Found"}

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        """This server's own greedy decode of ``n`` tokens in one request (the identity reference)."""
        _, answer = self.generate({"input_ids": prompt, "sampling_params": {"max_new_tokens": n, "temperature": 0}})
        return answer["output_ids"]

    def log_softmax(self, ids: list[int]):
        import torch
        with torch.no_grad():
            return torch.log_softmax(self.model(torch.tensor([ids])).logits[0].float(), dim=-1)

    def generate(self, body: dict):
        import torch
        params = dict(body.get("sampling_params") or {})
        vocab = self.model.config.vocab_size
        for key in params.get("logit_bias") or {}:
            if not 0 <= int(key) < vocab:
                return 400, {"error": {"message": f"logit_bias must has keys in [0, {vocab - 1}], got {key}."}}
        prompt = list(body["input_ids"])
        start = int(body.get("logprob_start_len") if body.get("logprob_start_len") is not None else -1)
        start = len(prompt) - 1 if start == -1 else start
        if start >= len(prompt):
            return 400, {"error": {"message": f"logprob_start_len ({start}) is too large"}}
        n = int(body.get("top_logprobs_num") or 0)
        temperature = float(params.get("temperature", 1.0))
        generator = torch.Generator().manual_seed(int(params.get("sampling_seed") or 0))
        ids, out_tokens, out_tops = list(prompt), [], []
        for _ in range(int(params.get("max_new_tokens", 128))):
            raw = self.log_softmax(ids)[-1]
            token = self._pick(raw, params, generator)
            shown = raw if temperature < 1e-6 else torch.log_softmax(raw / temperature, -1)
            out_tokens.append([shown[token].item(), token, None])
            out_tops.append(self._top(shown, n))
            ids.append(token)
        meta = {"id": "fake", "finish_reason": {"type": "length", "length": len(ids) - len(prompt)},
                "prompt_tokens": len(prompt), "weight_version": "default", "total_retractions": 0,
                "completion_tokens": len(ids) - len(prompt), "cached_tokens": 0, "e2e_latency": 0.0011}
        if body.get("return_logprob"):
            rows = self.log_softmax(prompt)                           # row i predicts prompt[i + 1]
            meta["input_token_logprobs"] = [[None, prompt[start], None]] + [
                [rows[p - 1][prompt[p]].item(), prompt[p], None] for p in range(start + 1, len(prompt))]
            meta["output_token_logprobs"] = out_tokens
            if n > 0:
                meta["input_top_logprobs"] = [None] + [self._top(rows[p - 1], n) for p in range(start + 1, len(prompt))]
                meta["output_top_logprobs"] = out_tops
        return 200, {"text": "", "output_ids": ids[len(prompt):], "meta_info": meta}

    @staticmethod
    def _top(row, n: int):
        import torch
        if n <= 0:
            return None
        best = torch.topk(row, n)
        return [[v, i, None] for v, i in zip(best.values.tolist(), best.indices.tolist())]

    @staticmethod
    def _pick(row, params: dict, generator) -> int:
        import torch
        temperature = float(params.get("temperature", 1.0))
        if temperature < 1e-6 or int(params.get("top_k", -1)) == 1:
            return int(row.argmax())
        probs = torch.softmax(row / temperature, -1)
        k = int(params.get("top_k", -1))
        if 0 < k < probs.numel():
            probs = probs.masked_fill(probs < torch.topk(probs, k).values[-1], 0.0)
        top_p = float(params.get("top_p", 1.0))
        if top_p < 1.0:
            ordered, order = probs.sort(descending=True)
            before = ordered.cumsum(0) - ordered
            probs = torch.zeros_like(probs).scatter(0, order, ordered.masked_fill(before > top_p, 0.0))
        return int(torch.multinomial(probs, 1, generator=generator))


# ------------------------------------------------------------------ the fakes' common setup
# What the vLLM, SGLang and shared scoring-engine tests build alike: a tiny target over the word
# tokenizer (the module fixtures ``target`` and ``tokenizer``, which a test module imports), a fake
# engine served on them, short retries, three prompts, and a pair whose target is the fake at ``url``.

FAKE_VOCAB = 255          # the word tokenizer's
FAKE_LENGTH = 16
FAKE_PROMPTS = [[1, 7, 9, 30, 41], [1, 100, 101, 102, 17, 100, 101], [1, 5, 5, 5, 5, 5, 5, 6]]


def fast_backoff():
    from remote.transport import Backoff
    return Backoff(retries=1, first_s=0.01, timeout_s=5.0)


@pytest.fixture(scope="module")
def target():
    """The model behind every fake engine, once per test module that imports this fixture: a
    sharpened tiny Llama over the word vocabulary."""
    from tests.helpers.models import tiny_llama
    return tiny_llama(3, vocab_size=FAKE_VOCAB, hidden=32, logit_scale=8.0, max_positions=128)


@pytest.fixture(scope="module")
def tokenizer():
    """The word tokenizer that the fake engines and their drafters share."""
    from tests.helpers.tokenizers import word_tokenizer
    return word_tokenizer()


def fake_engine_fixture(handler_class):
    """A module fixture serving ``handler_class(target, tokenizer)`` on a :class:`FakeServer` (the
    handler at ``.handler``); a test module names it: ``fake = fake_engine_fixture(FakeVllm)``."""

    @pytest.fixture(scope="module")
    def fake(target, tokenizer):
        with FakeServer(handler_class(target, tokenizer)) as server:
            yield server

    return fake


def served_pair_at(url: str, drafter, tokenizer):
    """A pair whose target is the server at ``url`` (its kind detected) and ``drafter`` here."""
    from engine import served_pair_of
    from remote.connect import connect
    client = connect(url, backoff=fast_backoff())
    return served_pair_of(client, client.info(), drafter, tokenizer, drafter_name="tiny")
