"""Drafting with the target's own multi-token-prediction (MTP) layers (``--drafter mtp``).

``mtp.model`` finds and loads the MTP layers a checkpoint ships (DeepSeek-V3, GLM-4.5 and
others) the way transformers does (``MtpModel.from_pretrained``), or says in one line why
not; ``mtp.drafter`` drafts with them from the target's hidden states.
"""

from model_drafters.mtp.drafter import MtpDrafter
from model_drafters.mtp.model import MTP_SPEC, MtpRefused, is_mtp, load_mtp, mtp_target, mark_mtp

__all__ = ["MTP_SPEC", "MtpDrafter", "MtpRefused", "is_mtp", "load_mtp", "mark_mtp", "mtp_target"]
