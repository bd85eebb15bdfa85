"""The tool catalog: what each tool is called, does, takes, and what kind of side effect it has."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["BUILTIN_TOOL_NAMES", "Approval", "Catalog", "SideEffect", "ToolSpec", "builtin_catalog"]

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


def _args(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


_STRING = {"type": "string"}

_BUILTIN = (
    ToolSpec(
        "code_execution",
        "Run Python, bash or JavaScript code in a sandbox; files it writes land in the run's workspace. "
        "Use it to compute, transform data, and make charts.",
        _args(
            {
                "language": {"enum": ["python", "bash", "javascript"]},
                "code": _STRING,
                "stdin": _STRING,
                "timeout_s": {"type": "integer", "minimum": 1, "maximum": 120},
            },
            ["language", "code"],
        ),
        "execute",
        "ask",
    ),
    ToolSpec(
        "read_file", "Read a text file from the run's workspace.", _args({"path": _STRING}, ["path"]), "read"
    ),
    ToolSpec(
        "write_file",
        "Write text to a file in the run's workspace (creates or replaces it).",
        _args({"path": _STRING, "content": _STRING}, ["path", "content"]),
        "write",
    ),
    ToolSpec(
        "list_files",
        "List the files in a folder of the run's workspace.",
        _args({"path": _STRING}, []),
        "read",
    ),
    ToolSpec(
        "delete_file",
        "Delete a file from the run's workspace.",
        _args({"path": _STRING}, ["path"]),
        "write",
        "ask",
    ),
    ToolSpec(
        "http_request",
        "Make an HTTP request to an allowed domain and return the response.",
        _args(
            {
                "method": {"enum": ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]},
                "url": _STRING,
                "headers": {"type": "object", "additionalProperties": _STRING},
                "body": _STRING,
            },
            ["method", "url"],
        ),
        "network",
        "ask",
    ),
    ToolSpec(
        "web_search",
        "Search the web (or a configured local folder) and return the top results.",
        _args({"query": _STRING, "num_results": {"type": "integer", "minimum": 1, "maximum": 20}}, ["query"]),
        "network",
    ),
    ToolSpec(
        "generate_image",
        "Generate an image from a text prompt and save it as a PNG in the workspace.",
        _args({"prompt": _STRING, "path": _STRING, "size": _STRING}, ["prompt", "path"]),
        "network",
        "ask",
    ),
    ToolSpec(
        "ask_user",
        "Ask the person running the plan a question and wait for the answer.",
        _args({"question": _STRING}, ["question"]),
        "read",
    ),
    ToolSpec(
        "remember",
        "Keep a fact in long-term memory for later steps and runs (never a secret).",
        _args({"fact": _STRING}, ["fact"]),
        "write",
    ),
    ToolSpec(
        "recall",
        "Search long-term memory: facts kept earlier and what happened in past runs.",
        _args({"query": _STRING}, ["query"]),
        "read",
    ),
)

BUILTIN_TOOL_NAMES = tuple(tool.name for tool in _BUILTIN)


def builtin_catalog() -> Catalog:
    """The tools masterplanner ships (names are a public contract)."""
    return Catalog(_BUILTIN)
