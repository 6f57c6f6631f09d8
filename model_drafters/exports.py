"""A drafter kind's package exports: its public names, each imported from its module on first use
(so importing the package stays cheap)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` of ``package``: each name of ``exports`` (name -> module) from its module."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(import_module(module), name)

    return __getattr__
