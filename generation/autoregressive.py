"""Plain autoregressive decoding: the baseline every other strategy is measured against."""

from __future__ import annotations

import torch

from generation.common import timed_run
from generation.decisions import DecisionLog
from utils.devices import model_device
from generation.observer import Observer, Watch, target_delay
from generation.options import LoopOptions
from generation.phases import PhaseClock, split_phases
from generation.result import GenerationResult, Round
from generation.served import ServedModel, served_generate
from kvcache.static import compile_report, loop_model, static_capacity


@torch.inference_mode()
def autoregressive_generate(prompt: list[int], model, options: LoopOptions, *, phase: str = "verify",
                            observer: Observer | None = None, interruptible: bool = False) -> GenerationResult:
    """One token per forward pass, feeding only the newest token when the cache is on.

    ``prompt``: the checked prompt ids (the encoder's for a seq2seq model); ``options``:
    :class:`generation.options.LoopOptions` (γ policy and trees do not apply). Stops after an end token
    (kept) or ``max_gen_len`` tokens; with ``interruptible`` a KeyboardInterrupt returns what was made.
    Time is booked under ``phase``: "verify" for the target, "draft" for a drafter on its own.
    """
    if phase not in ("draft", "verify"):
        raise ValueError(f"phase must be 'draft' or 'verify', got {phase!r}")
    if isinstance(model, ServedModel):        # the server's own decode is the reference
        return served_generate(prompt, model, options, observer=observer, interruptible=interruptible)
    logits_processor, generator, eos = options.processor, options.generator, options.eos
    device = model_device(model)
    cached = loop_model(model, use_cache=options.use_cache, compile=options.compile,
                        capacity=static_capacity(len(prompt), options.max_gen_len))
    clock = PhaseClock(device)
    result = GenerationResult()
    watch = Watch(observer)
    decisions = DecisionLog() if options.decisions else None
    start = None
    with timed_run(result, device, interruptible=interruptible) as started:
        start = cached.begin(prompt, options.prefills)
        ids = torch.tensor([start], dtype=torch.long, device=device)     # (1, L)
        for _ in range(options.max_gen_len):
            t0 = clock.mark()
            captured = cached.capture_s
            target_delay(options.target_delay_s, device)
            logits = cached.forward(ids, keep=1)                             # (1, V)
            if logits_processor.is_greedy:                                 # argmax: no one-hot rows built
                token = logits_processor.greedy_ids(logits)                  # (1,)
            else:
                token = logits_processor.sample(logits_processor(logits), generator)  # (1,)
            if decisions is not None:
                decisions.add(logits, 1)                                 # the step row that decided it
            t1 = clock.mark()
            ids = torch.cat([ids, token.view(1, 1)], dim=1)
            value = token.item()                                         # one host sync per token
            # a capture during this step is booked in compile.capture_s, not as the step's cost
            seconds = max(0.0, clock.seconds(t0, t1) - (cached.capture_s - captured))
            result.rounds += 1
            result.trace.append(Round(drafted=(), accepted=0, token=value, bonus=False, gamma=0,
                                      draft_s=seconds if phase == "draft" else 0.0,
                                      verify_s=seconds if phase == "verify" else 0.0))
            watch.round(result.trace[-1], [value])
            if value in eos:
                result.stop_reason = "eos"
                break
    result.compile = compile_report(options.compile, cached.compile_stats())
    result.seconds -= watch.paused_s + cached.capture_s            # capturing is not decoding
    result.first_token_s, result.first_tokens = watch.first_token(started)
    result.tokens = ids[0, len(start):].tolist() if start is not None else []
    if decisions is not None:
        result.decisions = decisions.read()[:len(result.tokens)]           # one read-back for the run
    result.target_calls = cached.forwards
    result.phases = split_phases(result.seconds, sum(r.draft_s for r in result.trace),
                                 sum(r.verify_s for r in result.trace))
    result.rollback = {"target" if phase == "verify" else "drafter": cached.stats.to_dict()}   # the model that ran
    return result
