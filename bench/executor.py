"""Run one variant on one prompt and return a RunRecord: our engine or a transformers peer.

Both go through the same timer; forward passes of both models are counted by
hooks that stay attached for every run, so their cost falls on all alike. Two
readings of the machine's load bracket every run: the record keeps how much CPU
other processes took meanwhile (``utils.machine_load``).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass

import torch

from advisor.recorded import storage_options
from analysis.acceptance import acceptance_counts
from bench.counting import ForwardCounter
from bench.ours import our_call, our_strategy
from bench.peers import (
    assistant_schedule, assistant_settings, generation_config, peer_call, quiet_transformers, static_cache_len,
)
from bench.processors import ProcessorSpec, make_processor
from bench.records import RunRecord
from bench.timing import timed
from bench.variants import DRAFTING, LOOP_PEERS, Variant
from engine import CrossTokenizerOptions, EngineState, NGramOptions
from engine.run import loop_vocab_size
from utils.defaults import DEFAULTS
from utils.machine_load import load_mark, other_load, read_load
from utils.method_name import STATIC


@dataclass
class RunSettings:
    """How every run decodes: the same for all variants of a benchmark (the defaults are the
    REPL's, ``utils.defaults``)."""

    spec: ProcessorSpec
    length: int = DEFAULTS.length
    seed: int = DEFAULTS.seed
    ngram_storage: str = DEFAULTS.ngram_storage
    ngram_n: int = DEFAULTS.ngram_n
    suffix_pattern: int = DEFAULTS.suffix_pattern   # the suffix storage's P (NGramOptions.max_pattern)
    filler_top_k: int = DEFAULTS.top_k_filler
    stop_if_unknown: bool = True
    assisted_confidence: float = 0.0
    max_matching_ngram_size: int | None = None
    tree_branch: int = DEFAULTS.tree_branch
    tree_sample: bool = DEFAULTS.tree_sample
    uag: str = DEFAULTS.uag  # how a drafter with another tokenizer drafts (slem or tli)
    compile: str = "off"     # how our forwards run (engine.Strategy.compile; --compile)


class Executor:
    """Holds the models, the processor, the engine state (one gamma policy per variant, living for the
    whole benchmark, so the model policy's costs carry over), each variant's drafting state and the
    call counters.

    Drafting state is honest: a ``fresh`` run (outside a session, warm-up, a session's first step)
    starts empty, so no repeat drafts from an earlier repeat's output; each variant has its own, so
    interleaved variants never share state, emptied or built before the clock starts.
    """

    def __init__(self, models, settings: RunSettings, state: EngineState | None = None):
        self.models = models
        self.settings = settings
        self.processor = make_processor(settings.spec)
        self.device = torch.device(str(models.device))
        self.state = state if state is not None else EngineState()
        self.ngram = storage_options(NGramOptions(settings.ngram_storage, settings.ngram_n, settings.filler_top_k,
                                                  stop_if_unknown=settings.stop_if_unknown, reset=False,
                                                  max_pattern=settings.suffix_pattern), settings.ngram_storage)
        self.own: dict[str, object] = {}   # variant name -> its storage (with its key) or arctic cache
        self.cross_options = CrossTokenizerOptions(settings.uag)
        # transformers' universal assisted generation prunes its assistant in place: on a pair
        # with two tokenizers its peer drafts with a copy (made before any hook is attached).
        self.cross = not models.shares_tokenizer
        self.peer_drafter = copy.deepcopy(models.drafter) if self.cross else models.drafter
        self.target_counter = ForwardCounter(models.target)
        self.drafter_counter = ForwardCounter(models.drafter)
        self.peer_counter = ForwardCounter(self.peer_drafter) if self.cross else None
        self.pad_token_id = getattr(models.tokenizer, "pad_token_id", None)

    def close(self) -> None:
        self.target_counter.detach()
        self.drafter_counter.detach()
        if self.peer_counter is not None:
            self.peer_counter.detach()

    def run(self, variant: Variant, ids: list[int], *, fresh: bool = True, **where) -> RunRecord:
        """Decode ``ids`` with ``variant``; ``where`` fills the record's prompt fields; ``fresh``: start from
        empty drafting state."""
        record = RunRecord(variant=variant.name, strategy=variant.strategy, gamma=variant.gamma,
                           family=variant.family, prompt_tokens=len(ids),
                           gamma_policy=variant.policy if variant.gamma is not None else "",
                           **where)
        self.target_counter.take()
        self.drafter_counter.take()
        if self.peer_counter is not None:
            self.peer_counter.take()
        before = read_load()
        if variant.family == "peer" and variant.strategy not in LOOP_PEERS:
            self._run_peer(variant, ids, record)
        else:
            self._run_ours(variant, ids, record, fresh)
        mark_load(record, other_load(before, read_load()))
        return record

    def ngram_options(self, variant: Variant) -> NGramOptions:
        """The n-gram options of a NASD variant: the run's, with the variant's own storage kind."""
        return storage_options(self.ngram, variant.storage) if variant.storage else self.ngram

    def _own_storage(self, variant: Variant, options: NGramOptions, fresh: bool):
        """Put ``variant``'s own storage into the engine state: built on first use, emptied when fresh."""
        self.state.storage, self.state.storage_key = self.own.get(variant.name, (None, None))
        storage = self.state.ngram_storage(options, loop_vocab_size(self.models))
        if fresh:
            storage.reset()
        self.own[variant.name] = (storage, self.state.storage_key)
        return storage

    def _arctic_options(self, variant: Variant, fresh: bool):
        """The ``arctic_suffix`` peer's options: its own cache, a new one when fresh."""
        from bench.arctic import ArcticOptions, new_cache

        if fresh or variant.name not in self.own:
            self.own[variant.name] = new_cache()
        return ArcticOptions(self.own[variant.name])

    def _run_ours(self, variant: Variant, ids: list[int], record: RunRecord, fresh: bool = True) -> None:
        s = self.settings
        generator = torch.Generator(device=self.device).manual_seed(s.seed)
        ngram = self.ngram_options(variant)
        arctic = self._arctic_options(variant, fresh) if variant.strategy == "arctic_suffix" else None
        if variant.strategy == "ngram":
            self._own_storage(variant, ngram, fresh)
        strategy = our_strategy(variant, processor=self.processor, max_gen_len=s.length, ngram=ngram,
                                tree_branch=s.tree_branch, tree_sample=s.tree_sample,
                                cross=self.cross_options, arctic=arctic, fresh=fresh, compile=s.compile)
        call = our_call(strategy, self.models, ids, state=self.state, generator=generator)
        result, seconds = timed(call, self.device)
        if variant.strategy == "ngram":  # the storage the engine drafted from (kept for a session's next step)
            self.own[variant.name] = (self.state.storage, self.state.storage_key)
        record.tokens = list(result.tokens)
        if record.repeat == 0:      # the rows a difference from target AR is judged by (first repeat only)
            record.decisions, record.prompt_ids = result.decisions, list(ids)
        record.seconds = seconds
        record.engine_seconds = result.seconds
        if result.first_token_s is not None:
            record.first_token_s, record.first_tokens = result.first_token_s, result.first_tokens
        record.stop_reason = result.stop_reason
        record.target_calls = result.target_calls
        record.drafter_calls = result.drafter_calls
        record.phases = dict(result.phases) or None
        record.compile = result.compile
        if variant.strategy in DRAFTING:
            record.drafted, record.accepted = result.drafted, result.accepted
            record.rounds = result.rounds
            record.gamma_policy = result.gamma_policy or record.gamma_policy
            record.mean_gamma = _mean_gamma(result.trace)
            record.tree_fallback = result.tree_fallback
            record.acceptance = acceptance_counts(result.trace).to_dict()
            record.hybrid = dict(result.hybrid) or None

    def _run_peer(self, variant: Variant, ids: list[int], record: RunRecord) -> None:
        s, models = self.settings, self.models
        config = generation_config(
            s.spec, max_new_tokens=s.length, end_tokens=list(models.end_tokens),
            pad_token_id=self.pad_token_id,
            prompt_lookup=variant.gamma if variant.strategy == "hf_prompt_lookup" else None,
            max_matching_ngram_size=s.max_matching_ngram_size, static=variant.cache == STATIC,
            cache_len=static_cache_len(variant.strategy, len(ids), s.length, variant.gamma)
            if variant.cache == STATIC else None,
        )
        input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        tokenizers = (models.tokenizer, models.drafter_tokenizer) if self.cross else None
        call = peer_call(variant.strategy, models.target, self.peer_drafter, input_ids, config, tokenizers)
        torch.manual_seed(s.seed)
        with quiet_transformers(), self._assistant(variant):
            output, seconds = timed(call, self.device)
        # A decoder-only model returns the prompt and what follows it; an encoder-decoder one
        # returns its decoder sequence, which starts with the decoder start token.
        skip = 1 if models.is_encoder_decoder else len(ids)
        generated = output[0, skip:].tolist()
        record.tokens = generated[:s.length]
        record.overshoot = len(generated) - len(record.tokens)
        record.seconds = seconds
        record.target_calls = self.target_counter.take()
        record.drafter_calls = self.drafter_counter.take()
        if self.peer_counter is not None:
            record.drafter_calls += self.peer_counter.take()
        ends = set(models.end_tokens)
        record.stop_reason = "eos" if record.tokens and record.tokens[-1] in ends else "length"

    def _assistant(self, variant: Variant):
        """The drafter's assisted-generation settings for an ``hf_assisted`` variant."""
        if variant.strategy != "hf_assisted":
            return contextlib.nullcontext()
        schedule, confidence = assistant_schedule(variant.policy, self.settings.assisted_confidence)
        return assistant_settings(self.peer_drafter, variant.gamma, confidence, schedule)


def mark_load(record: RunRecord, load: float | None) -> None:
    """Put the other processes' load during the run (cores' worth, None where unknown) on
    ``record``, and mark it ``busy`` above ``utils.machine_load.BUSY_CORES``."""
    mark = load_mark(load)
    record.other_load, record.busy = mark["other_load"], mark["busy"]


def _mean_gamma(trace) -> float | None:
    """Mean draft length the rounds asked for (the policy's choices, budget-capped)."""
    if not trace:
        return None
    return sum(r.gamma for r in trace) / len(trace)

