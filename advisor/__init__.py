"""The advisor: which way of drafting a pair should use on this machine for some prompts, and why.

Under greedy decoding the output does not depend on the drafter, so each drafter's rounds can be
replayed from target AR's output (``advisor.recorded``, ``advisor.teacher``, ``advisor.replay``)
and priced by forward costs measured on the machine. Layer 4: it imports the engine and below,
never ``bench`` or ``repl`` (they import it).
"""

CONFIRM = 2     # the best methods an advice runs for real by default (the pick: the faster measured)
