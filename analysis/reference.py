"""The reference a difference from target AR is judged against (``analysis.divergence``).

The model's own uncached forward over the committed prefix, in the run's dtype and in float32. What
a correct computation may differ from it by is measured once per model and dtype
(:func:`rounding_tolerance`) on paths that share nothing with the project's decoding (transformers'
own cache, fed one token and 2 to 8 at a time), so a bug's own deviation can never become its excuse.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Sequence

import torch

from analysis.divergence import Evidence
from kvcache.cache import cache_keyword, new_cache

PROBE_LENGTH = 48            # tokens of the probe sequence the tolerance is measured on
PROBE_PREFILL = 16           # the first chunk: a prefill, then steps and verify-shaped chunks
PROBE_CHUNKS = (1, 1, 1, 1, 2, 3, 4, 5, 8, 1, 1, 2, 4)
PROBE_SEEDS = (0, 1)         # two probe sequences
TOP = 8                      # the tokens compared per row: a recorded decision's width
SAFETY = 2.0                 # the tolerance is twice the largest rounding seen on the probes

_tolerances: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> {dtype: float}


def _dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def _device(model) -> torch.device:
    return next(model.parameters()).device


def _logits(model, ids: Sequence[int], **kwargs) -> torch.Tensor:
    """(n, V) float32 logits of an uncached forward over ``ids`` (or over ``ids`` on a cache)."""
    x = torch.tensor([list(ids)], dtype=torch.long, device=_device(model))
    with torch.no_grad():
        out = model(input_ids=x, **kwargs)
    return out


def _unit(dtype: torch.dtype) -> float:
    """The relative spacing of ``dtype`` (one unit in the last place at 1.0)."""
    return torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float32).eps


def rounding_tolerance(model) -> float:
    """What correct computations of ``model`` in its dtype differ from its uncached forward by, on the
    top 8 of each row: twice the largest difference transformers' own cache shows, fed step by step and
    in verify-sized chunks, at least one ulp of the largest logit. Measured once per model and dtype."""
    dtype = _dtype(model)
    known = _tolerances.setdefault(model, {})
    if dtype not in known:
        known[dtype] = _measure(model, dtype)
    return known[dtype]


def _measure(model, dtype: torch.dtype) -> float:
    vocab = int(model.get_output_embeddings().weight.shape[0])
    worst, scale = 0.0, 0.0
    for seed in PROBE_SEEDS:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (PROBE_LENGTH,), generator=gen).tolist()
        whole = _logits(model, ids, use_cache=False).logits[0].float()            # (n, V)
        scale = max(scale, float(whole.abs().max()))
        top = whole.topk(min(TOP, whole.shape[-1]), dim=-1).indices                 # (n, TOP)
        cache, at = new_cache(model), 0                    # transformers' own cache, filled in place
        for width in (PROBE_PREFILL, *PROBE_CHUNKS):
            if at + width > len(ids):
                break
            out = _logits(model, ids[at:at + width], use_cache=True, **{cache_keyword(model): cache})
            part = out.logits[0].float()                                              # (width, V)
            rows = slice(at, at + width)
            diff = (part.gather(-1, top[rows]) - whole[rows].gather(-1, top[rows])).abs()
            worst = max(worst, float(diff.max()))
            at += width
    return max(SAFETY * worst, _unit(dtype) * scale)


def _float32_copy(model):
    """``model`` in float32 (itself when it already is), or None when it cannot be cast (a
    quantised model whose weights are not floating point) or its float32 copy would not fit in
    the memory its device has free (a large target on a GPU)."""
    if _dtype(model) == torch.float32:
        return model
    if 4 * sum(p.numel() for p in model.parameters()) > 0.8 * _free_bytes(_device(model)):
        return None
    try:
        return copy.deepcopy(model).to(torch.float32)
    except Exception:  # noqa: BLE001  (no float32 reference: the verdict says so)
        return None


def _free_bytes(device: torch.device) -> float:
    """Memory free on ``device``: the GPU's, or the host's available memory (``/proc/meminfo``)."""
    if device.type == "cuda":
        return float(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return float(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return float("inf")


def reference_rows(model, prefix: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The uncached forward's last row over ``prefix`` in the model's dtype and in float32 (None
    where the model cannot be cast), each (V,) float32."""
    ref = _logits(model, prefix, use_cache=False).logits[0, -1].float()
    wide = _float32_copy(model)
    ref32 = None if wide is None else _logits(wide, prefix, use_cache=False).logits[0, -1].float()
    return ref, ref32


def evidence(model, prompt_ids: Sequence[int], shared: Sequence[int], a: int, b: int,
             ar_values: Sequence[tuple[int, float]], values: Sequence[tuple[int, float]],
             rows: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> Evidence:
    """The reference at the first difference: ``shared`` the tokens both runs emitted before it, ``a`` and
    ``b`` the two tokens there, ``ar_values`` / ``values`` each recorded row's (token, logit) pairs,
    ``rows`` the :func:`reference_rows` computed before, if any."""
    ref, ref32 = rows if rows is not None else reference_rows(model, [*prompt_ids, *shared])

    def deviation(pairs):
        return max((abs(v - float(ref[t])) for t, v in pairs), default=0.0)

    margin32 = None if ref32 is None else abs(float(ref32[a]) - float(ref32[b]))
    return Evidence(ar_deviation=deviation(ar_values), deviation=deviation(values),
                    tolerance=rounding_tolerance(model), margin32=margin32, dtype=_label(model))


def _label(model) -> str:
    """The computation's name in a verdict's note: the dtype, and ``quantised`` for weights held by
    optimum-quanto or bitsandbytes layers (their tolerance is their own)."""
    name = str(_dtype(model)).removeprefix("torch.")
    quantised = any(type(m).__module__.startswith(("optimum.quanto", "bitsandbytes")) for m in model.modules())
    return f"{name}, quantised" if quantised else name


class Referee:
    """Computes :class:`Evidence` for one prompt's differences from target AR with ``model`` (the
    pair's target, decoder-only and local). ``for_prompt(prompt_ids)`` gives the callable
    ``analysis.divergence.explain`` takes."""

    def __init__(self, model):
        self.model = model

    def for_prompt(self, prompt_ids: Sequence[int]):
        """The reference callable for one prompt: strategies that part from target AR at the same
        position share its forwards (and its float32 copy of the model) instead of repeating them."""
        rows: dict[int, tuple] = {}

        def reference(p, ar_tokens, a, b, ar_row, row):
            try:
                if p not in rows:
                    rows[p] = reference_rows(self.model, [*prompt_ids, *ar_tokens[:p]])
                return evidence(self.model, prompt_ids, ar_tokens[:p], a, b, _pairs(ar_row), _pairs(row),
                                rows=rows[p])
            except Exception:  # noqa: BLE001  (out of memory, say: the difference goes without a verdict)
                return None
        return reference


def _pairs(row) -> list[tuple[int, float]]:
    return list(zip(row.indices, row.values))


def referee_for(target) -> Referee | None:
    """A :class:`Referee` on ``target``, or None where no local reference can be computed: a
    served target (its weights are on the server) or an encoder-decoder model."""
    from transformers import PreTrainedModel

    if not isinstance(target, PreTrainedModel) or target.config.is_encoder_decoder:
        return None
    return Referee(target)
