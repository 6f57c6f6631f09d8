"""The one error type model loading raises, and the translation of library errors into it.

Every ``ModelLoadError`` reads as one line: what went wrong, then what to do next. The
REPL prints ``str(error)`` and exits non-zero before it starts; nothing else is needed.
"""

from __future__ import annotations

import os


class ModelLoadError(Exception):
    """A model could not be loaded; ``str(e)`` is one line naming the cause and the next step."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def _chain(exc: BaseException):
    """``exc`` followed by its causes and contexts, oldest last, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _has_type(exc: BaseException, name: str) -> bool:
    """True when ``exc`` or anything in its chain is an instance of a class called ``name``."""
    return any(name in {cls.__name__ for cls in type(e).__mro__} for e in _chain(exc))


def _text(exc: BaseException) -> str:
    """All messages in the chain of ``exc``, lower-cased, for pattern matching."""
    return " ".join(str(e) for e in _chain(exc)).lower()


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message (or its type name)."""
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()
    return type(exc).__name__


def hub_offline() -> bool:
    """True when the environment asks the Hugging Face libraries not to touch the network."""
    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return any((flag or "").strip().lower() in {"1", "true", "yes", "on"} for flag in flags)


def is_out_of_memory(exc: BaseException) -> bool:
    """True for CUDA/MPS/CPU out-of-memory failures, raised or anywhere in the chain of causes."""
    if _has_type(exc, "MemoryError") or _has_type(exc, "OutOfMemoryError"):
        return True
    return "out of memory" in _text(exc)


def explain_load_error(exc: BaseException, spec: str, where: str = "") -> ModelLoadError:
    """Translate an exception raised while loading ``spec`` into a one-line ``ModelLoadError``; ``where``
    names the device for the out-of-memory advice; unknown failures keep their first line."""
    if isinstance(exc, ModelLoadError):
        return exc
    text = _text(exc)
    if is_out_of_memory(exc):
        place = f" on {where}" if where else ""
        return ModelLoadError(
            f"Out of memory while loading '{spec}'{place}: try --quantize int8 or int4, "
            "--dtype bfloat16, --device-map auto (several GPUs), or a smaller model."
        )
    if _has_type(exc, "GatedRepoError") or "gated repo" in text:
        return ModelLoadError(
            f"'{spec}' is a gated model on the Hugging Face Hub: accept its licence at "
            f"https://huggingface.co/{spec} and log in (huggingface-cli login, or set HF_TOKEN)."
        )
    if _has_type(exc, "RepositoryNotFoundError") or "not a valid model identifier" in text:
        return ModelLoadError(
            f"'{spec}' is neither a local path nor a model id on the Hugging Face Hub: check the "
            "spelling (org/name), or pass a local model directory or a .gguf file."
        )
    if _has_type(exc, "LocalEntryNotFoundError") or "couldn't connect" in text:
        if hub_offline():
            return ModelLoadError(
                f"'{spec}' is not in the local Hugging Face cache and offline mode is on "
                "(--offline / HF_HUB_OFFLINE=1): download it once with network access, or pass "
                "a local model directory or a .gguf file."
            )
        return ModelLoadError(
            f"Could not reach the Hugging Face Hub to fetch '{spec}' (no network?) and it is not "
            "in the local cache: connect to the network, or pass a local model directory or "
            "a .gguf file (--offline skips the network)."
        )
    if isinstance(exc, ImportError) and "gguf" in text:
        return missing_gguf_error(spec)
    if "trust_remote_code" in text:
        return ModelLoadError(
            f"'{spec}' needs custom code from its repository (trust_remote_code), which this tool "
            "does not run: pick a model supported by transformers natively."
        )
    return ModelLoadError(f"Could not load '{spec}': {first_line(exc)}")


def missing_gguf_error(spec: str) -> ModelLoadError:
    """The error for a .gguf spec when the ``gguf`` package is not installed."""
    return ModelLoadError(
        f"Loading '{spec}' needs the gguf package, which is not installed: run "
        "`.venv/bin/python -m pip install 'gguf>=0.10'` (or bash scripts/setup.sh)."
    )
