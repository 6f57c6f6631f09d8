"""Copies of the target as drafters: the same weights in a lower precision, or quantised to int8.

``precision_copy`` casts a copy of every weight (``self:bf16``, ``self:fp16``).
``int8_copy`` quantises a copy's linear layers to int8 (``self:int8``) by one
of four routes:

- ``torch``: torch's dynamic quantisation (``torch.ao.quantization.quantize_dynamic``):
  int8 weights (one scale per output row), activations quantised per call,
  fbgemm/onednn int8 kernels.
  CPU only. It replaces every ``nn.Linear``, the output head included.
- ``weight-only``: int8 weights (one scale per output row) and bfloat16
  activations, multiplied by torch's weight-only kernel
  (``aten._weight_int8pack_mm``); the rest of the copy computes in bfloat16.
  No activation is quantised, so it agrees with the target more often than
  ``torch`` (0.955 against 0.87 of drafts accepted on the default model); it pays
  where bfloat16 is native (AVX-512 BF16 / AMX), and is measured for the default
  drafter only there. CPU only.
- ``quanto``: optimum-quanto weight-only int8 (the ``--quantize int8`` route);
  the output head stays in float, as transformers' own integration does.
- ``torchao``: torchao's int8 weight-only config, when the package is installed.

``scripts/int8_paths.py`` measures them on the default model; on the CPUs
measured the torch route was the fastest by far (docs/drafters.md), so it is
the choice on a CPU and quanto elsewhere.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import inspect
import warnings

import torch

from model_drafters.selfdraft.spec import INT8_ROUTES
from kvcache.cache import UnsupportedCacheError
from utils.devices import model_device
from utils.quantize import apply_quanto, output_head_names

CPU_ONLY_ROUTES = ("torch", "weight-only")
WEIGHT_ONLY_DTYPE = torch.bfloat16  # the weight-only route's activations
# torch's weight-only int8 kernel reads the inner dimension in blocks of 16: on
# torch 2.13 another width gave wrong sums or ended the process. Narrower layers stay in bfloat16.
WEIGHT_ONLY_BLOCK = 16
# The start of torch's deprecation warning for quantized tensor types, which the torch route creates.
QUANTIZED_TENSOR_WARNING = r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized tensor"


def precision_copy(model, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of ``model`` with every floating-point weight in ``dtype`` (the target is untouched)."""
    clone = copy.deepcopy(model)
    return clone.to(dtype).eval()


def default_int8_method(device: torch.device) -> str:
    """The int8 route for ``device``: torch's dynamic int8 on a CPU, optimum-quanto elsewhere."""
    return "torch" if device.type == "cpu" else "quanto"


def native_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16 or AMX), as torch reports it."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def _installed(module: str) -> bool:
    """Whether ``module`` (dotted: its package's too) can be imported here, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:          # the package of a dotted name is missing
        return False


def int8_available(method: str) -> bool:
    return {"torch": hasattr(torch.ao.quantization, "quantize_dynamic"),
            "weight-only": hasattr(torch.ops.aten, "_weight_int8pack_mm"),
            "quanto": _installed("optimum.quanto"),      # optimum alone (another of its packages) is not enough
            "torchao": _installed("torchao")}[method]


class Int8Refused(UnsupportedCacheError):
    """The model does not run with int8 linear layers here; the message is one line."""


def _trial(model) -> None:
    """A two-token forward, without a cache (the decoder's too for an encoder-decoder)."""
    ids = torch.zeros(1, 2, dtype=torch.long)
    kwargs = {"decoder_input_ids": ids} if getattr(model.config, "is_encoder_decoder", False) else {}
    with torch.inference_mode():
        model(input_ids=ids, use_cache=False, **kwargs)


@functools.lru_cache(maxsize=None)
def _class_source(cls: type) -> str:
    """The source of ``cls`` ("" when it has none): ``inspect`` parses the class's whole file
    each time it is asked (about 10 ms for a modeling file), so each class is read once."""
    try:
        return inspect.getsource(cls)
    except (OSError, TypeError):
        return ""


def _weights_read_directly(model) -> set[str]:
    """Linear layers whose parent's code reads ``self.<name>.weight`` itself (Mamba's
    ``dt_proj``): a dynamic int8 layer has no weight tensor to give it."""
    found = set()
    for parent_name, parent in model.named_modules():
        linears = [name for name, child in parent.named_children() if isinstance(child, torch.nn.Linear)]
        if not linears:
            continue
        source = _class_source(type(parent))
        found.update(f"{parent_name}.{name}" if parent_name else name
                     for name in linears if f"self.{name}.weight" in source)
    return found


class WeightOnlyInt8Linear(torch.nn.Module):
    """``nn.Linear`` with its weight in int8 (one scale per output row, symmetric), computed
    by torch's weight-only kernel on bfloat16 activations; the output has the input's dtype."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scale = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
        self.register_buffer("qweight", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(WEIGHT_ONLY_DTYPE))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(WEIGHT_ONLY_DTYPE))
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(WEIGHT_ONLY_DTYPE).contiguous()
        out = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scale)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def _weight_only_fits(linear: torch.nn.Linear) -> bool:
    return linear.in_features % WEIGHT_ONLY_BLOCK == 0


def _weight_only(model, keep_float: set[str]):
    """A bfloat16 copy of ``model`` whose linear layers, but ``keep_float`` and those the kernel
    cannot take, are :class:`WeightOnlyInt8Linear`."""
    clone = precision_copy(model, WEIGHT_ONLY_DTYPE)
    for parent_name, parent in list(clone.named_modules()):
        for name, child in list(parent.named_children()):
            full = f"{parent_name}.{name}" if parent_name else name
            if isinstance(child, torch.nn.Linear) and full not in keep_float and _weight_only_fits(child):
                setattr(parent, name, WeightOnlyInt8Linear(child))
    return clone


def _torch_dynamic(model, keep_float: set[str]):
    """A copy whose linear layers but ``keep_float`` are torch's dynamic int8 layers."""
    per_channel = torch.ao.quantization.per_channel_dynamic_qconfig  # one scale per output row
    linears = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    spec = ({torch.nn.Linear: per_channel} if not keep_float
            else {name: per_channel for name in linears - keep_float})
    with warnings.catch_warnings():
        # torch 2.13 warns, once per process, that quantized tensor types (torch.qint8) are deprecated:
        # quantize_dynamic holds each int8 weight as one, and fbgemm's int8 kernel takes no other.
        # Plain int8 tensors and scales do not replace it: activations quantised by hand and
        # multiplied by torch._int_mm ran over 10x slower per layer (576 -> 1536, one token) and
        # rounded differently. A user can do nothing about the warning, so a start stays quiet.
        warnings.filterwarnings("ignore", message=QUANTIZED_TENSOR_WARNING, category=UserWarning)
        return torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8)


def _with_fallbacks(model, quantise, route: str):
    """``quantise(model, keep_float)`` with every linear layer in int8 that the model's code allows.

    Some models read a linear layer's weight tensor themselves (the head's
    ``lm_head.weight.dtype``, Mamba's ``dt_proj.weight @ x``), which a quantised
    linear does not have: a two-token forward tells, and then those layers stay
    in float. A model that still does not run is refused with one line.
    """
    keep_float: set[str] = set()
    error: Exception | None = None
    for extra in (set, lambda: set(output_head_names(model)), lambda: _weights_read_directly(model)):
        keep_float |= extra()
        quantised = quantise(model, keep_float)
        try:
            _trial(quantised)
            return quantised
        except (AttributeError, TypeError, RuntimeError, ValueError) as e:
            error = e
    text = str(error).strip().splitlines()
    raise Int8Refused(f"self:int8: {type(model).__name__} does not run with {route} int8 layers "
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
    if method not in INT8_ROUTES:
        raise ValueError(f"unknown int8 method {method!r}: use {', '.join(INT8_ROUTES)}")
    if not int8_available(method):
        raise ValueError(f"int8 method {method!r} is not available in this environment")
    if method in CPU_ONLY_ROUTES and model_device(model).type != "cpu":
        raise ValueError(f"int8 route {method!r} runs on a CPU only; this model is on {model_device(model)}")
    if method == "torch":  # quantize_dynamic copies the model itself (float32 in, int8 weights out)
        source = model if model.dtype == torch.float32 else copy.deepcopy(model).float()
        quantised = _with_fallbacks(source, _torch_dynamic, "torch's dynamic")
    elif method == "weight-only":  # _weight_only copies the model itself
        quantised = _with_fallbacks(model, _weight_only, "weight-only")
    else:
        quantised = {"quanto": _quanto, "torchao": _torchao}[method](copy.deepcopy(model))
    quantised.eval()
    object.__setattr__(quantised, "int8_method", method)
    return quantised
