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
