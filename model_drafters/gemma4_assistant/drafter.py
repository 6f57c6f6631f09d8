"""Drafting with a Gemma 4 assistant from the target's shared keys and values and its last hidden state.

What transformers' ``SinglePositionMultiTokenCandidateGenerator`` does, on the loop's own target
state. With n committed tokens the target's cache holds positions 0..n-2; draft i+1 comes from one
assistant forward at position n-1 over [E_target(t_i); s_i] (t_0 = x_{n-1}, s_0 = the target's
final normed hidden state at n-2; then the drafts and the assistant's projected outputs), attending
to the target's cached keys and values of its last non-shared layer of each type.

The assistant has no cache, so the only thing rolled back is the target's. Unlike transformers'
loop, which reads the keys from the verify's output (a rejected draft's included), these come from
the rolled-back cache: same output, other drafts.
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
