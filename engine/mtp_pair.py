"""Load a pair whose drafter is the target's own MTP layers (``--drafter mtp``).

The target loads as any target does (``utils.models.load_model``); its MTP layers are then
read from the same checkpoint by transformers' ``MtpModel.from_pretrained`` (``mtp.load_mtp``).
A target without them (its config declares none, its checkpoint holds none, or transformers
is older than 5.24) is refused with one line (``ModelLoadError``).
"""

from __future__ import annotations

from mtp import MtpRefused, load_mtp
from utils.devices import dtype_name, model_device
from utils.models import ModelLoadError, ModelPair, describe, load_model
from kvcache.probe import probe_pair
from utils.progress import Progress, no_progress
from utils.quantize import parse_quantize
from utils.vocab import check_compatible, context_length, end_token_ids


def load_mtp_pair(target: str | None, *, device: str = "auto", dtype: str = "auto", quantize: str | None = None,
                  progress: Progress | None = None, cache_dir=None) -> ModelPair:
    """The target ``target`` and its MTP layers as the drafter; ``ModelLoadError`` (one line) if it has none."""
    say = progress or no_progress
    quantize = parse_quantize(quantize)
    model, tokenizer = load_model(target, device=device, dtype=dtype, quantize=quantize,
                                  progress=progress, cache_dir=cache_dir)
    label = describe(target, model, quantize)
    say(f"Loading the MTP layers of {label}")
    try:
        layers = load_mtp(model)
    except MtpRefused as exc:
        raise ModelLoadError(f"--drafter mtp: {exc}") from exc
    count = len(layers.layers)
    pair = ModelPair(
        target=model, drafter=layers, tokenizer=tokenizer, target_name=label,
        drafter_name=f"{target or 'the default model'} mtp ({count} MTP layer{'s' * (count != 1)}, "
                     f"{dtype_name(next(layers.parameters()).dtype)})",
        end_tokens=end_token_ids(tokenizer, model), device=model_device(model),
        vocab_size=check_compatible(tokenizer, tokenizer, model, model),   # the MTP layers use the target's head
        context_length=context_length(model, tokenizer), self_draft_demo=False,
        notes=(f"the drafter is the target's own {count} MTP layer(s); chains past {count} draft reuse the last",),
    )
    say("Probing the target's cached forward against the uncached one")
    pair.probe = probe_pair(pair)
    return pair
