"""Tools step agents can use.

This version has the catalog the planner chooses from (names, descriptions, argument schemas,
side-effect classes); the tools themselves come with the tools issue.
"""

from .catalog import BUILTIN_TOOL_NAMES, Catalog, SideEffect, ToolSpec, builtin_catalog

__all__ = ["BUILTIN_TOOL_NAMES", "Catalog", "SideEffect", "ToolSpec", "builtin_catalog"]
