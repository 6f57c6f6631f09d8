"""A proxy that puts a network round trip between the REPL and a served target.

Every HTTP request is held for MS milliseconds (half before it is forwarded, half before the
answer goes back), then passed to the upstream server unchanged. Point ``--target-server`` at
the proxy to measure what a server farther away would give, and compare with ``/rtt``'s
prediction (scripts/rtt_check.py --target-server does both).

    python scripts/delay_proxy.py --upstream http://127.0.0.1:8080 --delay 20 --port 8090

Listens on 127.0.0.1 only. Standard library only.
"""

from __future__ import annotations

import argparse
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"


class DelayProxy:
    """``with DelayProxy(upstream, delay_ms) as proxy:`` ``proxy.url`` forwards to ``upstream``
    after ``delay_ms`` (``port`` 0: a free one)."""

    def __init__(self, upstream: str, delay_ms: float, port: int = 0):
        self.upstream = upstream.rstrip("/")
        self.delay_s = delay_ms / 1000.0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self, method: str):
                length = int(self.headers.get("Content-Length") or 0)
                data = self.rfile.read(length) if length else None
                time.sleep(outer.delay_s / 2)
                request = urllib.request.Request(outer.upstream + self.path, data=data, method=method,
                                                 headers={"Content-Type": self.headers.get("Content-Type",
                                                                                           "application/json")})
                try:
                    with urllib.request.urlopen(request, timeout=600) as answer:
                        status, body = answer.status, answer.read()
                except urllib.error.HTTPError as e:
                    status, body = e.code, e.read()
                except OSError as e:
                    status, body = 502, f'{{"error": {{"message": "proxy: {type(e).__name__}"}}}}'.encode()
                time.sleep(outer.delay_s / 2)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._forward("GET")

            def do_POST(self):
                self._forward("POST")

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((HOST, port), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://{HOST}:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> DelayProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the server's address, e.g. http://127.0.0.1:8080")
    parser.add_argument("--delay", type=float, default=20.0, help="milliseconds added to every request (default 20)")
    parser.add_argument("--port", type=int, default=8090)
    args = parser.parse_args(argv)
    with DelayProxy(args.upstream, args.delay, args.port) as proxy:
        print(f"{proxy.url} -> {args.upstream}, {args.delay:g} ms a request (Ctrl-C stops)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
