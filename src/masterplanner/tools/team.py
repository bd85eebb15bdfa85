"""The tools step agents use to work together: messages, questions, broadcasts, notes.

They are not in the planner's catalog: every step agent of a run with more than one step gets
them (run option `team_tools`). Like the other
shipped tools each is defined once (`BuiltinTool`): the function's signature is the schema the
agent sees. Each binds its arguments to the run's team (`ToolContext.team`, the engine's
`StepTeam`) through the engine's call path, so every call is checkpointed and recorded.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic_ai import RunContext

from ..errors import ToolError
from .builtin import BuiltinTool
from .context import StepDeps, Team
from .names import TEAM_TOOL_NAMES

__all__ = ["TEAM_TOOLS", "TEAM_TOOL_NAMES", "team_tool"]

Context = RunContext[StepDeps]


def _team(ctx: Context) -> Team:
    team = ctx.deps.context.team
    if team is None:
        raise ToolError("this step works alone: the run has no other steps to message")
    return team


async def send_message(ctx: Context, to: str, content: str) -> str:
    """Send a message to another step of this run (by its step id, or its role when only one step has it).

    A running step sees it at its next turn; one that has not started sees it when it starts.

    Args:
        to: the recipient's step id (or role)
        content: what to tell it
    """
    team = _team(ctx)
    return await ctx.deps.run_tool(
        "send_message", {"to": to, "content": content}, lambda: team.send(to, content)
    )


async def ask_agent(ctx: Context, to: str, question: str) -> str:
    """Ask another step of this run a question and wait for its answer.

    A finished step answers from its output; a running one at its next turn. A step that has
    not started cannot be asked (send it a message instead).

    Args:
        to: the step id (or role) to ask
        question: what you want to know
    """
    team = _team(ctx)
    return await ctx.deps.run_tool(
        "ask_agent", {"to": to, "question": question}, lambda: team.ask(to, question)
    )


async def broadcast(ctx: Context, content: str) -> str:
    """Send one message to every other step of this run that is running or has not started.

    Args:
        content: the update or request for all of them
    """
    team = _team(ctx)
    return await ctx.deps.run_tool("broadcast", {"content": content}, lambda: team.broadcast(content))


async def reply(ctx: Context, question_id: Annotated[int, Field(ge=1)], answer: str) -> str:
    """Answer a question another step asked you.

    Args:
        question_id: the number of the question (question #N)
        answer: your answer
    """
    team = _team(ctx)
    return await ctx.deps.run_tool(
        "reply", {"question_id": question_id, "answer": answer}, lambda: team.reply(question_id, answer)
    )


async def set_note(ctx: Context, key: str, value: str) -> str:
    """Write a note on the run's blackboard, for every step to read (replaces the note's old value).

    Args:
        key: the note's name, e.g. "data-format"
        value: what it says
    """
    team = _team(ctx)
    return await ctx.deps.run_tool(
        "set_note", {"key": key, "value": value}, lambda: team.set_note(key, value)
    )


async def get_note(ctx: Context, key: str) -> str:
    """Read a note from the run's blackboard.

    Args:
        key: the note's name
    """
    team = _team(ctx)
    return await ctx.deps.run_tool("get_note", {"key": key}, lambda: team.get_note(key))


async def list_notes(ctx: Context) -> str:
    """List the notes on the run's blackboard."""
    team = _team(ctx)
    return await ctx.deps.run_tool("list_notes", {}, team.list_notes)


TEAM_TOOLS: tuple[BuiltinTool, ...] = (
    BuiltinTool(send_message, "Send a message to another step of the run.", "read"),
    BuiltinTool(ask_agent, "Ask another step of the run a question and wait for the answer.", "read"),
    BuiltinTool(broadcast, "Send a message to every step of the run still to finish.", "read"),
    BuiltinTool(reply, "Answer a question another step asked.", "read"),
    BuiltinTool(set_note, "Write a note on the run's blackboard.", "read"),
    BuiltinTool(get_note, "Read a note from the run's blackboard.", "read"),
    BuiltinTool(list_notes, "List the run's notes.", "read"),
)
"""The team tools, in the order step agents are given them."""

# TEAM_TOOL_NAMES (imported from `names.py`): see `builtin.py`

_BY_NAME = {tool.name: tool for tool in TEAM_TOOLS}


def team_tool(name: str) -> BuiltinTool | None:
    """The team tool called `name`, if there is one."""
    return _BY_NAME.get(name)
