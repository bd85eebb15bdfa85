"""The tools a step agent calls: thin async wrappers that route every call through `run_tool`.

`run_tool` (the engine's) applies the approval policy, checkpoints the call as a DBOS step and
writes its `tool_called` / `tool_result` events; these wrappers only bind arguments to the tool
implementations in `masterplanner.tools`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import ToolError
from ..tools.catalog import ToolSpec
from ..tools.code_execution import execute_code, format_result
from ..tools.http import HttpPolicy
from ..tools.http import http_request as fetch
from ..tools.images import ImageConfig
from ..tools.images import generate_image as make_image
from ..tools.mcp import McpServer, call_mcp_tool, split_tool_name
from ..tools.web_search import SearchConfig
from ..tools.web_search import web_search as search_web
from ..tools.workspace import Workspace

if TYPE_CHECKING:
    from ..registry.memory import MemoryStore

__all__ = ["ToolContext", "ToolRunner", "step_tools"]


ToolRunner = Callable[[str, dict[str, Any], Callable[[], str | Awaitable[str]]], Awaitable[str]]
"""Runs one tool call (checkpointed, logged) and returns its result text."""


@dataclass(frozen=True)
class ToolContext:
    """What the step tools work with besides the workspace: configurations and the front end."""

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


def step_tools(
    workspace: Workspace, context: ToolContext, names: list[str], run_tool: ToolRunner
) -> list[Any]:
    """The step's tools (those of `names` this version can run), each call going through `run_tool`."""
    available: dict[str, Any] = {
        **_file_tools(workspace, run_tool),
        **_code_tools(workspace, run_tool),
        **_network_tools(context, run_tool),
        **_other_tools(workspace, context, run_tool),
        **_memory_tools(context, run_tool),
        **_mcp_tools(context, names, run_tool),
    }
    return [available[name] for name in names if name in available]


def _mcp_tools(context: ToolContext, names: list[str], run_tool: ToolRunner) -> dict[str, Any]:
    """Tools of MCP servers, with the schema the server declared."""
    from pydantic_ai import Tool

    tools: dict[str, Any] = {}
    for name in names:
        found = split_tool_name(name, context.mcp_servers)
        spec = context.mcp_specs.get(name)
        if found is None or spec is None:
            continue
        server, tool = found

        def bind(name: str = name, server: str = server, tool: str = tool) -> Callable[..., Awaitable[str]]:
            async def call(**arguments: Any) -> str:
                return await run_tool(
                    name, arguments, lambda: call_mcp_tool(context.mcp_servers[server], tool, arguments)
                )

            return call

        tools[name] = Tool.from_schema(bind(), name, spec.description, spec.args_schema)
    return tools


def _file_tools(workspace: Workspace, run_tool: ToolRunner) -> dict[str, Callable[..., Any]]:
    async def read_file(path: str) -> str:
        """Read a text file from the workspace.

        Args:
            path: the file's path relative to the workspace, e.g. data/sales.csv
        """
        return await run_tool("read_file", {"path": path}, lambda: workspace.read_file(path))

    async def write_file(path: str, content: str) -> str:
        """Create or replace a text file in the workspace.

        Args:
            path: the file's path relative to the workspace, e.g. report.md
            content: what the file will contain
        """
        return await run_tool(
            "write_file", {"path": path, "content": content}, lambda: workspace.write_file(path, content)
        )

    async def delete_file(path: str) -> str:
        """Delete a file from the workspace (folders are not deleted).

        Args:
            path: the file's path relative to the workspace
        """
        return await run_tool("delete_file", {"path": path}, lambda: workspace.delete_file(path))

    async def list_files(path: str = ".") -> str:
        """List the files and directories of a workspace directory.

        Args:
            path: the directory relative to the workspace; "." is the workspace itself
        """

        def listing() -> str:
            entries = workspace.list_files(path)
            if not entries:
                return "(empty)"
            return "\n".join(f"{entry.name}\t{entry.kind}\t{entry.size}" for entry in entries)

        return await run_tool("list_files", {"path": path}, listing)

    return {
        "read_file": read_file,
        "write_file": write_file,
        "delete_file": delete_file,
        "list_files": list_files,
    }


def _code_tools(workspace: Workspace, run_tool: ToolRunner) -> dict[str, Callable[..., Any]]:
    async def code_execution(
        code: str, language: str = "python", stdin: str = "", timeout_s: float = 30
    ) -> str:
        """Run a program in an isolated sandbox whose working directory is the workspace.

        Files the program writes land in the workspace. No network. Returns the exit code,
        stdout and stderr.

        Args:
            code: the program's source
            language: python, bash or javascript
            stdin: text given to the program on standard input
            timeout_s: seconds before the program is killed (at most 120)
        """

        async def run() -> str:
            room = await asyncio.to_thread(workspace.room)
            result = await execute_code(
                workspace, language, code, stdin=stdin, timeout_s=timeout_s, max_growth_bytes=room
            )
            return format_result(result)

        return await run_tool(
            "code_execution",
            {"language": language, "code": code, "stdin": stdin, "timeout_s": timeout_s},
            run,
        )

    return {"code_execution": code_execution}


def _network_tools(context: ToolContext, run_tool: ToolRunner) -> dict[str, Callable[..., Any]]:
    http, search = context.http, context.search

    async def http_request(
        url: str, method: str = "GET", headers: dict[str, str] | None = None, body: str | None = None
    ) -> str:
        """Make an HTTP(S) request to an allowed domain and return the status, headers and body.

        Args:
            url: the full URL, e.g. https://example.com/data.json
            method: GET, POST, PUT, PATCH, DELETE, HEAD or OPTIONS
            headers: request headers
            body: request body text
        """

        async def call() -> str:
            return (await fetch(http, method, url, headers, body)).describe()

        return await run_tool("http_request", {"method": method, "url": url, "headers": headers or {}}, call)

    async def web_search(query: str, num_results: int = 5) -> str:
        """Search the web (or the configured folder) and return titles, URLs and snippets.

        Args:
            query: what to search for
            num_results: how many results (1 to 20)
        """

        async def call() -> str:
            hits = await search_web(search, query, num_results)
            if not hits:
                return "no results"
            return "\n\n".join(f"{n}. {hit.title}\n{hit.url}\n{hit.snippet}" for n, hit in enumerate(hits, 1))

        return await run_tool("web_search", {"query": query, "num_results": num_results}, call)

    return {"http_request": http_request, "web_search": web_search}


def _other_tools(
    workspace: Workspace, context: ToolContext, run_tool: ToolRunner
) -> dict[str, Callable[..., Any]]:
    async def generate_image(prompt: str, path: str, size: str = "1024x1024") -> str:
        """Generate an image from a text description and save it as a PNG in the workspace.

        Args:
            prompt: what the image shows
            path: where to save it in the workspace, ending in .png
            size: 1024x1024, 1024x1536, 1536x1024, 512x512 or 256x256
        """
        return await run_tool(
            "generate_image",
            {"prompt": prompt, "path": path, "size": size},
            lambda: make_image(context.images, workspace, prompt, path, size),
        )

    async def ask_user(question: str) -> str:
        """Ask the person running the plan a question and wait for the answer.

        Args:
            question: the question, complete and self-contained
        """

        async def call() -> str:
            if context.ask_person is None:
                raise ToolError("no one can be asked in this run")
            if not question.strip():
                raise ToolError("the question is empty")
            answer = await context.ask_person(question)
            return answer if answer.strip() else "(the person gave no answer)"

        return await run_tool("ask_user", {"question": question}, call)

    return {"generate_image": generate_image, "ask_user": ask_user}


def _memory_tools(context: ToolContext, run_tool: ToolRunner) -> dict[str, Callable[..., Any]]:
    import asyncio

    def store() -> MemoryStore:
        if context.memory is None:
            raise ToolError("long-term memory is not available in this run")
        return context.memory

    async def remember(fact: str) -> str:
        """Keep a fact in long-term memory, for later steps and runs. Never store secrets.

        Args:
            fact: one self-contained fact, e.g. "The sales data in sales.csv is in euros."
        """

        async def call() -> str:
            item = await asyncio.to_thread(store().remember, fact, source=context.memory_source)
            return f"remembered as {item.id}"

        return await run_tool("remember", {"fact": fact}, call)

    async def recall(query: str) -> str:
        """Search long-term memory: facts kept earlier and what happened in past runs.

        Args:
            query: what to look for
        """

        async def call() -> str:
            found = await asyncio.to_thread(store().recall, query, 5)
            if not found:
                return "nothing remembered about that"
            return "\n".join(
                f"{n}. [{item.kind}, {item.created_at[:10]}] {item.text}" for n, item in enumerate(found, 1)
            )

        return await run_tool("recall", {"query": query}, call)

    return {"remember": remember, "recall": recall}
