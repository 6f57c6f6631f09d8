"""Model loading for the REPL, the benchmark and the tests: any target/drafter pair, or the offline default.

``load_model(spec)`` takes a hub id, a local directory, a ``.gguf`` file, or ``None`` for the offline
default. ``load_pair`` loads a target and a drafter, checks they are of the same kind, compares their
tokenizers and returns a ``ModelPair``. How the models load is one ``LoadOptions`` value, passed down
whole. Drafters made from the target load in ``model_drafters.selfdraft.load``.

Every failure a user can cause or fix is a one-line ``ModelLoadError``. Neither torch nor
transformers is imported at import time (``infer.py --help`` stays fast).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from utils.default_model import DEFAULT_LABEL, default_model_dir, weights_subfolder
from utils.devices import dtype_name, model_device, resolve_device, resolve_dtype
from utils.errors import ModelLoadError, explain_load_error, missing_gguf_error
from utils.gguf_files import gguf_available
from utils.progress import Progress, no_progress, quiet_hf_progress
from utils.quantize import BNB, QUANTO, apply_quanto, bnb_config, check_quantize_supported, parse_quantize
from utils.vocab import context_length, end_token_ids, pair_vocabulary

if TYPE_CHECKING:
    import torch

__all__ = [
    "ModelLoadError",
    "ModelPair",
    "ModelSource",
    "load_model",
    "load_pair",
    "resolve_source",
    "set_offline",
]

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
SELF_DRAFT = "self"
# A drafter spec that names a drafter kind (``self:int8``, ``eagle3:PATH``; two letters or more before the
# colon, so a drive letter is a path): such drafters load with their target, through engine.load_pair.
_KIND_SPEC = re.compile(r"^[A-Za-z][\w-]+:")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def set_offline(offline: bool) -> None:
    """With ``offline=True``, forbid the Hugging Face libraries the network (HF_HUB_OFFLINE,
    TRANSFORMERS_OFFLINE, and huggingface_hub's switch if it is imported); call it before transformers
    is imported. ``offline=False`` changes nothing, so a user's offline environment is respected."""
    if not offline:
        return
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True


@dataclass(frozen=True)
class ModelSource:
    """Where a model comes from: ``location`` (hub id or directory), an optional GGUF file in it, a label."""

    location: str
    gguf_file: str | None
    label: str
    kind: str  # "default", "hub", "dir" or "gguf"


def _gguf_source(path: Path, spec: str) -> ModelSource:
    """A source for one GGUF file (checking that the gguf package is there)."""
    if not gguf_available():
        raise missing_gguf_error(spec)
    return ModelSource(str(path.parent), path.name, path.name, "gguf")


def _directory_source(path: Path, spec: str) -> ModelSource:
    """A source for a directory: a saved transformers model, or a folder holding exactly one GGUF."""
    if (path / "config.json").is_file():
        return ModelSource(str(path), None, path.name or spec, "dir")
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return _gguf_source(ggufs[0], spec)
    if ggufs:
        names = ", ".join(p.name for p in ggufs)
        raise ModelLoadError(f"'{spec}' holds several GGUF files ({names}): pass the path of one of them.")
    raise ModelLoadError(
        f"'{spec}' is a directory without config.json or a .gguf file: pass a saved transformers "
        "model directory, a .gguf file, or a hub id (org/name)."
    )


def resolve_source(spec: str | None, *, cache_dir=None, progress: Progress | None = None) -> ModelSource:
    """Classify ``spec`` as the default model, a .gguf file, a local directory, or a hub id."""
    if spec is None:
        folder = default_model_dir(cache_dir, progress)
        return ModelSource(str(folder), None, DEFAULT_LABEL, "default")
    text = str(spec).strip()
    if not text:
        raise ModelLoadError("An empty model name was given: pass a hub id (org/name), a directory or a .gguf file.")
    path = Path(text).expanduser()
    if text.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file '{text}' does not exist: check the path.")
        return _gguf_source(path, text)
    if path.is_dir():
        return _directory_source(path, text)
    if path.exists():
        raise ModelLoadError(f"'{text}' is a file but not a .gguf model: pass a model directory, a .gguf file or a hub id.")
    looks_like_path = text.startswith(("/", ".", "~")) or "\\" in text or text.count("/") > 1
    if looks_like_path or not _HUB_ID.match(text):
        raise ModelLoadError(f"'{text}' does not exist: check the path, or use org/name for a model on the Hugging Face Hub.")
    return ModelSource(text, None, text, "hub")


def _check_device_map(device_map) -> None:
    """Accept accelerate's device-map strategies (or an explicit dict); refuse anything else."""
    if device_map is None or isinstance(device_map, dict):
        return
    if device_map not in DEVICE_MAPS:
        raise ModelLoadError(f"Unknown device map {device_map!r}: use {', '.join(DEVICE_MAPS)}.")
    import importlib.util

    if importlib.util.find_spec("accelerate") is None:
        raise ModelLoadError("--device-map needs the accelerate package: run `.venv/bin/python -m pip install accelerate`.")


def _weight_kwargs(torch_dtype, device, method: str | None, device_map) -> dict[str, Any]:
    """The ``from_pretrained`` arguments for dtype, placement and bitsandbytes quantisation."""
    kwargs: dict[str, Any] = {"dtype": torch_dtype}
    if device_map is not None:
        kwargs["device_map"] = device_map
    elif device.type == "cuda":  # load straight onto the GPU, not through CPU memory
        kwargs["device_map"] = {"": device.index or 0}
    if method in BNB:
        kwargs["quantization_config"] = bnb_config(method, torch_dtype)
    return kwargs


def _check_gguf_quantize(source: ModelSource, method: str | None) -> None:
    """bitsandbytes cannot quantise a GGUF file as it loads: refuse before reading it."""
    if source.gguf_file is not None and method in BNB:
        bits = method.removeprefix("bnb")
        raise ModelLoadError(
            f"--quantize {method} (bitsandbytes) cannot be combined with a .gguf file ({source.label}): "
            f"use --quantize int{bits} (optimum-quanto) or a transformers model directory."
        )


def read_config(source: ModelSource):
    """The model config of ``source`` (no weights read), load errors translated into one line."""
    from utils.hf_load import load_config

    try:
        return load_config(source.location, source.gguf_file)
    except Exception as exc:
        raise explain_load_error(exc, source.label) from exc


def load_model(
    spec: str | None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    quantize: str | None = None,
    device_map=None,
    progress: Progress | None = None,
    cache_dir=None,
    tokenizer=None,
):
    """Load ``(model, tokenizer)``, the model in eval mode; ``ModelLoadError`` (one line) on failure.

    ``spec``: hub id, local directory, ``.gguf`` path, or ``None`` for the offline default.
    ``dtype`` ``auto`` is resolved here (``utils.devices.auto_dtype``), never by the library, whose
    default differs between 4.x and 5.x. ``quantize``: None|int8|int4 (optimum-quanto) or bnb8|bnb4
    (CUDA). ``tokenizer``: reuse this one (a self-draft pair loads the same files twice; parsing a large
    ``tokenizer.json`` costs tenths of a second).
    """
    from utils.hf_load import load_tokenizer, load_weights

    say = progress or no_progress
    quiet_hf_progress()
    method = parse_quantize(quantize)
    _check_device_map(device_map)
    where = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, where)
    check_quantize_supported(method, where)
    source = resolve_source(spec, cache_dir=cache_dir, progress=say)
    _check_gguf_quantize(source, method)
    config = read_config(source)
    placement = f"device map {device_map}" if device_map is not None else str(where)
    try:
        if tokenizer is None:
            say(f"Loading tokenizer of {source.label}")
            tokenizer = load_tokenizer(source.location, source.gguf_file)
        say(f"Loading {source.label} ({dtype_name(torch_dtype)}, {placement})")
        kwargs = _weight_kwargs(torch_dtype, where, method, device_map)
        if source.kind == "default" and (subfolder := weights_subfolder(Path(source.location), torch_dtype)):
            kwargs["subfolder"] = subfolder  # the cached bfloat16 copy: no conversion at load time
        model = load_weights(source.location, source.gguf_file, config=config, **kwargs)
        if device_map is None and where.type not in ("cpu", "cuda"):
            model.to(where)
        if method in QUANTO:
            say(f"Quantising {source.label} weights to {method} (optimum-quanto)")
            apply_quanto(model, method)
    except Exception as exc:
        raise explain_load_error(exc, source.label, where=placement) from exc
    return model.eval(), tokenizer


@dataclass
class ModelPair:
    """A target and a drafter, with what the decoding loops need to know; ``drafter_tokenizer`` is None
    when the drafter shares the target's tokenizer."""

    target: Any
    drafter: Any
    tokenizer: Any  # the target's
    target_name: str  # human labels for the banner
    drafter_name: str
    end_tokens: list[int]
    device: torch.device  # where the target's inputs go
    vocab_size: int  # shared vocabulary length: compare logits over [:vocab_size]
    context_length: int | None  # target's maximum positions (None: unknown)
    self_draft_demo: bool  # True when the drafter is the target's own weights (the default pair)
    is_encoder_decoder: bool = False  # both models are seq2seq (T5, BART): prompts go to the encoder
    probe: Any = None  # kvcache.probe.PairProbe: how each model is fed over its cache, and why
    notes: tuple[str, ...] = ()  # banner lines about the drafter (a self-drafter chosen by measuring)
    drafts_on_target_cache: bool = False  # a self-drafter (model_drafters.selfdraft.load): drafts on the target's cache
    drafter_tokenizer: Any = None  # the drafter's own tokenizer when it differs from the target's
    tokenizer_difference: str | None = None  # how the two tokenizers differ, in words

    @property
    def shares_tokenizer(self) -> bool:
        return self.drafter_tokenizer is None

    @property
    def drafter_tok(self):
        """The tokenizer of the drafter's own ids (the target's when they share one)."""
        return self.tokenizer if self.drafter_tokenizer is None else self.drafter_tokenizer

    def banner_lines(self) -> list[str]:
        """Plain-text lines describing the pair, for the REPL's start-up banner."""
        lines = [f"target:  {self.target_name}", f"drafter: {self.drafter_name}", *self.notes]
        if self.probe is not None:
            lines.append(self.probe.summary())
        if self.self_draft_demo:
            lines.append(
                "self-draft demo: the drafter is the target's own weights in another dtype, so it shows "
                "the machinery, not a real speedup; pass --target and --drafter for a real pair."
            )
        if not self.shares_tokenizer:
            lines.append(
                f"the drafter has another tokenizer ({self.tokenizer_difference}): it drafts through "
                "text (/uag slem or tli), still lossless."
            )
        return lines


def describe(spec: str | None, model, quantize: str | None, note: str = "") -> str:
    """A human label such as ``SmolLM2-135M-Instruct (float32)`` or ``org/model (bfloat16, int8)``."""
    source = DEFAULT_LABEL if spec is None else str(spec)
    parts = [dtype_name(model.dtype)] + ([quantize] if quantize else []) + ([note] if note else [])
    return f"{source} ({', '.join(parts)})"


@dataclass(frozen=True)
class LoadOptions:
    """How a pair's models load, as one value built where a loader is called and passed down whole.

    ``dtype`` and ``quantize`` are the target's; ``drafter_dtype`` defaults to bfloat16 for a self-draft
    demo, else ``dtype``; ``drafter_quantize=None`` follows ``quantize`` (``"none"`` keeps the drafter
    unquantised). A drafter kind loaded with its target takes the target's dtype, device and quantisation.
    """

    device: str = "auto"
    dtype: str = "auto"
    drafter_dtype: str | None = None
    quantize: str | None = None
    drafter_quantize: str | None = None
    device_map: Any = None
    progress: Progress | None = None
    cache_dir: Any = None

    @classmethod
    def of(cls, options: LoadOptions | None = None, **keywords) -> LoadOptions:
        """``options``, or one made of ``keywords`` (``TypeError`` names an unknown one); not both."""
        if options is not None and keywords:
            raise TypeError(f"pass LoadOptions or its fields as keywords, not both ({', '.join(keywords)})")
        return options if options is not None else cls(**keywords)

    @property
    def say(self) -> Progress:
        """The progress callback, or one that says nothing."""
        return self.progress or no_progress


def load_target(target: str | None, options: LoadOptions):
    """(model, tokenizer, label) for ``target`` loaded as ``options`` say for a target."""
    quantize = parse_quantize(options.quantize)
    model, tokenizer = load_model(target, device=options.device, dtype=options.dtype, quantize=quantize,
                                  progress=options.progress, cache_dir=options.cache_dir)
    return model, tokenizer, describe(target, model, quantize)


def _drafter_plan(target, drafter, options: LoadOptions):
    """Decide the drafter spec, dtype and quantisation, and whether this is a self-draft demo."""
    self_draft = drafter == SELF_DRAFT or (target is None and drafter is None)
    if target is not None and drafter is None:
        raise ModelLoadError(
            f"--target {target} was given without --drafter: pass --drafter with a smaller model (ideally "
            "one that shares the target's tokenizer), or a drafter made from the target "
            "(self:bf16, self:int8, self:skip=auto)."
        )
    spec = target if self_draft else drafter
    chosen_dtype = options.drafter_dtype or ("bfloat16" if self_draft else options.dtype)
    chosen_quantize = options.quantize if options.drafter_quantize is None else options.drafter_quantize
    return spec, chosen_dtype, parse_quantize(chosen_quantize), self_draft


def _kind(config) -> str:
    """``encoder-decoder (t5)`` or ``decoder-only (llama)``, for messages."""
    from utils.hf_load import is_encoder_decoder

    shape = "encoder-decoder" if is_encoder_decoder(config) else "decoder-only"
    return f"{shape} ({getattr(config, 'model_type', None) or 'unknown type'})"


def _check_same_kind(target: str | None, drafter: str | None, *, cache_dir=None, progress=None) -> bool:
    """Refuse a pair that mixes an encoder-decoder and a decoder-only model, before any weights are
    read; True when both are encoder-decoder."""
    from utils.hf_load import is_encoder_decoder

    say = progress or no_progress
    target_source = resolve_source(target, cache_dir=cache_dir, progress=say)
    target_config = read_config(target_source)
    if drafter == target:
        return is_encoder_decoder(target_config)
    drafter_source = resolve_source(drafter, cache_dir=cache_dir, progress=say)
    drafter_config = read_config(drafter_source)
    if is_encoder_decoder(target_config) != is_encoder_decoder(drafter_config):
        raise ModelLoadError(
            f"Target {target_source.label} is {_kind(target_config)} but drafter {drafter_source.label} is "
            f"{_kind(drafter_config)}: pick a drafter of the same kind from the target's model family."
        )
    return is_encoder_decoder(target_config)


def load_pair(target: str | None = None, drafter: str | None = None, options: LoadOptions | None = None,
              **keywords) -> ModelPair:
    """Load a target and a drafter model and check that they can decode together.

    ``target=None`` is the offline default; ``drafter="self"`` (or neither given) reuses the target's
    weights in bfloat16 (a self-draft demo); ``drafter=None`` with a real target is refused. How they
    load is ``options``, or ``LoadOptions``' fields as keywords. A mixed encoder-decoder / decoder-only
    pair is refused. Drafters made from the target load in ``model_drafters.selfdraft.load``;
    ``engine.load_pair`` is the loader the front ends call.
    """
    return load_two_models(target, drafter, LoadOptions.of(options, **keywords))


def load_two_models(target: str | None, drafter: str | None, options: LoadOptions) -> ModelPair:
    """``load_pair`` with its options as one value (what ``engine.load_pair`` calls)."""
    if drafter is not None and _KIND_SPEC.match(str(drafter).strip()):
        raise ModelLoadError(f"--drafter {drafter} is loaded with its target: load it with engine.load_pair")
    quantize = parse_quantize(options.quantize)
    drafter_spec, d_dtype, d_quantize, self_draft = _drafter_plan(target, drafter, options)
    quiet_hf_progress()
    seq2seq = _check_same_kind(target, drafter_spec, cache_dir=options.cache_dir, progress=options.progress)
    common = {"device": options.device, "device_map": options.device_map, "progress": options.progress,
              "cache_dir": options.cache_dir}
    target_model, tokenizer = load_model(target, dtype=options.dtype, quantize=quantize, **common)
    shared = tokenizer if drafter_spec == target else None  # a self-draft reads the same tokenizer
    drafter_model, drafter_tok = load_model(drafter_spec, dtype=d_dtype, quantize=d_quantize, tokenizer=shared, **common)
    vocab_size, difference = pair_vocabulary(tokenizer, drafter_tok, target_model, drafter_model)
    if difference is not None and seq2seq:
        raise ModelLoadError(
            f"Target and drafter do not share a tokenizer ({difference}) and are encoder-decoder models: "
            "a drafter with another tokenizer needs decoder-only models; pick one from the target's family."
        )
    note = "self-draft demo" if self_draft else ""
    pair = ModelPair(
        target=target_model,
        drafter=drafter_model,
        tokenizer=tokenizer,
        target_name=describe(target, target_model, quantize),
        drafter_name=describe(drafter_spec, drafter_model, d_quantize, note),
        end_tokens=end_token_ids(tokenizer, target_model),
        device=model_device(target_model),
        vocab_size=vocab_size,
        context_length=context_length(target_model, tokenizer),
        self_draft_demo=self_draft,
        is_encoder_decoder=seq2seq,
        drafter_tokenizer=None if difference is None else drafter_tok,
        tokenizer_difference=difference,
    )
    return pair
