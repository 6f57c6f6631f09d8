"""NASD: n-gram assisted speculative decoding = the verify loop with an n-gram drafter."""

from __future__ import annotations

import torch

from generation.common import check_gamma, check_request, model_device
from generation.result import GenerationResult
from generation.verify import verify_loop
from ngram_assisted.drafter import NGramDrafter
from ngram_assisted.storage import NGramStorage
from sampling import LogitsProcessor


def ngram_assisted_speculative_generate(
    inputs,
    ngram_storage: NGramStorage,
    target,
    *,
    gamma: int = 4,
    filler_top_k: int = 1,
    logits_processor: LogitsProcessor,
    max_gen_len: int = 128,
    eos_tokens_id=None,
    use_cache: bool = True,
    stop_if_unknown: bool = True,
    confident_start: bool = True,
    generator: torch.Generator | None = None,
    interruptible: bool = False,
    gamma_policy=None,
    observer=None,
    target_delay_s: float = 0.0,
    tree: int = 0,
    tree_branch: int = 2,
    inspect: bool = True,
) -> GenerationResult:
    """Generate with drafts from ``ngram_storage``, verified by ``target``.

    The storage is filled with the prompt (what it already holds is kept: reset it
    first for an independent run), drafts come from its best continuations, and it
    learns every appended token and, when ``filler_top_k`` > 1, the target's top-k
    predictions at each verified position. With ``confident_start`` a round drafts
    only when the full (n-1)-token context is known (see NGramDrafter.propose).
    Drafts are deterministic, so the accept
    rule uses q = one-hot: the output follows the target's distribution exactly.
    ``gamma_policy`` (None: always ``gamma``) picks each round's draft length;
    it may choose 0, a plain target step. For an encoder-decoder target the
    storage starts from the encoder's ids, so drafts can copy from the source.
    ``observer`` and ``target_delay_s``: see :func:`generation.verify.verify_loop`.
    ``tree`` > 0 verifies a trie of the storage's top continuations (at most
    that many nodes, ``tree_branch`` per context) instead of one chain.
    ``inspect`` records the per-token inspector's numbers (``generation.inspection``).
    """
    prompt = check_request(inputs, max_gen_len, target)
    gamma = check_gamma(gamma)
    if isinstance(filler_top_k, bool) or not isinstance(filler_top_k, int) or filler_top_k < 1:
        raise ValueError(f"filler_top_k must be an integer >= 1, got {filler_top_k!r}")
    drafter = NGramDrafter(ngram_storage, filler_top_k=filler_top_k,
                           stop_if_unknown=stop_if_unknown, confident_start=confident_start,
                           device=model_device(target))
    return verify_loop(
        prompt, drafter, target,
        logits_processor=logits_processor, gamma=gamma, max_gen_len=max_gen_len,
        eos_tokens_id=eos_tokens_id, use_cache=use_cache,
        vocab_size=min(target.config.vocab_size, ngram_storage.vocab_size),
        generator=generator, interruptible=interruptible, gamma_policy=gamma_policy,
        observer=observer, target_delay_s=target_delay_s,
        tree=tree, tree_branch=tree_branch,
        inspect=inspect,
    )
