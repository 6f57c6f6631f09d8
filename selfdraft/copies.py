"""Copies of the target as drafters: the same weights in a lower precision, or quantised to int8.

``precision_copy`` casts a copy of every weight (``self:bf16``, ``self:fp16``).
``int8_copy`` quantises a copy's linear layers to int8 (``self:int8``) by one
of three routes:

- ``torch``: torch's dynamic quantisation (``torch.ao.quantization.quantize_dynamic``):
  int8 weights (one scale per output row), activations quantised per call,
  fbgemm/onednn int8 kernels.
  CPU only. It replaces every ``nn.Linear``, the output head included.
- ``quanto``: optimum-quanto weight-only int8 (the ``--quantize int8`` route);
  the output head stays in float, as transformers' own integration does.
- ``torchao``: torchao's int8 weight-only config, when the package is installed.

``scripts/int8_paths.py`` measures them on the default model; on the CPUs
measured the torch route was the fastest by far (docs/drafters.md), so it is
the choice on a CPU and quanto elsewhere.
"""

from __future__ import annotations

import copy
import importlib.util
import inspect

import torch

from utils.cache import UnsupportedCacheError
from utils.devices import model_device
from utils.quantize import apply_quanto, output_head_names

INT8_METHODS = ("torch", "quanto", "torchao")


def precision_copy(model, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of ``model`` with every floating-point weight in ``dtype`` (the target is untouched)."""
    clone = copy.deepcopy(model)
    return clone.to(dtype).eval()


def default_int8_method(device: torch.device) -> str:
    """The int8 route for ``device``: torch's dynamic int8 on a CPU, optimum-quanto elsewhere."""
    return "torch" if device.type == "cpu" else "quanto"


def int8_available(method: str) -> bool:
    return {"torch": hasattr(torch.ao.quantization, "quantize_dynamic"),
            "quanto": importlib.util.find_spec("optimum") is not None,
            "torchao": importlib.util.find_spec("torchao") is not None}[method]


class Int8Refused(UnsupportedCacheError):
    """The model does not run with int8 linear layers here; the message is one line."""


def _trial(model) -> None:
    """A two-token forward, without a cache (the decoder's too for an encoder-decoder)."""
    ids = torch.zeros(1, 2, dtype=torch.long)
    kwargs = {"decoder_input_ids": ids} if getattr(model.config, "is_encoder_decoder", False) else {}
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False, **kwargs)


def _weights_read_directly(model) -> set[str]:
    """Linear layers whose parent's code reads ``self.<name>.weight`` itself (Mamba's
    ``dt_proj``): a dynamic int8 layer has no weight tensor to give it."""
    found = set()
    for parent_name, parent in model.named_modules():
        try:
            source = inspect.getsource(type(parent))
        except (OSError, TypeError):
            continue
        for name, child in parent.named_children():
            if isinstance(child, torch.nn.Linear) and f"self.{name}.weight" in source:
                found.add(f"{parent_name}.{name}" if parent_name else name)
    return found


def _torch_dynamic(model):
    """A copy with every linear layer in dynamic int8 that the model's code allows.

    Some models read a linear layer's weight tensor themselves (the head's
    ``lm_head.weight.dtype``, Mamba's ``dt_proj.weight @ x``), which a quantised
    linear does not have: a two-token forward tells, and then those layers stay
    in float. A model that still does not run is refused with one line.
    """
    per_channel = torch.ao.quantization.per_channel_dynamic_qconfig  # one scale per output row
    linears = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    keep_float: set[str] = set()
    error: Exception | None = None
    for extra in (set, lambda: set(output_head_names(model)), lambda: _weights_read_directly(model)):
        keep_float |= extra()
        spec = ({torch.nn.Linear: per_channel} if not keep_float
                else {name: per_channel for name in linears - keep_float})
        quantised = torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8)
        try:
            _trial(quantised)
            return quantised
        except (AttributeError, TypeError, RuntimeError, ValueError) as e:
            error = e
    text = str(error).strip().splitlines()
    raise Int8Refused(f"self:int8: {type(model).__name__} does not run with torch's dynamic int8 layers "
                      f"({type(error).__name__}: {text[0] if text else ''}); use self:bf16 or self:fp16")


def _quanto(model):
    return apply_quanto(model, "int8")


def _torchao(model):
    from torchao.quantization import Int8WeightOnlyConfig, quantize_  # optional: imported only when chosen

    quantize_(model, Int8WeightOnlyConfig())
    return model


def int8_copy(model, method: str | None = None) -> torch.nn.Module:
    """A copy of ``model`` whose linear weights are int8, by ``method`` (None: the device's default)."""
    method = method or default_int8_method(model_device(model))
    if method not in INT8_METHODS:
        raise ValueError(f"unknown int8 method {method!r}: use {', '.join(INT8_METHODS)}")
    if not int8_available(method):
        raise ValueError(f"int8 method {method!r} is not available in this environment")
    if method == "torch":  # quantize_dynamic copies the model itself (float32 in, int8 weights out)
        quantised = _torch_dynamic(model if model.dtype == torch.float32 else copy.deepcopy(model).float())
    else:
        quantised = {"quanto": _quanto, "torchao": _torchao}[method](copy.deepcopy(model))
    quantised.eval()
    object.__setattr__(quantised, "int8_method", method)
    return quantised
