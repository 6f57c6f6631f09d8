"""Weight quantisation choices: optimum-quanto int8/int4 on any device, bitsandbytes 8/4-bit on CUDA.

optimum-quanto is the design's choice (the reference defaulted to int8 for both models); the
bitsandbytes route exists for CUDA users who prefer it. Choices are checked before any weights
are read so that a wrong choice costs nothing.
"""

from __future__ import annotations

from utils.errors import ModelLoadError

QUANTO = ("int8", "int4")
BNB = ("bnb8", "bnb4")
QUANTIZE_CHOICES = ("none",) + QUANTO + BNB


def parse_quantize(quantize: str | None) -> str | None:
    """Normalise a ``--quantize`` value: ``None``/``"none"`` -> ``None``, else one of QUANTO + BNB."""
    if quantize is None:
        return None
    text = str(quantize).strip().lower()
    if text in ("", "none", "no", "off"):
        return None
    if text not in QUANTO + BNB:
        raise ModelLoadError(f"Unknown quantisation {quantize!r}: use {', '.join(QUANTIZE_CHOICES)}.")
    return text


def _require(module: str, choice: str) -> None:
    """Raise a one-line error when the package behind ``choice`` cannot be imported."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        package = {"optimum": "optimum-quanto", "bitsandbytes": "bitsandbytes"}[module]
        raise ModelLoadError(
            f"--quantize {choice} needs the {package} package, which is not installed: "
            f"run `.venv/bin/python -m pip install {package}` (it is in requirements.txt)."
        )


def check_quantize_supported(method: str | None, device) -> None:
    """Refuse a quantisation the device or the installed packages cannot run, before loading."""
    if method is None:
        return
    if method in BNB:
        if device.type != "cuda":
            bits = method.removeprefix("bnb")
            raise ModelLoadError(
                f"--quantize {method} (bitsandbytes) needs a CUDA GPU but this run is on {device.type}: "
                f"use --quantize int{bits} (optimum-quanto), which works on any device."
            )
        _require("bitsandbytes", method)
    else:
        _require("optimum", method)


def bnb_config(method: str, compute_dtype):
    """The transformers ``BitsAndBytesConfig`` for ``bnb8`` or ``bnb4`` (NF4, computing in ``compute_dtype``)."""
    from transformers import BitsAndBytesConfig

    if method == "bnb8":
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype
    )


def output_head_names(model) -> list[str]:
    """Module names of the output projection (``lm_head``), which quantisation leaves alone."""
    head = model.get_output_embeddings()
    return [name for name, module in model.named_modules() if head is not None and module is head]


def apply_quanto(model, method: str):
    """Quantise ``model``'s linear weights in place with optimum-quanto (``int8`` or ``int4``) and freeze
    them; returns it. Weight-only; the output head stays unquantised, as in transformers' quanto
    integration: it is the most sensitive layer, and a tied head would be an extra copy."""
    from optimum.quanto import freeze, qint4, qint8, quantize

    quantize(model, weights={"int8": qint8, "int4": qint4}[method], exclude=output_head_names(model) or None)
    freeze(model)
    return model
