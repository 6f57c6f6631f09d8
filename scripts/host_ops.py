"""Host work a step on the ``graphs`` path: the ops dispatched outside the captured forwards.

On a GPU a captured forward is one launch; everything else a decode step or a speculative round
does (copying its inputs in, rolling the cache back, choosing the token, growing the sequence,
reading it back) is a launch or a sync of its own, each paid on the host's clock. This counts them
on the CPU with a cheap backend (the count does not depend on the machine): views are left out,
and runs of two lengths are differenced so the eager prefill cancels.

    .venv/bin/python scripts/host_ops.py            # target AR a token, speculative γ4 a round, by depth
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kvcache import static  # noqa: E402

PROMPT = list(range(1, 9))          # within the tiny Llama's 64 ids


class HostOps:
    """Counts non-view ops dispatched outside the captured callables while :meth:`counting`. Whether a
    captured callable is running is kept for the process (``inside``): a capture made under one
    counter and replayed under another is still left out."""

    inside = [False]

    def __init__(self):
        self.ops: list[str] = []

    @contextlib.contextmanager
    def installed(self):
        """Wrap every capture made meanwhile so its calls are not counted (``static._compiled``)."""
        compiled = static._compiled
        inside = HostOps.inside

        def wrapped(device):
            fn = compiled(device)

            def call(*args):
                inside[0] = True
                try:
                    return fn(*args)
                finally:
                    inside[0] = False
            return call

        static._compiled = wrapped
        try:
            yield self
        finally:
            static._compiled = compiled

    @contextlib.contextmanager
    def counting(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        counter = self

        class Count(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not HostOps.inside[0] and not func.is_view:
                    counter.ops.append(str(func))
                return func(*args, **(kwargs or {}))

        self.ops = []
        with Count():
            yield self


def per_unit(run, short: int, long: int) -> float:
    """Ops a unit (``run(n)`` returns (result, units)) between runs of ``short`` and ``long`` tokens, after
    one run that captures every width the long run needs; no run may capture (asserted)."""
    counter = HostOps()
    with counter.installed():
        run(long)
        counts = {}
        for n in (short, long):
            with counter.counting():
                result, units = run(n)
            assert result.compile["captures"] == 0, result.compile
            counts[n] = (len(counter.ops), units)
    (a, ua), (b, ub) = counts[short], counts[long]
    return (b - a) / (ub - ua)


def target_ar_per_token(model, processor, *, decisions: bool = True) -> float:
    """Ops a token of target AR on ``graphs``, as the engine runs it (``decisions``: keeping each deciding
    row for the verdicts, the default)."""
    from engine import Strategy, run_strategy
    from engine.pair import pair_of

    pair = pair_of(model)

    def run(n):
        strategy = Strategy("target", processor=processor, max_gen_len=n, compile="graphs", decisions=decisions)
        result = run_strategy(strategy, pair, PROMPT)
        assert len(result.tokens) == n
        return result, n

    return per_unit(run, 4, 12)


def speculative_per_round(target, drafter, gamma: int, *, inspect: bool) -> float:
    """Ops a round of speculative decoding (greedy, a model drafter) on ``graphs``."""
    from engine import Strategy, run_strategy
    from engine.pair import pair_of
    from sampling import GreedyProcessor

    pair = pair_of(target, drafter)

    def run(n):
        strategy = Strategy("s", drafter="model", gamma=gamma, processor=GreedyProcessor(), max_gen_len=n,
                            compile="graphs", inspect=inspect)
        result = run_strategy(strategy, pair, PROMPT)
        return result, result.rounds

    return per_unit(run, 8, 40)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="2,16,28", help="target layers (comma-separated)")
    parser.add_argument("--drafter-layers", type=int, default=1)
    parser.add_argument("--gamma", type=int, default=4)
    args = parser.parse_args(argv)
    import transformers

    from sampling import GreedyProcessor
    from tests.helpers.models import tiny_llama

    static.BACKEND = "eager"
    torch.set_num_threads(1)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}; ops outside the captured "
          f"forwards (views left out), greedy, a drafter of {args.drafter_layers} layer(s)")
    print(f"{'target layers':>13} | target AR a token | same, no decisions kept | speculative γ{args.gamma} a round "
          f"| same, inspected")
    drafter = tiny_llama(4, layers=args.drafter_layers)
    for depth in (int(d) for d in args.depths.split(",")):
        target = tiny_llama(3, layers=depth)
        ar = target_ar_per_token(target, GreedyProcessor())
        bare = target_ar_per_token(target, GreedyProcessor(), decisions=False)
        plain = speculative_per_round(target, drafter, args.gamma, inspect=False)
        inspected = speculative_per_round(target, drafter, args.gamma, inspect=True)
        print(f"{depth:>13} | {ar:>16.1f} | {bare:>23.1f} | {plain:>22.1f} | {inspected:>15.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
