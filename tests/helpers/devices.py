"""Where the tests run: the CPU, or the device ``SPECDEC_TEST_DEVICE`` names (``cuda``), which
tests/conftest.py makes torch's default (docs/results.md, "On a GPU")."""

import os

import torch

TEST_DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
ON_CPU = torch.device(TEST_DEVICE).type == "cpu"
