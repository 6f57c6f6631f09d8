"""Feeding a token tree (or one level of it) to a cached model in one forward pass."""

from __future__ import annotations

import torch

from generation.tree import NO_EXTRA, ExtraRows, Tree, extra_positions, layer_mask, tree_positions, visibility
from kvcache.cache import CachedModel


def model_dtype(model) -> torch.dtype:
    return model.get_input_embeddings().weight.dtype


def masked_forward(cached: CachedModel, tokens: torch.Tensor, positions: torch.Tensor,
                   visible: torch.Tensor, keep: int) -> torch.Tensor:
    """Feed ``tokens`` (1, m) with every key's ``positions`` (K,) and ``visible`` (m, K), K counting cache
    and block, each kind of attention layer given its own mask; returns (keep, V) logits."""
    dtype = model_dtype(cached.model)
    kinds = cached.attention_kinds()
    masks = {name: layer_mask(visible, positions, window=window, dtype=dtype) for name, window in kinds.items()}
    mask = next(iter(masks.values())) if len(masks) == 1 else masks
    m = tokens.shape[1]
    return cached.forward_masked(tokens, positions[-m:].view(1, m), mask, keep)


def tree_forward(cached: CachedModel, ids: torch.Tensor, tree: Tree, extra: ExtraRows = NO_EXTRA) -> torch.Tensor:
    """Score every node of ``tree`` after ``ids`` (1, L) in one pass: (n + 1 + m, V), the root's logits,
    each node's, then each ``extra`` row's. The cache then holds ``ids``, every node and every extra
    row; :func:`keep_path` keeps the accepted path."""
    device = ids.device
    past, length = cached.length, ids.shape[1]
    chain = length - past
    fed = torch.tensor(tree.tokens + extra.tokens, dtype=torch.long, device=device)
    tokens = torch.cat([ids[:, past:], fed.view(1, -1)], dim=1)                 # (1, chain + n + m)
    positions = torch.cat([torch.arange(length, device=device),
                           tree_positions(tree, length, device),
                           extra_positions(extra, length, device)])             # (past + chain + n + m,)
    visible = visibility(tree, past, chain, device, extra)                      # (chain + n + m, K)
    return masked_forward(cached, tokens, positions, visible, keep=len(tree) + len(extra) + 1)


def keep_path(cached: CachedModel, tree: Tree, path: list[int], extra: int = 0) -> None:
    """After :func:`tree_forward`, keep only the nodes of ``path`` in the cache (the ``extra``
    rows fed after the nodes go too)."""
    cached.keep_block(len(tree) + extra, path)
