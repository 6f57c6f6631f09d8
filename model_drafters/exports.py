"""A drafter kind's package exports, imported lazily (``utils.lazy``)."""

from utils.lazy import lazy_exports  # noqa: F401
