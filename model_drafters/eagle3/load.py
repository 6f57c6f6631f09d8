"""Reading an EAGLE-3 head from a directory in the published layout, or saying in one line why not.

A published head (EAGLE's, SpecForge's, those vLLM and SGLang serve) is ``config.json`` (a Llama
layer's fields, ``vocab_size``, ``draft_vocab_size``, optionally ``target_hidden_size`` and the layers
to read) and ``model.safetensors`` or ``pytorch_model.bin`` under :class:`eagle3.head.Eagle3Head`'s
names. As vLLM and SGLang do, the method is named (``eagle3:PATH``) and the weights' shapes are
checked, not ``architectures``; ``t2d`` is derived from ``d2t``. Every refusal names the file, key,
what it holds and what was expected (:func:`misfit`).

The target layers feeding ``fc`` (``aux_layers``, indices into ``hidden_states``): by default 2, L // 2
and L - 3 (EAGLE's ``modeling_llama_kv``, vLLM, SGLang); a config may name them as vLLM reads them
(``eagle_aux_hidden_state_layer_ids``: the input of layer i) or as SGLang does
(``eagle_config.eagle_aux_hidden_state_layer_ids``: the output of layer i).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from model_drafters.eagle3.head import Eagle3Head
from kvcache.probe import ProbeResult, remember
from utils.hf_load import text_config as config_text

PREFIX = "eagle3:"
EAGLE3_ATTR = "eagle3_of"          # on a loaded head: the target it drafts for
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
NOT_READ = ("t2d",)                # tensors a checkpoint may hold that the head derives instead
# config.json fields that are the head's bookkeeping, not its Llama layer's
_NOT_LAYER = ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_config",
              "eagle_aux_hidden_state_layer_ids", "norm_before_residual", "auto_map", "transformers_version", "model_type")


class Eagle3Refused(ValueError):
    """The path holds no EAGLE-3 head this target can draft with; the message says why (one line)."""


def misfit(file: Path, key: str, found, expected, why: str) -> Eagle3Refused:
    """The one-line refusal of ``key`` in ``file``: what it holds, what was expected and why."""
    return Eagle3Refused(f"{file}: {key} is {found}, expected {expected} ({why})")


def shape_text(shape) -> str:
    """A shape as ``[rows, columns]``."""
    return "[" + ", ".join(str(int(n)) for n in shape) + "]"


def is_eagle3(spec) -> bool:
    """Whether ``--drafter`` names an EAGLE-3 head (``eagle3:PATH``)."""
    return spec is not None and str(spec).strip().lower().startswith(PREFIX)


def eagle3_location(spec: str) -> str:
    """The PATH (or hub id) of ``eagle3:PATH``."""
    location = str(spec).strip()[len(PREFIX):].strip()
    if not location:
        raise Eagle3Refused("--drafter eagle3: needs the head's directory or hub id (eagle3:PATH)")
    return location


def eagle3_target(model):
    """The target ``model`` drafts for when it is a loaded EAGLE-3 head, else None."""
    return getattr(model, EAGLE3_ATTR, None) if model is not None else None


# ------------------------------------------------------------------ the directory


def head_folder(location: str) -> Path:
    """The local directory of ``location``: a directory as it is, a hub id through the hub's cache."""
    path = Path(location).expanduser()
    if path.is_dir():
        return path
    if path.exists() or location.startswith(("/", ".", "~")) or location.count("/") != 1:
        raise Eagle3Refused(f"{location} is not a directory (nor an org/name hub id)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(location, allow_patterns=["*.json", *WEIGHT_FILES]))
    except Exception as exc:  # noqa: BLE001  (offline, unknown repo, no access: one line)
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Eagle3Refused(f"cannot fetch the EAGLE-3 head {location}: {text}") from exc


def read_config(folder: Path) -> dict:
    """The head's config.json (its ``architectures`` are not read: the method is known)."""
    file = folder / "config.json"
    if not file.is_file():
        raise Eagle3Refused(f"{file}: no such file (an EAGLE-3 head's directory holds config.json and "
                            f"{' or '.join(WEIGHT_FILES)})")
    try:
        config = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise Eagle3Refused(f"{file}: not JSON ({str(exc).splitlines()[0]})") from exc
    if "transformer_layer_config" in config:
        raise Eagle3Refused(f"{file}: transformer_layer_config marks the speculators layout, which is not read "
                            "here; use the head in EAGLE's own layout (fc, midlayer, d2t)")
    return config


@dataclass(frozen=True)
class Checkpoint:
    """A head's weights file: its tensors under the head's names, and each one's name in the file."""

    file: Path
    tensors: dict[str, torch.Tensor]
    stored: dict[str, str]           # the head's name -> the file's

    def key(self, name: str) -> str:
        """``name`` as the file spells it; a missing ``midlayer.`` tensor under the prefix the file's
        other layer tensors carry (``layers.0.``, ``model.layers.0.``)."""
        if name in self.stored or not name.startswith("midlayer."):
            return self.stored.get(name, name)
        for plain, stored in self.stored.items():
            if plain.startswith("midlayer."):
                return stored[:len(stored) - len(plain) + len("midlayer.")] + name[len("midlayer."):]
        return name


def read_weights(folder: Path) -> Checkpoint:
    """The head's tensors by their checkpoint names (``layers.0.`` read as ``midlayer.``)."""
    found = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if found is None:
        raise Eagle3Refused(f"{folder}: no {' or '.join(WEIGHT_FILES)} (an EAGLE-3 head's weights)")
    if found.suffix == ".safetensors":
        from safetensors.torch import load_file

        weights = load_file(str(found))
    else:
        weights = torch.load(str(found), map_location="cpu", weights_only=True)
    stored = {_plain_name(name): name for name in weights}
    tensors = {_plain_name(name): tensor for name, tensor in weights.items() if _plain_name(name) not in NOT_READ}
    return Checkpoint(found, tensors, stored)


def _plain_name(name: str) -> str:
    name = name.removeprefix("model.")
    return "midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name


# ------------------------------------------------------------------ fitting the target


def text_config(target):
    return config_text(target.config)


def aux_layers(config: dict, target_layers: int) -> tuple[int, ...]:
    """Which of the target's ``hidden_states`` feed ``fc``, ascending (see the module's doc);
    refused as ``KEY is ..., expected ...`` (the caller names config.json)."""
    named = config.get("eagle_aux_hidden_state_layer_ids")
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if named:
        key, given, shift, means = "eagle_aux_hidden_state_layer_ids", named, 0, "hidden state i, the input of layer i"
    elif nested:
        key, given, shift, means = ("eagle_config.eagle_aux_hidden_state_layer_ids", nested, 1,
                                    "the output of layer i, hidden state i + 1")
    else:
        key, shift, means = ("eagle_aux_hidden_state_layer_ids (absent: 2, L/2, L-3)", 0,
                             "hidden state i, the input of layer i")
        given = [2, target_layers // 2, target_layers - 3]
    given = [int(i) for i in given]
    top = target_layers - 1 - shift
    if len(given) != 3 or any(not 0 <= i <= top for i in given):
        raise Eagle3Refused(f"{key} is {given}, expected three of 0..{top} "
                            f"({means}; the target has {target_layers} layers)")
    return tuple(sorted(i + shift for i in given))


@dataclass(frozen=True)
class Fit:
    """What the head must be to draft for the target: from the target and the head's config."""

    layer: object                    # the LlamaConfig of the head's one decoder layer
    target_hidden: int
    vocab: int                       # the target's vocabulary (the head's vocab_size)
    draft_vocab: int
    declared_layers: int             # config.json's num_hidden_layers (the head has one)

    def why(self, key: str) -> str:
        """What fixes the shape of ``key``, for a refusal."""
        hidden, layer = self.layer.hidden_size, self.layer
        if key == "fc.weight":
            return (f"fc fuses three of the target's hidden states, {self.target_hidden} wide each, "
                    f"into hidden_size {hidden}")
        if key == "lm_head.weight":
            return f"draft_vocab_size {self.draft_vocab} by hidden_size {hidden}"
        if key == "embed_tokens.weight":
            return f"the target's vocabulary {self.vocab} by hidden_size {hidden}"
        if key == "d2t":
            return (f"one offset to a target id per draft id: draft_vocab_size {self.draft_vocab} "
                    f"of the target's {self.vocab}")
        if ".self_attn." in key:
            heads, kv = layer.num_attention_heads, layer.num_key_value_heads
            head_dim = getattr(layer, "head_dim", None) or hidden // heads
            return (f"attention over [embedding; hidden state], 2 x hidden_size {hidden}, "
                    f"{heads} heads and {kv} key-value heads of {head_dim}")
        if ".mlp." in key:
            return f"hidden_size {hidden}, intermediate_size {layer.intermediate_size}"
        return f"hidden_size {hidden}"


def fit_of(config: dict, checkpoint: Checkpoint, target, config_file: Path) -> Fit:
    """The head's shapes for ``target``, after the config's own fields are checked against it."""
    from transformers import LlamaConfig

    text = text_config(target)
    vocab, hidden = int(text.vocab_size), int(text.hidden_size)
    if int(config.get("vocab_size", vocab)) != vocab:
        raise misfit(config_file, "vocab_size", config["vocab_size"], vocab, "the target's vocabulary")
    if int(config.get("target_hidden_size", hidden)) != hidden:
        raise misfit(config_file, "target_hidden_size", config["target_hidden_size"], hidden,
                     "the target's hidden size")
    fields = {k: v for k, v in config.items() if k not in _NOT_LAYER}
    layer = LlamaConfig(**{**fields, "num_hidden_layers": 1, "vocab_size": vocab})
    lm_head = checkpoint.tensors.get("lm_head.weight")
    draft_vocab = int(config.get("draft_vocab_size") or (lm_head.shape[0] if lm_head is not None else vocab))
    return Fit(layer, hidden, vocab, draft_vocab, int(config.get("num_hidden_layers", 1)))


def expected_shapes(fit: Fit, *, own_embeddings: bool) -> dict[str, torch.Size]:
    """Every tensor the head loads, with its shape (the head built on the meta device: no memory)."""
    with torch.device("meta"):
        head = Eagle3Head(fit.layer, draft_vocab_size=fit.draft_vocab, target_hidden_size=fit.target_hidden,
                          own_embeddings=own_embeddings)
    return {name: t.shape for name, t in head.state_dict().items() if name not in NOT_READ}


def refuse_misfit(fit: Fit, checkpoint: Checkpoint, config_file: Path) -> None:
    """Refuse the first tensor that does not fit, ``fc`` first, in one line naming the file, the key
    and both shapes; then a tensor no head holds, then a ``d2t`` pointing outside the target."""
    tensors = checkpoint.tensors
    own_embeddings = "embed_tokens.weight" in tensors
    want = expected_shapes(fit, own_embeddings=own_embeddings)
    _refuse_shape(checkpoint, "fc.weight", want["fc.weight"], fit)
    if not own_embeddings and fit.layer.hidden_size != fit.target_hidden:
        raise misfit(config_file, "hidden_size", fit.layer.hidden_size, fit.target_hidden,
                     f"the head has no embed_tokens.weight, so it reads the target's embeddings, "
                     f"{fit.target_hidden} wide")
    if fit.declared_layers != 1:
        raise misfit(config_file, "num_hidden_layers", fit.declared_layers, 1,
                     "an EAGLE-3 head has one decoder layer, midlayer")
    for name, shape in want.items():
        if name == "d2t" and name not in tensors and fit.draft_vocab == fit.vocab:
            continue                                                  # no map needed: draft id = target id
        _refuse_shape(checkpoint, name, shape, fit)
    for name, tensor in tensors.items():
        if name not in want:
            raise misfit(checkpoint.file, checkpoint.key(name), shape_text(tensor.shape), "no such tensor",
                         "an EAGLE-3 head holds fc, midlayer, norm, lm_head, d2t, t2d and at most its own "
                         "embed_tokens")
    if "d2t" in tensors:
        ids = torch.arange(fit.draft_vocab, device=tensors["d2t"].device) + tensors["d2t"].long()
        lowest, highest = int(ids.min()), int(ids.max())
        if lowest < 0 or highest >= fit.vocab:
            raise misfit(checkpoint.file, checkpoint.key("d2t"), f"offsets to target ids {lowest}..{highest}",
                         f"target ids in 0..{fit.vocab - 1}", "draft id + d2t[draft id] is a target id")


def _refuse_shape(checkpoint: Checkpoint, name: str, shape: torch.Size, fit: Fit) -> None:
    found = checkpoint.tensors.get(name)
    if found is None or found.shape != shape:
        held = "missing" if found is None else shape_text(found.shape)
        raise misfit(checkpoint.file, checkpoint.key(name), held, shape_text(shape), fit.why(name))


def build_head(config: dict, checkpoint: Checkpoint, target, config_file: Path) -> Eagle3Head:
    """The head of ``config`` and ``checkpoint``, in the target's dtype and on its device."""
    fit = fit_of(config, checkpoint, target, config_file)
    refuse_misfit(fit, checkpoint, config_file)
    head = Eagle3Head(fit.layer, draft_vocab_size=fit.draft_vocab, target_hidden_size=fit.target_hidden,
                      own_embeddings="embed_tokens.weight" in checkpoint.tensors,
                      norm_before_residual=bool(config.get("norm_before_residual", False)))
    weights = dict(checkpoint.tensors)
    # on the CPU, named: a default device set by the caller (torch.set_default_device) would put
    # the map's new tensors there and the checkpoint's d2t on the CPU
    d2t = weights.get("d2t", torch.zeros(fit.draft_vocab, dtype=torch.long, device="cpu")).long().cpu()
    weights["d2t"] = d2t
    weights["t2d"] = torch.zeros(fit.vocab, dtype=torch.bool, device="cpu")
    weights["t2d"][torch.arange(fit.draft_vocab, device="cpu") + d2t] = True     # which target ids the head drafts
    head.load_state_dict(weights, strict=True)
    decoder_layer = next(target.get_decoder().parameters())
    return head.to(device=decoder_layer.device, dtype=decoder_layer.dtype).eval()


def target_layers(target) -> int:
    """How many layers ``target``'s ``hidden_states`` cover (their count less the embeddings'),
    from one uncached forward of one token: a config's ``num_hidden_layers`` may count
    otherwise (LongCat-Flash's counts two sublayers per layer)."""
    if getattr(target.config, "is_encoder_decoder", False):
        raise Eagle3Refused(f"{type(target).__name__} is an encoder-decoder model; an EAGLE-3 head drafts "
                            "for a decoder-only target")
    device = next(target.parameters()).device
    with torch.inference_mode():
        out = target(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), use_cache=False,
                     output_hidden_states=True)
    states = getattr(out, "hidden_states", None)
    if not states:
        raise Eagle3Refused(f"{type(target).__name__} returns no hidden states for an EAGLE-3 head to read")
    return len(states) - 1


def load_eagle3(target, spec: str) -> Eagle3Head:
    """The EAGLE-3 head ``eagle3:PATH`` (or a bare PATH) for ``target``, marked for the engine."""
    location = eagle3_location(spec) if is_eagle3(spec) else str(spec)
    folder = head_folder(location)
    config = read_config(folder)
    head = build_head(config, read_weights(folder), target, folder / "config.json")
    count = target_layers(target)
    try:
        layers = aux_layers(config, count)
    except Eagle3Refused as exc:
        raise Eagle3Refused(f"{folder / 'config.json'}: {exc}") from exc
    return mark_eagle3(head, target, layers, name=location)


def mark_eagle3(head: Eagle3Head, target, layers: tuple[int, ...], *, name: str = "") -> Eagle3Head:
    """Record that ``head`` drafts for ``target`` from its ``hidden_states`` at ``layers``; returns it.

    The head reads the target's embeddings unless it has its own. Its cache is the drafter's
    (cropped by ``eagle3.Eagle3Drafter``), so the cache probe records it without running it.
    """
    object.__setattr__(head, EAGLE3_ATTR, target)
    object.__setattr__(head, "aux_layers", tuple(layers))
    object.__setattr__(head, "name_or_path", name)
    if head.embed_tokens is None:
        object.__setattr__(head, "target_embeddings", target.get_input_embeddings().weight)
    dtype = str(next(head.parameters()).dtype).removeprefix("torch.")
    remember(head, ProbeResult(type(head).__name__, dtype, "cached", rollback="crop",
                               reason="EAGLE-3 head: its own cache, cropped by the drafter"))
    return head
