"""Reading an EAGLE-3 head from a directory in the published layout, or saying in one line why not.

A published head (EAGLE's own releases, SpecForge's, the ones vLLM and SGLang serve) is a
directory with ``config.json`` (``architectures`` naming an EAGLE-3 class such as
``LlamaForCausalLMEagle3``; a Llama layer's fields: ``hidden_size``, heads, key-value heads,
``intermediate_size``, ``rms_norm_eps``, rope settings; ``vocab_size``, the target's;
``draft_vocab_size``; optionally ``target_hidden_size`` and the target layers to read) and its
weights in ``model.safetensors`` or ``pytorch_model.bin`` under the names of
:class:`eagle3.head.Eagle3Head`.

Which target hidden states feed ``fc`` (``aux_layers``), as indices into transformers'
``hidden_states`` (0: the embeddings, i: the input of layer i): by default 2, L // 2 and
L - 3 of the target's L layers (counted from its ``hidden_states``, ``target_layers``) (EAGLE's ``modeling_llama_kv``, vLLM's and SGLang's
default), in ascending order, concatenated. A config may name them: top-level
``eagle_aux_hidden_state_layer_ids`` as vLLM reads them (the input of layer i), or
``eagle_config.eagle_aux_hidden_state_layer_ids`` as SGLang reads them (the output of layer
i, the input of layer i + 1; SpecForge writes these).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from eagle3.head import Eagle3Head
from kvcache.probe import ProbeResult, remember

PREFIX = "eagle3:"
EAGLE3_ATTR = "eagle3_of"          # on a loaded head: the target it drafts for
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# config.json fields that are the head's bookkeeping, not its Llama layer's
_NOT_LAYER = ("architectures", "draft_vocab_size", "target_hidden_size", "eagle_config",
              "eagle_aux_hidden_state_layer_ids", "norm_before_residual", "auto_map", "transformers_version", "model_type")


class Eagle3Refused(ValueError):
    """The path holds no EAGLE-3 head this target can draft with; the message says why (one line)."""


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
    """The head's config.json, refused when it does not describe an EAGLE-3 head."""
    file = folder / "config.json"
    if not file.is_file():
        raise Eagle3Refused(f"{folder} holds no config.json: not an EAGLE-3 head")
    config = json.loads(file.read_text())
    names = [str(a) for a in config.get("architectures") or []]
    if not any("eagle3" in a.lower() for a in names):
        said = ", ".join(names) or "none"
        raise Eagle3Refused(f"{folder} is not an EAGLE-3 head (its config names architectures {said}; "
                            "an EAGLE-3 head's name one such as LlamaForCausalLMEagle3)")
    if "transformer_layer_config" in config:
        raise Eagle3Refused(f"{folder} is in the speculators layout ({', '.join(names)}), which is not read here; "
                            "use the head in EAGLE's own layout (fc, midlayer, d2t)")
    return config


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The head's tensors by their checkpoint names (``layers.0.`` read as ``midlayer.``)."""
    found = next((folder / name for name in WEIGHT_FILES if (folder / name).is_file()), None)
    if found is None:
        raise Eagle3Refused(f"{folder} holds no {' or '.join(WEIGHT_FILES)}")
    if found.suffix == ".safetensors":
        from safetensors.torch import load_file

        weights = load_file(str(found))
    else:
        weights = torch.load(str(found), map_location="cpu", weights_only=True)
    weights = {_plain_name(name): tensor for name, tensor in weights.items()}
    missing = [name for name in ("fc.weight", "lm_head.weight") if name not in weights]
    if missing or not any(name.startswith("midlayer.") for name in weights):
        what = ", ".join(missing + ([] if any(n.startswith("midlayer.") for n in weights) else ["midlayer.*"]))
        raise Eagle3Refused(f"{found.name} in {folder} has no {what}: not the EAGLE-3 layout")
    return weights


def _plain_name(name: str) -> str:
    name = name.removeprefix("model.")
    return "midlayer." + name[len("layers.0."):] if name.startswith("layers.0.") else name


# ------------------------------------------------------------------ fitting the target


def text_config(target):
    config = target.config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def aux_layers(config: dict, target_layers: int) -> tuple[int, ...]:
    """Which of the target's ``hidden_states`` feed ``fc``, ascending (see the module's doc)."""
    named = config.get("eagle_aux_hidden_state_layer_ids")
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if named:
        layers, said = [int(i) for i in named], "eagle_aux_hidden_state_layer_ids"
    elif nested:
        layers, said = [int(i) + 1 for i in nested], "eagle_config.eagle_aux_hidden_state_layer_ids (+1)"
    else:
        layers = [2, target_layers // 2, target_layers - 3]
        said = f"the default 2, L/2, L-3 for L = {target_layers}"
    if len(layers) != 3 or any(not 0 <= i < target_layers for i in layers):
        raise Eagle3Refused(f"the head reads target hidden states {layers} ({said}); the target has "
                            f"{target_layers} layers, so three of 0..{target_layers - 1} are needed")
    return tuple(sorted(layers))


def _refuse_misfit(config: dict, weights: dict, target, where: Path) -> tuple[int, int]:
    """(draft vocabulary, target hidden size) after checking that the head fits ``target``."""
    text = text_config(target)
    vocab, hidden = int(text.vocab_size), int(text.hidden_size)
    head_vocab = int(config.get("vocab_size", vocab))
    if head_vocab != vocab:
        raise Eagle3Refused(f"the head at {where} is for a vocabulary of {head_vocab}; the target's has {vocab}")
    fused = weights["fc.weight"].shape[1]
    if fused != 3 * hidden:
        raise Eagle3Refused(f"the head at {where} fuses three hidden states of {fused // 3} (fc reads {fused}); "
                            f"the target's hidden size is {hidden}")
    head_hidden = int(config.get("hidden_size", 0))
    if "embed_tokens.weight" not in weights and head_hidden != hidden:
        raise Eagle3Refused(f"the head at {where} has hidden size {head_hidden} and no embeddings of its own; "
                            f"the target's embeddings are {hidden} wide")
    draft_vocab = int(config.get("draft_vocab_size") or weights["lm_head.weight"].shape[0])
    if weights["lm_head.weight"].shape[0] != draft_vocab:
        raise Eagle3Refused(f"the head at {where} declares draft_vocab_size {draft_vocab} but its lm_head has "
                            f"{weights['lm_head.weight'].shape[0]} rows")
    if "d2t" not in weights and draft_vocab != vocab:
        raise Eagle3Refused(f"the head at {where} drafts over {draft_vocab} ids but has no d2t map to the target's")
    if "d2t" in weights:
        ids = torch.arange(draft_vocab, device=weights["d2t"].device) + weights["d2t"].long()
        if ids.min() < 0 or ids.max() >= vocab:
            raise Eagle3Refused(f"the head at {where} maps draft ids outside the target's vocabulary of {vocab}")
    return draft_vocab, hidden


def build_head(config: dict, weights: dict, target, where: Path) -> Eagle3Head:
    """The head of ``config`` and ``weights``, in the target's dtype and on its device."""
    from transformers import LlamaConfig

    draft_vocab, target_hidden = _refuse_misfit(config, weights, target, where)
    fields = {k: v for k, v in config.items() if k not in _NOT_LAYER}
    fields["num_hidden_layers"] = 1
    layer = LlamaConfig(**fields)
    head = Eagle3Head(layer, draft_vocab_size=draft_vocab, target_hidden_size=target_hidden,
                      own_embeddings="embed_tokens.weight" in weights,
                      norm_before_residual=bool(config.get("norm_before_residual", False)))
    weights = dict(weights)
    weights.setdefault("d2t", torch.zeros(draft_vocab, dtype=torch.long))
    weights.setdefault("t2d", torch.zeros(layer.vocab_size, dtype=torch.bool))
    weights["d2t"], weights["t2d"] = weights["d2t"].long(), weights["t2d"].bool()
    try:
        head.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise Eagle3Refused(f"the weights at {where} do not fit an EAGLE-3 head of its config: "
                            f"{' '.join(line.strip() for line in first[:3])[:300]}") from exc
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
    weights = read_weights(folder)
    head = build_head(config, weights, target, folder)
    layers = aux_layers(config, target_layers(target))
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
