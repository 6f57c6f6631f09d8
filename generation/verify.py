"""The one verify loop behind speculative decoding and NASD.

A drafter proposes up to gamma tokens (with their probabilities when it has
them); the target scores them all in one forward pass; the accept rule keeps a
prefix and adds one target token; caches are rolled back to what was kept; the
drafter is told what the sequence became. Strategies differ only in the drafter.
A gamma policy (``generation.gamma_policies``) picks each round's draft length
and learns from the finished round. What a drafter may do is
``generation.drafter.Drafter``; the loop calls its methods and nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from analysis.sources import fill_summary
from generation.common import cut_at_end, timed_run
from generation.decisions import DecisionLog
from utils.devices import model_device
from generation.drafter import Drafter
from generation.inspection import Inspection, decode, record_round
from generation.observer import Observer, Watch, target_delay
from generation.options import LoopOptions
from generation.phases import PhaseClock, fill_target_first, split_phases
from generation.result import GenerationResult, Round
from generation.tree_round import tree_round
from generation.verify_rules import Rule, block_details, on_greedy_columns, verify_rule
from sampling import LogitsProcessor
from sampling.processors import probs_dtype
from kvcache.cache import CachedModel, UnsupportedCacheError, tree_support
from kvcache.probe import not_causal
from kvcache.static import compile_report, loop_model, static_capacity


@dataclass
class _Loop:
    """What one generation's rounds share."""

    target: CachedModel
    drafter: Drafter
    processor: LogitsProcessor
    generator: torch.Generator | None
    vocab_size: int | None
    eos: frozenset[int]
    clock: PhaseClock
    result: GenerationResult
    watch: Watch
    target_delay_s: float = 0.0
    inspect: bool = False
    verify: str = "residual"    # the chain verify rule's name (generation.verify_rules)
    decisions: DecisionLog | None = None    # the rows that decided each emitted token, when kept

    @property
    def rule(self) -> Rule:
        """The rule itself, looked up where it is kept (a test may swap one in)."""
        return verify_rule(self.verify)


@torch.inference_mode()
def verify_loop(prompt: list[int], drafter: Drafter, target, options: LoopOptions, *,
                observer: Observer | None = None, interruptible: bool = False) -> GenerationResult:
    """Draft, verify, accept, roll back; repeat until an end token or the budget.

    ``prompt``: the checked prompt ids (the encoder's for a seq2seq target).
    ``target``: the target model, or a ``CachedModel`` over it fed as it is.
    ``options`` (:class:`generation.options.LoopOptions`): the processor, the
    budget, the end tokens, the γ policy, trees, the inspector and the rest.
    After every round the target cache holds a prefix of the kept sequence
    minus its last token: all of it when its layers can be cropped, a shorter
    one after a snapshot restore (recurrent layers). ``observer`` (see
    ``generation.observer``) is told each round's drafts and outcome; the time
    spent inside it is left out of ``seconds``. With ``interruptible``, Ctrl-C
    ends the run and keeps what was made. With ``options.tree`` > 0 each round
    verifies a token tree (``generation.tree_round``) when both the target and
    the drafter can take one; otherwise chains run and ``result.tree_fallback``
    says why; ``result.tree_rule`` says which tree rule ran ("top" or "sampled").
    """
    policy = options.gamma_policy
    verify_rule(options.verify)                         # an unknown name fails here, before any forward
    if policy is None:
        raise ValueError("the verify loop needs a gamma policy (generation.gamma_policies.make_policy)")
    given = isinstance(target, CachedModel)           # a cached model fed as it is (the advisor's recorded target)
    reason = not_causal(target.model if given else target)
    if reason is not None:
        raise UnsupportedCacheError(reason)
    device = model_device(target.model if given else target)
    model = target if given else loop_model(
        target, use_cache=options.use_cache, compile=options.compile,
        capacity=static_capacity(len(prompt), options.max_gen_len, options.tree + drafter.most_extra_rows))
    result = GenerationResult(gamma_policy=policy.name, tree=options.tree)
    loop = _Loop(model, drafter, options.processor, options.generator, options.vocab_size, options.eos,
                 PhaseClock(device), result, Watch(observer), options.target_delay_s, options.inspect,
                 options.verify, DecisionLog() if options.decisions else None)
    start = None
    with timed_run(result, device, interruptible=interruptible) as started:
        drafter.attach_target(model)            # before the target begins: it may ask for hidden states
        start = model.begin(prompt, options.prefills)
        ids = torch.tensor([start], dtype=torch.long, device=device)     # (1, L)
        drafter.begin(prompt)
        policy.begin(drafter.kind)
        trees = options.tree > 0 and _trees_possible(model, drafter, result)
        sampled = trees and options.tree_sample and not options.processor.is_greedy and drafter.samples_trees
        result.tree_rule = ("sampled" if sampled else "top") if trees else ""
        result.verify_rule = "" if trees else options.verify
        generated = 0
        first_capture = 0.0
        while generated < options.max_gen_len:
            k_max = min(policy.next_gamma(), options.max_gen_len - generated - 1)
            before = model.capture_s, drafter.capture_s
            if trees:
                ids, new, stop = tree_round(loop, ids, k_max, options.tree, options.tree_branch, sampled=sampled)
            else:
                ids, new, stop = _round(loop, ids, k_max, policy.threshold)
            _book_captures(result, before, (model.capture_s, drafter.capture_s))
            policy.observe(result.trace[-1])
            generated += len(new)
            if result.rounds == 1:          # captures inside the first round are not time to first token
                first_capture = model.capture_s + drafter.capture_s
            if stop:
                result.stop_reason = "eos"
                break
            if options.max_rounds and result.rounds >= options.max_rounds and generated < options.max_gen_len:
                result.stop_reason = "rounds"
                break
    network = model.network_stats()
    report = drafter.report()
    if network is None:
        result.compile = compile_report(options.compile, model.compile_stats(), report.compile)
    result.seconds -= loop.watch.paused_s + model.capture_s + drafter.capture_s    # capturing is not decoding
    result.first_token_s, result.first_tokens = loop.watch.first_token(started)
    if result.first_token_s is not None:
        result.first_token_s = max(0.0, result.first_token_s - first_capture)
    result.tokens = ids[0, len(start):].tolist() if start is not None else []
    if loop.decisions is not None:
        result.decisions = loop.decisions.read()                          # the run's one read-back
    result.target_calls = model.forwards
    result.drafter_calls = drafter.calls
    result.phases = split_phases(result.seconds, sum(r.draft_s for r in result.trace),
                                 sum(r.verify_s for r in result.trace))
    result.rollback = {"target": model.stats.to_dict()}
    if network is not None:
        result.network = network
    if report.rollback is not None:
        result.rollback["drafter"] = report.rollback
    if report.cross_tokenizer is not None:
        result.cross_tokenizer = report.cross_tokenizer
    if report.round_notes:           # each round's note: why the drafter drafted what it did
        result.trace = [replace(r, note=note) if note is not None else r
                        for r, note in zip(result.trace, report.round_notes)] + result.trace[len(report.round_notes):]
    if report.fill_costs:
        result.width_fill = fill_summary(result.trace, report.fill_costs)
    return result


def _book_captures(result: GenerationResult, before: tuple[float, float], after: tuple[float, float]) -> None:
    """Take the captures made during the last round out of its verify and draft times: a capture is
    booked in ``compile.capture_s``, never as a round's cost (the speedup model and the cost tables
    read those per round)."""
    verify, draft = after[0] - before[0], after[1] - before[1]
    if verify > 0 or draft > 0:
        last = result.trace[-1]
        result.trace[-1] = replace(last, verify_s=max(0.0, last.verify_s - verify),
                                   draft_s=max(0.0, last.draft_s - draft))


def _trees_possible(model: CachedModel, drafter, result: GenerationResult) -> bool:
    """Whether this target and drafter can take trees; if not, record why (one line)."""
    reason = tree_support(model)
    if reason is None:
        reason = drafter.tree_support()
    if reason is not None:
        result.tree_fallback = f"chain instead of a tree: {reason}"
    return reason is None


def _round(loop: _Loop, ids: torch.Tensor, k_max: int, stop_below: float | None):
    """One round; returns (ids, tokens appended, whether an end token ended it)."""
    clock, target, drafter = loop.clock, loop.target, loop.drafter
    filled = fill_target_first(drafter, ids, clock)                      # (start, end) marks
    t0 = filled[1]
    if k_max > 0:
        draft, q = drafter.propose(ids, k_max, stop_below)
    else:
        draft, q = ids.new_empty(0), None
    t1 = clock.mark()
    if loop.watch.active:
        # Shown as pending before the verify. The copy to the host counts (as
        # other: a GPU pays a sync for it); the observer call itself does not.
        loop.watch.drafted(draft.tolist())
        t_verify = clock.mark()
    else:
        t_verify = t1
    k = draft.shape[0]
    target_delay(loop.target_delay_s, ids.device)
    target.checkpoint()
    logits = target.forward(torch.cat([ids, draft.view(1, -1)], dim=1), keep=k + 1)
    if loop.vocab_size is not None:
        logits = logits[:, :loop.vocab_size]                             # (k+1, V)
    if loop.processor.is_greedy and not loop.inspect:      # the rule on the ids that matter (same n, token)
        p = None
        n, token = on_greedy_columns(loop.rule, loop.processor.greedy_ids(logits), q, draft,
                                     loop.processor.sample, loop.generator, probs_dtype(logits.dtype))
    else:
        p = loop.processor(logits)
        n, token = loop.rule(p, q, draft, loop.processor.sample, loop.generator)
    top_k = logits.topk(drafter.wants_top_k, dim=-1).indices if drafter.wants_top_k > 1 else None
    t2 = clock.mark()
    record = _record(loop, logits, p, q, draft, n, token) if loop.inspect else None
    # The round's single host sync: n, the target token, the drafts, the top-k (, the record).
    parts = [n.view(1), token.view(1), draft]
    if top_k is not None:
        parts.append(top_k.flatten())
    if record is not None:
        parts.append(record)
    flat = torch.cat(parts).tolist()
    n, token, drafts = flat[0], flat[1], flat[2:2 + k]
    new, stop = cut_at_end(drafts[:n] + [token], loop.eos)
    ids = torch.cat([ids, torch.tensor([new], dtype=torch.long, device=ids.device)], dim=1)
    target.rollback(ids.shape[1] - 1)
    if loop.decisions is not None:
        loop.decisions.add(logits, len(new))                             # row i decided new[i]
    top_k_rows = None
    if top_k is not None:
        width, rows = drafter.wants_top_k, flat[2 + k:]
        top_k_rows = [rows[i * width:(i + 1) * width] for i in range(len(new))]
    drafter.update(new, top_k_rows)
    inspection = None
    if record is not None:
        inspection = decode(flat[len(flat) - record.numel():], drafts, n, vocab=p.shape[-1],
                            has_q=q is not None, shown="softmax" if loop.processor.is_greedy else "rule",
                            rule=loop.verify)
    _count(loop.result, drafts, n, new, gamma=k_max,
           draft_s=clock.seconds(t0, t1), verify_s=clock.seconds(t_verify, t2) + clock.seconds(*filled),
           inspection=inspection)
    loop.watch.round(loop.result.trace[-1], new)
    return ids, new, stop


def _record(loop: _Loop, logits, p, q, draft, n, token) -> torch.Tensor:
    """The inspector's numbers for this round, on the device (``generation.inspection``).

    Under greedy, p and q are one-hot; the models' softmax is shown instead
    (the drafter's logits when it keeps them, else its one-hot q). Under the
    block rule its running ratios and thresholds (``block_details``, on the
    rule's own p and q) go in too; the numbers follow ``loop.verify``.
    """
    p_view, q_view = p, q
    if loop.processor.is_greedy:
        p_view = logits.float().softmax(dim=-1)                          # (k+1, V)
        draft_logits = loop.drafter.draft_logits() if q is not None else None
        if draft_logits is not None and draft_logits.shape[0] == draft.shape[0]:
            q_view = draft_logits.to(p.device).float().softmax(dim=-1)   # (k, V)
    block = block_details(p, q, draft) if loop.verify == "block" else None      # ((k,), (k,))
    return record_round(p, q, draft, n, token, p_view=p_view, q_view=q_view, rule=loop.verify, block=block)


def _count(result: GenerationResult, drafts: list[int], n: int, new: list[int], *,
           gamma: int, draft_s: float, verify_s: float, inspection: Inspection | None = None) -> None:
    """Add one round to the result's counters and trace.

    drafts: all drafts proposed; n: how many the target accepted; new: what was
    appended. When an end token among the accepted drafts ends the output, the
    drafts after it are dropped from the round (they were never needed), so they
    count as neither drafted nor rejected.
    """
    token_in = len(new) > n                      # the target's own token was appended
    kept = n if token_in else len(new)
    drafted = drafts if token_in else drafts[:kept]
    result.rounds += 1
    result.drafted += len(drafted)
    result.accepted += kept
    result.trace.append(Round(
        drafted=tuple(drafted),
        accepted=kept,
        token=new[-1] if token_in else None,
        bonus=token_in and n == len(drafts) > 0,
        gamma=gamma,
        draft_s=draft_s,
        verify_s=verify_s,
        inspection=None if inspection is None else inspection.trimmed(len(drafted), token_in, n < len(drafts)),
    ))
