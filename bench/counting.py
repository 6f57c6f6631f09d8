"""Count forward passes of a model with a hook, for decoders that do not report them.

The hook stays on for every run of a benchmark (ours and the peers'), so its
small per-call cost falls on all alike.
"""

from __future__ import annotations


class ForwardCounter:
    """Counts calls of ``module.forward`` while attached."""

    def __init__(self, module):
        self.calls = 0
        self._handle = module.register_forward_hook(self._count)

    def _count(self, module, args, output) -> None:
        self.calls += 1

    def take(self) -> int:
        """The count since the last ``take`` (and start again from zero)."""
        calls, self.calls = self.calls, 0
        return calls

    def detach(self) -> None:
        self._handle.remove()
