"""The HTTP transport every served-target client shares: JSON over HTTP to one server.

Every request goes through :class:`Transport`: a timeout, a bounded number of retries with
back-off for the faults that may pass (connection refused or reset, a timeout, HTTP 5xx), and one
line (:class:`ServerError`) for everything else. The time each request took on the wire and the
compute time the server reported are kept (:class:`RequestTimes`). Standard library only; no torch.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass


class ServerError(ValueError):
    """A served target failed or answered what cannot be used: one line for the user."""


@dataclass
class RequestTimes:
    """Requests made, and their seconds: on the wire (sent to read) and reported by the server."""

    requests: int = 0
    wall_s: float = 0.0
    server_s: float = 0.0
    retries: int = 0

    def add(self, wall_s: float, server_s: float) -> None:
        self.requests += 1
        self.wall_s += wall_s
        self.server_s += server_s

    def mark(self) -> tuple[int, float, float, int]:
        """Where the counters stand now, for :meth:`since`."""
        return self.requests, self.wall_s, self.server_s, self.retries

    def since(self, mark: tuple[int, float, float, int]) -> dict:
        """The figures of the requests made after ``mark`` (:meth:`to_dict`'s form)."""
        requests, wall, server, retries = mark
        return RequestTimes(self.requests - requests, self.wall_s - wall, self.server_s - server,
                            self.retries - retries).to_dict()

    def to_dict(self) -> dict:
        """The result's ``network`` figures: the round trip is the wire time the server did not report."""
        rtt = max(self.wall_s - self.server_s, 0.0)
        return {"requests": self.requests, "request_s": self.wall_s, "server_s": self.server_s,
                "round_trip_s": rtt, "round_trip_per_request_ms": 1000 * rtt / self.requests if self.requests else 0.0,
                "retries": self.retries}


@dataclass(frozen=True)
class Backoff:
    """How a request is retried: ``retries`` more tries after the first, waiting ``first_s``, doubled each time."""

    retries: int = 2
    first_s: float = 0.25
    timeout_s: float = 30.0


def check_url(url: str) -> str:
    """``url`` without a trailing slash, or a one-line refusal (http(s)://host[:port] only)."""
    text = (url or "").strip().rstrip("/")
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServerError(f"--target-server {url!r} is not a server address: give http://HOST:PORT")
    try:
        parts.port
    except ValueError:
        raise ServerError(f"--target-server {url!r} has a port that is not a number") from None
    return text


class Transport:
    """JSON over HTTP to one server, with bounded retries; every fault becomes a :class:`ServerError`."""

    def __init__(self, url: str, backoff: Backoff = Backoff()):
        self.url = check_url(url)
        self.backoff = backoff
        self.times = RequestTimes()

    def get(self, path: str) -> tuple[dict, float]:
        return self._request(path, None)

    def post(self, path: str, body: dict) -> tuple[dict, float]:
        return self._request(path, json.dumps(body).encode())

    def _request(self, path: str, data: bytes | None) -> tuple[dict, float]:
        """The decoded JSON answer and the seconds it took; retried on faults that may pass."""
        wait = self.backoff.first_s
        for attempt in range(self.backoff.retries + 1):
            try:
                return self._once(path, data)
            except _Passing as e:
                if attempt == self.backoff.retries:
                    raise ServerError(f"{self.url}{path}: {e} (after {attempt + 1} tries)") from None
                self.times.retries += 1
                time.sleep(wait)
                wait *= 2
        raise AssertionError("unreachable")

    def _once(self, path: str, data: bytes | None) -> tuple[dict, float]:
        request = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=self.backoff.timeout_s) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as e:
            detail = _error_text(e)
            if e.code >= 500:
                raise _Passing(f"HTTP {e.code}{detail}") from None
            raise ServerError(f"{self.url}{path}: HTTP {e.code}{detail}") from None
        except (socket.timeout, TimeoutError):
            raise _Passing(f"no answer within {self.backoff.timeout_s:g} s") from None
        except urllib.error.URLError as e:
            reason = e.reason
            if isinstance(reason, (socket.timeout, TimeoutError)):
                raise _Passing(f"no answer within {self.backoff.timeout_s:g} s") from None
            raise _Passing(f"cannot reach the server ({_reason_text(reason)})") from None
        except (ConnectionError, OSError) as e:
            raise _Passing(f"the connection failed ({_reason_text(e)})") from None
        seconds = time.perf_counter() - start
        try:
            return json.loads(raw), seconds
        except ValueError:
            raise ServerError(f"{self.url}{path}: the answer is not JSON ({raw[:60]!r})") from None


class _Passing(Exception):
    """A fault that may pass (refused, reset, timed out, 5xx): retried."""


def _reason_text(reason) -> str:
    text = getattr(reason, "strerror", None) or str(reason)
    return str(text).strip().splitlines()[0] if str(text).strip() else type(reason).__name__


def _error_text(error: urllib.error.HTTPError) -> str:
    """': <the server's message>' from an HTTP error's JSON body, when it has one."""
    try:
        body = json.loads(error.read() or b"{}")
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    message = body.get("error", {}).get("message") if isinstance(body.get("error"), dict) else body.get("error")
    message = message or body.get("message")        # SGLang's OpenAI routes answer {"object": "error", "message"}
    return f": {str(message).splitlines()[0]}" if message else ""
