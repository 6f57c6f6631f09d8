"""Drafting with a Gemma 4 assistant from the target's shared keys and values and its last hidden state.

What transformers' ``SinglePositionMultiTokenCandidateGenerator`` does, on the
loop's own target state. With n committed tokens x_0..x_{n-1}, the target's
cache holds positions 0..n-2 (x_{n-1} is fed by the next verify). Draft i+1
comes from one assistant forward at the fixed position n-1:

    input   [E_target(t_i); s_i]     t_0 = x_{n-1}, s_0 = h_{n-2} (the target's final, normed hidden
                                     state there); t_i = draft i, s_i = the assistant's projected
                                     output of step i-1
    keys    per layer type, the target's cached keys and values of its last non-shared layer of
            that type: positions 0..n-2 (full attention); the W-1 latest (sliding, window W)
            (with the cache off, the same positions of the ``shared_kv_states`` the target's
            last uncached forward returned: ``CachedModel.keep_kv_states``)

The assistant has no cache: every step attends to the same target keys, so it
keeps no state between rounds and the only thing rolled back is the target's
cache, by the loop. h_{n-2} comes from a forward the loop runs anyway (the
verify, or in the first round the prompt's prefill): the drafter sets the
target's ``CachedModel.keep_hidden`` in ``attach_target``; no target forward is
added.

Where transformers' own assisted loop differs: it takes the keys from the
verify forward's output rather than the rolled-back cache, so after a round
that rejected a draft the assistant there also attends to the rejected draft's
key at position n-1, and its sliding keys are the window plus the verify's new
tokens. Its output is still the target's (the verify decides), but its drafts
are not these.
"""

from __future__ import annotations

import torch

from generation.hidden_rows import HeadDrafter
from model_drafters.gemma4_assistant.model import producer_layers, text_config
from sampling import LogitsProcessor


def shared_kv_states(cache, producers: dict[str, int], seen: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """layer type -> (keys, values) the assistant attends to at position ``seen`` from ``cache``
    (which holds positions 0..seen-1): a full layer's every key, a sliding layer's W-1 latest.
    (1, kv heads, positions, head dim) each."""
    states = {}
    for kind, index in producers.items():
        layer = cache.layers[index]
        keys, values = layer.keys, layer.values
        held = keys.shape[-2]
        if getattr(layer, "is_sliding", False):
            keep = min(held, int(layer.sliding_window) - 1, seen)   # a recorded past may be longer
            keys, values = keys[:, :, held - keep:], values[:, :, held - keep:]
        elif held != seen:
            raise RuntimeError(f"the target's {kind} cache holds {held} positions, not the {seen} committed")
        states[kind] = (keys, values)
    return states


def uncached_kv_states(kept: dict, window: int, seen: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The same from an uncached target forward's ``shared_kv_states`` (``kept``: positions from 0, drafts
    of the verify included): positions 0..seen-1 of a full layer, the W-1 latest of them of a sliding one."""
    states = {}
    for kind, (keys, values) in kept.items():
        start = max(0, seen - (window - 1)) if kind == "sliding_attention" else 0
        states[kind] = (keys[:, :, start:seen], values[:, :, start:seen])
    return states


class AssistantDrafter(HeadDrafter):
    """Drafts a chain with a Gemma 4 assistant (``assistant``, marked for its target), q from
    ``processor``; one assistant forward (``calls``) per draft."""

    def __init__(self, assistant, processor: LogitsProcessor, *, vocab_size: int | None = None,
                 generator: torch.Generator | None = None):
        super().__init__(assistant, processor, vocab_size=vocab_size, generator=generator)
        self.assistant = assistant
        self.producers: dict[str, int] = {}   # layer type -> the target layer whose keys are read
        self.window = 0                        # the target's sliding window
        self.embed = None

    # ------------------------------------------------------------------ contract

    def attach_target(self, target) -> None:
        """Keep the target's ``CachedModel`` (its cache is read each round) and ask its forwards
        to keep their final hidden states."""
        self.target = target
        config = text_config(target.model.config)
        self.producers = producer_layers(config)
        self.window = int(config.sliding_window)
        self.embed = target.model.get_input_embeddings()
        target.keep_hidden = True
        target.keep_kv_states = not target.use_cache     # no cache to read them from: keep the forward's

    def tree_support(self) -> str | None:
        return "the Gemma 4 assistant proposes chains only (trees from its logits are not built)"

    def fill_target(self, ids: torch.Tensor) -> None:
        """In the first round the target prefills all but the last token here (the verify feeds
        that one and the drafts), keeping the hidden state of position n-2."""
        wanted = ids.shape[1] - 1
        # cache on: the cache lacks committed positions; cache off: no forward has run on them yet
        missing = self.target.length < wanted if self.target.use_cache else not self.holds_hidden(wanted - 1)
        if missing:
            self.target.forward(ids[:, :wanted], keep=1)

    def chain_step(self, ids: torch.Tensor, n: int):
        if self.target.use_cache:
            kv = shared_kv_states(self.target.cache, self.producers, n - 1)
        else:
            kv = uncached_kv_states(self.target.kv_states, self.window, n - 1)
        state = self.last_hidden(n - 2)                                     # (1, 1, H_target)
        position = torch.tensor([[n - 1]], device=self.device)             # every draft sits at one position

        def step(seq: torch.Tensor) -> torch.Tensor:             # (1, n + d) -> the assistant's logits, (1, V)
            nonlocal state
            embeds = torch.cat([self.embed(seq[:, -1:]), state], dim=-1)   # (1, 1, 2 H_target)
            out = self.assistant(inputs_embeds=embeds, position_ids=position, shared_kv_states=kv,
                                 use_cache=False)
            self._forwards += 1
            state = out.last_hidden_state                                   # (1, 1, H_target)
            return out.logits[0, -1:]

        return step

    # ------------------------------------------------------------------ internals

    def last_hidden(self, position: int) -> torch.Tensor:
        """The target's final hidden state at ``position``, from its last forward: (1, 1, H)."""
        if not self.holds_hidden(position):
            raise RuntimeError(f"the target's last forward kept no hidden state for position {position}")
        start, rows = self.target.hidden
        return rows[position - start].to(self.device)[None, None]

    def holds_hidden(self, position: int) -> bool:
        kept = self.target.hidden
        return kept is not None and kept[0] <= position < kept[0] + kept[1].shape[0]
