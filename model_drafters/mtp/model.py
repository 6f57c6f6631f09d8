"""The target's MTP layers, read from its checkpoint the way transformers reads them.

transformers (from 5.24) builds an ``MtpModel`` from a loaded target, sharing its embeddings, head
and rotary table, and reads the MTP weights from the target's checkpoint (the layers after the main
ones, ``model.layers.61.*`` for DeepSeek-V3). A target without them is refused in one line
(:class:`MtpRefused`).
"""

from __future__ import annotations

import transformers

from kvcache.probe import ProbeResult, remember
from utils.hf_load import text_config

MTP_SPEC = "mtp"
MTP_ATTR = "mtp_of"   # on an MtpModel: the target it drafts for


class MtpRefused(ValueError):
    """The target has no MTP layers this transformers can load; the message says why (one line)."""


def has_mtp_model() -> bool:
    """Whether this transformers has the ``MtpModel`` the drafter is built on and tested with (5.24
    on). 5.17 to 5.19 ship an earlier ``MtpModel`` without ``forward_layer`` (one layer at a time),
    which failed on a GPU machine's 5.17; 5.20 to 5.23 have not been tested, so they are refused too."""
    from kvcache.cache import TRANSFORMERS_RELEASE

    if TRANSFORMERS_RELEASE < (5, 24):
        return False
    try:
        from transformers.modeling_layers import MtpModel
    except ImportError:
        return False
    return hasattr(MtpModel, "forward_layer")


def is_mtp(spec) -> bool:
    """Whether ``--drafter`` names the target's own MTP layers."""
    return spec is not None and str(spec).strip().lower() == MTP_SPEC


def require_mtp_model(subject: str) -> None:
    """:class:`MtpRefused`, its line starting with ``subject``, where :func:`has_mtp_model` is false."""
    if not has_mtp_model():
        raise MtpRefused(f"{subject} transformers >= 5.24 (MtpModel with forward_layer); this is "
                         f"transformers {transformers.__version__}")


def mtp_layers(target) -> int:
    """How many MTP layers ``target``'s config declares; :class:`MtpRefused` when it cannot be drafted with."""
    require_mtp_model("--drafter mtp needs")
    config = text_config(target.config)
    count = getattr(config, "num_mtp_layers", None)
    kind = getattr(config, "model_type", None) or type(target).__name__
    if not count:
        said = "declares no num_mtp_layers" if count is None else "declares num_mtp_layers = 0"
        raise MtpRefused(f"{kind} has no MTP layers to draft with (its config {said})")
    return int(count)


def load_mtp(target):
    """The MTP layers of ``target`` (loaded with ``from_pretrained``), as an ``MtpModel`` in eval mode."""
    count = mtp_layers(target)
    from transformers.modeling_layers import MtpModel

    source = getattr(target.config, "name_or_path", "") or type(target).__name__
    device = next(target.get_decoder().layers[-1].parameters()).device
    try:
        model = MtpModel.from_pretrained(target, device_map={"": device})
    except RuntimeError as exc:   # weights missing from the checkpoint
        raise MtpRefused(f"{source} declares {count} MTP layer(s) but its checkpoint holds no weights for them "
                         f"(transformers looks for keys matching {_patterns(target)})") from exc
    except (ValueError, OSError) as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise MtpRefused(f"the MTP layers of {source} cannot be loaded: {text}") from exc
    return mark_mtp(model.eval(), target)


def _patterns(target) -> str:
    patterns = getattr(target, "_keys_to_ignore_on_load_unexpected", None) or []
    return ", ".join(sorted(str(p) for p in patterns)) or "no pattern"


def mark_mtp(model, target):
    """Record that ``model`` (an ``MtpModel``) drafts for ``target``; returns it.

    The engine then drafts with it through :class:`mtp.MtpDrafter`. Its cache is not a
    model's own (the drafter keeps and rolls back an ``MtpCache`` per draft depth), so the
    cache probe, which runs models alone, records it without running it. :class:`MtpRefused` on a
    transformers whose ``MtpModel`` the drafter does not run (before 5.24).
    """
    require_mtp_model("MTP layers need")
    object.__setattr__(model, MTP_ATTR, target)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    remember(model, ProbeResult(type(model).__name__, dtype, "cached", rollback="crop",
                                reason="MTP layers: one MtpCache per draft depth, cropped by the drafter"))
    return model


def mtp_target(model):
    """The target ``model`` drafts for when it is a marked MtpModel, else None."""
    return getattr(model, MTP_ATTR, None) if model is not None else None
