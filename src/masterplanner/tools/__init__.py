"""Tools step agents can use.

The shipped ones (each defined once, in `builtin.py`), MCP servers' tools, the catalog the
planner chooses from, and the workspace and sandbox they work in. Names are imported on first
use: the shipped tools' module imports pydantic-ai, which settings and the catalog do not need.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .builtin import BUILTIN_TOOL_NAMES, BUILTIN_TOOLS, BuiltinTool, builtin_catalog, builtin_tool
    from .catalog import Catalog, SideEffect, ToolSpec

__all__ = [
    "BUILTIN_TOOLS",
    "BUILTIN_TOOL_NAMES",
    "BuiltinTool",
    "Catalog",
    "SideEffect",
    "ToolSpec",
    "builtin_catalog",
    "builtin_tool",
]

_HOMES = {
    ".builtin": ("BUILTIN_TOOLS", "BUILTIN_TOOL_NAMES", "BuiltinTool", "builtin_catalog", "builtin_tool"),
    ".catalog": ("Catalog", "SideEffect", "ToolSpec"),
}
_MODULE_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'masterplanner.tools' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
