"""Feeding a token tree (or one level of it) to a cached model in one forward pass."""

from __future__ import annotations

import torch

from generation.tree import Tree, layer_mask, tree_positions, visibility
from kvcache.cache import CachedModel


def model_dtype(model) -> torch.dtype:
    return model.get_input_embeddings().weight.dtype


def masked_forward(cached: CachedModel, tokens: torch.Tensor, positions: torch.Tensor,
                   visible: torch.Tensor, keep: int) -> torch.Tensor:
    """Feed ``tokens`` (1, m) with every key's ``positions`` (K,) and ``visible`` (m, K).

    K counts the cache and the block. Each kind of attention layer gets its own
    mask (sliding windows applied inside it). Returns (keep, V) logits.
    """
    dtype = model_dtype(cached.model)
    kinds = cached.attention_kinds()
    masks = {name: layer_mask(visible, positions, window=window, dtype=dtype) for name, window in kinds.items()}
    mask = next(iter(masks.values())) if len(masks) == 1 else masks
    m = tokens.shape[1]
    return cached.forward_masked(tokens, positions[-m:].view(1, m), mask, keep)


def tree_forward(cached: CachedModel, ids: torch.Tensor, tree: Tree) -> torch.Tensor:
    """Score every node of ``tree`` after the committed sequence ``ids`` (1, L).

    Feeds the tokens of ``ids`` the cache has not seen (the last one is the
    root) and the nodes, in one pass. Returns (n + 1, V): the root's logits,
    then each node's. The cache then holds ``ids`` and every node; keep the
    accepted path with :func:`keep_path`.
    """
    device = ids.device
    past, length = cached.length, ids.shape[1]
    chain = length - past
    nodes = torch.tensor(tree.tokens, dtype=torch.long, device=device)
    tokens = torch.cat([ids[:, past:], nodes.view(1, -1)], dim=1)               # (1, chain + n)
    positions = torch.cat([torch.arange(length, device=device),
                           tree_positions(tree, length, device)])              # (past + chain + n,)
    visible = visibility(tree, past, chain, device)                             # (chain + n, K)
    return masked_forward(cached, tokens, positions, visible, keep=len(tree) + 1)


def keep_path(cached: CachedModel, tree: Tree, path: list[int]) -> None:
    """After :func:`tree_forward`, keep only the nodes of ``path`` in the cache."""
    cached.keep_block(len(tree), path)
