"""The tool catalog: what each tool is called, does, takes, and what kind of side effect it has.

The shipped tools' entries are derived from their definitions (`builtin.py`); an MCP server's
from what the server declares.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Approval", "Catalog", "SideEffect", "ToolSpec"]

SideEffect = Literal["read", "write", "network", "execute"]
Approval = Literal["auto", "ask", "deny"]
"""A tool call's approval policy: run it, ask the person first, or refuse it."""


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the planner and the review screen see it."""

    name: str
    description: str
    args_schema: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    side_effect: SideEffect = "read"
    approval: Approval = "auto"
    repeatable: bool = False
    """Whether a call cut off by a stop (the process died mid-call) is made again on resume: it
    only reads, or making it twice has the effect of making it once. Otherwise it is not made
    again, and the agent is told that whether it took effect is unknown."""
    mcp_server: str | None = None
    """The MCP server that offers the tool (None: a shipped tool)."""
    mcp_tool: str | None = None
    """The tool's own name on that server: calls go there by these two, not by the catalog name
    (`<server>_<tool>` does not say where the server's name ends: servers `a` and `a_b`)."""


class Catalog:
    """An ordered set of tools, looked up by name."""

    def __init__(self, tools: Iterable[ToolSpec]) -> None:
        self._tools: dict[str, ToolSpec] = {}
        for tool in tools:
            if tool.name in self._tools:
                raise ValueError(f"tool {tool.name!r} is listed twice")
            self._tools[tool.name] = tool

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[ToolSpec]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __getitem__(self, name: str) -> ToolSpec:
        return self._tools[name]

    @property
    def names(self) -> list[str]:
        """Tool names in catalog order."""
        return list(self._tools)

    def subset(self, names: Iterable[str]) -> Catalog:
        """The catalog restricted to `names` (unknown names raise `KeyError`), in catalog order."""
        wanted = set(names)
        unknown = wanted - set(self._tools)
        if unknown:
            raise KeyError(f"unknown tools: {', '.join(sorted(unknown))}")
        return Catalog(tool for tool in self if tool.name in wanted)
