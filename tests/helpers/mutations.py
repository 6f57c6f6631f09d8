"""Mutations the tests patch in to show a check has power: each breaks one rule on purpose."""

from __future__ import annotations

import torch


def shifted_rows(real):
    """Mutation of a tree accept rule ``real``: each node's draw taken from the row
    of the node after it (an off-by-one)."""
    def accept(p, *args, **kwargs):
        return real(torch.cat([p[1:], p[-1:]]), *args, **kwargs)
    return accept


def own_time_counted(real):
    """Mutation of ``utils.machine_load.other_load`` ``real``: this process's own CPU time is not
    taken out of the system's (every reading's own seconds read as zero)."""
    from dataclasses import replace

    def other_load(before, after):
        return real(replace(before, own_busy_s=0.0), replace(after, own_busy_s=0.0))
    return other_load


def static_by_attribute(real):
    """Mutation of ``bench.peers.static_peer_refusal`` ``real``: a decoder-only model's assisted
    generation and prompt lookup taken on a static cache wherever ``Cache`` has
    ``activate_past_recording``, untried (the rule that let through releases which still raise)."""
    def refusal(strategy, target, drafter=None):
        from transformers.cache_utils import Cache

        if strategy in ("hf_assisted", "hf_prompt_lookup") and not target.config.is_encoder_decoder \
                and hasattr(Cache, "activate_past_recording"):
            return None
        return real(strategy, target, drafter)
    return refusal
