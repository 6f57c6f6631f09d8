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
