"""A step agent's tools: the shipped ones from their definitions, MCP servers' from what they declare.

Every call goes through the engine's `run_tool` (`StepDeps.run_tool`), which applies the
approval policy, checkpoints the call as a DBOS step and writes its events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic_ai import ModelRetry, RunContext, Tool

from ..tools import BUILTIN_TOOL_NAMES, builtin_tool
from ..tools.context import StepDeps, ToolContext
from ..tools.mcp import argument_problems, call_mcp_tool
from ..tools.team import TEAM_TOOLS

__all__ = ["runnable_tools", "step_tools", "team_tools"]


def runnable_tools(names: Sequence[str], context: ToolContext) -> list[str]:
    """The names among `names` a step can run here: shipped tools and the run's MCP servers' tools."""
    return [name for name in names if name in BUILTIN_TOOL_NAMES or name in context.mcp_specs]


def step_tools(names: Sequence[str], context: ToolContext) -> list[Tool[StepDeps]]:
    """The pydantic-ai tools for `names` (those `runnable_tools` keeps), in that order."""
    tools: list[Tool[StepDeps]] = []
    for name in names:
        shipped = builtin_tool(name)
        if shipped is not None:
            tools.append(shipped.tool)
        elif (served := _mcp_tool(name, context)) is not None:
            tools.append(served)
    return tools


def _mcp_tool(name: str, context: ToolContext) -> Tool[StepDeps] | None:
    """An MCP server's tool, with the schema the server declared, called where discovery found it."""
    spec = context.mcp_specs.get(name)
    if spec is None or spec.mcp_server is None or spec.mcp_tool is None:
        return None
    server, tool = spec.mcp_server, spec.mcp_tool

    async def call(ctx: RunContext[StepDeps], **arguments: Any) -> str:
        # pydantic-ai passes a schema-given tool's arguments unchecked: checked here as a shipped
        # tool's are, so a call that does not fit is the model's to fix, before anyone is asked
        problems = argument_problems(spec.args_schema, arguments)
        if problems:
            raise ModelRetry(f"the arguments do not fit {name}: {'; '.join(problems)}")
        config = ctx.deps.context.mcp_servers[server]
        return await ctx.deps.run_tool(
            name, arguments, lambda: call_mcp_tool(server, config, tool, arguments)
        )

    return Tool.from_schema(call, name, spec.description, spec.args_schema, takes_ctx=True)


def team_tools() -> list[Tool[StepDeps]]:
    """The team tools of a step that works with others."""
    return [shipped.tool for shipped in TEAM_TOOLS]
