"""Load a pair whose drafter is made from the target: ``--drafter self:...``, or the measured default.

``load_self_draft_pair`` loads the target once (``utils.models.load_model``) and builds the
drafter from it (``selfdraft.build``). With neither a target nor a drafter it loads the offline
default and the self-drafter this machine runs fastest, measured once and kept
(``model_drafters.selfdraft.default``). Like ``utils.models.load_pair`` it probes both models' cached forwards
(``kvcache.probe.probe_pair``) and attaches the result to the pair.
"""

from __future__ import annotations

from model_drafters.selfdraft import (
    SelfDraftSpec, SelfDraftSpecError, SkipRefused, build_self_drafter, lean_of, num_layers, parse_self_draft,
)
from model_drafters.selfdraft.calibrate import Decode, calibration_ids, greedy_continuation
from generation.timing import time_target
from model_drafters.selfdraft.default import default_drafter
from model_drafters.selfdraft.search import search_skip
from utils.default_model import DEFAULT_LABEL, cache_root
from utils.devices import dtype_name, model_device
from utils.hf_load import is_encoder_decoder
from utils.models import LoadOptions, ModelLoadError, ModelPair, load_target
from kvcache.probe import probe_pair
from utils.progress import no_progress
from utils.vocab import check_compatible, context_length, end_token_ids


def _float_dtype(model):
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), None)


def _drafter_name(target: str | None, spec: SelfDraftSpec, draft) -> str:
    """``SmolLM2-135M-Instruct self:int8 (float32, torch int8)``."""
    int8 = f", {draft.int8_method} int8" if spec.kind == "int8" else ""
    lean = ", lean step" if lean_of(draft)[0] is not None else ""
    return f"{DEFAULT_LABEL if target is None else target} {spec.label} ({dtype_name(_float_dtype(draft))}{int8}{lean})"


def lean_note(spec: SelfDraftSpec, draft) -> list[str]:
    """A banner line where a copy drafts through its own forward, not a lean step, and why."""
    step, reason = lean_of(draft)
    if step is not None or not reason:
        return []
    return [f"{spec.label} drafts through the model's own forward, not a lean step: {reason}"]


def resolve_skip(decode: Decode, model, tokenizer, spec: SelfDraftSpec, say=no_progress
                 ) -> tuple[SelfDraftSpec, list[str]]:
    """``spec`` with ``self:skip=auto`` replaced by the layers a search on this machine picks
    (``model_drafters.selfdraft.search``), and the search's one line; any other spec as it is."""
    if not spec.auto:
        return spec, []
    say("Searching the layers to skip (self:skip=auto)")
    ids = calibration_ids(tokenizer)
    found = search_skip(model, greedy_continuation(decode, model, ids), ids.shape[1], time_target(model, ids).verify_s)
    return SelfDraftSpec("skip", found.layers), [found.line(num_layers(model))]


def resolve_variant(pair, text: str, say=no_progress, *, decode: Decode) -> tuple[str | None, list[str]]:
    """The self-drafter ``text`` (a ``self:`` spec) resolved against ``pair``'s target: its label and
    the layer search's lines; None and why where the search keeps every layer (nothing to run).
    ``decode``: the engine's greedy run (``calibrate.Decode``), which the layer search's text comes from."""
    spec, lines = resolve_skip(decode, pair.target, pair.tokenizer, parse_self_draft(text), say)
    if spec.kind == "skip" and not spec.layers:
        return None, ["the layer search found no layer worth skipping on this target; not run"]
    return spec.label, lines


def _build(decode: Decode, model, tokenizer, spec: SelfDraftSpec | None, label: str, cache_dir, say):
    """(drafter model, its resolved spec, banner lines) for ``spec`` (None: the measured default)."""
    if spec is None:
        draft, chosen, notes = default_drafter(decode, model, tokenizer, label, cache_root(cache_dir), say=say)
        return draft, parse_self_draft(chosen), list(notes)
    resolved, notes = resolve_skip(decode, model, tokenizer, spec, say)
    return build_self_drafter(model, resolved), resolved, notes


def load_self_draft_pair(target: str | None, drafter: str | None, options: LoadOptions, *, decode: Decode) -> ModelPair:
    """A pair whose drafter is made from the target (``drafter`` a ``self:`` spec), or, with
    ``drafter=None``, the self-drafter this machine runs fastest (measured once, then read back).

    ``decode``: the engine's greedy run (``calibrate.Decode``), which the measuring decodes with.
    Every failure a user can cause surfaces as ``ModelLoadError`` with one line.
    """
    try:
        spec = parse_self_draft(drafter) if drafter is not None else None
    except SelfDraftSpecError as exc:
        raise ModelLoadError(str(exc)) from exc
    model, tokenizer, label = load_target(target, options)
    say = options.say
    try:
        draft, spec, notes = _build(decode, model, tokenizer, spec, label, options.cache_dir, say)
    except (SkipRefused, ValueError) as exc:  # Int8Refused and an int8 route this device lacks are ValueErrors
        raise ModelLoadError(str(exc)) from exc
    pair = ModelPair(
        target=model, drafter=draft, tokenizer=tokenizer,
        target_name=label,
        drafter_name=_drafter_name(target, spec, draft),
        end_tokens=end_token_ids(tokenizer, model), device=model_device(model),
        vocab_size=check_compatible(tokenizer, tokenizer, model, model),  # the drafter has the target's head
        context_length=context_length(model, tokenizer),
        self_draft_demo=False, is_encoder_decoder=is_encoder_decoder(model.config),
        notes=tuple(notes + lean_note(spec, draft)), drafts_on_target_cache=True,
    )
    say("Probing each model's cached forward against the uncached one")
    pair.probe = probe_pair(pair)
    return pair
