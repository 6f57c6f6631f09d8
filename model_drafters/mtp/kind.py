"""The MTP kind (``--drafter mtp``): the target's own MTP layers, attached beside it."""

from __future__ import annotations

from model_drafters.kind import SERVED_WEIGHTS, Attached, DrafterKind, not_in_hybrid
from model_drafters.mtp.drafter import MtpDrafter
from model_drafters.mtp.model import MTP_SPEC, MtpRefused, is_mtp, load_mtp, mtp_target
from utils.devices import dtype_name


def attach(model, spec: str, *, target_name, label: str, cache_dir=None, say) -> Attached:
    """The MTP layers of the loaded ``model``."""
    say(f"Loading the MTP layers of {label}")
    layers = load_mtp(model)
    count = len(layers.layers)
    return Attached(layers, f"{target_name or 'the default model'} mtp ({count} MTP layer{'s' * (count != 1)}, "
                            f"{dtype_name(next(layers.parameters()).dtype)})",
                    f"the drafter is the target's own {count} MTP layer(s); chains past {count} draft reuse the last")


def draft(pair, strategy, state, context) -> MtpDrafter:
    return MtpDrafter(pair.drafter, context.processor, vocab_size=context.vocab_size, generator=context.generator)


KIND = DrafterKind(
    name="mtp", prefix=MTP_SPEC, is_spec=is_mtp, made_for=mtp_target, draft=draft,
    attach=attach, refused=MtpRefused,
    alone="the MTP layers draft from the target's hidden states: they cannot decode on their own",
    hybrid=not_in_hybrid("the MTP drafter"), served=SERVED_WEIGHTS,
    hf_peer="hf_mtp",
    replay="drafts from the target's hidden states, here from a forward over the kept tokens (a run "
           "takes them from its verify); checked against runs on random MTP layers only",
)
