"""Lazy package exports (PEP 562): a package names what it exports, and each
name's module is imported on first use, so a light submodule can be read
without the heavy ones beside it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` for ``package``: ``name`` comes from module ``exports[name]``."""

    def __getattr__(name: str):
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module), name)
        setattr(sys.modules[package], name, value)   # later look-ups skip this function
        return value

    return __getattr__
