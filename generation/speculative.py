"""Speculative decoding with a drafter model (Leviathan et al. 2023; Chen et al. 2023)."""

from __future__ import annotations

import torch

from generation.common import check_gamma, check_request, model_device
from generation.result import GenerationResult
from generation.tree import Tree
from generation.tree_draft import draft_tree, sample_tree
from generation.verify import verify_loop
from sampling import LogitsProcessor
from utils.cache import CachedModel, tree_support


def draft_tokens(step, seq: torch.Tensor, k: int, processor: LogitsProcessor, generator, vocab_size,
                 stop_below: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to k tokens drawn one by one from q = processor(step(seq)): ids (k',) and q (k', V).

    ``step(seq)`` returns the drafter's logits for the token after ``seq`` (1, L),
    shape (1, V). With ``stop_below`` the round ends early once the top
    probability for the next token falls below it (one host sync per step).
    """
    drafts, probs = [], []
    for _ in range(k):
        logits = step(seq)                                      # (1, V)
        if vocab_size is not None:
            logits = logits[:, :vocab_size]
        q = processor(logits)                                   # (1, V)
        if stop_below is not None and drafts and q.max().item() < stop_below:
            break
        token = processor.sample(q, generator)                  # (1,)
        seq = torch.cat([seq, token.view(1, 1)], dim=1)
        drafts.append(token)
        probs.append(q)
    return torch.cat(drafts), torch.cat(probs)


class ModelDrafter:
    """Drafts with a smaller model, sampling each token from q = processor(drafter logits).

    Keeps its own cache (a :class:`utils.cache.CachedModel`): every step feeds
    only the tokens it has not seen, and at the start of each round the cache
    is rolled back to a prefix of the kept sequence.
    """

    wants_top_k = 0
    kind = "model"

    def __init__(self, model, processor: LogitsProcessor, *, use_cache: bool = True,
                 vocab_size: int | None = None, generator: torch.Generator | None = None):
        self.model = model
        self.processor = processor
        self.vocab_size = vocab_size
        self.generator = generator
        self.device = model_device(model)
        self.cached = CachedModel(model, use_cache=use_cache)
        self._logits: list[torch.Tensor] = []  # the last proposal's logits rows, (1, V) each

    @property
    def calls(self) -> int:
        """Drafter forward passes since begin()."""
        return self.cached.forwards

    def begin(self, prompt: list[int]) -> None:
        self.cached.begin(prompt)

    def propose(self, ids: torch.Tensor, k: int, stop_below: float | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to k tokens drawn one by one from the drafter: ids (k',) and q (k', V).

        With ``stop_below`` the round ends early once the drafter's top
        probability for the next token falls below it (that check costs one
        host sync per step).
        """
        seq = ids.to(self.device)
        self.cached.rollback(seq.shape[1] - 1)
        self.cached.checkpoint()
        self._logits = []

        def step(s: torch.Tensor) -> torch.Tensor:
            logits = self.cached.forward(s, keep=1)                 # (1, V)
            self._logits.append(logits)
            return logits

        drafts, probs = draft_tokens(step, seq, k, self.processor, self.generator, self.vocab_size, stop_below)
        del self._logits[drafts.shape[0]:]                          # a step past an early stop drafted nothing
        return drafts.to(ids.device), probs.to(ids.device)

    def propose_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int) -> Tree:
        """A dynamic tree (``generation.tree_draft``) of at most ``nodes`` nodes and
        ``depth`` levels; a chain of ``min(depth, nodes)`` drafts when this drafter
        cannot take a tree (recurrent layers, no custom masks)."""
        seq = ids.to(self.device)
        self.cached.rollback(seq.shape[1] - 1)
        self.cached.checkpoint()
        if tree_support(self.cached) is not None:
            drafts, _ = self.propose(ids, min(depth, nodes))
            return Tree.chain(drafts.tolist())
        return draft_tree(self.cached, self.processor, self.vocab_size, seq, depth, nodes, branch)

    def propose_sampled_tree(self, ids: torch.Tensor, depth: int, nodes: int, branch: int
                             ) -> tuple[Tree, torch.Tensor]:
        """A tree whose children are drawn from q without replacement
        (``generation.tree_draft.sample_tree``) and q at the root and each node,
        (n + 1, V); a chain of ``min(depth, nodes)`` drafts and their q when this
        drafter cannot take a tree."""
        seq = ids.to(self.device)
        self.cached.rollback(seq.shape[1] - 1)
        self.cached.checkpoint()
        if tree_support(self.cached) is not None:
            drafts, q = self.propose(ids, min(depth, nodes))
            return Tree.chain(drafts.tolist()), torch.cat([q, torch.zeros_like(q[:1])])
        tree, q = sample_tree(self.cached, self.processor, self.vocab_size, seq, depth, nodes, branch,
                              self.generator)
        return tree, q.to(ids.device)

    def draft_logits(self) -> torch.Tensor | None:
        """The last proposal's raw logits, (k', V): the inspector shows their
        softmax under greedy, where q itself is one-hot."""
        if not self._logits:
            return None
        logits = torch.cat(self._logits)                            # (k', V_drafter)
        return logits if self.vocab_size is None else logits[:, :self.vocab_size]

    def update(self, new_tokens: list[int], top_k: list[list[int]] | None) -> None:
        """Nothing to learn: the cache is rolled back lazily at the next proposal."""

    def rollback_stats(self) -> dict:
        return self.cached.stats.to_dict()


def shared_vocab_size(*models) -> int:
    """The vocabulary length every model's logits cover (embeddings may be padded)."""
    return min(m.config.vocab_size for m in models)


def speculative_generate(
    inputs,
    drafter,
    target,
    *,
    logits_processor: LogitsProcessor,
    gamma: int = 4,
    max_gen_len: int = 128,
    eos_tokens_id=None,
    use_cache: bool = True,
    vocab_size: int | None = None,
    generator: torch.Generator | None = None,
    interruptible: bool = False,
    gamma_policy=None,
    observer=None,
    target_delay_s: float = 0.0,
    tree: int = 0,
    tree_branch: int = 2,
    tree_sample: bool = False,
    inspect: bool = True,
) -> GenerationResult:
    """Generate up to ``max_gen_len`` tokens after ``inputs`` with a drafter model.

    The drafter proposes gamma tokens per round (fewer when the budget is nearly
    spent); the target verifies them in one forward pass. Output follows the
    target's distribution under ``logits_processor`` exactly; under greedy it is
    the target's greedy output token for token. ``vocab_size`` defaults to the
    shorter of the two models' vocabularies. ``gamma_policy`` (see
    ``generation.gamma_policies``) varies the draft length per round; None keeps
    it at ``gamma``. ``observer`` and ``target_delay_s``: see
    :func:`generation.verify.verify_loop`. ``tree`` > 0 drafts and verifies a
    token tree of at most that many nodes per round (``tree_branch`` children
    per expanded node; depth still gamma; ``tree_sample``: children drawn from
    q and verified by recursive rejection sampling, see
    ``generation.verify.verify_loop``). For an encoder-decoder pair ``inputs``
    are the encoder's ids and both decoders start from the decoder start token.
    ``inspect`` records the per-token inspector's numbers (``generation.inspection``).
    """
    prompt = check_request(inputs, max_gen_len, target, drafter)
    gamma = check_gamma(gamma)
    vocab = vocab_size or shared_vocab_size(target, drafter)
    model_drafter = ModelDrafter(drafter, logits_processor, use_cache=use_cache,
                                 vocab_size=vocab, generator=generator)
    return verify_loop(
        prompt, model_drafter, target,
        logits_processor=logits_processor, gamma=gamma, max_gen_len=max_gen_len,
        eos_tokens_id=eos_tokens_id, use_cache=use_cache, vocab_size=vocab,
        generator=generator, interruptible=interruptible, gamma_policy=gamma_policy,
        observer=observer, target_delay_s=target_delay_s,
        tree=tree, tree_branch=tree_branch, tree_sample=tree_sample,
        inspect=inspect,
    )
