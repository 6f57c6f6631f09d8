"""The one function that turns a strategy into a decode: the only way into decoding."""

from __future__ import annotations

from dataclasses import replace

import torch

from analysis.hybrid import hybrid_summary
from engine.drafters import DRAFTERS, DraftContext
from engine.kinds import kind_of_module, kind_of_pair
from engine.pair import pair_of, shared_vocab_size
from engine.state import EngineState
from engine.strategy import HybridOptions, Strategy
from generation.autoregressive import autoregressive_generate
from generation.common import check_gamma, check_request, end_tokens
from generation.observer import Observer
from generation.options import LoopOptions
from generation.result import GenerationResult
from generation.verify import verify_loop
from generation.served import ServedModel
from sampling import GreedyProcessor
from sampling.spec import as_processor
from utils.devices import model_device


def run_strategy(strategy: Strategy, pair, prompt_ids: list[int], *, state: EngineState | None = None,
                 interruptible: bool = False, generator: torch.Generator | None = None,
                 observer: Observer | None = None, prefills=(), target=None, drafter=None) -> GenerationResult:
    """Decode ``prompt_ids`` (the encoder's ids for a seq2seq pair) with ``strategy`` on ``pair``.

    ``pair`` needs ``target``, ``drafter`` (None when no strategy uses it),
    ``end_tokens`` and ``vocab_size`` (None: the models' shared length), as a
    ``utils.models.ModelPair`` has (``engine.load_pair`` loads one,
    ``engine.pair_of`` wraps models in memory). ``state`` carries the n-gram
    storage, the γ policies and what was built once for the pair from run to
    run (a fresh one when None). ``generator``, when given, is drawn from
    instead of one seeded from ``strategy.seed`` (a caller that samples many
    runs from one stream). When the pair's drafter has a tokenizer of its own,
    drafter AR starts from the drafter's own prompt ids and returns drafter
    ids (the "model" drafter crosses the tokenizers itself, see
    ``engine.drafters.model_drafter``). ``observer`` (see
    ``generation.observer``: ``drafted`` and ``round``) is told each round as
    it runs (live rendering); the time spent inside it is left out of the
    result's seconds. With an interruptible run, Ctrl-C ends the decode and
    keeps what was made. ``prefills`` (``kvcache.prefill.prefill``): a model
    with a prefill of this prompt among them begins from a copy of it.
    A drafting strategy may be given ``target``, a ``kvcache.CachedModel`` fed in
    place of the pair's target (the advisor's recorded target, whose verifies
    are answered from target AR's output: ``advisor.stored``), and ``drafter``,
    a ``Drafter`` built by the caller in place of the strategy's own (the
    advisor's teacher-forced drafter model); the loop and its counts are the same.
    """
    state = state if state is not None else EngineState()
    on_drafter = strategy.model == "drafter" and not strategy.drafts
    model = pair.drafter if on_drafter else pair.target
    if on_drafter and model is None:
        raise ValueError("this pair has no drafter model to decode with")
    if on_drafter and not decodes_alone(model):
        raise ValueError(f"{decodes_alone_reason(model)}: drafter AR cannot run")
    if generator is None and strategy.seed is not None:
        torch.manual_seed(strategy.seed)
        generator = torch.Generator(device=model_device(model)).manual_seed(strategy.seed)
    processor = as_processor(strategy.processor)
    eos = pair.end_tokens
    kind = kind_of_pair(pair) if on_drafter else None
    if kind is not None and kind.alone_inputs is not None:   # the drafter reads and writes its own ids
        prompt_ids, eos = kind.alone_inputs(pair, prompt_ids, state)
    prompt = check_request(prompt_ids, strategy.max_gen_len, model)
    if isinstance(model, ServedModel):   # its sampling settings decide what is exact (a refusal is one line)
        model = model.bound(processor)
    options = LoopOptions(
        processor=processor, max_gen_len=strategy.max_gen_len, eos=end_tokens(eos),
        use_cache=strategy.use_cache, generator=generator, inspect=strategy.inspect,
        # The injected round trip is paid by every target forward, and only by those.
        target_delay_s=0.0 if on_drafter else strategy.target_delay_s,
        tree=strategy.tree, tree_branch=strategy.tree_branch, tree_sample=strategy.tree_sample,
        verify=strategy.verify, prefills=tuple(prefills), compile=strategy.compile,
        decisions=strategy.decisions and processor.is_greedy and not on_drafter,
        max_rounds=strategy.max_rounds,
    )
    if not strategy.drafts:
        return autoregressive_generate(prompt, model, options, phase="draft" if on_drafter else "verify",
                                       observer=observer, interruptible=interruptible)
    if strategy.drafter not in DRAFTERS:
        raise ValueError(f"unknown drafter {strategy.drafter!r} (choose from {', '.join(DRAFTERS)})")
    check_gamma(strategy.gamma)
    vocab = loop_vocab_size(pair)
    context = DraftContext(processor, generator, vocab, prompt, strategy.max_gen_len, tuple(prefills))
    if drafter is None:
        drafter = DRAFTERS[strategy.drafter](pair, strategy, state, context)
    options = replace(options, vocab_size=vocab, gamma_policy=state.gamma_policy(strategy))
    result = verify_loop(prompt, drafter, model if target is None else target, options, observer=observer,
                         interruptible=interruptible)
    hybrid = strategy.drafter_options
    if isinstance(hybrid, HybridOptions) and hybrid.min_match > 0:
        result.hybrid = hybrid_summary(result.trace, hybrid.min_match)
    return result


def greedy_run(target, drafter, prompt: list[int], tokens: int, gamma: int = 0) -> GenerationResult:
    """A greedy run of ``tokens`` tokens from ``prompt``: target AR where ``drafter`` is None, else
    speculative decoding at ``gamma`` with the model ``drafter``. What a drafter kind's loader
    measures with (``DrafterKind.load``: the self-drafters' calibration and layer search)."""
    if drafter is None:
        strategy = Strategy("target", processor=GreedyProcessor(), max_gen_len=tokens)
    else:
        strategy = Strategy("calibration", drafter="model", gamma=gamma, processor=GreedyProcessor(), max_gen_len=tokens)
    return run_strategy(strategy, pair_of(target, drafter), prompt)


def decodes_alone(drafter) -> bool:
    """Whether a pair's drafter model can decode on its own (drafter AR): not one of a kind that
    reads the target's state (the target's MTP layers, an EAGLE-3 head, a Gemma 4 assistant)."""
    return decodes_alone_reason(drafter) is None


def decodes_alone_reason(drafter) -> str | None:
    """Why ``drafter`` cannot decode on its own (one line, its kind's), or None when it can."""
    kind = kind_of_module(drafter)
    return kind.alone if kind is not None else None


def loop_vocab_size(pair) -> int:
    """The vocabulary the verify loop compares over: the pair's shared length, within the target's logits."""
    shared = pair.vocab_size or shared_vocab_size(pair.target, pair.drafter)
    return min(pair.target.config.vocab_size, shared)
