"""Load a pair whose drafter is a Gemma 4 assistant checkpoint (``--drafter gemma4-assistant:PATH``).

The target loads as any target does (``utils.models.load_model``); the assistant is then read
from PATH with transformers' ``Gemma4AssistantForCausalLM`` in the target's dtype and on its
device (``gemma4_assistant.load_assistant``). A target that is not a Gemma 4, a PATH that holds
no assistant, an assistant of other sizes, or a transformers without the class is refused with
one line (``ModelLoadError``).
"""

from __future__ import annotations

from gemma4_assistant import AssistantRefused, assistant_path, load_assistant
from kvcache.probe import probe_pair
from utils.devices import dtype_name, model_device
from utils.models import ModelLoadError, ModelPair, describe, load_model
from utils.progress import Progress, no_progress
from utils.quantize import parse_quantize
from utils.vocab import check_compatible, context_length, end_token_ids


def load_assistant_pair(target: str | None, spec: str, *, device: str = "auto", dtype: str = "auto",
                        quantize: str | None = None, progress: Progress | None = None, cache_dir=None) -> ModelPair:
    """The target ``target`` and the assistant named by ``spec``; ``ModelLoadError`` (one line) if it cannot draft."""
    say = progress or no_progress
    try:
        path = assistant_path(spec)
        from gemma4_assistant.model import assistant_class
        assistant_class()                     # refuse an old transformers before loading the target
    except AssistantRefused as exc:
        raise ModelLoadError(f"--drafter {spec}: {exc}") from exc
    quantize = parse_quantize(quantize)
    model, tokenizer = load_model(target, device=device, dtype=dtype, quantize=quantize,
                                  progress=progress, cache_dir=cache_dir)
    label = describe(target, model, quantize)
    say(f"Loading the Gemma 4 assistant at {path}")
    try:
        assistant = load_assistant(path, model, cache_dir=cache_dir)
    except AssistantRefused as exc:
        raise ModelLoadError(f"--drafter {spec}: {exc}") from exc
    layers = assistant.config.get_text_config().num_hidden_layers
    pair = ModelPair(
        target=model, drafter=assistant, tokenizer=tokenizer, target_name=label,
        drafter_name=f"{path} (Gemma 4 assistant, {layers} layer{'s' * (layers != 1)}, "
                     f"{dtype_name(next(assistant.parameters()).dtype)})",
        end_tokens=end_token_ids(tokenizer, model), device=model_device(model),
        vocab_size=check_compatible(tokenizer, tokenizer, model, model),   # the assistant shares the target's ids
        context_length=context_length(model, tokenizer), self_draft_demo=False,
        notes=("the drafter attends to the target's cached keys and values; its drafts all sit at one position",),
    )
    say("Probing the target's cached forward against the uncached one")
    pair.probe = probe_pair(pair)
    return pair
