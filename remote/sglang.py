"""The SGLang client: its native ``/generate``, a verify round in one request."""

from __future__ import annotations

import re
import uuid

from remote.dialect import NextToken, SamplerFields, ScoringClient, ServedModelInfo
from remote.transport import ServerError, Transport


class SglangClient(ScoringClient):
    """SGLang's native API: ``/generate`` with ``input_ids``.

    ``return_logprob`` with ``logprob_start_len: S`` and ``top_logprobs_num: N`` returns the top N
    predicting each prompt token from S on (``meta_info.input_top_logprobs``) and after the whole prompt
    (``output_top_logprobs``): one request per verify round, the radix cache reused up to S. From
    sgl-project/sglang (python/sglang/srt/):

    - ``managers/io_struct.py`` ``GenerateReqInput`` and ``sampling/sampling_params.py``: temperature 0
    is top_k 1, top_k -1 the whole vocabulary, and ``--preferred-sampling-params`` fills what a
    request leaves out, so every field is sent;
    - ``managers/scheduler_output_processor_mixin.py``: the first input entry is None, entry j is the
    token at S + j; each entry is ``[logprob, token_id, text]``, a missing top list None;
    - ``layers/sampler.py``: a greedy request's logprobs are the raw model's, so only greedy requests
    are read;
    - ``meta_info.e2e_latency`` is the server's seconds; ``/v1/models`` gives ``max_model_len``;
    ``/tokenize`` returns ``tokens``.

    SGLang publishes no vocabulary size; ``SamplingParams.verify`` states it when it refuses a
    ``logit_bias`` key ("logit_bias must has keys in [0, V-1]"), so ``info()`` sends one request built
    to be refused that way and reads V from the answer.
    """

    kind = "sglang"
    route = "/generate"
    server = "an SGLang server"
    _PROBE_ID = 1_000_000_000          # a logit_bias key above any vocabulary
    _BOUND = re.compile(r"logit_bias must ha\w* keys in \[0, (\d+)\]")

    def __init__(self, transport: Transport):
        super().__init__(transport)
        self._key = ""

    def new_run(self) -> None:
        """A fresh ``extra_key`` for the run's requests (SGLang's radix cache keys prefixes by it), so a run
        never reads another's prompt from the cache."""
        self._key = uuid.uuid4().hex

    def info(self) -> ServedModelInfo:
        context = self._models()
        return ServedModelInfo(self._name(), self._vocab_size(), context, "SGLang")

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

    @staticmethod
    def _sampling(max_new_tokens: int, fields: SamplerFields) -> dict:
        """Every sampling field, explicitly (min-p and penalties off); ``ignore_eos`` off and end tokens
        kept in the text (the loop stops at them itself)."""
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
        self.times.add(wall, _server_seconds(answer))
        answer["_wall_s"] = wall
        return answer

    def rows(self, sequence: list[int], keep: int, n_probs: int) -> list[NextToken]:
        """Every position of a verify round in one greedy request: ``logprob_start_len`` L - keep scores
        the prompt tokens after it; the first output entry is the distribution after the whole sequence."""
        answer = self._generate(sequence, SamplerFields(), logprob_start=len(sequence) - keep, n_probs=n_probs)
        meta, wall = answer["meta_info"], answer["_wall_s"]
        server_s = _server_seconds(answer)
        if meta.get("prompt_tokens") not in (None, len(sequence)):
            raise ServerError(f"{self.transport.url}/generate read {meta['prompt_tokens']} prompt tokens, not the "
                              f"{len(sequence)} ids sent")
        inside = keep - 1
        tops = [self._checked(entries, n_probs, server_s, wall) for entries in self._input_rows(meta, sequence, inside)]
        return tops + [self._last_row(meta, n_probs, server_s, wall)]

    def _input_rows(self, meta: dict, sequence: list[int], inside: int) -> list:
        """The top lists of the last ``inside`` prompt positions, each checked against the sequence's token
        there."""
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
        return self.check_greedy(self._checked(entries, n_probs, server_s, wall), sampled)

    def _checked(self, entries, n_probs: int, server_s: float, wall: float) -> NextToken:
        """A position's ``[logprob, token_id, text]`` list as a row, best first; exactly N of them."""
        try:
            pairs = sorted(((int(e[1]), float(e[0])) for e in entries or []), key=lambda p: -p[1])
        except (IndexError, TypeError, ValueError):
            raise ServerError(f"{self.transport.url}/generate: a top logprobs entry is not "
                              "[logprob, token_id, text]") from None
        return self.top_row(pairs, n_probs, server_s, wall, "top_logprobs_num ignored, or a smaller vocabulary")

    def sample(self, ids: list[int], fields: SamplerFields) -> tuple[int, float]:
        """One token from SGLang's sampler; its radix cache holds the context. ``sampling_seed``:
        SGLang draws with it when started with ``--enable-deterministic-inference``."""
        answer = self._generate(ids, fields)
        tokens = answer.get("output_ids")
        if not tokens:
            raise ServerError(f"{self.transport.url}/generate returned no output_ids")
        return int(tokens[0]), answer["_wall_s"]


def _server_seconds(answer: dict) -> float:
    """SGLang's ``meta_info.e2e_latency``: the seconds from the request's arrival to its end on the
    server (queue, compute, detokenising); 0 when it is not reported."""
    meta = answer.get("meta_info") if isinstance(answer, dict) else None
    latency = meta.get("e2e_latency") if isinstance(meta, dict) else None
    return float(latency) if isinstance(latency, (int, float)) else 0.0
