"""HTTP clients for a target model behind a serving engine (llama.cpp, vLLM, SGLang).

A client knows one engine's API: what the model is (vocabulary, context), how to tokenize a text
on the server, how to ask for the distribution after a prefix (top-N logprobs), and how to decode
with the server's own sampler. Every request goes through :class:`Transport`: a timeout, a
bounded number of retries with back-off for the faults that may pass (connection refused or
reset, a timeout, HTTP 5xx), and one line (:class:`ServerError`) for everything else. The time
each request took on the wire and the compute time the server reported are kept
(:class:`RequestTimes`). Standard library only; no torch.
"""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
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


@dataclass(frozen=True)
class ServedModelInfo:
    """What the server says about its model."""

    name: str
    vocab_size: int
    context_length: int | None
    detail: str = ""          # e.g. the weights' quantisation


@dataclass(frozen=True)
class SamplerFields:
    """The sampling settings a request sends, every one explicitly (an engine's defaults never apply).

    ``temperature`` 0 means greedy; ``top_k`` 0 and ``top_p`` 1 mean off.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class NextToken:
    """The distribution after a prefix: the top-N ids and their log-probabilities (raw, before any sampler)."""

    ids: list[int]
    logprobs: list[float]
    server_s: float
    wall_s: float


class ServerClient:
    """One engine's API. A kind subclasses it; ``KINDS`` maps a ``--server-kind`` name to its class."""

    kind = ""

    def __init__(self, transport: Transport):
        self.transport = transport

    @property
    def times(self) -> RequestTimes:
        return self.transport.times

    def info(self) -> ServedModelInfo:
        raise NotImplementedError

    def new_run(self) -> None:
        """A generation starts: its requests must not reuse what another run left in the
        server's prompt cache, so that each strategy pays its own prompt, as a local one does."""

    def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    def next_token(self, prefix: list[int], n_probs: int) -> NextToken:
        raise NotImplementedError

    def rows(self, sequence: list[int], keep: int, n_probs: int) -> list[NextToken]:
        """The distributions after each of the last ``keep`` prefixes of ``sequence`` (a verify
        round's positions). Here one request each; an engine that scores a prompt's positions
        overrides it with one request in all."""
        start = len(sequence) - keep + 1
        return [self.next_token(sequence[:start + j], n_probs) for j in range(keep)]

    def decode(self, prompt: list[int], max_new: int, fields: SamplerFields):
        """Yield ``(token, seconds_since_the_last)`` as the server's own sampler makes them."""
        raise NotImplementedError


class LlamaCppClient(ServerClient):
    """llama.cpp's ``llama-server`` (also ``xllamacpp.Server``): ``/completion`` with token ids.

    ``/completion`` returns the distribution after the last prompt token only, so a verify round
    of γ drafts costs γ+1 requests (``cache_prompt`` reuses the prefix each time). ``n_probs``
    gives the top-N of the model's raw softmax, before temperature and the sampler chain (checked
    in tests/test_served.py: the same numbers at every temperature; ``post_sampling_probs`` off).
    """

    kind = "llamacpp"

    def __init__(self, transport: Transport):
        super().__init__(transport)
        self._fresh = False

    def new_run(self) -> None:
        """The run's first request goes with ``cache_prompt`` off: the slot evaluates the whole
        prompt (and keeps it for the run's next requests) instead of reusing another run's."""
        self._fresh = True

    def info(self) -> ServedModelInfo:
        answer, _ = self.transport.get("/v1/models")
        try:
            entry = answer["data"][0]
            meta = entry["meta"]
            return ServedModelInfo(str(entry.get("id", "?")).rsplit("/", 1)[-1], int(meta["n_vocab"]),
                                   int(meta.get("n_ctx") or 0) or None, str(meta.get("ftype", "")))
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(f"{self.transport.url}/v1/models does not describe a llama.cpp model "
                              "(no data[0].meta.n_vocab): is it another engine? pass --server-kind") from None

    def tokenize(self, text: str) -> list[int]:
        answer, _ = self.transport.post("/tokenize", {"content": text, "add_special": False})
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise ServerError(f"{self.transport.url}/tokenize returned no token list")
        return [int(t) for t in tokens]

    def _body(self, prompt: list[int], n_predict: int, fields: SamplerFields, n_probs: int) -> dict:
        """Every sampling field, explicitly: the server's defaults (top_k 40, top_p 0.95, min_p 0.05,
        temperature last) never apply. Greedy is top_k 1 then temperature 0. ``ignore_eos`` stays off:
        llama.cpp implements it as a -inf bias on the end tokens, so the sampler would never pick
        one that its ``n_probs`` still ranks first."""
        if fields.greedy:
            samplers, top_k = ["top_k", "temperature"], 1
        else:   # the order of sampling.processors: temperature, then top-k, then top-p
            samplers, top_k = ["temperature", "top_k", "top_p"], fields.top_k
        fresh, self._fresh = self._fresh, False
        return {"prompt": prompt, "n_predict": n_predict, "n_probs": n_probs, "post_sampling_probs": False,
                "cache_prompt": not fresh, "samplers": samplers, "temperature": fields.temperature, "top_k": top_k,
                "top_p": fields.top_p, "min_p": 0.0, "typical_p": 1.0, "top_n_sigma": -1.0,
                "xtc_probability": 0.0, "repeat_penalty": 1.0, "presence_penalty": 0.0,
                "frequency_penalty": 0.0, "dry_multiplier": 0.0, "mirostat": 0, "ignore_eos": False,
                "seed": fields.seed, "return_tokens": True, "stream": False}

    # How many tokens a position may ban before its answer is taken as lacking probabilities.
    MAX_BANNED = 8

    def next_token(self, prefix: list[int], n_probs: int) -> NextToken:
        """The top ``n_probs`` after ``prefix``. llama.cpp sends no probabilities with a token
        whose text ends inside a UTF-8 character (a byte-level piece: it holds the text back, and
        the probabilities with it), so a position whose greedy token is one is asked again with
        that token banned (``logit_bias``, which acts in the sampler: ``n_probs`` stays the raw
        softmax, the banned token in it) until the picked token is a whole one; each such request
        is counted and timed like any other."""
        banned: list[int] = []
        server_s = wall = 0.0
        while True:
            body = self._body(prefix, 1, SamplerFields(), n_probs)
            if banned:
                body["logit_bias"] = [[token, False] for token in banned]
            answer, took = self.transport.post("/completion", body)
            spent = _server_seconds(answer)
            self.times.add(took, spent)
            server_s, wall = server_s + spent, wall + took
            picked = int(answer["tokens"][0]) if answer.get("tokens") else None
            probabilities = answer.get("completion_probabilities")
            if not probabilities and picked is not None and picked not in banned and len(banned) < self.MAX_BANNED:
                banned.append(picked)
                continue
            break
        try:
            row = probabilities[0]["top_logprobs"]
            ids = [int(e["id"]) for e in row]
            logprobs = [float(e["logprob"]) for e in row]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(f"{self.transport.url}/completion ignored n_probs: the answer has no "
                              "completion_probabilities[0].top_logprobs") from None
        if len(ids) < n_probs:
            raise ServerError(f"{self.transport.url}/completion returned {len(ids)} logprobs, not the "
                              f"{n_probs} asked for (a field ignored, or a smaller vocabulary)")
        best = next((i for i in ids if i not in banned), None)
        if picked is not None and best is not None and picked != best:
            raise ServerError(f"{self.transport.url}/completion ignored the greedy settings: it sampled "
                              f"{picked}, not its top-1 {best}")
        if banned and ids[:len(banned)] != banned:
            raise ServerError(f"{self.transport.url}/completion: the probabilities moved with logit_bias "
                              "(they are not the raw softmax)")
        return NextToken(ids, logprobs, server_s, wall)

    def decode(self, prompt: list[int], max_new: int, fields: SamplerFields):
        """The server's own decode, one request per token so that each is timed and Ctrl-C keeps
        the tokens made (the prefix is cached on the server, so each request feeds one token)."""
        self.new_run()
        ids = list(prompt)
        for _ in range(max_new):
            # A seed per position: one seed for every request would draw the same uniform each time.
            step = SamplerFields(fields.temperature, fields.top_k, fields.top_p,
                                 (fields.seed * 1_000_003 + len(ids)) % 2**32)
            answer, wall = self.transport.post("/completion", self._body(ids, 1, step, 0))
            self.times.add(wall, _server_seconds(answer))
            tokens = answer.get("tokens")
            if not tokens:
                raise ServerError(f"{self.transport.url}/completion returned no token ids (return_tokens ignored)")
            ids.append(int(tokens[0]))
            yield int(tokens[0]), wall


def _server_seconds(answer: dict) -> float:
    """The compute the server reported (llama.cpp: prompt and predicted milliseconds), else 0."""
    timings = answer.get("timings") if isinstance(answer, dict) else None
    if not isinstance(timings, dict):
        return 0.0
    return (float(timings.get("prompt_ms") or 0.0) + float(timings.get("predicted_ms") or 0.0)) / 1000.0


class VllmClient(ServerClient):
    """vLLM's OpenAI server: ``/v1/completions`` with a prompt of token ids.

    ``prompt_logprobs: N`` returns, for every prompt position, the top N of the distribution that
    predicts it (the position's own token added with its rank), and ``logprobs: N`` the top N after
    the last: a verify round is one request whatever γ. Such a request skips vLLM's prefix cache,
    so each recomputes its context. The logprobs are the raw model's (vLLM's default
    ``logprobs_mode``, before temperature and the sampler). The compute the server spent is read
    from the response's ``metrics`` when vLLM runs with ``--enable-per-request-metrics`` (queue plus
    time to the first token); otherwise the whole request time counts as round trip. The
    vocabulary size is read once with ``logprobs: -1``, which needs ``--max-logprobs -1``.
    """

    kind = "vllm"

    def __init__(self, transport: Transport):
        super().__init__(transport)
        self._model = ""
        self._salt = ""

    def new_run(self) -> None:
        """A fresh ``cache_salt`` for the run's requests: vLLM shares cached prefixes only among
        requests of the same salt, so a run never reads another's prompt from the cache."""
        self._salt = uuid.uuid4().hex

    def model(self) -> str:
        if not self._model:
            answer, _ = self.transport.get("/v1/models")
            try:
                self._model = str(answer["data"][0]["id"])
            except (KeyError, IndexError, TypeError):
                raise ServerError(f"{self.transport.url}/v1/models lists no model") from None
        return self._model

    def info(self) -> ServedModelInfo:
        answer, _ = self.transport.get("/v1/models")
        try:
            entry = answer["data"][0]
            self._model = str(entry["id"])
            context = int(entry.get("max_model_len") or 0) or None
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(f"{self.transport.url}/v1/models lists no model: is it a vLLM server?") from None
        try:
            whole = self._complete([0], 1, SamplerFields(), logprobs=-1)
        except ServerError as e:
            if "max allowed" not in str(e):
                raise
            raise ServerError(f"{self.transport.url} caps logprobs ({str(e).rsplit(': ', 1)[-1]}): start vLLM "
                              "with --max-logprobs -1 so that the client can read the vocabulary size") from None
        vocab = len(self._choice(whole).get("logprobs", {}).get("top_logprobs", [{}])[0])
        return ServedModelInfo(self._model.rstrip("/").rsplit("/", 1)[-1], vocab, context, "vLLM")

    def tokenize(self, text: str) -> list[int]:
        return _tokenize_prompt(self.transport, self.model(), text)

    def _complete(self, prompt: list[int], max_tokens: int, fields: SamplerFields, *, logprobs: int,
                  prompt_logprobs: int | None = None) -> dict:
        """One ``/v1/completions`` request; every sampling field explicit (vLLM's order: penalties,
        temperature, min-p, top-k, top-p; penalties and min-p off, so ours). ``ignore_eos`` stays
        off and end tokens are decoded, not skipped."""
        body = {"model": self.model(), "prompt": prompt, "max_tokens": max_tokens, "n": 1,
                "temperature": fields.temperature, "top_k": fields.top_k if fields.top_k > 0 else -1,
                "top_p": fields.top_p, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                "frequency_penalty": 0.0, "seed": fields.seed, "ignore_eos": False, "min_tokens": 0,
                "stop": [], "stop_token_ids": [], "skip_special_tokens": False, "add_special_tokens": False,
                "logprobs": logprobs, "return_tokens_as_token_ids": True, "return_token_ids": True,
                "stream": False}
        if prompt_logprobs is not None:
            body["prompt_logprobs"] = prompt_logprobs
        if self._salt:
            body["cache_salt"] = self._salt
        answer, wall = self.transport.post("/v1/completions", body)
        self.times.add(wall, _vllm_server_seconds(answer))
        answer["_wall_s"] = wall
        return answer

    def _choice(self, answer: dict) -> dict:
        try:
            return answer["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise ServerError(f"{self.transport.url}/v1/completions returned no choice") from None

    def next_token(self, prefix: list[int], n_probs: int) -> NextToken:
        return self.rows(prefix, 1, n_probs)[0]

    def rows(self, sequence: list[int], keep: int, n_probs: int) -> list[NextToken]:
        """Every position of a verify round in one request: ``prompt_logprobs`` for the prefixes
        inside the sequence, the sampled token's ``logprobs`` for the whole of it."""
        inside = keep - 1
        answer = self._complete(sequence, 1, SamplerFields(), logprobs=n_probs,
                                prompt_logprobs=n_probs if inside else None)
        choice, wall = self._choice(answer), answer["_wall_s"]
        server_s = _vllm_server_seconds(answer)
        tops = []
        if inside:
            scored = choice.get("prompt_logprobs")
            if not isinstance(scored, list) or len(scored) != len(sequence):
                raise ServerError(f"{self.transport.url}/v1/completions ignored prompt_logprobs: no score "
                                  f"for each of the {len(sequence)} prompt tokens")
            for position in range(len(sequence) - inside, len(sequence)):
                tops.append(self._prompt_row(scored[position], n_probs, server_s, wall))
        tops.append(self._last_row(choice, n_probs, server_s, wall))
        return tops

    def _prompt_row(self, entry, n_probs: int, server_s: float, wall: float) -> NextToken:
        """A ``prompt_logprobs`` entry ({id: {logprob, rank}}): its top N by rank, best first (the
        position's own token, added when it ranks lower, is left out: a row holds the top N)."""
        try:
            ranked = sorted((int(v["rank"]), int(k), float(v["logprob"])) for k, v in entry.items())
        except (AttributeError, KeyError, TypeError, ValueError):
            raise ServerError(f"{self.transport.url}/v1/completions: a prompt_logprobs entry is not "
                              "{id: {logprob, rank}}") from None
        kept = [(i, lp) for rank, i, lp in ranked if rank <= n_probs]
        return self._checked(kept, n_probs, server_s, wall)

    def _last_row(self, choice: dict, n_probs: int, server_s: float, wall: float) -> NextToken:
        """The top N after the whole prompt (``logprobs``, keyed ``token_id:ID``); the token vLLM
        sampled greedily must be its top-1."""
        try:
            top = choice["logprobs"]["top_logprobs"][0]
            pairs = sorted(((int(str(k).rsplit(":", 1)[-1]), float(v)) for k, v in top.items()),
                           key=lambda e: -e[1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(f"{self.transport.url}/v1/completions ignored logprobs or "
                              "return_tokens_as_token_ids: no top_logprobs keyed token_id:ID") from None
        row = self._checked(pairs[:n_probs], n_probs, server_s, wall)
        sampled = (choice.get("token_ids") or [None])[0]
        tied = len(row.logprobs) > 1 and row.logprobs[0] == row.logprobs[1]
        if sampled is not None and int(sampled) != row.ids[0] and not tied:
            raise ServerError(f"{self.transport.url}/v1/completions ignored the greedy settings: it sampled "
                              f"{sampled}, not its top-1 {row.ids[0]}")
        return row

    def _checked(self, pairs: list[tuple[int, float]], n_probs: int, server_s: float, wall: float) -> NextToken:
        if len(pairs) < n_probs:
            raise ServerError(f"{self.transport.url}/v1/completions returned {len(pairs)} logprobs, not the "
                              f"{n_probs} asked for (start vLLM with --max-logprobs -1)")
        return NextToken([i for i, _ in pairs], [lp for _, lp in pairs], server_s, wall)

    def decode(self, prompt: list[int], max_new: int, fields: SamplerFields):
        """vLLM's own decode, one request per token (each timed; Ctrl-C keeps what was made; its
        prefix cache holds the context), a seed per position as for llama.cpp."""
        self.new_run()
        ids = list(prompt)
        for _ in range(max_new):
            step = SamplerFields(fields.temperature, fields.top_k, fields.top_p,
                                 (fields.seed * 1_000_003 + len(ids)) % 2**32)
            answer = self._complete(ids, 1, step, logprobs=0)
            tokens = self._choice(answer).get("token_ids")
            if not tokens:
                raise ServerError(f"{self.transport.url}/v1/completions returned no token ids "
                                  "(return_token_ids ignored)")
            ids.append(int(tokens[0]))
            yield int(tokens[0]), answer["_wall_s"]


def _tokenize_prompt(transport: Transport, model: str, text: str) -> list[int]:
    """``/tokenize`` as vLLM and SGLang both take it: ``{model, prompt, add_special_tokens}`` in,
    ``{tokens}`` out."""
    answer, _ = transport.post("/tokenize", {"model": model, "prompt": text, "add_special_tokens": False})
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list):
        raise ServerError(f"{transport.url}/tokenize returned no token list")
    return [int(t) for t in tokens]


def _vllm_server_seconds(answer: dict) -> float:
    """vLLM's per-request metrics (``--enable-per-request-metrics``): queue time plus time to the
    first token, the compute of a one-token request; 0 when the server does not report them."""
    metrics = answer.get("metrics") if isinstance(answer, dict) else None
    if not isinstance(metrics, dict):
        return 0.0
    return (float(metrics.get("queue_time_ms") or 0.0) + float(metrics.get("time_to_first_token_ms") or 0.0)) / 1000.0


class SglangClient(ServerClient):
    """SGLang's native API: ``/generate`` with ``input_ids``.

    ``return_logprob`` with ``logprob_start_len: S`` and ``top_logprobs_num: N`` returns in
    ``meta_info.input_top_logprobs`` the top N of the distribution that predicts each prompt token
    from position S on, and ``output_top_logprobs`` the top N after the whole prompt: a verify round
    is one request whatever γ. SGLang reuses its radix (prefix) cache up to S (the matched prefix is
    capped there: python/sglang/srt/managers/schedule_batch.py), so a request recomputes only the
    positions it scores. The facts it rests on, from sgl-project/sglang:

    - request fields: ``GenerateReqInput`` (python/sglang/srt/managers/io_struct.py) and
      ``SamplingParams`` (python/sglang/srt/sampling/sampling_params.py: temperature 0 becomes
      top_k 1 at temperature 1, top_k -1 means the whole vocabulary, every field has a default and
      ``--preferred-sampling-params`` fills the ones a request leaves out (tokenizer_manager.py,
      ``_create_tokenized_object``), so all are sent);
    - the input entries (``add_input_logprob_return_values`` in
      python/sglang/srt/managers/scheduler_output_processor_mixin.py): the first is None, entry j
      is the token at position S + j with the distribution after the prefix before it; the
      distribution after the last prompt token is the first output entry, not an input one;
    - each entry is ``[logprob, token_id, text]`` (text None without ``return_text_in_logprobs``),
      a position's top list None when it has none (``detokenize_top_logprobs_tokens`` in
      python/sglang/srt/managers/tokenizer_manager.py);
    - the logprobs of a greedy request are the raw model's: python/sglang/srt/layers/sampler.py takes
      ``log_softmax`` of the logits before any processing when a batch is all greedy, and otherwise
      divides by the request's temperature (1 for a greedy request, whatever
      ``SGLANG_RETURN_ORIGINAL_LOGPROB`` says) and renormalises over its top-p (1 here). The client
      reads logprobs from greedy requests only;
    - ``meta_info.e2e_latency`` (tokenizer_manager.py: from the request's arrival to its end on the
      server) is taken as the server's seconds; ``/v1/models`` is owned by ``sglang`` and gives
      ``max_model_len`` (python/sglang/srt/entrypoints/openai/protocol.py, ``ModelCard``);
      ``/tokenize`` takes ``prompt`` and ``add_special_tokens`` and returns ``tokens``.

    SGLang publishes its vocabulary size nowhere (``/get_model_info`` has no such field). It states
    it in one refusal: ``SamplingParams.verify`` bounds ``logit_bias`` keys by the model's vocabulary
    ("logit_bias must has keys in [0, V-1]"), checked before the request is scheduled; ``info()``
    sends one request built to be refused that way and reads V from the answer, or refuses.
    """

    kind = "sglang"
    _PROBE_ID = 1_000_000_000          # a logit_bias key above any vocabulary
    _BOUND = re.compile(r"logit_bias must ha\w* keys in \[0, (\d+)\]")

    def __init__(self, transport: Transport):
        super().__init__(transport)
        self._model = ""
        self._key = ""

    def new_run(self) -> None:
        """A fresh ``extra_key`` for the run's requests: SGLang's radix cache keys prefixes by it
        (``GenerateReqInput.extra_key``, the field its ``cache_salt`` feeds), so a run never reads
        another's prompt from the cache."""
        self._key = uuid.uuid4().hex

    def model(self) -> str:
        if not self._model:
            self._models()
        return self._model

    def _models(self) -> int | None:
        """The served model's name (``/v1/models``), kept; its context length."""
        answer, _ = self.transport.get("/v1/models")
        try:
            entry = answer["data"][0]
            self._model = str(entry["id"])
            return int(entry.get("max_model_len") or 0) or None
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(f"{self.transport.url}/v1/models lists no model: is it an SGLang server?") from None

    def info(self) -> ServedModelInfo:
        context = self._models()
        return ServedModelInfo(self._model.rstrip("/").rsplit("/", 1)[-1], self._vocab_size(), context, "SGLang")

    def _vocab_size(self) -> int:
        """V, from SGLang's refusal of a ``logit_bias`` key outside the vocabulary (see the class)."""
        body = {"input_ids": [0], "sampling_params": {"max_new_tokens": 0, "logit_bias": {str(self._PROBE_ID): 0.0}},
                "stream": False}
        try:
            self.transport.post("/generate", body)
        except ServerError as e:
            found = self._BOUND.search(str(e))
            if found:
                return int(found.group(1)) + 1
            raise ServerError(f"{self.transport.url}/generate does not state its vocabulary size ({e}): "
                              "an SGLang with logit_bias checks is needed") from None
        raise ServerError(f"{self.transport.url}/generate accepted a logit_bias key outside any vocabulary, so its "
                          "vocabulary size cannot be read: an SGLang with logit_bias checks is needed")

    def tokenize(self, text: str) -> list[int]:
        return _tokenize_prompt(self.transport, self.model(), text)

    @staticmethod
    def _sampling(max_new_tokens: int, fields: SamplerFields) -> dict:
        """Every sampling field, explicitly (SGLang's order: temperature, then top-k and top-p on the
        softmax; min-p and every penalty off). ``ignore_eos`` stays off and end tokens are kept in the
        text, not trimmed (the loop stops at end tokens itself)."""
        return {"max_new_tokens": max_new_tokens, "temperature": fields.temperature,
                "top_k": fields.top_k if fields.top_k > 0 else -1, "top_p": fields.top_p, "min_p": 0.0,
                "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0,
                "min_new_tokens": 0, "n": 1, "stop": [], "stop_token_ids": [], "ignore_eos": False,
                "skip_special_tokens": False, "spaces_between_special_tokens": True, "no_stop_trim": True,
                "sampling_seed": fields.seed}

    def _generate(self, input_ids: list[int], fields: SamplerFields, *, logprob_start: int | None = None,
                  n_probs: int = 0) -> dict:
        """One ``/generate`` request for one new token; logprobs asked for when ``logprob_start`` is set."""
        body = {"input_ids": input_ids, "sampling_params": self._sampling(1, fields), "stream": False}
        if self._key:
            body["extra_key"] = self._key
        if logprob_start is not None:
            body.update(return_logprob=True, logprob_start_len=logprob_start, top_logprobs_num=n_probs,
                        return_text_in_logprobs=False)
        answer, wall = self.transport.post("/generate", body)
        if not isinstance(answer, dict) or not isinstance(answer.get("meta_info"), dict):
            raise ServerError(f"{self.transport.url}/generate returned no meta_info: is it an SGLang server?")
        self.times.add(wall, _sglang_server_seconds(answer))
        answer["_wall_s"] = wall
        return answer

    def next_token(self, prefix: list[int], n_probs: int) -> NextToken:
        return self.rows(prefix, 1, n_probs)[0]

    def rows(self, sequence: list[int], keep: int, n_probs: int) -> list[NextToken]:
        """Every position of a verify round in one greedy request: ``logprob_start_len`` L - keep
        scores the prompt tokens after it (the prefixes inside the sequence), the first output entry
        is the distribution after the whole sequence."""
        answer = self._generate(sequence, SamplerFields(), logprob_start=len(sequence) - keep, n_probs=n_probs)
        meta, wall = answer["meta_info"], answer["_wall_s"]
        server_s = _sglang_server_seconds(answer)
        if meta.get("prompt_tokens") not in (None, len(sequence)):
            raise ServerError(f"{self.transport.url}/generate read {meta['prompt_tokens']} prompt tokens, not the "
                              f"{len(sequence)} ids sent")
        inside = keep - 1
        tops = [self._checked(entries, n_probs, server_s, wall) for entries in self._input_rows(meta, sequence, inside)]
        return tops + [self._last_row(meta, n_probs, server_s, wall)]

    def _input_rows(self, meta: dict, sequence: list[int], inside: int) -> list:
        """The top lists of the last ``inside`` prompt positions; each entry's token (in
        ``input_token_logprobs``) must be the sequence's token there, or the rows are not where they
        are read."""
        if not inside:
            return []
        tops, tokens = meta.get("input_top_logprobs"), meta.get("input_token_logprobs")
        if not isinstance(tops, list) or not isinstance(tokens, list) or len(tops) < inside or len(tokens) < inside:
            raise ServerError(f"{self.transport.url}/generate ignored logprob_start_len or top_logprobs_num: no "
                              f"input_top_logprobs for the last {inside} prompt tokens")
        try:
            scored = [int(entry[1]) for entry in tokens[-inside:]]
        except (IndexError, TypeError, ValueError):
            raise ServerError(f"{self.transport.url}/generate: an input_token_logprobs entry is not "
                              "[logprob, token_id, text]") from None
        if scored != sequence[-inside:]:
            raise ServerError(f"{self.transport.url}/generate scored the tokens {scored}, not the last {inside} "
                              f"sent ({sequence[-inside:]}): its input logprobs are not where SGLang puts them")
        return tops[-inside:]

    def _last_row(self, meta: dict, n_probs: int, server_s: float, wall: float) -> NextToken:
        """The top N after the whole prompt; the token SGLang sampled greedily must be its top-1."""
        try:
            entries = meta["output_top_logprobs"][0]
            sampled = int(meta["output_token_logprobs"][0][1])
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServerError(f"{self.transport.url}/generate ignored return_logprob or top_logprobs_num: no "
                              "output_top_logprobs") from None
        row = self._checked(entries, n_probs, server_s, wall)
        tied = len(row.logprobs) > 1 and row.logprobs[0] == row.logprobs[1]
        if sampled != row.ids[0] and not tied:
            raise ServerError(f"{self.transport.url}/generate ignored the greedy settings: it sampled "
                              f"{sampled}, not its top-1 {row.ids[0]}")
        return row

    def _checked(self, entries, n_probs: int, server_s: float, wall: float) -> NextToken:
        """A position's ``[logprob, token_id, text]`` list as a row, best first; exactly N of them."""
        try:
            pairs = sorted(((int(e[1]), float(e[0])) for e in entries or []), key=lambda p: -p[1])
        except (IndexError, TypeError, ValueError):
            raise ServerError(f"{self.transport.url}/generate: a top logprobs entry is not "
                              "[logprob, token_id, text]") from None
        if len(pairs) < n_probs:
            raise ServerError(f"{self.transport.url}/generate returned {len(pairs)} logprobs, not the "
                              f"{n_probs} asked for (top_logprobs_num ignored, or a smaller vocabulary)")
        pairs = pairs[:n_probs]
        return NextToken([i for i, _ in pairs], [lp for _, lp in pairs], server_s, wall)

    def decode(self, prompt: list[int], max_new: int, fields: SamplerFields):
        """SGLang's own decode, one request per token (each timed; Ctrl-C keeps what was made; its
        radix cache holds the context), a seed per position as for llama.cpp (``sampling_seed``:
        SGLang draws with it when started with ``--enable-deterministic-inference``)."""
        self.new_run()
        ids = list(prompt)
        for _ in range(max_new):
            step = SamplerFields(fields.temperature, fields.top_k, fields.top_p,
                                 (fields.seed * 1_000_003 + len(ids)) % 2**32)
            answer = self._generate(ids, step)
            tokens = answer.get("output_ids")
            if not tokens:
                raise ServerError(f"{self.transport.url}/generate returned no output_ids")
            ids.append(int(tokens[0]))
            yield int(tokens[0]), answer["_wall_s"]


def _sglang_server_seconds(answer: dict) -> float:
    """SGLang's ``meta_info.e2e_latency``: the seconds from the request's arrival to its end on the
    server (queue, compute, detokenising); 0 when it is not reported."""
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    latency = meta.get("e2e_latency") if isinstance(meta, dict) else None
    return float(latency) if isinstance(latency, (int, float)) else 0.0


KINDS: dict[str, type[ServerClient]] = {"llamacpp": LlamaCppClient, "vllm": VllmClient, "sglang": SglangClient}
# Named so that a user sees them refused in one line rather than as unknown words (none at present).
PLANNED: tuple[str, ...] = ()


def detect_kind(transport: Transport) -> str:
    """The engine behind ``transport``: llama.cpp answers ``/props`` with
    ``default_generation_settings``; vLLM and SGLang list their models as ``owned_by: vllm`` or
    ``sglang``; an SGLang whose ``/v1/models`` says nothing answers ``/get_model_info`` with
    ``model_path`` and ``is_generation``."""
    props = _get_or_empty(transport, "/props")
    if "default_generation_settings" in props:
        return "llamacpp"
    models = _get_or_empty(transport, "/v1/models")
    owners = {str(m.get("owned_by", "")).lower() for m in (models.get("data") or []) if isinstance(m, dict)}
    for kind in KINDS:
        if kind in owners:
            return kind
    if {"model_path", "is_generation"} <= set(_get_or_empty(transport, "/get_model_info")):
        return "sglang"
    raise ServerError(f"{transport.url} is neither a llama.cpp server (/props), a vLLM one (/v1/models owned by "
                      f"vllm) nor an SGLang one (/v1/models owned by sglang, /get_model_info): pass --server-kind "
                      f"({', '.join(KINDS)})")


def _get_or_empty(transport: Transport, path: str) -> dict:
    """``path``'s JSON object, or {} when the server has no such path (HTTP 404) or answers no object."""
    try:
        answer, _ = transport.get(path)
    except ServerError as e:
        if "HTTP 404" not in str(e):
            raise
        return {}
    return answer if isinstance(answer, dict) else {}


def connect(url: str, kind: str | None = None, backoff: Backoff = Backoff()) -> ServerClient:
    """A client for the server at ``url`` (``kind`` detected when None)."""
    transport = Transport(url, backoff)
    name = (kind or "").strip().lower() or detect_kind(transport)
    if name in PLANNED:
        raise ServerError(f"--server-kind {name}: not supported yet (supported: {', '.join(KINDS)})")
    if name not in KINDS:
        raise ServerError(f"--server-kind {name!r} is unknown (supported: {', '.join(KINDS)})")
    return KINDS[name](transport)
