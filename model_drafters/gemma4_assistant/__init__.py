"""Drafting with a Gemma 4 assistant checkpoint (``--drafter gemma4-assistant:PATH``).

``gemma4_assistant.model`` loads the assistant for a Gemma 4 target with transformers' own
class, or says in one line why not; ``gemma4_assistant.drafter`` drafts with it from the
target's shared keys and values and its last hidden state.
"""

from model_drafters.gemma4_assistant.drafter import AssistantDrafter
from model_drafters.gemma4_assistant.model import (PREFIX, AssistantRefused, assistant_path, assistant_target, is_assistant_spec,
                                    load_assistant, mark_assistant)

__all__ = ["PREFIX", "AssistantDrafter", "AssistantRefused", "assistant_path", "assistant_target",
           "is_assistant_spec", "load_assistant", "mark_assistant"]
