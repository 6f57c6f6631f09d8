"""The replay machinery for the benchmark and its scripts; it lives in ``advisor.recorded``."""

from advisor.recorded import (  # noqa: F401  (re-exported)
    FILL, TOP_K, PromptLookup, Recorded, Replayed, _accepted, _book, copy_ceiling, drafter_factory, oracle,
    record, replay, storage_options,
)
