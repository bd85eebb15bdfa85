"""What a step agent is given: its prompt, a brief with its dependencies' outputs, its tools, its model."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from ..models.local import ToolAids
from ..plan import Plan, Step, sinks
from ..tools.code_execution import execute_code, format_result
from ..tools.http import HttpPolicy
from ..tools.http import http_request as fetch
from ..tools.web_search import SearchConfig
from ..tools.web_search import web_search as search_web
from ..tools.workspace import Workspace

__all__ = [
    "RUNNABLE_TOOLS",
    "BudgetedModel",
    "dependency_context",
    "mentioned_file_names",
    "step_brief",
    "step_instructions",
    "step_tools",
    "tool_aids",
]

RUNNABLE_TOOLS = (
    "code_execution",
    "read_file",
    "write_file",
    "list_files",
    "delete_file",
    "http_request",
    "web_search",
)
"""The catalog tools step agents can run in this version (the tools issue adds the rest)."""

_FILE_NAME = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.[A-Za-z][A-Za-z0-9]{0,7})(?![\w/-])")
_TRUNCATED = "\n[… truncated: {cut:,} more characters not shown]"


def mentioned_file_names(*texts: str) -> tuple[str, ...]:
    """File names like `haiku.txt` or `out/report.md` that the texts mention, in order, without repeats."""
    names: dict[str, None] = {}
    for text in texts:
        for match in _FILE_NAME.finditer(text):
            name = match.group(1)
            if not re.fullmatch(r"\d+\.\d+", name):
                names.setdefault(name, None)
    return tuple(names)


def tool_aids(plan: Plan, step: Step, tools: list[str], workspace: Workspace) -> ToolAids | None:
    """Tool-use aids for a small local model, grounded in the step's text and the workspace's files.

    The file names the step mentions (and, for a step nothing depends on, the task) split in two:
    those that exist may be read, those that do not may be written. The first call must be one
    of those reads or writes; with nothing grounded there is no aid.
    """
    texts = [step.title, step.instruction, step.expected_output]
    if step.id in sinks(plan.steps):
        texts.append(plan.task)
    names = mentioned_file_names(*texts)
    existing = tuple(name for name in names if workspace.is_file(name))
    fresh = tuple(name for name in names if name not in existing)
    values: dict[str, dict[str, tuple[str, ...]]] = {}
    if existing and "read_file" in tools:
        values["read_file"] = {"path": existing}
    if fresh and "write_file" in tools:
        values["write_file"] = {"path": fresh}
    if not values:
        return None
    return ToolAids(first_call_tools=tuple(values), argument_values=values, max_tool_calls=len(values))


def dependency_context(step: Step, outputs: Mapping[str, str], limit: int) -> str:
    """The outputs of `step`'s dependencies, each cut to `limit` characters with the cut marked."""
    sections = []
    for dependency in step.depends_on:
        text = outputs.get(dependency, "")
        if len(text) > limit:
            text = text[:limit] + _TRUNCATED.format(cut=len(text) - limit)
        sections.append(f"### Output of step {dependency}\n{text}")
    return "\n\n".join(sections)


def step_instructions(step: Step, prompt: str | None) -> str:
    """The agent's system prompt: the reviewed prompt, or one built from the step when there is none."""
    if prompt:
        return prompt
    return f"You are a {step.agent_role}. Do exactly the step you are given and report its result."


def step_brief(
    plan: Plan, step: Step, outputs: Mapping[str, str], *, tools: list[str], context_chars: int
) -> str:
    """The user message of a step agent: the task, its step, what it must produce, and its inputs."""
    lines = [
        f"Overall task: {plan.task}",
        f"Your step ({step.id}): {step.title}",
        f"Instruction: {step.instruction}",
    ]
    if step.expected_output:
        lines.append(f"Expected output: {step.expected_output}")
    if tools:
        lines.append(f"Tools you can use: {', '.join(tools)}. Files live in the run's workspace.")
    context = dependency_context(step, outputs, context_chars)
    if context:
        lines.append("Inputs from the steps before yours:\n\n" + context)
    lines.append("When you are done, reply with your step's result.")
    return "\n".join(lines)


ToolRunner = Callable[[str, dict[str, Any], Callable[[], str | Awaitable[str]]], Awaitable[str]]
"""Runs one tool call (checkpointed, logged) and returns its result text."""


def step_tools(
    workspace: Workspace, http: HttpPolicy, search: SearchConfig, names: list[str], run_tool: ToolRunner
) -> list[Callable[..., Any]]:
    """The step's tools, each call going through `run_tool`."""

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
            result = await execute_code(workspace, language, code, stdin=stdin, timeout_s=timeout_s)
            return format_result(result)

        return await run_tool(
            "code_execution",
            {"language": language, "code": code, "stdin": stdin, "timeout_s": timeout_s},
            run,
        )

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

    available: dict[str, Callable[..., Any]] = {
        "web_search": web_search,
        "http_request": http_request,
        "code_execution": code_execution,
        "read_file": read_file,
        "delete_file": delete_file,
        "write_file": write_file,
        "list_files": list_files,
    }
    return [available[name] for name in names if name in available]


class BudgetedModel(WrapperModel):
    """Checks the run's budget before every request (`check` raises when it is used up)."""

    def __init__(self, wrapped: Model, check: Callable[[], None]) -> None:
        super().__init__(wrapped)
        self._check = check

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Refuse the request if the budget is spent, else make it."""
        self._check()
        return await self.wrapped.request(messages, model_settings, model_request_parameters)
