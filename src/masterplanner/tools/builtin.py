"""The tools masterplanner ships, each defined once.

A `BuiltinTool` is one function and what hangs off it: the function's signature and docstring
are the schema and description a step agent sees (pydantic-ai builds them), and beside it stand
what the planner and the review screen read (`description`), its side-effect class, its default
approval policy, and what it needs to work in a configuration (`unavailable`). The catalog
(`builtin_catalog`), a step's tools (`engine/step_tools.py`) and a run's available tools
(`engine/catalogs.run_catalog`) all derive from `BUILTIN_TOOLS`.

Each function only binds its arguments to the engine's call path (`ctx.deps.run_tool`), which
applies the approval policy, checkpoints the call and writes its events.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import Field
from pydantic_ai import RunContext, Tool

from ..errors import ToolError
from .catalog import Approval, Catalog, SideEffect, ToolSpec
from .code_execution import Language
from .context import StepDeps
from .images import ImageConfig
from .names import BUILTIN_TOOL_NAMES
from .results import FILE_CUT
from .workspace import MAX_READ_BYTES

if TYPE_CHECKING:
    from ..settings import Settings

__all__ = [
    "BUILTIN_TOOLS",
    "BUILTIN_TOOL_NAMES",
    "BuiltinTool",
    "builtin_catalog",
    "builtin_tool",
    "search_setup_problem",
]

_WEB_SEARCH_HOW_TO = (
    "set web_search_backend to local (with web_search_folder), searxng (with searxng_url), "
    "brave (with BRAVE_API_KEY) or tavily (with TAVILY_API_KEY), "
    "e.g. MASTERPLANNER_WEB_SEARCH_BACKEND=local MASTERPLANNER_WEB_SEARCH_FOLDER=/path/to/notes"
)
_HTTP_HOW_TO = """set http_allowed_domains (e.g. MASTERPLANNER_HTTP_ALLOWED_DOMAINS='["example.com"]')"""

Context = RunContext[StepDeps]


@dataclass(frozen=True)
class BuiltinTool:
    """One shipped tool: its function, and what the planner, the policies and the settings need of it."""

    function: Callable[..., Awaitable[str]]
    """`(ctx, **arguments) -> result text`; its signature is the tool's argument schema."""
    description: str
    """What the planner and the review screen read (the agent reads the function's docstring)."""
    side_effect: SideEffect
    approval: Approval = "auto"
    """The default approval policy (settings, the review and the agent may override it)."""
    unavailable: Callable[[Settings], str | None] | None = None
    """What would make the tool work in this configuration, or None when it works."""
    repeatable: bool = False
    """A call cut off by a stop is made again on resume (`ToolSpec.repeatable`)."""

    @property
    def name(self) -> str:
        """The tool's name: its function's (a public contract)."""
        return self.function.__name__

    @cached_property
    def tool(self) -> Tool[StepDeps]:
        """The pydantic-ai tool a step agent is given."""
        return Tool(self.function, takes_ctx=True, docstring_format="google")

    @cached_property
    def spec(self) -> ToolSpec:
        """The catalog entry: name, description, argument schema, side effect, approval."""
        return ToolSpec(
            self.name,
            self.description,
            self.tool.tool_def.parameters_json_schema,
            self.side_effect,
            self.approval,
            self.repeatable,
        )


# ---- workspace files


async def read_file(ctx: Context, path: str) -> str:
    """Read a text file from the workspace.

    Args:
        path: the file's path relative to the workspace, e.g. data/sales.csv
    """
    workspace = ctx.deps.workspace

    def read() -> str:  # a file over the cap: its start, said so (before, the call failed)
        text, size = workspace.read_start(path)
        if size <= MAX_READ_BYTES:
            return text
        return f"{FILE_CUT}only its first {MAX_READ_BYTES:,} of {size:,} bytes were read]\n{text}"

    return await ctx.deps.run_tool("read_file", {"path": path}, read)


async def write_file(ctx: Context, path: str, content: str) -> str:
    """Create or replace a text file in the workspace.

    Args:
        path: the file's path relative to the workspace, e.g. report.md
        content: what the file will contain
    """
    workspace = ctx.deps.workspace

    def check() -> None:  # under `ask`, nobody is asked about a path refused anyway
        workspace.check_write_path(path)

    return await ctx.deps.run_tool(
        "write_file",
        {"path": path, "content": content},
        lambda: workspace.write_file(path, content),
        check=check,
    )


async def list_files(ctx: Context, path: str = ".") -> str:
    """List the files and directories of a workspace directory.

    Args:
        path: the directory relative to the workspace; "." is the workspace itself
    """
    workspace = ctx.deps.workspace

    def listing() -> str:
        listed = workspace.list_files(path)
        if not listed:
            return "(empty)"
        rows = [f"{entry.name}\t{entry.kind}\t{entry.size}" for entry in listed]
        if listed.total > len(listed):  # said, as a cut file or response is
            rows.append(f"[listing cut: the first {len(rows):,} of {listed.total:,} entries, sorted by name]")
        return "\n".join(rows)

    return await ctx.deps.run_tool("list_files", {"path": path}, listing)


async def delete_file(ctx: Context, path: str) -> str:
    """Delete a file from the workspace (folders are not deleted).

    Args:
        path: the file's path relative to the workspace
    """
    workspace = ctx.deps.workspace
    return await ctx.deps.run_tool(
        "delete_file",
        {"path": path},
        lambda: workspace.delete_file(path),
        check=lambda: workspace.check_delete_path(path),  # nobody is asked about a path refused anyway
    )


# ---- code


async def code_execution(
    ctx: Context,
    code: str,
    language: Language = "python",
    stdin: str = "",
    timeout_s: Annotated[int, Field(ge=1, le=120)] = 30,
) -> str:
    """Run a program in an isolated sandbox whose working directory is the workspace.

    Files the program writes land in the workspace. No network. Returns the exit code,
    stdout and stderr.

    Args:
        code: the program's source (for sql, one SQLite query)
        language: python, bash, javascript, or sql: a query over the workspace's CSV files, each
            a table named after its file (expenses.csv is expenses), its first row the column
            names; the result's rows come back as CSV
        stdin: text given to the program on standard input
        timeout_s: seconds before the program is killed (at most 120)
    """
    from .code_execution import execute_code, format_result

    workspace = ctx.deps.workspace

    async def run() -> str:
        room = await asyncio.to_thread(workspace.room)
        result = await execute_code(
            workspace, language, code, stdin=stdin, timeout_s=timeout_s, max_growth_bytes=room
        )
        return format_result(result)

    arguments = {"language": language, "code": code, "stdin": stdin, "timeout_s": timeout_s}
    return await ctx.deps.run_tool("code_execution", arguments, run)


def _sandbox_missing(_settings: Settings) -> str | None:
    from ..sandbox import sandbox_problems

    problems = sandbox_problems()
    if not problems:
        return None
    return f"the sandbox cannot start here: {'; '.join(problems)} (masterplanner doctor checks it)"


# ---- network


async def http_request(
    ctx: Context,
    url: str,
    method: Literal["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"] = "GET",
    headers: dict[str, str] | None = None,
    body: str | None = None,
) -> str:
    """Make an HTTP(S) request to an allowed domain and return the status, headers and body.

    Args:
        url: the full URL, e.g. https://example.com/data.json
        method: GET, HEAD, POST, PUT, PATCH, DELETE or OPTIONS
        headers: request headers
        body: request body text
    """
    from .http import check_request
    from .http import http_request as fetch

    policy = ctx.deps.context.http

    async def call() -> str:
        return (await fetch(policy, method, url, headers, body)).describe()

    # the body too: the person approves every character of what is sent
    arguments: dict[str, Any] = {"method": method, "url": url, "headers": headers or {}}
    if body is not None:
        arguments["body"] = body
    return await ctx.deps.run_tool(
        "http_request",
        arguments,
        call,
        lambda: check_request(policy, method, url, headers, body),
    )


def _http_missing(settings: Settings) -> str | None:
    return None if settings.http_allowed_domains else _HTTP_HOW_TO


async def web_search(ctx: Context, query: str, num_results: Annotated[int, Field(ge=1, le=20)] = 5) -> str:
    """Search the web (or the configured folder) and return titles, URLs and snippets.

    Args:
        query: what to search for
        num_results: how many results (1 to 20)
    """
    from .web_search import web_search as search_web

    config = ctx.deps.context.search

    async def call() -> str:
        hits = await search_web(config, query, num_results)
        if not hits:
            return "no results"
        return "\n\n".join(f"{n}. {hit.title}\n{hit.url}\n{hit.snippet}" for n, hit in enumerate(hits, 1))

    return await ctx.deps.run_tool("web_search", {"query": query, "num_results": num_results}, call)


def search_setup_problem(settings: Settings) -> str | None:
    """What the chosen web search backend lacks, or None when it has all it needs or none is chosen.

    With a backend chosen and not usable, `web_search` is left out of every run (`doctor` says so).
    """
    if settings.web_search_backend == "none":
        return None
    return _search_missing(settings)


def _search_missing(settings: Settings) -> str | None:
    """What the configured search backend still lacks, if anything.

    A half-set backend passed planning, and every search then failed while the run "succeeded".
    """
    backend = settings.web_search_backend
    if backend == "none":
        return _WEB_SEARCH_HOW_TO
    if backend == "local":
        folder = settings.web_search_folder
        if folder is None:
            return "web_search_backend is local: set web_search_folder (MASTERPLANNER_WEB_SEARCH_FOLDER)"
        if not folder.expanduser().is_dir():
            return f"web_search_backend is local: web_search_folder {folder} is not a folder"
    if backend == "searxng" and not settings.searxng_url:
        return "web_search_backend is searxng: set searxng_url (MASTERPLANNER_SEARXNG_URL)"
    variable = {"brave": "BRAVE_API_KEY", "tavily": "TAVILY_API_KEY"}.get(backend)
    if variable is not None and not os.environ.get(variable):
        return f"web_search_backend is {backend}: set the environment variable {variable}"
    return None


async def generate_image(ctx: Context, prompt: str, path: str, size: str = "1024x1024") -> str:
    """Generate an image from a text description and save it as a PNG in the workspace.

    Args:
        prompt: what the image shows
        path: where to save it in the workspace, ending in .png
        size: 1024x1024, 1024x1536, 1536x1024, 512x512 or 256x256
    """
    from .images import check_image_call
    from .images import generate_image as make_image

    config, workspace, spending = ctx.deps.context.images, ctx.deps.workspace, ctx.deps.context.spending
    return await ctx.deps.run_tool(
        "generate_image",
        {"prompt": prompt, "path": path, "size": size},
        lambda: make_image(config, workspace, prompt, path, size, spending),
        check=lambda: check_image_call(workspace, prompt, path, size),  # nobody is asked about those
    )


def _image_key_missing(_settings: Settings) -> str | None:
    key = ImageConfig().api_key_variable
    if os.environ.get(key):
        return None
    return (
        f"set the environment variable {key} (the key of the images API; "
        "image_base_url names another OpenAI-compatible one)"
    )


# ---- the person and memory


async def ask_user(ctx: Context, question: str) -> str:
    """Ask the person running the plan a question and wait for the answer.

    Args:
        question: the question, complete and self-contained
    """
    ask = ctx.deps.context.ask_person

    async def call() -> str:
        if ask is None:
            raise ToolError("no one can be asked in this run")
        if not question.strip():
            raise ToolError("the question is empty")
        answer = await ask(question)
        return answer if answer.strip() else "(the person gave no answer)"

    return await ctx.deps.run_tool("ask_user", {"question": question}, call)


async def remember(ctx: Context, fact: str) -> str:
    """Keep a fact in long-term memory, for later steps and runs. Never store secrets.

    Args:
        fact: one self-contained fact, e.g. "The sales data in sales.csv is in euros."
    """
    context = ctx.deps.context

    async def call() -> str:
        if context.memory is None:
            raise ToolError("long-term memory is not available in this run")
        item = await asyncio.to_thread(context.memory.remember, fact, source=context.memory_source)
        return f"remembered as {item.id}"

    return await ctx.deps.run_tool("remember", {"fact": fact}, call)


async def recall(ctx: Context, query: str) -> str:
    """Search long-term memory: facts kept earlier and what happened in past runs.

    Args:
        query: what to look for
    """
    memory = ctx.deps.context.memory

    async def call() -> str:
        if memory is None:
            raise ToolError("long-term memory is not available in this run")
        found = await asyncio.to_thread(memory.recall, query, 5)
        if not found:
            return "nothing remembered about that"
        return "\n".join(
            f"{n}. [{item.kind}, {item.created_at[:10]}] {item.text}" for n, item in enumerate(found, 1)
        )

    return await ctx.deps.run_tool("recall", {"query": query}, call)


BUILTIN_TOOLS: tuple[BuiltinTool, ...] = (
    BuiltinTool(
        code_execution,
        "Run Python, bash or JavaScript code, or an SQL query over the workspace's CSV files, in a "
        "sandbox; files it writes land in the run's workspace. Use it to compute, transform data, "
        "and make charts.",
        "execute",
        "ask",
        _sandbox_missing,
    ),
    BuiltinTool(read_file, "Read a text file from the run's workspace.", "read", repeatable=True),
    BuiltinTool(
        write_file,
        "Write text to a file in the run's workspace (creates or replaces it).",
        "write",
        repeatable=True,  # the file ends with the same content
    ),
    BuiltinTool(list_files, "List the files in a folder of the run's workspace.", "read", repeatable=True),
    BuiltinTool(delete_file, "Delete a file from the run's workspace.", "write", "ask", repeatable=True),
    BuiltinTool(
        http_request,
        "Make an HTTP request to an allowed domain and return the response.",
        "network",
        "ask",
        _http_missing,
    ),
    BuiltinTool(
        web_search,
        "Search the web (or a configured local folder) and return the top results.",
        "network",
        unavailable=_search_missing,
        repeatable=True,
    ),
    BuiltinTool(
        generate_image,
        "Generate an image from a text prompt and save it as a PNG in the workspace.",
        "network",
        "ask",
        _image_key_missing,
    ),
    BuiltinTool(
        ask_user,
        "Ask the person running the plan a question and wait for the answer.",
        "read",
        repeatable=True,  # its question is a stored request, found again (not asked twice)
    ),
    BuiltinTool(
        remember, "Keep a fact in long-term memory for later steps and runs (never a secret).", "write"
    ),
    BuiltinTool(
        recall,
        "Search long-term memory: facts kept earlier and what happened in past runs.",
        "read",
        repeatable=True,
    ),
)
"""Every shipped tool, in catalog order."""

# BUILTIN_TOOL_NAMES (imported from `names.py`): the same names without the definitions, for
# checks that need no more; `test_the_tool_names_kept_apart_are_the_tools_defined` keeps them in step

_BY_NAME = {tool.name: tool for tool in BUILTIN_TOOLS}


def builtin_tool(name: str) -> BuiltinTool | None:
    """The shipped tool called `name`, if there is one."""
    return _BY_NAME.get(name)


def builtin_catalog() -> Catalog:
    """The tools masterplanner ships (names are a public contract)."""
    return Catalog(tool.spec for tool in BUILTIN_TOOLS)
