"""The names of the shipped tools and the team tools, without their definitions.

Checking a name (a tool policy, an answer to a plan review) needs only these; the definitions
(`builtin.py`, `team.py`) import pydantic-ai. A test keeps both in step with the definitions.
"""

from __future__ import annotations

__all__ = ["BUILTIN_TOOL_NAMES", "TEAM_TOOL_NAMES"]

BUILTIN_TOOL_NAMES = (
    "code_execution",
    "read_file",
    "write_file",
    "list_files",
    "delete_file",
    "http_request",
    "web_search",
    "generate_image",
    "ask_user",
    "remember",
    "recall",
)
"""Every shipped tool's name, in catalog order (`builtin.BUILTIN_TOOLS`)."""

TEAM_TOOL_NAMES = ("send_message", "ask_agent", "broadcast", "reply", "set_note", "get_note", "list_notes")
"""The team tools' names, in the order step agents are given them (`team.TEAM_TOOLS`)."""
