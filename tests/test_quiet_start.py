"""A start prints no Python warning: building each self-drafter, as a default start does, warns nothing.

torch gives some warnings once per process (the deprecation of its quantized tensor types, which
the torch int8 route creates, is one), so a test that ran earlier in this process could have used
the warning up and hidden it. The drafters are therefore built in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Every self-drafter kind; "self:int8" is the CPU's default route (torch's dynamic int8).
LABELS = ("self:int8", "self:int8=weight-only", "self:bf16", "self:fp16", "self:skip=1")

SCRIPT = """
import warnings
# Python's default filters stay first (they hide DeprecationWarning outside __main__, as on a
# start); any warning a start would print reaches the catch-all below and raises.
warnings.filterwarnings("error", append=True)

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from model_drafters.selfdraft.build import build_self_drafter
from model_drafters.selfdraft.spec import parse_self_draft

torch.manual_seed(0)
config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                     tie_word_embeddings=False, bos_token_id=0, eos_token_id=None, pad_token_id=None)
target = LlamaForCausalLM(config).eval()
ids = torch.tensor([[1, 2, 3, 4]])                      # (1, T)
for label in {labels!r}:
    drafter = build_self_drafter(target, parse_self_draft(label))
    with torch.inference_mode():
        drafter(input_ids=ids)                           # one forward: (1, T, V) logits
print("quiet")
"""


def test_building_every_self_drafter_prints_no_warning():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(labels=LABELS)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    last = (done.stderr.strip().splitlines() or [""])[-1]
    assert done.returncode == 0 and done.stdout.strip() == "quiet", last
    assert "Warning" not in done.stderr, done.stderr[-2000:]
