"""The vLLM client: its OpenAI server's ``/v1/completions``, a verify round in one request."""

from __future__ import annotations

import uuid

from remote.dialect import NextToken, SamplerFields, ScoringClient, ServedModelInfo
from remote.transport import ServerError, Transport


class VllmClient(ScoringClient):
    """vLLM's OpenAI server: ``/v1/completions`` with a prompt of token ids.

    ``prompt_logprobs: N`` returns the top N predicting every prompt position and ``logprobs: N`` after
    the last: one request per verify round, which skips the prefix cache. The logprobs are the raw
    model's (the default ``logprobs_mode``). The server's compute comes from ``metrics`` with
    ``--enable-per-request-metrics``, else the whole request counts as round trip. The vocabulary size
    is read once with ``logprobs: -1`` (needs ``--max-logprobs -1``).
    """

    kind = "vllm"
    route = "/v1/completions"
    server = "a vLLM server"
    SHORT = "start vLLM with --max-logprobs -1"     # what to change when a row comes back short

    def __init__(self, transport: Transport):
        super().__init__(transport)
        self._salt = ""

    def new_run(self) -> None:
        """A fresh ``cache_salt`` for the run's requests: vLLM shares cached prefixes only among
        requests of the same salt, so a run never reads another's prompt from the cache."""
        self._salt = uuid.uuid4().hex

    def info(self) -> ServedModelInfo:
        context = self._models()
        try:
            whole = self._complete([0], 1, SamplerFields(), logprobs=-1)
        except ServerError as e:
            if "max allowed" not in str(e):
                raise
            raise ServerError(f"{self.transport.url} caps logprobs ({str(e).rsplit(': ', 1)[-1]}): start vLLM "
                              "with --max-logprobs -1 so that the client can read the vocabulary size") from None
        vocab = len(self._choice(whole).get("logprobs", {}).get("top_logprobs", [{}])[0])
        return ServedModelInfo(self._name(), vocab, context, "vLLM")

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
        self.times.add(wall, _server_seconds(answer))
        answer["_wall_s"] = wall
        return answer

    def _choice(self, answer: dict) -> dict:
        try:
            return answer["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise ServerError(f"{self.transport.url}/v1/completions returned no choice") from None

    def rows(self, sequence: list[int], keep: int, n_probs: int) -> list[NextToken]:
        """Every position of a verify round in one request: ``prompt_logprobs`` for the prefixes
        inside the sequence, the sampled token's ``logprobs`` for the whole of it."""
        inside = keep - 1
        answer = self._complete(sequence, 1, SamplerFields(), logprobs=n_probs,
                                prompt_logprobs=n_probs if inside else None)
        choice, wall = self._choice(answer), answer["_wall_s"]
        server_s = _server_seconds(answer)
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
        return self.top_row(kept, n_probs, server_s, wall, self.SHORT)

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
        sampled = (choice.get("token_ids") or [None])[0]
        return self.check_greedy(self.top_row(pairs, n_probs, server_s, wall, self.SHORT), sampled)

    def sample(self, ids: list[int], fields: SamplerFields) -> tuple[int, float]:
        """One token from vLLM's sampler (``return_token_ids``); its prefix cache holds the context."""
        answer = self._complete(ids, 1, fields, logprobs=0)
        tokens = self._choice(answer).get("token_ids")
        if not tokens:
            raise ServerError(f"{self.transport.url}/v1/completions returned no token ids "
                              "(return_token_ids ignored)")
        return int(tokens[0]), answer["_wall_s"]


def _server_seconds(answer: dict) -> float:
    """vLLM's per-request metrics (``--enable-per-request-metrics``): queue time plus time to the
    first token, the compute of a one-token request; 0 when the server does not report them."""
    metrics = answer.get("metrics") if isinstance(answer, dict) else None
    if not isinstance(metrics, dict):
        return 0.0
    return (float(metrics.get("queue_time_ms") or 0.0) + float(metrics.get("time_to_first_token_ms") or 0.0)) / 1000.0
