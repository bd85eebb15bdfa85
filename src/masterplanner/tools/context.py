"""What a step's tool calls work with: the workspace, the run's tool configuration, the engine's call path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .catalog import ToolSpec
from .http import HttpPolicy
from .images import ImageConfig
from .mcp import McpServer
from .web_search import SearchConfig
from .workspace import Workspace

if TYPE_CHECKING:
    from ..registry.memory import MemoryStore

__all__ = ["StepDeps", "ToolContext", "ToolRunner"]


ToolRunner = Callable[[str, dict[str, Any], Callable[[], str | Awaitable[str]]], Awaitable[str]]
"""Runs one tool call (approval policy, checkpoint, events) and returns what the agent sees."""


@dataclass(frozen=True)
class ToolContext:
    """The run's tool configuration, besides the workspace."""

    http: HttpPolicy
    search: SearchConfig
    images: ImageConfig
    ask_person: Callable[[str], Awaitable[str]] | None = None
    """How a step puts a question to the person: the engine opens a stored `ask_user` request
    and waits for any process to answer it (None: no one can be asked)."""
    mcp_servers: Mapping[str, McpServer] = field(default_factory=dict)
    mcp_specs: Mapping[str, ToolSpec] = field(default_factory=dict)
    """The MCP servers' tools by catalog name (discovered for this run)."""
    memory: MemoryStore | None = None
    """Long-term memory for `remember` / `recall` (None: not available in this run)."""
    memory_source: str = ""
    """What a remembered fact is recorded as coming from (the run id)."""


@dataclass(frozen=True)
class StepDeps:
    """A step agent's dependencies: every tool function gets them as `ctx.deps`."""

    workspace: Workspace
    context: ToolContext
    run_tool: ToolRunner
    """The engine's path for every call: the tool functions only bind arguments to it."""
