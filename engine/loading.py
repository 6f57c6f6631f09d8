"""The one model loader the front ends call: a self-drafter, or a pair of two models.

A ``self:`` drafter (``self:bf16``, ``self:int8``, ``self:skip=auto``, ...) and the call with
neither a target nor a drafter (the offline default with the self-drafter measured fastest on
this machine) go to ``engine.self_pair.load``; ``mtp`` (the target's own MTP layers) to
``engine.mtp_pair``; ``eagle3:PATH`` (an EAGLE-3 head) to ``engine.eagle3_pair``; ``gemma4-assistant:PATH`` to ``engine.assistant_pair``; everything else (two models, or the ``--drafter self`` bfloat16 demo) to
``utils.models.load_pair``. Each attaches the cache probe (``kvcache.probe``).
"""

from __future__ import annotations

from engine.assistant_pair import load_assistant_pair
from engine.eagle3_pair import load_eagle3_pair
from engine.mtp_pair import load_mtp_pair
from eagle3 import is_eagle3
from engine.self_pair.load import load_self_draft_pair
from gemma4_assistant import is_assistant_spec
from mtp import is_mtp
from selfdraft.spec import is_self_draft
from utils import models
from utils.models import ModelPair
from kvcache.probe import probe_pair
from utils.progress import Progress, no_progress


def wants_self_draft(target: str | None, drafter: str | None) -> bool:
    """Whether the drafter is made from the target: a ``self:`` spec, or the default (neither given)."""
    return is_self_draft(drafter) or (target is None and drafter is None)


def load_pair(
    target: str | None = None,
    drafter: str | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    drafter_dtype: str | None = None,
    quantize: str | None = None,
    drafter_quantize: str | None = None,
    device_map=None,
    progress: Progress | None = None,
    cache_dir=None,
) -> ModelPair:
    """Load the pair the user asked for; the arguments are ``utils.models.load_pair``'s.

    A self-drafter is built from the loaded target, so ``drafter_dtype``, ``drafter_quantize``
    and ``device_map`` do not apply to it (the spec names its precision); nor do they to the
    target's MTP layers (``drafter="mtp"``), an EAGLE-3 head (``drafter="eagle3:PATH"``) or a Gemma 4
    assistant (``"gemma4-assistant:PATH"``),
    which take the target's dtype and device.
    """
    if is_assistant_spec(drafter):
        return load_assistant_pair(target, drafter, device=device, dtype=dtype, quantize=quantize,
                                   progress=progress, cache_dir=cache_dir)
    if is_mtp(drafter):
        return load_mtp_pair(target, device=device, dtype=dtype, quantize=quantize, progress=progress,
                             cache_dir=cache_dir)
    if is_eagle3(drafter):
        return load_eagle3_pair(target, drafter, device=device, dtype=dtype, quantize=quantize, progress=progress,
                                cache_dir=cache_dir)
    if wants_self_draft(target, drafter):
        return load_self_draft_pair(target, drafter, device=device, dtype=dtype, quantize=quantize,
                                    progress=progress, cache_dir=cache_dir)
    pair = models.load_pair(target, drafter, device=device, dtype=dtype, drafter_dtype=drafter_dtype,
                            quantize=quantize, drafter_quantize=drafter_quantize, device_map=device_map,
                            progress=progress, cache_dir=cache_dir)
    (progress or no_progress)("Probing each model's cached forward against the uncached one")
    pair.probe = probe_pair(pair)
    return pair
