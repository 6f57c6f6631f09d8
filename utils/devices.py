"""Device and dtype resolution: turn the user's ``--device`` and ``--dtype`` words into torch objects.

``auto`` prefers CUDA (the design's primary target), then Apple MPS, then the CPU. The dtype
``auto`` is float32 on the CPU, bfloat16 on CUDA (float16 on GPUs without bf16) and float16 on MPS.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from utils.errors import ModelLoadError

if TYPE_CHECKING:  # torch is imported lazily so that `infer.py --help` stays fast
    import torch

# Accepted spellings -> the torch attribute name.
DTYPES = {
    "float32": "float32", "fp32": "float32", "float": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16",
}

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")


def mps_available() -> bool:
    """True when Apple's Metal backend can be used."""
    import torch

    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def _cuda_device(text: str) -> torch.device:
    """Parse and check ``cuda`` / ``cuda:N`` against the GPUs present."""
    import torch

    if not torch.cuda.is_available():
        raise ModelLoadError(
            f"--device {text} asks for a CUDA GPU but none is available here: use --device auto or --device cpu."
        )
    dev = torch.device(text)
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise ModelLoadError(
            f"--device {text} asks for GPU {dev.index} but only {count} GPU(s) exist: use cuda:0..cuda:{count - 1}."
        )
    return torch.device("cuda", dev.index if dev.index is not None else torch.cuda.current_device())


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """The torch device for ``auto``, ``cpu``, ``cuda``, ``cuda:N`` or ``mps``."""
    import torch

    if isinstance(device, torch.device):
        device = str(device)
    text = str(device or "auto").strip().lower()
    if text == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("mps") if mps_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    if text == "cuda" or text.startswith("cuda:"):
        try:
            return _cuda_device(text)
        except RuntimeError:
            raise ModelLoadError(f"--device {device!r} is not a valid CUDA device: use cuda or cuda:N.") from None
    if text == "mps":
        if not mps_available():
            raise ModelLoadError("--device mps asks for Apple's Metal GPU but it is not available: use --device auto or cpu.")
        return torch.device("mps")
    raise ModelLoadError(f"Unknown device {device!r}: use auto, cpu, cuda, cuda:N or mps.")


def auto_dtype(device: torch.device) -> torch.dtype:
    """The default dtype for ``device``: float32 on CPU, bf16 (else fp16) on CUDA, fp16 on MPS."""
    import torch

    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "mps":
        return torch.float16
    return torch.float32


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """The torch dtype for ``auto``, ``float32``, ``bfloat16`` or ``float16`` (fp32/bf16/fp16 too)."""
    import torch

    if isinstance(dtype, torch.dtype):
        if dtype in {getattr(torch, name) for name in DTYPES.values()}:
            return dtype
        raise ModelLoadError(f"Unsupported dtype {dtype}: use {', '.join(DTYPE_CHOICES)}.")
    text = str(dtype or "auto").strip().lower()
    if text == "auto":
        return auto_dtype(device)
    if text not in DTYPES:
        raise ModelLoadError(f"Unknown dtype {dtype!r}: use {', '.join(DTYPE_CHOICES)}.")
    return getattr(torch, DTYPES[text])


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def synchronize(device: "str | torch.device | None") -> None:
    """Wait for queued device work, so that a timer does not stop before the kernels do."""
    import torch

    kind = torch.device(device).type if device is not None else "cpu"
    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.synchronize(device)
    elif kind == "mps" and hasattr(torch, "mps"):
        torch.mps.synchronize()
    elif kind == "xpu" and hasattr(torch, "xpu"):
        torch.xpu.synchronize(device)


def model_device(model) -> torch.device:
    """Where a model's inputs go: the device of its input embeddings (right for sharded models too)."""
    get_embeddings = getattr(model, "get_input_embeddings", None)
    embeddings = get_embeddings() if get_embeddings is not None else None
    if embeddings is not None:
        return embeddings.weight.device
    return next(model.parameters()).device


HALF_DTYPES = ("bfloat16", "float16")


def half_precision_reason(dtype: str) -> str:
    """Why greedy outputs of a target in half precision may differ from its AR output: one line
    (docs/results.md, "A target in bfloat16 under greedy" and "On a GPU")."""
    return (f"the target runs in {dtype}: a verify forward of k tokens rounds differently from a "
            f"1-token step, so a near-tie can go the other way and 'identical' can fall below all "
            f"(transformers' decoders alike); float32 keeps greedy outputs comparable token for token")
