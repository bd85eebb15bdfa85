"""What a step's tool calls work with: the workspace, the run's tool configuration, the engine's call path."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from .catalog import ToolSpec
from .http import HttpPolicy
from .images import ImageConfig, ImageSpending
from .mcp import McpServer
from .web_search import SearchConfig
from .workspace import Workspace

if TYPE_CHECKING:
    from ..registry.memory import MemoryStore

__all__ = ["StepDeps", "Team", "ToolContext", "ToolRunner"]


class ToolRunner(Protocol):
    """Runs one tool call (approval policy, checkpoint, events) and returns what the agent sees.

    `check`, when given, refuses arguments the call could never accept (it raises `ToolError`)
    before the person is asked to approve the call: nobody is asked about a request to a host the
    allowlist refuses anyway.
    """

    def __call__(
        self,
        name: str,
        arguments: dict[str, Any],
        call: Callable[[], str | Awaitable[str]],
        check: Callable[[], None] | None = None,
    ) -> Awaitable[str]:
        """Run the call `name` with `arguments` (shown and recorded) by calling `call`."""


class Team(Protocol):
    """One step's side of its run's team: what the team tools (`tools/team.py`) call."""

    async def send(self, to: str, content: str) -> str:
        """Send a message to a step; returns what the agent is told."""
        ...

    async def ask(self, to: str, question: str) -> str:
        """Ask a step a question; returns its answer, or why there is none."""
        ...

    async def broadcast(self, content: str) -> str:
        """Send a message to every step still to finish."""
        ...

    async def reply(self, question_id: int, answer: str) -> str:
        """Answer a question asked of this step."""
        ...

    async def set_note(self, key: str, value: str) -> str:
        """Write a note on the run's blackboard."""
        ...

    async def get_note(self, key: str) -> str:
        """Read one note."""
        ...

    async def list_notes(self) -> str:
        """List the notes."""
        ...


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
    team: Team | None = None
    """The step's messages, questions and notes (None: the step works alone)."""
    spending: ImageSpending | None = None
    """How a step's paid tool requests (`generate_image`) are held to the run's budgets and counted
    in its usage (None: they are not)."""


@dataclass(frozen=True)
class StepDeps:
    """A step agent's dependencies: every tool function gets them as `ctx.deps`."""

    workspace: Workspace
    context: ToolContext
    run_tool: ToolRunner
    """The engine's path for every call: the tool functions only bind arguments to it."""
