"""A layer-skipping view of a decoder-only model: the target with some layers left out.

Draft&Verify (Zhang et al. 2023) and SWIFT (Xia et al. 2024) draft with the
target itself, skipping a set of its intermediate layers. The view built here
shares every weight with the target (no copy): it is a shallow copy of the
model's module tree whose decoder-layer list holds only the kept layers.

Cache bookkeeping is the delicate part. An attention (or mixer) module finds
its cache layer by its ``layer_idx``, and the model reads the sequence length
and the mask sizes from cache layer 0 (or the first of each kind). So every
kept layer is a shallow copy whose ``layer_idx`` is renumbered to its place
among the kept layers (0..k-1), and the view's config says it has k layers of
the kept layers' types. Its own cache (``DynamicCache(config=view.config)``)
then has exactly k layers, consistent whichever layers were skipped, layer 0
included; and a cache made of the target's own layers at the kept positions
(``kvcache.shared``) lines up with it.
"""

from __future__ import annotations

import copy

import torch

from kvcache.cache import UnsupportedCacheError
from utils.hf_load import text_config as config_text

SKIP_ATTR = "self_draft_skipped"  # on the view: the target's layer numbers it skips


class SkipRefused(UnsupportedCacheError):
    """The model cannot be drafted from by skipping layers; the message is one line."""


def text_config(model):
    return config_text(model.config)


def num_layers(model) -> int:
    return int(text_config(model).num_hidden_layers)


def decoder_layers(model) -> tuple[list[str], torch.nn.ModuleList]:
    """(path of module names from the model to the layer list, the list).

    The list is the ``ModuleList`` whose length is the config's number of
    hidden layers and whose modules (or their children) carry a ``layer_idx``.
    """
    if getattr(model.config, "is_encoder_decoder", False):
        raise SkipRefused(f"self:skip needs a decoder-only model; {type(model).__name__} is encoder-decoder "
                          "(use self:bf16, self:fp16 or self:int8)")
    n = num_layers(model)
    for name, module in model.named_modules():
        if (isinstance(module, torch.nn.ModuleList) and len(module) == n
                and any(hasattr(m, "layer_idx") for m in module[0].modules())):
            return name.split("."), module
    raise SkipRefused(f"self:skip cannot find the decoder layers of {type(model).__name__} "
                      "(use self:bf16, self:fp16 or self:int8)")


def _shallow(module: torch.nn.Module) -> torch.nn.Module:
    """A new module object sharing parameters, buffers and hooks, with its own child table. A
    ``forward`` set on the instance (transformers 4.57 wraps a layer's once hidden states are asked
    for) is bound to ``module`` and would run it, not the clone: the clone runs its class's own."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    vars(clone).pop("forward", None)
    return clone


def _renumbered(module: torch.nn.Module, index: int) -> torch.nn.Module:
    """A shallow copy of ``module`` in which every ``layer_idx`` reads ``index``."""
    clone = _shallow(module)
    if "layer_idx" in vars(module):
        clone.layer_idx = index
    for name, child in module._modules.items():
        if child is not None and any("layer_idx" in vars(m) for m in child.modules()):
            clone._modules[name] = _renumbered(child, index)
    return clone


def _view_config(config, kept: list[int]):
    """The config of a model with only the ``kept`` layers (their types kept)."""
    view = copy.deepcopy(config)
    view.num_hidden_layers = len(kept)
    for key in ("layer_types", "layers_block_type"):
        types = getattr(config, key, None)
        if not isinstance(types, (list, tuple)) or len(types) != config.num_hidden_layers:
            continue
        wanted = [types[i] for i in kept]
        attention = [i for i, t in enumerate(types) if "attention" in str(t)]
        if attention and not any("attention" in str(t) for t in wanted):
            # A hybrid's cache reads its length from an attention layer.
            raise SkipRefused(f"self:skip: {type(config).__name__} needs an attention layer and these would skip "
                              f"all of them (keep one of layers {', '.join(map(str, attention))})")
        try:
            setattr(view, key, wanted)
        except AttributeError:  # a read-only property, derived from the layer count
            if list(getattr(view, key)) != wanted:
                raise SkipRefused(f"self:skip: {type(config).__name__} derives its layer types from their "
                                  "positions, so these layers cannot be skipped (use self:bf16 or self:int8)")
    return view


def check_layers(model, skipped) -> list[int]:
    """The kept layer numbers, refusing numbers out of range or skipping every layer."""
    n = num_layers(model)
    skipped = sorted(set(int(i) for i in skipped))
    bad = [i for i in skipped if not 0 <= i < n]
    if bad:
        raise SkipRefused(f"self:skip: layer {bad[0]} does not exist ({type(model).__name__} has layers 0-{n - 1})")
    kept = [i for i in range(n) if i not in skipped]
    if not kept:
        raise SkipRefused(f"self:skip cannot skip all {n} layers: keep at least one")
    return kept


def skip_view(model, skipped) -> torch.nn.Module:
    """The model with the ``skipped`` layers left out, sharing every weight with it.

    The returned module runs on its own (with a cache of its own) like any
    causal LM; ``getattr(view, SKIP_ATTR)`` lists the skipped layer numbers.
    Raises :class:`SkipRefused` (one line) for encoder-decoder models, models
    whose layer list cannot be found, and bad layer numbers.
    """
    path, layers = decoder_layers(model)
    kept = check_layers(model, skipped)
    root = _shallow(model)
    config = _view_config(text_config(model), kept)
    parent = root
    for name in path[:-1]:
        child = _shallow(parent._modules[name])
        parent._modules[name] = child
        parent = child
    parent._modules[path[-1]] = torch.nn.ModuleList([_renumbered(layers[i], j) for j, i in enumerate(kept)])
    for module in {id(m): m for m in [root, *_path_modules(root, path)]}.values():
        if getattr(module, "config", None) is not None and "config" in vars(module):
            module.config = config
    object.__setattr__(root, SKIP_ATTR, tuple(i for i in range(num_layers(model)) if i not in kept))
    return root


def _path_modules(root, path):
    module = root
    for name in path[:-1]:
        module = module._modules[name]
        yield module


def kept_layers(view) -> list[int] | None:
    """The target layer numbers a skip view keeps (None when ``view`` is no skip view)."""
    skipped = getattr(view, SKIP_ATTR, None)
    if skipped is None:
        return None
    total = view.config.num_hidden_layers + len(skipped)
    return [i for i in range(total) if i not in skipped]
