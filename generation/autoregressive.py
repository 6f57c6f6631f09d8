"""Plain autoregressive decoding: the baseline every other strategy is measured against."""

from __future__ import annotations

import torch

from generation.common import check_request, end_tokens, model_device, timed_run
from generation.result import GenerationResult, Round
from sampling import LogitsProcessor
from utils.cache import forward_unseen, new_cache


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
    trace: bool = False,
    interruptible: bool = False,
) -> GenerationResult:
    """One token per forward pass, feeding only the newest token when the cache is on.

    Stops after an end token (kept in the output) or ``max_gen_len`` tokens. With
    ``interruptible`` a KeyboardInterrupt ends generation and returns what was made.
    """
    prompt = check_request(inputs, max_gen_len, model)
    device = model_device(model)
    eos = end_tokens(eos_tokens_id)
    ids = torch.tensor([prompt], dtype=torch.long, device=device)    # (1, L)
    cache = new_cache(model) if use_cache else None
    result = GenerationResult(trace=[] if trace else None)
    with timed_run(result, device, interruptible=interruptible):
        for _ in range(max_gen_len):
            logits, cache = forward_unseen(model, ids, cache, keep=1)   # (1, V)
            result.target_calls += 1
            token = logits_processor.sample(logits_processor(logits), generator)  # (1,)
            ids = torch.cat([ids, token.view(1, 1)], dim=1)
            value = token.item()                                        # one host sync per token
            result.rounds += 1
            if result.trace is not None:
                result.trace.append(Round(drafted=(), accepted=0, token=value, bonus=False))
            if value in eos:
                result.stop_reason = "eos"
                break
    result.tokens = ids[0, len(prompt):].tolist()
    return result
