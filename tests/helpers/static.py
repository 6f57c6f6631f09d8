"""The static path's process-wide state, as the tests reset it (``kvcache.static.kept``)."""

from __future__ import annotations

import weakref
from dataclasses import replace

from kvcache import static


def fresh_captures(monkeypatch) -> None:
    """No capture kept from an earlier test: the zoo's models are shared between files, and a test
    counts its captures from none. Each model's refusal and caches stay; after the test the
    registry is put back as it was (what the test captured, or tried on a new model, is dropped)."""
    fresh = weakref.WeakKeyDictionary({model: replace(entry, captures={}) for model, entry in static._KEPT.items()})
    monkeypatch.setattr(static, "_KEPT", fresh)
