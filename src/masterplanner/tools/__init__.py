"""Tools step agents can use.

The shipped ones (each defined once, in `builtin.py`), MCP servers' tools, the catalog the
planner chooses from, and the workspace and sandbox they work in. Names are imported on first
use: the shipped tools' module imports pydantic-ai, which settings and the catalog do not need.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

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


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
