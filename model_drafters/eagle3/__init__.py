"""Drafting with an EAGLE-3 head (``--drafter eagle3:PATH``; Li et al., NeurIPS 2025).

``eagle3.head`` is the head (one decoder layer over the target's fused low, mid and high
hidden states, its own draft vocabulary mapped to the target's by ``d2t``); ``eagle3.load``
reads one from a directory in the published layout, or says in one line why not;
``eagle3.drafter`` drafts with it from the hidden states of the target's verify passes.
"""

from model_drafters.eagle3.drafter import Eagle3Drafter
from model_drafters.eagle3.head import Eagle3Head
from model_drafters.eagle3.load import (PREFIX as EAGLE3_PREFIX, Eagle3Refused, aux_layers, eagle3_target, is_eagle3,
                         load_eagle3, mark_eagle3)

__all__ = ["EAGLE3_PREFIX", "Eagle3Drafter", "Eagle3Head", "Eagle3Refused", "aux_layers", "eagle3_target",
           "is_eagle3", "load_eagle3", "mark_eagle3"]
