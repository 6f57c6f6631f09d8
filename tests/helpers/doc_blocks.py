"""The Python blocks of a page under docs/, for tests that run an example as it is written."""

from __future__ import annotations

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parent.parent.parent / "docs"


def python_block(page: str, marker: str) -> str:
    """The one ```python block of ``docs/<page>`` that holds ``marker`` (AssertionError unless exactly one)."""
    text = (DOCS / page).read_text(encoding="utf-8")
    found = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if marker in b]
    assert len(found) == 1, f"docs/{page} must hold one example with {marker!r}, found {len(found)}"
    return found[0]


def run_example(page: str, marker: str, source: str | None = None, **names) -> dict:
    """Run the block of :func:`python_block` (or ``source``, an edited copy of it) with ``names`` defined;
    returns the names it leaves."""
    scope = dict(names)
    exec(compile(source if source is not None else python_block(page, marker), f"docs/{page}", "exec"), scope)
    return scope
