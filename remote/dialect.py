"""What every engine's client shares: the shape of a client, and of its answers.

:class:`ServerClient` is the shape (model facts, tokenizing on the server, the top-N after a prefix,
decoding with the server's sampler) and the decode loop; :class:`ScoringClient` adds what vLLM and
SGLang share. ``remote.connect`` picks a client. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass

from remote.transport import RequestTimes, ServerError, Transport


@dataclass(frozen=True)
class ServedModelInfo:
    """What the server says about its model."""

    name: str
    vocab_size: int
    context_length: int | None
    detail: str = ""          # e.g. the weights' quantisation


@dataclass(frozen=True)
class SamplerFields:
    """The sampling settings a request sends, every one explicitly; ``temperature`` 0 is greedy,
    ``top_k`` 0 and ``top_p`` 1 are off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def at(self, position: int) -> SamplerFields:
        """The same settings with a seed of ``position``'s own: one seed for every request of a
        decode would draw the same uniform each time."""
        return SamplerFields(self.temperature, self.top_k, self.top_p, (self.seed * 1_000_003 + position) % 2**32)


@dataclass
class NextToken:
    """The distribution after a prefix: the top-N ids and their log-probabilities (raw, before any sampler)."""

    ids: list[int]
    logprobs: list[float]
    server_s: float
    wall_s: float


class ServerClient:
    """One engine's API. A kind subclasses it; ``remote.connect.KINDS`` maps a ``--server-kind``
    name to its class."""

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

    def sample(self, ids: list[int], fields: SamplerFields) -> tuple[int, float]:
        """One token after ``ids`` from the server's own sampler, and the request's seconds."""
        raise NotImplementedError

    def decode(self, prompt: list[int], max_new: int, fields: SamplerFields):
        """Yield ``(token, seconds_since_the_last)`` as the server's own sampler makes them: one
        request per token, so that each is timed and Ctrl-C keeps the tokens made (the prefix is
        cached on the server, so each request feeds one token); a seed per position."""
        self.new_run()
        ids = list(prompt)
        for _ in range(max_new):
            token, wall = self.sample(ids, fields.at(len(ids)))
            ids.append(token)
            yield token, wall

    def token_list(self, answer, path: str) -> list[int]:
        """The ``tokens`` of a ``/tokenize`` answer, or a one-line refusal."""
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list):
            raise ServerError(f"{self.transport.url}{path} returned no token list")
        return [int(t) for t in tokens]


class ScoringClient(ServerClient):
    """An engine that scores a prompt's positions (vLLM, SGLang): a verify round is one request whatever
    γ. ``route`` is the path its scoring requests go to."""

    route = ""
    server = ""          # how a refusal names the engine: "a vLLM server"

    def __init__(self, transport: Transport):
        super().__init__(transport)
        self._model = ""

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
            raise ServerError(f"{self.transport.url}/v1/models lists no model: is it {self.server}?") from None

    def _name(self) -> str:
        """The model's name without its path."""
        return self._model.rstrip("/").rsplit("/", 1)[-1]

    def tokenize(self, text: str) -> list[int]:
        answer, _ = self.transport.post("/tokenize", {"model": self.model(), "prompt": text,
                                                      "add_special_tokens": False})
        return self.token_list(answer, "/tokenize")

    def next_token(self, prefix: list[int], n_probs: int) -> NextToken:
        return self.rows(prefix, 1, n_probs)[0]

    def top_row(self, pairs: list[tuple[int, float]], n_probs: int, server_s: float, wall: float,
                hint: str) -> NextToken:
        """The first ``n_probs`` of ``pairs`` (id, logprob), best first, as a row; fewer is refused
        in one line ending with ``hint`` (what to change)."""
        if len(pairs) < n_probs:
            raise ServerError(f"{self.transport.url}{self.route} returned {len(pairs)} logprobs, not the "
                              f"{n_probs} asked for ({hint})")
        pairs = pairs[:n_probs]
        return NextToken([i for i, _ in pairs], [lp for _, lp in pairs], server_s, wall)

    def check_greedy(self, row: NextToken, sampled: int | None) -> NextToken:
        """``row``, once the token the engine sampled greedily is its top-1 (or tied with it)."""
        tied = len(row.logprobs) > 1 and row.logprobs[0] == row.logprobs[1]
        if sampled is not None and int(sampled) != row.ids[0] and not tied:
            raise ServerError(f"{self.transport.url}{self.route} ignored the greedy settings: it sampled "
                              f"{sampled}, not its top-1 {row.ids[0]}")
        return row
