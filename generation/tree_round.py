"""One draft-and-verify round over a token tree, beside the chain round of ``generation.verify``.

The target scores the root and every node in one forward (``generation.tree_forward``),
``accept_tree`` picks the path and the target cache keeps exactly that path (a gather). Extra rows
(``Drafter.extra_rows``: lookahead's window) are scored in the same pass, never verified, their
argmax handed back, and dropped from the cache with the rejected nodes.
"""

from __future__ import annotations

import torch

from generation.accept import accept_tree, accept_tree_rrs
from generation.common import cut_at_end
from generation.observer import target_delay
from generation.phases import fill_target_first
from generation.result import GenerationResult, Round
from generation.tree import NO_EXTRA, Tree, ancestors
from generation.tree_forward import keep_path, tree_forward


def tree_round(loop, ids: torch.Tensor, k_max: int, nodes: int, branch: int, *, sampled: bool = False):
    """One tree round; returns (ids, tokens appended, whether an end token ended it). ``sampled``:
    children drawn from q and verified by recursive rejection sampling (``accept_tree_rrs``); else the
    top children, verified by following the target's draw (``accept_tree``)."""
    clock, target, drafter = loop.clock, loop.target, loop.drafter
    filled = fill_target_first(drafter, ids, clock)                      # (start, end) marks
    t0 = filled[1]
    q = None
    if k_max <= 0 or nodes <= 0:
        tree = Tree((), (), ())
    elif sampled:
        tree, q = drafter.propose_sampled_tree(ids, k_max, nodes, branch)
    else:
        tree = drafter.propose_tree(ids, k_max, nodes, branch)
    extra = drafter.extra_rows(ids, tree) or NO_EXTRA
    t1 = clock.mark()
    if loop.watch.active:
        # The live view shows the tree's first-choice line as pending (the
        # observer's time is left out, as in the chain round).
        loop.watch.drafted(first_choice_line(tree, -1))
        t_verify = clock.mark()
    else:
        t_verify = t1
    device = ids.device
    target_delay(loop.target_delay_s, device)
    target.checkpoint()         # snapshots only layers a gather cannot put back (none on most models)
    logits = tree_forward(target, ids, tree, extra)                     # (n + 1 + m, V)
    if loop.vocab_size is not None:
        logits = logits[:, :loop.vocab_size]
    logits, extra_argmax = logits[:len(tree) + 1], logits[len(tree) + 1:].argmax(dim=-1)   # (n + 1, V), (m,)
    tokens = torch.tensor(tree.tokens, dtype=torch.long, device=device)
    parents = torch.tensor(tree.parents, dtype=torch.long, device=device)
    if q is not None:
        p = loop.processor(logits)
        n, deepest, token = (torch.tensor(v, device=device) for v in
                             accept_tree_rrs(p, q[:, :p.shape[-1]], tree, loop.processor.sample, loop.generator))
    elif loop.processor.is_greedy:       # the draws are the logits' argmax: no rows of probabilities built
        n, deepest, token = accept_tree(logits, tokens, parents, ancestors(tree, device), _greedy_draws(loop.processor),
                                        loop.generator)
    else:
        n, deepest, token = accept_tree(loop.processor(logits), tokens, parents, ancestors(tree, device),
                                        loop.processor.sample, loop.generator)
    width = drafter.wants_top_k
    top_k = logits.topk(width, dim=-1).indices if width > 1 else None  # (n + 1, width)
    t2 = clock.mark()
    # The round's single host sync.
    parts = [n.view(1), deepest.view(1), token.view(1), extra_argmax]
    if top_k is not None:
        parts.append(top_k.flatten())
    flat = torch.cat(parts).tolist()
    deepest, token = flat[1], flat[2]
    start = 3 + len(extra)                                              # where the top-k rows begin
    path = tree.path_to(deepest)
    new, stop = cut_at_end([tree.tokens[i] for i in path] + [token], loop.eos)
    ids = torch.cat([ids, torch.tensor([new], dtype=torch.long, device=device)], dim=1)
    keep_path(target, tree, path, len(extra))
    at = [0] + [i + 1 for i in path]                                   # rows that produced new[j]
    if loop.decisions is not None:
        loop.decisions.add(logits, at[:len(new)])
    rows = None
    if top_k is not None:
        rows = [flat[start + r * width:start + (r + 1) * width] for r in at][:len(new)]
    if len(extra):
        drafter.extra_outputs(flat[3:start])
    drafter.update(new, rows)
    count_tree(loop.result, tree, path, new, gamma=k_max,
               draft_s=clock.seconds(t0, t1), verify_s=clock.seconds(t_verify, t2) + clock.seconds(*filled))
    loop.watch.round(loop.result.trace[-1], new)
    return ids, new, stop


def _greedy_draws(processor):
    """A sampler for ``accept_tree`` that reads a greedy processor's draws off the logits themselves
    (``processor.sample(processor(rows))``, without the one-hot rows)."""
    return lambda rows, generator=None: processor.greedy_ids(rows)


def first_choice_line(tree: Tree, node: int) -> list[int]:
    """Tokens of the rank-0 children below ``node`` (-1: the root), down to a leaf."""
    line = []
    kids = tree.children(node)
    while kids:
        line.append(tree.tokens[kids[0]])
        kids = tree.children(kids[0])
    return line


def count_tree(result: GenerationResult, tree: Tree, path: list[int], new: list[int], *,
               gamma: int, draft_s: float, verify_s: float) -> None:
    """Add one tree round to the result's counters and trace (see ``Round``)."""
    n = len(path)
    token_in = len(new) > n
    kept = n if token_in else len(new)
    stop_node = path[-1] if path else -1
    line = [tree.tokens[i] for i in path] + first_choice_line(tree, stop_node)
    result.rounds += 1
    result.drafted += len(tree) if token_in else kept
    result.accepted += kept
    result.trace.append(Round(
        drafted=tuple(line if token_in else line[:kept]),
        accepted=kept,
        token=new[-1] if token_in else None,
        bonus=token_in and n > 0 and not tree.children(stop_node),
        gamma=gamma,
        draft_s=draft_s,
        verify_s=verify_s,
        tree_tokens=tree.tokens,
        tree_parents=tree.parents,
        path=tuple(path[:kept]),
        ranks=tuple(tree.ranks[i] for i in path[:kept]),
    ))
