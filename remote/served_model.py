"""What a served target is to the engine: a :class:`kvcache.cache.SessionModel` that also decodes
with the engine's own sampler and counts its requests (``remote.target.ServedTarget`` is the one)."""

from __future__ import annotations

from kvcache.cache import SessionModel


class ServedModel(SessionModel):
    """A target whose cache lives in a serving engine (``remote.target``), not in this process.

    It makes its own session for each generation (:meth:`session`, shaped like
    ``kvcache.cache.CachedModel``) and decodes with the engine's own sampler (:meth:`decode`).
    ``kvcache.probe.cached_model`` hands out the session; nothing is probed.
    """

    def bound(self, processor):
        """This target with a run's sampling settings (they decide what a verify can take as exact)."""
        return self

    def decode(self, prompt: list[int], max_new: int, processor, seed: int):
        """Yield ``(token, seconds)`` as the engine's own sampler makes them."""
        raise NotImplementedError

    def network_mark(self):
        """Where the request counters stand now."""
        raise NotImplementedError

    def network_since(self, mark) -> dict:
        """The requests made since ``mark``: count, seconds on the wire, reported compute, round trip."""
        raise NotImplementedError
