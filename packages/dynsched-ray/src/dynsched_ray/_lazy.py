"""Names a package exports but imports on first access (PEP 562 ``__getattr__``)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` importing ``names[name]`` (a module path) on first access.

    The value is cached in the package's namespace, so the import happens once. Lazy
    exports keep a package import free of torch, vLLM and import cycles between
    sub-packages.
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        vars(importlib.import_module(package))[name] = value
        return value

    return __getattr__
