"""The llama.cpp client: ``llama-server`` (also ``xllamacpp.Server``), one request per position."""

from __future__ import annotations

from remote.dialect import NextToken, SamplerFields, ServerClient, ServedModelInfo
from remote.transport import ServerError, Transport


class LlamaCppClient(ServerClient):
    """llama.cpp's ``llama-server`` (also ``xllamacpp.Server``): ``/completion`` with token ids.

    It returns the distribution after the last prompt token only, so a round of γ drafts costs γ+1
    requests (``cache_prompt`` reuses the prefix). ``n_probs`` gives the top-N of the raw softmax,
    before temperature and the sampler chain (tests/test_served.py checks it).
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
        return self.token_list(answer, "/tokenize")

    def _body(self, prompt: list[int], n_predict: int, fields: SamplerFields, n_probs: int) -> dict:
        """Every sampling field, explicitly: the server's defaults (top_k 40, top_p 0.95, min_p 0.05) never
        apply. Greedy is top_k 1 then temperature 0. ``ignore_eos`` stays off: llama.cpp biases the end
        tokens to -inf, so the sampler would never pick one its ``n_probs`` ranks first."""
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
        """The top ``n_probs`` after ``prefix``. llama.cpp sends no probabilities with a token whose text
        ends inside a UTF-8 character, so such a position is asked again with that token banned
        (``logit_bias`` acts in the sampler; ``n_probs`` stays the raw softmax) until the token is whole;
        each request is counted and timed."""
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

    def sample(self, ids: list[int], fields: SamplerFields) -> tuple[int, float]:
        """One token from ``/completion``'s sampler (``return_tokens``)."""
        answer, wall = self.transport.post("/completion", self._body(ids, 1, fields, 0))
        self.times.add(wall, _server_seconds(answer))
        tokens = answer.get("tokens")
        if not tokens:
            raise ServerError(f"{self.transport.url}/completion returned no token ids (return_tokens ignored)")
        return int(tokens[0]), wall


def _server_seconds(answer: dict) -> float:
    """The compute the server reported (llama.cpp: prompt and predicted milliseconds), else 0."""
    timings = answer.get("timings") if isinstance(answer, dict) else None
    if not isinstance(timings, dict):
        return 0.0
    return (float(timings.get("prompt_ms") or 0.0) + float(timings.get("predicted_ms") or 0.0)) / 1000.0
