"""The target model behind a server, in the shape the verify loop drives.

:class:`ServedTarget` stands where a transformers model stands in a ``ModelPair``; its
:class:`ServedSession` per generation returns ``keep`` rows of logits built from the server's top-N
log-probabilities (``remote.rules``). ``bound(processor)`` fixes a run's sampling settings.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from generation.served import ServedModel
from kvcache.cache import RollbackStats
from remote.dialect import SamplerFields, ServedModelInfo, ServerClient
from remote.rules import DEFAULT_PROBS, ServedPlan, nucleus_certified, plan_for, row_of
from remote.transport import ServerError
from sampling.processors import GreedyProcessor, LogitsProcessor


class ServedTarget(torch.nn.Module, ServedModel):
    """A model served by ``client``; ``n_probs`` log-probabilities are asked for at each position."""

    def __init__(self, client: ServerClient, info: ServedModelInfo, *, n_probs: int = DEFAULT_PROBS,
                 device: torch.device | str = "cpu", processor: LogitsProcessor | None = None):
        super().__init__()
        self.client = client
        self.info = info
        self.n_probs = n_probs
        self.processor = processor
        self.config = SimpleNamespace(vocab_size=info.vocab_size, max_position_embeddings=info.context_length,
                                      is_encoder_decoder=False, model_type="served")
        # Zero-size: says where the loop's inputs go (utils.devices.model_device), holds no weights.
        self.anchor = torch.nn.Parameter(torch.empty(0, device=device), requires_grad=False)

    @property
    def dtype(self) -> None:
        """The server's weights' dtype is not known here (a GGUF may be quantised): None."""
        return None

    def bound(self, processor: LogitsProcessor) -> ServedTarget:
        """The same server with ``processor``'s sampling settings (a verify session checks them)."""
        return ServedTarget(self.client, self.info, n_probs=self.n_probs, device=self.anchor.device,
                            processor=processor)

    def plan(self) -> ServedPlan:
        return plan_for(self.processor or GreedyProcessor(), self.n_probs, self.info.vocab_size)

    def session(self) -> ServedSession:
        return ServedSession(self, self.plan())

    def decode(self, prompt: list[int], max_new: int, processor, seed: int):
        return self.client.decode(list(prompt), max_new, sampler_fields(processor, seed))

    def network_mark(self):
        """Where the request counters stand, for :meth:`network_since`."""
        return self.client.times.mark()

    def network_since(self, mark) -> dict:
        return self.client.times.since(mark)

    def forward(self, *args, **kwargs):
        raise TypeError("a served target runs on its server: decode through engine.run_strategy")


def sampler_fields(processor: LogitsProcessor, seed: int) -> SamplerFields:
    """The server-side settings of ``processor`` (every field explicit; greedy is temperature 0)."""
    if processor.is_greedy:
        return SamplerFields(seed=seed)
    return SamplerFields(temperature=processor.temperature, top_k=getattr(processor, "top_k", 0) or 0,
                         top_p=getattr(processor, "top_p", 1.0) or 1.0, seed=seed)


class ServedSession:
    """One generation against the server: the loop's ``CachedModel`` calls, each a set of requests.

    The server keeps the prefix cache, so nothing is rolled back here. A round of γ drafts is γ+1
    requests on llama.cpp and one on an engine that scores positions; ``forwards`` counts rounds,
    ``network_stats()`` the requests and their times.
    """

    keep_hidden = False
    hidden = None
    cache_off = False
    capture_s = 0.0
    path = "served"
    reason = ""
    tree_reason = "the target is behind a server, whose API scores one chain position per request"

    def __init__(self, target: ServedTarget, plan: ServedPlan):
        self.target = target
        self.plan = plan
        self.forwards = 0
        self._length = 0
        self.stats = RollbackStats(method="server", path="served")
        self._mark = target.client.times.mark()
        self.per_call: list[tuple[int, float, float]] = []   # per target call: requests, request ms, server ms

    @property
    def device(self) -> torch.device:
        return self.target.anchor.device

    @property
    def length(self) -> int:
        return self._length

    def begin(self, prompt: list[int], prefills=()) -> list[int]:
        self.target.client.new_run()
        self._mark = self.target.client.times.mark()
        self.per_call = []
        self._length = 0
        return list(prompt)

    def forward(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        """The logits rows (keep, V) after each of the last ``keep`` prefixes of ``ids`` (1, L)."""
        sequence = ids[0].tolist()
        mark = self.target.client.times.mark()
        start = len(sequence) - keep + 1
        tops = self.target.client.rows(sequence, keep, self.plan.n_probs)
        if len(tops) != keep:
            raise ServerError(f"the server scored {len(tops)} positions, not the {keep} asked for")
        rows = [self._row(sequence[:start + j], top) for j, top in enumerate(tops)]
        spent = self.target.client.times.since(mark)
        self.per_call.append((spent["requests"], round(1000 * spent["request_s"], 3), round(1000 * spent["server_s"], 3)))
        self.forwards += 1
        self._length = len(sequence)
        return torch.stack(rows).to(self.device)                          # (keep, V)

    def _row(self, prefix: list[int], top) -> torch.Tensor:
        """The row of the distribution ``top`` after ``prefix``; a nucleus row the returned mass
        does not certify is asked again with four times as many log-probabilities (the whole
        vocabulary at most, which is exact)."""
        plan, processor = self.plan, self.target.processor
        n = plan.n_probs
        while True:
            if min(top.ids) < 0 or max(top.ids) >= plan.vocab_size:
                raise ServerError(f"the server returned token id {max(top.ids)} outside its {plan.vocab_size}-token "
                                  "vocabulary: it serves another model than it described")
            if plan.mode != "nucleus" or n >= plan.vocab_size or nucleus_certified(
                    top.logprobs, processor.temperature, processor.top_p, plan.vocab_size):
                return row_of(top.ids, top.logprobs, plan)
            n = min(4 * n, plan.vocab_size)
            top = self.target.client.next_token(prefix, n)

    def checkpoint(self) -> None:
        """Nothing to snapshot: the server's cache follows the prompt each request sends."""

    def rollback(self, length: int) -> None:
        self._length = min(self._length, length)

    def network_stats(self) -> dict:
        """This generation's requests: count, wire seconds, server-reported compute, round trip, and
        ``per_call``: [requests, request ms, server ms] for each target call (a verify round's)."""
        return {**self.target.client.times.since(self._mark), "per_call": [list(c) for c in self.per_call]}
