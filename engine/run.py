"""The one function that turns a strategy into a decode."""

from __future__ import annotations

import torch

from cross_tokenizer import drafter_inputs, has_own_tokenizer
from engine.drafters import DRAFTERS, DraftContext
from engine.state import EngineState
from engine.strategy import Strategy
from generation.autoregressive import autoregressive_generate
from generation.common import check_gamma, check_request
from generation.observer import Observer
from generation.result import GenerationResult
from generation.verify import verify_loop
from sampling.spec import ProcessorSpec
from utils.devices import model_device


def run_strategy(strategy: Strategy, pair, prompt_ids: list[int], *, state: EngineState | None = None,
                 interruptible: bool = False, generator: torch.Generator | None = None,
                 observer: Observer | None = None) -> GenerationResult:
    """Decode ``prompt_ids`` (the encoder's ids for a seq2seq pair) with ``strategy`` on ``pair``.

    ``pair`` needs ``target``, ``drafter`` (None when no strategy uses it),
    ``end_tokens`` and ``vocab_size`` (None: the models' shared length), as a
    ``utils.models.ModelPair`` has. ``state`` carries the n-gram storage and
    the γ policies from run to run (a fresh one when None). ``generator``, when
    given, is drawn from instead of one seeded from ``strategy.seed`` (a caller
    that samples many runs from one stream). When the pair's drafter has a
    tokenizer of its own, drafter AR starts from the drafter's own prompt ids
    and returns drafter ids (the "model" drafter crosses the tokenizers itself,
    see ``engine.drafters.model_drafter``). ``observer`` (see
    ``generation.observer``: ``drafted`` and ``round``) is told each round as
    it runs (live rendering); the time spent inside it is left out of the
    result's seconds. With an interruptible run, Ctrl-C ends the decode and
    keeps what was made.
    """
    state = state if state is not None else EngineState()
    model = pair.drafter if strategy.key == "drafter" and not strategy.drafts else pair.target
    if generator is None and strategy.seed is not None:
        torch.manual_seed(strategy.seed)
        generator = torch.Generator(device=model_device(model)).manual_seed(strategy.seed)
    processor = strategy.processor
    if isinstance(processor, ProcessorSpec):
        processor = processor.build()
    common = dict(logits_processor=processor, max_gen_len=strategy.max_gen_len,
                  eos_tokens_id=pair.end_tokens, use_cache=strategy.use_cache, generator=generator,
                  interruptible=interruptible, observer=observer)
    # The injected round trip is paid by every target forward, and only by those.
    delay = strategy.target_delay_s if strategy.drafts or strategy.key != "drafter" else 0.0
    if not strategy.drafts:
        phase = "draft" if strategy.key == "drafter" else "verify"
        if strategy.key == "drafter" and has_own_tokenizer(pair):  # the drafter reads and writes its own ids
            prompt_ids, common["eos_tokens_id"] = drafter_inputs(pair, prompt_ids)
        return autoregressive_generate(prompt_ids, model, phase=phase, target_delay_s=delay, **common)
    if strategy.drafter not in DRAFTERS:
        raise ValueError(f"unknown drafter {strategy.drafter!r} (choose from {', '.join(DRAFTERS)})")
    prompt = check_request(prompt_ids, strategy.max_gen_len, pair.target)
    gamma = check_gamma(strategy.gamma)
    vocab = loop_vocab_size(pair)
    context = DraftContext(processor, generator, vocab, prompt, strategy.max_gen_len)
    drafter = DRAFTERS[strategy.drafter](pair, strategy, state, context)
    return verify_loop(prompt, drafter, pair.target, gamma=gamma, vocab_size=vocab,
                       gamma_policy=state.gamma_policy(strategy), target_delay_s=delay,
                       tree=strategy.tree, tree_branch=strategy.tree_branch,
                       tree_sample=strategy.tree_sample, inspect=strategy.inspect,
                       **common)


def loop_vocab_size(pair) -> int:
    """The vocabulary the verify loop compares over: the pair's shared length, within the target's logits."""
    models = [m for m in (pair.target, pair.drafter) if m is not None]
    shared = pair.vocab_size or min(m.config.vocab_size for m in models)
    return min(pair.target.config.vocab_size, shared)
