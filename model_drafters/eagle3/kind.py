"""The EAGLE-3 kind (``--drafter eagle3:PATH``): a head read from its directory, attached beside the target."""

from __future__ import annotations

from model_drafters.eagle3.drafter import Eagle3Drafter
from model_drafters.eagle3.load import PREFIX, Eagle3Refused, eagle3_target, is_eagle3, load_eagle3
from model_drafters.kind import SERVED_STATES, Attached, DrafterKind, not_in_hybrid
from utils.devices import dtype_name


def attach(model, spec: str, *, target_name, label: str, cache_dir=None, say) -> Attached:
    """The EAGLE-3 head ``spec`` fitted to the loaded ``model``."""
    say(f"Loading the EAGLE-3 head {spec}")
    head = load_eagle3(model, spec)
    layers = ", ".join(str(i) for i in head.aux_layers)
    return Attached(head, f"{spec} (EAGLE-3 head, draft vocabulary {head.draft_vocab_size}, "
                          f"{dtype_name(next(head.parameters()).dtype)})",
                    f"the drafter is an EAGLE-3 head reading the target's hidden states {layers}")


def draft(pair, strategy, state, context) -> Eagle3Drafter:
    return Eagle3Drafter(pair.drafter, context.processor, vocab_size=context.vocab_size,
                         generator=context.generator)


KIND = DrafterKind(
    name="eagle3", prefix=PREFIX, is_spec=is_eagle3, made_for=eagle3_target, draft=draft,
    attach=attach, refused=Eagle3Refused,
    alone="an EAGLE-3 head drafts from the target's hidden states: it cannot decode on its own",
    hybrid=not_in_hybrid("an EAGLE-3 head"), served=SERVED_STATES,
    hf_peer=None,    # transformers' assisted generation cannot draft with a head reading the target's states
    replay="drafts from the target's hidden states, here from a forward over the kept tokens (a run "
           "takes them from its verify); checked against runs on random heads only",
)
