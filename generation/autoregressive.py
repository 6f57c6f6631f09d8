"""Plain autoregressive decoding: the baseline every other strategy is measured against."""

from __future__ import annotations

import torch

from generation.common import check_request, end_tokens, model_device, timed_run
from generation.observer import Observer, Watch, target_delay
from generation.phases import PhaseClock, split_phases
from generation.result import GenerationResult, Round
from sampling import LogitsProcessor
from utils.cache import CachedModel


@torch.inference_mode()
def autoregressive_generate(
    inputs,
    model,
    *,
    logits_processor: LogitsProcessor,
    max_gen_len: int = 128,
    eos_tokens_id=None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    interruptible: bool = False,
    phase: str = "verify",
    observer: Observer | None = None,
    target_delay_s: float = 0.0,
) -> GenerationResult:
    """One token per forward pass, feeding only the newest token when the cache is on.

    Stops after an end token (kept in the output) or ``max_gen_len`` tokens. With
    ``interruptible`` a KeyboardInterrupt ends generation and returns what was made.
    Each step's forward and sampling time is booked under ``phase``: "verify"
    for the target (its forward is what speculative rounds call verifying),
    "draft" when the model is a drafter running on its own. For an
    encoder-decoder model ``inputs`` are the encoder's ids and ``tokens`` the
    generated decoder ids (without the decoder start token). ``observer`` is
    told each step (its time is left out of ``seconds``); ``target_delay_s``
    waits that long before every forward (an injected network round trip,
    booked under ``phase``).
    """
    if phase not in ("draft", "verify"):
        raise ValueError(f"phase must be 'draft' or 'verify', got {phase!r}")
    prompt = check_request(inputs, max_gen_len, model)
    device = model_device(model)
    eos = end_tokens(eos_tokens_id)
    cached = CachedModel(model, use_cache=use_cache)
    clock = PhaseClock(device)
    result = GenerationResult()
    watch = Watch(observer)
    start = None
    with timed_run(result, device, interruptible=interruptible):
        start = cached.begin(prompt)
        ids = torch.tensor([start], dtype=torch.long, device=device)     # (1, L)
        for _ in range(max_gen_len):
            t0 = clock.mark()
            target_delay(target_delay_s, device)
            logits = cached.forward(ids, keep=1)                             # (1, V)
            token = logits_processor.sample(logits_processor(logits), generator)  # (1,)
            t1 = clock.mark()
            ids = torch.cat([ids, token.view(1, 1)], dim=1)
            value = token.item()                                         # one host sync per token
            seconds = clock.seconds(t0, t1)
            result.rounds += 1
            result.trace.append(Round(drafted=(), accepted=0, token=value, bonus=False, gamma=0,
                                      draft_s=seconds if phase == "draft" else 0.0,
                                      verify_s=seconds if phase == "verify" else 0.0))
            watch.round(result.trace[-1], [value])
            if value in eos:
                result.stop_reason = "eos"
                break
    result.seconds -= watch.paused_s
    result.tokens = ids[0, len(start):].tolist() if start is not None else []
    result.target_calls = cached.forwards
    result.phases = split_phases(result.seconds, sum(r.draft_s for r in result.trace),
                                 sum(r.verify_s for r in result.trace))
    result.rollback = {"target": cached.stats.to_dict()}
    return result
