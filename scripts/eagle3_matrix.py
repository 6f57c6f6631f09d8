"""An EAGLE-3 head on every decoder-only family of the architecture matrix: lossless, or refused in one line.

For each family of ``tests/helpers/arch_zoo.py`` (T5 and BART left out: a head drafts for
decoder-only targets) a random head is saved in the published layout and loaded back
(``tests.helpers.eagle3.zoo_head``); greedy speculative decoding with it, chains (γ 3) and
trees of 8 nodes, must give ``generate``'s tokens on the matrix prompts. One line per family.

    python scripts/eagle3_matrix.py [FAMILY ...]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import Strategy, run_strategy  # noqa: E402
from tests.helpers.arch_zoo import (FAMILIES, LENGTH, PROMPTS, FamilyUnavailable, _greedy, _pair,  # noqa: E402
                                    reference)
from tests.helpers.eagle3 import zoo_head  # noqa: E402


def family_line(name: str) -> str:
    begun = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as folder:
            target, head = zoo_head(name, Path(folder) / "head")
    except FamilyUnavailable as exc:
        return f"{name}: unavailable ({exc})"
    except ValueError as exc:
        return f"{name}: refused ({str(exc).splitlines()[0]})"
    cells = []
    for tree in (0, 8):
        strategy = Strategy("speculative", drafter="model", gamma=3, tree=tree, processor=_greedy(),
                            max_gen_len=LENGTH)
        for prompt in PROMPTS[:2]:
            result = run_strategy(strategy, _pair(target, head), list(prompt))
            same = tuple(result.tokens) == reference(name, prompt)
            kind = "chain" if tree == 0 or result.tree_fallback else "tree"
            cells.append(f"{kind} {'identical' if same else 'DIFFERENT'} ({result.accepted}/{result.drafted})")
    return f"{name}: {'; '.join(cells)} [{time.perf_counter() - begun:.1f} s]"


def main(argv: list[str]) -> int:
    names = argv or [n for n in FAMILIES if n not in ("t5", "bart")]
    bad = 0
    for name in names:
        line = family_line(name)
        bad += "DIFFERENT" in line
        print(line, flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
