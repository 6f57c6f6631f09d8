"""Run one variant on one prompt and return a RunRecord: our engine or a transformers peer.

Both go through the same timer; forward passes of both models are counted by
hooks that stay attached for every run, so their cost falls on all alike.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from bench.counting import ForwardCounter
from bench.ours import make_storage, our_call
from bench.peers import assistant_settings, generation_config, peer_call, quiet_transformers
from bench.processors import ProcessorSpec, make_processor
from bench.records import RunRecord
from bench.timing import timed
from bench.variants import Variant


@dataclass
class RunSettings:
    """How every run decodes: the same for all variants of a benchmark."""

    spec: ProcessorSpec
    length: int = 128
    seed: int = 0
    ngram_storage: str = "basic"
    ngram_n: int = 3
    filler_top_k: int = 1
    stop_if_unknown: bool = True
    assisted_confidence: float = 0.0
    max_matching_ngram_size: int | None = None


class Executor:
    """Holds the models, the processor, one n-gram storage and the call counters."""

    def __init__(self, models, settings: RunSettings):
        self.models = models
        self.settings = settings
        self.processor = make_processor(settings.spec)
        self.device = torch.device(str(models.device))
        self.storage = make_storage(settings.ngram_storage, settings.ngram_n, _vocab(models))
        self.target_counter = ForwardCounter(models.target)
        self.drafter_counter = ForwardCounter(models.drafter)
        self.pad_token_id = getattr(models.tokenizer, "pad_token_id", None)

    def close(self) -> None:
        self.target_counter.detach()
        self.drafter_counter.detach()

    def run(self, variant: Variant, ids: list[int], **where) -> RunRecord:
        """Decode ``ids`` with ``variant``; ``where`` fills the record's prompt fields."""
        record = RunRecord(variant=variant.name, strategy=variant.strategy, gamma=variant.gamma,
                           family=variant.family, prompt_tokens=len(ids), **where)
        self.target_counter.take()
        self.drafter_counter.take()
        if variant.family == "peer":
            self._run_peer(variant, ids, record)
        else:
            self._run_ours(variant, ids, record)
        return record

    def _run_ours(self, variant: Variant, ids: list[int], record: RunRecord) -> None:
        s = self.settings
        generator = torch.Generator(device=self.device).manual_seed(s.seed)
        call = our_call(variant.strategy, variant.gamma, self.models, ids,
                        processor=self.processor, max_gen_len=s.length, generator=generator,
                        storage=self.storage, filler_top_k=s.filler_top_k,
                        stop_if_unknown=s.stop_if_unknown)
        result, seconds = timed(call, self.device)
        record.tokens = list(result.tokens)
        record.seconds = seconds
        record.engine_seconds = result.seconds
        record.stop_reason = result.stop_reason
        record.target_calls = result.target_calls
        record.drafter_calls = result.drafter_calls
        if variant.strategy in ("speculative", "ngram"):
            record.drafted, record.accepted = result.drafted, result.accepted

    def _run_peer(self, variant: Variant, ids: list[int], record: RunRecord) -> None:
        s, models = self.settings, self.models
        config = generation_config(
            s.spec, max_new_tokens=s.length, end_tokens=list(models.end_tokens),
            pad_token_id=self.pad_token_id,
            prompt_lookup=variant.gamma if variant.strategy == "hf_prompt_lookup" else None,
            max_matching_ngram_size=s.max_matching_ngram_size,
        )
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        call = peer_call(variant.strategy, models.target, models.drafter, input_ids, config)
        gamma = variant.gamma if variant.strategy == "hf_assisted" else None
        torch.manual_seed(s.seed)
        with quiet_transformers(), _maybe_assistant(models.drafter, gamma, s.assisted_confidence):
            output, seconds = timed(call, self.device)
        generated = output[0, len(ids):].tolist()
        record.tokens = generated[:s.length]
        record.overshoot = len(generated) - len(record.tokens)
        record.seconds = seconds
        record.target_calls = self.target_counter.take()
        record.drafter_calls = self.drafter_counter.take()
        ends = set(models.end_tokens)
        record.stop_reason = "eos" if record.tokens and record.tokens[-1] in ends else "length"


def _vocab(models) -> int:
    vocab = getattr(models, "vocab_size", None)
    return int(vocab) if vocab else int(models.target.config.vocab_size)


def _maybe_assistant(drafter, gamma: int | None, confidence: float):
    if gamma is None:
        return contextlib.nullcontext()
    return assistant_settings(drafter, gamma, confidence)
