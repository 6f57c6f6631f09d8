"""Load a pair whose drafter is an EAGLE-3 head (``--drafter eagle3:PATH``).

The target loads as any target does (``utils.models.load_model``); the head is then read from
its own directory (or hub id) in the published layout and fitted to the target
(``eagle3.load_eagle3``). A path without an EAGLE-3 head, or a head whose hidden size or
vocabulary does not fit the target, is refused with one line (``ModelLoadError``).
"""

from __future__ import annotations

from eagle3 import Eagle3Refused, load_eagle3
from utils.devices import dtype_name, model_device
from utils.errors import ModelLoadError
from utils.models import ModelPair, describe, load_model
from kvcache.probe import probe_pair
from utils.progress import Progress, no_progress
from utils.quantize import parse_quantize
from utils.vocab import check_compatible, context_length, end_token_ids


def load_eagle3_pair(target: str | None, drafter: str, *, device: str = "auto", dtype: str = "auto",
                     quantize: str | None = None, progress: Progress | None = None, cache_dir=None) -> ModelPair:
    """The target ``target`` and the EAGLE-3 head ``drafter`` (``eagle3:PATH``); ``ModelLoadError`` (one line)
    when the head cannot draft for it."""
    say = progress or no_progress
    quantize = parse_quantize(quantize)
    model, tokenizer = load_model(target, device=device, dtype=dtype, quantize=quantize,
                                  progress=progress, cache_dir=cache_dir)
    label = describe(target, model, quantize)
    say(f"Loading the EAGLE-3 head {drafter}")
    try:
        head = load_eagle3(model, drafter)
    except Eagle3Refused as exc:
        raise ModelLoadError(f"--drafter {drafter}: {exc}") from exc
    layers = ", ".join(str(i) for i in head.aux_layers)
    pair = ModelPair(
        target=model, drafter=head, tokenizer=tokenizer, target_name=label,
        drafter_name=f"{drafter} (EAGLE-3 head, draft vocabulary {head.draft_vocab_size}, "
                     f"{dtype_name(next(head.parameters()).dtype)})",
        end_tokens=end_token_ids(tokenizer, model), device=model_device(model),
        vocab_size=check_compatible(tokenizer, tokenizer, model, model),   # the head drafts target ids
        context_length=context_length(model, tokenizer), self_draft_demo=False,
        notes=(f"the drafter is an EAGLE-3 head reading the target's hidden states {layers}",),
    )
    say("Probing the target's cached forward against the uncached one")
    pair.probe = probe_pair(pair)
    return pair
