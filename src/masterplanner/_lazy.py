"""Package attributes imported on first use (PEP 562), so importing a package stays cheap."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import import_module
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(
    package: str, homes: Mapping[str, Sequence[str]], public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`, whose names live in the modules `homes` maps.

    `homes` maps a module (relative to `package`) to the names it holds; a name is imported the
    first time it is asked for, then kept in the package's namespace.
    """
    module_of = {name: module for module, names in homes.items() for name in names}

    def get(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(module, package), name)
        vars(sys.modules[package])[name] = value
        return value

    def listing() -> list[str]:
        return sorted(public)

    return get, listing
