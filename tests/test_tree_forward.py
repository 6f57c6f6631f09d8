"""One forward over a token tree equals running each root-to-node path on its own,
and the cache after the gather equals the cache of feeding the accepted path."""

import pytest
import torch

import generation.tree
from generation.tree import Tree
import generation.tree_forward
from generation.tree_forward import tree_forward
from tests.helpers.arch_zoo import PROMPTS, build
from kvcache.probe import cached_model
from kvcache.cache import TRANSFORMERS_RELEASE, UnsupportedCacheError, tree_support

# Two roots, branching below both; depth 3 (node 5 hangs under node 2).
TREE = Tree(tokens=(7, 9, 30, 31, 40, 50), parents=(-1, -1, 0, 0, 1, 2), ranks=(0, 1, 0, 1, 0, 0))
FAMILIES = ["llama", "qwen2", "mistral", "gemma2"]


def uncached_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0, -1]


def started(model, prompt, fed):
    """A cached model that has been fed ``prompt[:fed]`` (the rest is unseen)."""
    cached = cached_model(model)
    cached.begin(list(prompt))
    reason = tree_support(cached)
    if reason is not None and TRANSFORMERS_RELEASE < (5,):
        pytest.skip(f"transformers {TRANSFORMERS_RELEASE}: {reason} (chains run instead)")
    if fed > cached.length:     # a cache that snapshots layers has the prompt but its last token already
        cached.forward(torch.tensor([list(prompt[:fed])]), keep=1)
    return cached


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("fed", [0, 19])
def test_tree_logits_equal_each_path_on_its_own(name, fed):
    model = build(name)
    prompt = list(PROMPTS[0])
    with torch.inference_mode():
        cached = started(model, prompt, fed)
        assert tree_support(cached) is None
        logits = tree_forward(cached, torch.tensor([prompt]), TREE)
        assert torch.allclose(logits[0], uncached_logits(model, prompt), atol=1e-4)
        for node in range(len(TREE)):
            path = [TREE.tokens[i] for i in TREE.path_to(node)]
            want = uncached_logits(model, prompt + path)
            assert torch.allclose(logits[node + 1], want, atol=1e-4), (name, node)


@pytest.mark.parametrize("name", FAMILIES)
def test_cache_after_gather_equals_cache_of_the_path(name):
    model = build(name)
    prompt = list(PROMPTS[1])
    path = TREE.path_to(5)                                  # nodes 0, 2, 5
    tokens = [TREE.tokens[i] for i in path]
    with torch.inference_mode():
        cached = started(model, prompt, len(prompt) - 1)
        if cached.needs_snapshots:
            pytest.skip("sliding layers that record no past are restored after a tree, not gathered "
                        "(tests/test_tree_decoding.py runs that path)")
        tree_forward(cached, torch.tensor([prompt]), TREE)
        generation.tree_forward.keep_path(cached, TREE, path)
        plain = started(model, prompt + tokens, len(prompt) + len(tokens))
        assert cached.length == plain.length == len(prompt) + len(tokens)
        for got, want in zip(cached.cache.layers, plain.cache.layers):
            # A sliding layer may hold fewer past positions (trimmed to its window).
            n = min(got.keys.shape[-2], want.keys.shape[-2])
            assert n >= min(len(prompt) + len(tokens), getattr(got, "sliding_window", 10**6) - 1)
            assert torch.allclose(got.keys[:, :, -n:], want.keys[:, :, -n:], atol=1e-5)
            assert torch.allclose(got.values[:, :, -n:], want.values[:, :, -n:], atol=1e-5)
        # And the next step's logits agree.
        nxt = torch.tensor([prompt + tokens + [3]])
        a = cached.forward(nxt, keep=1)
        assert torch.allclose(a[0], uncached_logits(model, nxt[0].tolist()), atol=1e-4)


def test_a_mask_without_ancestors_is_caught(monkeypatch):
    """Mutation: nodes that see only themselves (not their ancestors) give other logits."""
    monkeypatch.setattr(generation.tree, "ancestors", lambda tree, device=None: torch.eye(len(tree), dtype=torch.bool))
    with pytest.raises(AssertionError):
        test_tree_logits_equal_each_path_on_its_own("llama", 19)


def test_a_gather_replaced_by_a_crop_is_caught(monkeypatch):
    """Mutation: keeping the first nodes of the block (a crop) instead of the path."""
    monkeypatch.setattr(generation.tree_forward, "keep_path",
                        lambda cached, tree, path: cached.keep_block(len(tree), list(range(len(path)))))
    with pytest.raises(AssertionError):
        test_cache_after_gather_equals_cache_of_the_path("llama")


def test_a_mask_without_windows_is_caught(monkeypatch):
    """Mutation: ignoring the sliding window changes a sliding model's logits."""
    real = generation.tree.layer_mask
    monkeypatch.setattr(generation.tree_forward, "layer_mask",
                        lambda v, p, window, dtype: _no_window(real, v, p, window, dtype))
    with pytest.raises(AssertionError):
        test_tree_logits_equal_each_path_on_its_own("mistral", 19)


def _no_window(real, visible, positions, window, dtype):
    """The sliding layer's keys, but every one of them visible regardless of distance."""
    mask = real(visible, positions, window=None, dtype=dtype)
    if window is None:
        return mask
    past = visible.shape[1] - visible.shape[0]
    return mask[..., max(past - window + 1, 0):]


@pytest.mark.parametrize("name", ["mamba2", "jamba"])
def test_recurrent_models_report_why_not(name):
    cached = cached_model(build(name))
    try:
        cached.begin(list(PROMPTS[0]))
    except UnsupportedCacheError:   # transformers 4.57: refused outright, chains and trees alike
        return
    assert tree_support(cached)
