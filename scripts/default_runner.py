"""The measurement scripts' common start: the default pair, loaded and warmed up, on N torch threads."""

from __future__ import annotations

import torch

from engine import load_pair
from repl.runner import Runner


def default_runner(threads: int | None) -> Runner:
    """A REPL runner on the default pair after its warm-up; ``threads`` (None: torch's choice)."""
    if threads:
        torch.set_num_threads(threads)
    runner = Runner(load_pair())
    runner.warm_up()
    return runner
