"""The Gemma 4 assistant kind (``--drafter gemma4-assistant:PATH``), attached beside a Gemma 4 target."""

from __future__ import annotations

from model_drafters.gemma4_assistant.drafter import AssistantDrafter
from model_drafters.gemma4_assistant.model import (PREFIX, AssistantRefused, assistant_class, assistant_path,
                                                   assistant_target, is_assistant_spec, load_assistant)
from model_drafters.kind import SERVED_STATES, Attached, DrafterKind, not_in_hybrid
from utils.devices import dtype_name


def check(spec: str) -> None:
    """Refuse an empty PATH or an old transformers before the target loads."""
    assistant_path(spec)
    assistant_class()


def attach(model, spec: str, *, target_name, label: str, cache_dir=None, say) -> Attached:
    """The assistant at ``spec``'s PATH for the loaded ``model``."""
    path = assistant_path(spec)
    say(f"Loading the Gemma 4 assistant at {path}")
    assistant = load_assistant(path, model, cache_dir=cache_dir)
    layers = assistant.config.get_text_config().num_hidden_layers
    return Attached(assistant, f"{path} (Gemma 4 assistant, {layers} layer{'s' * (layers != 1)}, "
                               f"{dtype_name(next(assistant.parameters()).dtype)})",
                    "the drafter attends to the target's cached keys and values; its drafts all sit at one position")


def draft(pair, strategy, state, context) -> AssistantDrafter:
    return AssistantDrafter(pair.drafter, context.processor, vocab_size=context.vocab_size,
                            generator=context.generator)


KIND = DrafterKind(
    name="gemma4_assistant", prefix=PREFIX, is_spec=is_assistant_spec, made_for=assistant_target, draft=draft,
    attach=attach, check=check, refused=AssistantRefused,
    alone="the Gemma 4 assistant drafts from the target's keys and values: it cannot decode on its own",
    hybrid=not_in_hybrid("the Gemma 4 assistant"), served=SERVED_STATES,
    replay="drafts from the target's last states, here from a forward over the kept tokens "
           "(a run takes them from its verify); checked against runs on random assistants only",
)
