"""MCP servers declared in `masterplanner.toml`: their tools join the catalog as `<server>_<tool>`.

```toml
[mcp_servers.notes]            # stdio: a command the server runs as
command = "python"
args = ["notes_server.py"]

[mcp_servers.remote]           # streamable HTTP
url = "http://localhost:8000/mcp"
```

Their tools default to the `ask` approval policy: what a third-party server does is unknown.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..errors import ConfigError, ToolError, ToolNameClashError
from ..private import create_private_file, private_folder
from .catalog import ToolSpec
from .mcp_names import catalog_names
from .names import BUILTIN_TOOL_NAMES, TEAM_TOOL_NAMES

# The MCP client library logs what it cannot parse from a server (a line a server prints that is
# not JSON-RPC) as an error with a traceback and pydantic's advice, on stderr, at every call: a
# server's failure reaches the person through our own errors (discovery, tool errors) instead.
logging.getLogger("mcp").addHandler(logging.NullHandler())
logging.getLogger("mcp").propagate = False

__all__ = [
    "McpServer",
    "argument_problems",
    "discover_each",
    "discover_tools",
    "is_http_url",
    "mcp_client",
]


class McpServer(BaseModel):
    """How to reach one MCP server: a `command` (stdio) or a `url` (streamable HTTP)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    url: str | None = None
    timeout_s: float = Field(
        30.0,
        gt=0,
        le=600,
        description=(
            "how long the server has to start and answer the handshake, and then each request; a "
            "stdio server given up on then has up to 2 s more to stop (4 s if it ignores SIGTERM)"
        ),
    )
    log_file: Path | None = Field(
        None, description="where a stdio server's standard error goes (default: <home>/logs/mcp-<name>.log)"
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        """An http(s) URL with a host, refused at load otherwise, naming the setting.

        Before, each run failed as the server's tools were listed, in the MCP library's words
        ("Invalid HTTP/S URL provided for Streamable HTTP.").
        """
        if url is None:
            return None
        url = url.strip()
        if not is_http_url(url):
            from ..database import shown_url  # its password never in the message

            example = "http://localhost:8000/mcp"
            raise ValueError(f"expected an http:// or https:// URL such as {example}, got {shown_url(url)!r}")
        return url

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either 'command' (stdio) or 'url' (streamable HTTP)")
        return self


def is_http_url(url: str) -> bool:
    """Whether `url` is an http:// or https:// URL with a host (and a port, if any, that is a number)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is no number raises here
    except ValueError:
        return False
    # (urlsplit drops a tab or a line break inside the URL, which HTTP clients then refuse)
    blank = any(character.isspace() or ord(character) < 32 for character in url)
    return parts.scheme in ("http", "https") and bool(parts.hostname) and not blank


def mcp_client(server: McpServer) -> Any:
    """A FastMCP client for the server (not connected yet)."""
    return _client(server, None)


def _client(server: McpServer, report: Path | None) -> Any:
    """`mcp_client`; a stdio server's guard writes why its exec failed into `report` (`_session`)."""
    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport, StreamableHttpTransport

    if server.command is not None:
        # keep_alive off: the server ends with its call. fastmcp's default keeps it running, so a
        # run stopped mid-call (SIGTERM, Ctrl-C) waited for the server to finish the call, dropped
        # its result, and made the call again on resume: its side effect twice.
        # the server's own messages (a tool's traceback, say) go to its log, not into the terminal
        # and the live view of the run
        # (its owner's only: what a server says may quote what it was given)
        log = server.log_file
        if log is not None:
            private_folder(log.parent)
            create_private_file(log)
        # on Linux under a guard that ends it with this process, also on kill -9: before, a server
        # busy in a call ran on, orphaned, for ever
        command, args = _guarded(server.command, list(server.args), server.env, report)
        transport: Any = StdioTransport(
            command, args, env=dict(server.env) or None, keep_alive=False, log_file=log
        )
    else:
        transport = StreamableHttpTransport(str(server.url))
    # init_timeout bounds the whole handshake: without it, the client waited 10 s for a reply to
    # its `server/discover` probe (a fixed limit of the MCP library), then timeout_s for
    # `initialize`, so a server that never answered was given up on after 15 to 20 s whatever
    # its timeout_s
    return Client(transport, timeout=server.timeout_s, init_timeout=server.timeout_s)


_GUARD = Path(__file__).with_name("mcp_guard.py")


def _guarded(
    command: str, args: list[str], env: Mapping[str, str], report: Path | None = None
) -> tuple[str, list[str]]:
    """The command line that starts a stdio server under `mcp_guard.py`, which ends it with us.

    Linux only (the kernel's parent-death signal); elsewhere the server's own command line. A
    command that cannot be found is left as it is (`_session` refuses it before this), and there
    is no server to end. The guard writes the errno of an exec that fails into `report`.
    """
    if not _GUARDED:
        return command, args
    executable = shutil.which(command, path=_search_path(env))
    if executable is None:
        return command, args
    reporting = [f"--report={report}"] if report is not None else []
    return sys.executable, ["-I", "-S", str(_GUARD), *reporting, str(os.getpid()), executable, command, *args]


_GUARDED = sys.platform.startswith("linux")


def _search_path(env: Mapping[str, str]) -> str:
    """Where a command without a slash is looked for, as the library's spawn looks.

    On the PATH of the server's environment (the library's default environment keeps ours).
    """
    return env.get("PATH", os.environ.get("PATH", os.defpath))


class _CannotStart(Exception):
    """A stdio server whose command cannot be executed; the message says which and why, in our words."""


@asynccontextmanager
async def _session(server: McpServer) -> AsyncIterator[Any]:
    """A connected client of the server; `_CannotStart` when a stdio server's command cannot run.

    Before, a command that exists but cannot be executed (a script without a `#!` line, a file
    without execute permission, a folder) failed as "Connection closed" or in the library's
    words, and the reason was in the server's log alone. What can be seen without starting it is
    checked first (`_command_problem`); what only the exec tells (a script without `#!`, a
    missing interpreter) the guard writes into a report file, read once the connection failed.
    """
    command = server.command
    if command is not None:
        problem = _command_problem(command, _search_path(server.env))
        if problem is not None:
            raise _CannotStart(f"its command {command} could not be started: {problem}")
    report = _report_file() if command is not None and _GUARDED else None
    try:
        async with _client(server, report) as client:
            yield client
    except Exception:
        failure = None if report is None or command is None else _exec_failure(command, server, report)
        if failure is None:
            raise
        raise _CannotStart(f"its command {command} could not be started: {failure}") from None
    finally:
        if report is not None:
            report.unlink(missing_ok=True)


def _report_file() -> Path:
    """An empty file of its owner's only, for the guard to write a failed exec's errno into."""
    descriptor, name = tempfile.mkstemp(prefix="masterplanner-mcp-", suffix=".exec")
    os.close(descriptor)
    return Path(name)


def _command_problem(command: str, search_path: str) -> str | None:
    """Why a stdio server's command cannot be executed, as far as can be seen without running it.

    None when it is an executable file (found on `search_path` if it has no slash), as the
    library's spawn would find it.
    """
    if shutil.which(command, path=search_path) is not None:
        return None
    if os.sep in command:
        candidates = [command]
    else:
        candidates = [os.path.join(folder or os.curdir, command) for folder in search_path.split(os.pathsep)]
    found = next((path for path in candidates if os.path.exists(path)), None)
    if found is None:
        return "no such file" if os.sep in command else "no program of that name is on the PATH"
    if os.path.isdir(found):
        return f"{found} is a folder, not a program" if found != command else "it is a folder, not a program"
    which = "the file" if found == command else found
    return f"permission denied ({which} is not executable; chmod +x makes it so)"


def _exec_failure(command: str, server: McpServer, report: Path) -> str | None:
    """Why the guard could not execute a server's command, from its report; None if it did not fail."""
    try:
        written = report.read_text().strip()
    except OSError:
        return None
    if not written.isdigit():
        return None
    number = int(written)
    if number == errno.ENOEXEC:
        return "exec format error (a script needs a first line like #!/bin/sh)"
    if number == errno.ENOENT:
        interpreter = _interpreter(shutil.which(command, path=_search_path(server.env)))
        if interpreter is not None:
            return f"the interpreter its first line names ({interpreter}) was not found"
        return "no such file (the loader it needs is missing: a program built for another system?)"
    if number == errno.EACCES:
        return "permission denied (is it on a file system mounted noexec?)"
    reason = os.strerror(number)
    return reason[:1].lower() + reason[1:]


def _interpreter(executable: str | None) -> str | None:
    """The interpreter a script's `#!` line names, or None (not a script, or unreadable)."""
    if executable is None:
        return None
    try:
        with open(executable, "rb") as script:
            first = script.readline(256)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    return words[0] if words else None


async def discover_tools(servers: Mapping[str, McpServer]) -> list[ToolSpec]:
    """List every server's tools as catalog entries; `ConfigError` names a server that fails.

    A tool offered under a built-in or team tool's name is refused too (`_taken_name`).
    """
    listed = {name: await _list_tools(name, server) for name, server in servers.items()}
    specs = _specs(listed)
    taken = _taken_name(specs)
    if taken is not None:
        raise taken
    return specs


async def discover_each(servers: Mapping[str, McpServer]) -> dict[str, list[ToolSpec] | ConfigError]:
    """Each server's tools as a run offers them, or why they cannot be listed (`doctor`).

    The servers that list their tools are named together, as `discover_tools` names them (two
    servers' tools of one name are told apart). Two tools that cannot be named apart (a server
    listing one name twice) are the error of the one or two servers offering them, in the words a
    run fails with; the others are named without them. Before, that error was every server's. A
    tool offered under a built-in or team tool's name is its server's error, in the words a run
    refuses it with (`_taken_name`).
    """
    found: dict[str, list[ToolSpec] | ConfigError] = {}
    listed: dict[str, list[Any]] = {}
    for name, server in servers.items():
        try:
            listed[name] = await _list_tools(name, server)
        except ConfigError as exc:
            found[name] = exc
    while True:
        try:
            specs = _specs(listed)
            break
        except ToolNameClashError as exc:
            for name in exc.servers:
                found[name] = exc
                del listed[name]
    for name in listed:
        own = [spec for spec in specs if spec.mcp_server == name]
        found[name] = _taken_name(own) or own
    return {name: found[name] for name in servers}


def _taken_name(specs: Iterable[ToolSpec]) -> ConfigError | None:
    """The error of the first of `specs` offered under a built-in or team tool's name, or None.

    A step cannot be given two tools of one name: every run refuses such a tool, and `doctor`
    reports it on its server (before, doctor listed it among the server's tools).
    """
    for spec in specs:
        if spec.name in BUILTIN_TOOL_NAMES or spec.name in TEAM_TOOL_NAMES:
            kind = "built-in" if spec.name in BUILTIN_TOOL_NAMES else "team"
            return ConfigError(
                f"MCP tool {spec.name!r} (tool {spec.mcp_tool!r} of the MCP server {spec.mcp_server!r}) "
                f"has the name of a {kind} tool; give its server another name in mcp_servers (a "
                "server's tools are called <server>_<tool>)"
            )
    return None


async def _list_tools(name: str, server: McpServer) -> list[Any]:
    """The server's own listing of its tools; `ConfigError` names the server and why it fails."""
    try:
        async with _session(server) as client:
            return list(await client.list_tools())
    except _CannotStart as exc:
        raise ConfigError(f"MCP server {name!r}: {exc}") from None
    except Exception as exc:  # any transport or protocol failure: the configuration is at fault
        problem = _silent("it", server) if _timed_out(exc) else f"{type(exc).__name__}: {exc}"
        raise ConfigError(
            f"MCP server {name!r}: cannot list its tools: {problem}{_see_log(server)}"
        ) from None


def _specs(listed: Mapping[str, list[Any]]) -> list[ToolSpec]:
    """The catalog entries of the servers' listed tools, named across all of them (`catalog_names`)."""
    names = catalog_names({name: [tool.name for tool in tools] for name, tools in listed.items()})
    specs: list[ToolSpec] = []
    for name, tools in listed.items():
        for tool in tools:
            specs.append(
                ToolSpec(
                    names[(name, tool.name)],
                    (tool.description or f"{tool.name} from the MCP server {name}").strip(),
                    dict(tool.input_schema or {"type": "object", "properties": {}}),
                    "execute",
                    "ask",
                    # what the server declares: a call that only reads, or whose repeat changes nothing
                    repeatable=bool(
                        tool.annotations is not None
                        and (tool.annotations.read_only_hint or tool.annotations.idempotent_hint)
                    ),
                    mcp_server=name,
                    mcp_tool=tool.name,
                )
            )
    return specs


async def call_mcp_tool(name: str, server: McpServer, tool: str, arguments: dict[str, Any]) -> str:
    """Call one tool and return its result as text; a tool-level error is a `ToolError` with it.

    Each call starts the server and stops it when the call ends (also when the call is
    cancelled: the run stopped, or the step timed out). A server whose command cannot be
    executed is a `ToolError` naming the command and the reason (`_session`); one that
    stops or fails before it replies, or does not reply within its `timeout_s`, is a `ToolError`
    saying so (`name`: the server's name in mcp_servers). A tool's error goes to the
    agent as every tool's failure does (marked, a library's "for further information" advice
    dropped): before, it was a result of its own kind, with the server's validation advice and
    URL in it.
    """
    try:
        async with _session(server) as client:
            result = await client.call_tool(tool, arguments, raise_on_error=False)
    except _CannotStart as exc:
        raise ToolError(f"MCP server {name!r}: {exc}") from None
    except Exception as exc:
        if _timed_out(exc):
            raise ToolError(f"{_silent(f'the MCP server {name!r}', server)}{_see_log(server)}") from None
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ToolError(
            f"the MCP server stopped or failed before it replied ({detail}){_see_log(server)}"
        ) from None
    text = _result_text(result.content, result.structured_content)
    if result.is_error:
        raise ToolError(f"the tool reported an error: {text}")
    return text


def _result_text(content: list[Any], structured: dict[str, Any] | None) -> str:
    """What the agent reads of a tool's result: its text, and each other block described.

    Structured content is the result only when there is no content besides it (as JSON). Before,
    only text blocks were kept: an image or a resource's text came as '', and an empty text as
    the Python form of its structured copy (`{'result': ''}`).
    """
    if not content and structured is not None:
        return json.dumps(structured, ensure_ascii=False)
    return "\n".join(part for part in map(_block_text, content) if part)


def _block_text(block: Any) -> str:
    """One content block of a tool's result as text: a text as it is, other kinds described."""
    from mcp import types

    if isinstance(block, types.TextContent):
        return block.text
    if isinstance(block, types.ImageContent | types.AudioContent):
        return f"[{block.mime_type}, {_decoded_size(block.data):,} bytes]"
    if isinstance(block, types.EmbeddedResource):
        resource = block.resource
        if isinstance(resource, types.TextResourceContents):
            return resource.text
        return _described_resource(str(resource.uri), resource.mime_type, _decoded_size(resource.blob))
    if isinstance(block, types.ResourceLink):
        return _described_resource(str(block.uri), block.mime_type, block.size)
    return f"[{getattr(block, 'type', type(block).__name__)} content]"


def _described_resource(uri: str, mime_type: str | None, size: int | None) -> str:
    """A resource the agent gets no text of: `[resource URI, MIME type, N bytes]`, as far as known."""
    parts = [
        f"resource {uri}",
        *([mime_type] if mime_type else []),
        *([f"{size:,} bytes"] if size is not None else []),
    ]
    return f"[{', '.join(parts)}]"


def _decoded_size(data: str) -> int:
    """How many bytes base64 `data` holds, without decoding it."""
    data = data.strip()
    return len(data) * 3 // 4 - (len(data) - len(data.rstrip("=")))


def _timed_out(error: BaseException) -> bool:
    """Whether the client gave up on the server for its silence: a request's or the handshake's timeout."""
    from mcp.shared.exceptions import MCPError
    from mcp.types import REQUEST_TIMEOUT

    if isinstance(error, MCPError):
        return error.code == REQUEST_TIMEOUT
    # the handshake's: fastmcp's "Client failed to connect: Failed to initialize server session",
    # caused by a TimeoutError
    cause = error.__cause__
    for _ in range(10):  # a chain's few links (one made into a loop ends here too)
        if cause is None or isinstance(cause, TimeoutError):
            break
        cause = cause.__cause__
    return isinstance(cause, TimeoutError)


def _silent(who: str, server: McpServer) -> str:
    """A server (`who`) that did not answer in time, in our words: the limit and the setting that sets it.

    Before, it read "Request 'tools/call' timed out" (or 'initialize'), naming neither.
    """
    return f"{who} did not answer within {server.timeout_s:g} s (its timeout_s)"


def _see_log(server: McpServer) -> str:
    """Where to read what a stdio server said on its standard error, for an error message."""
    return f" (its messages are in {server.log_file})" if server.command and server.log_file else ""


def argument_problems(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """What is wrong with a call's `arguments` by the tool's declared input schema, in our words.

    An empty list when they fit, or when the schema itself cannot be read (the server decides).
    """
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError:
        return []
    problems: list[str] = []
    for error in sorted(
        Draft202012Validator(schema).iter_errors(dict(arguments)), key=lambda e: list(e.path)
    ):
        where = ".".join(str(part) for part in error.path)
        if error.validator == "required" and isinstance(error.validator_value, list):
            missing = [name for name in error.validator_value if name not in (error.instance or {})]
            problems.extend(f"missing argument {(where + '.' if where else '') + name!r}" for name in missing)
        elif error.validator == "additionalProperties" and isinstance(error.instance, dict):
            known = set((error.schema.get("properties") or {}) if isinstance(error.schema, dict) else ())
            problems.extend(
                f"unexpected argument {(where + '.' if where else '') + name!r}"
                for name in error.instance
                if name not in known
            )
        elif error.validator == "type":
            problems.append(f"argument {where!r} should be of type {error.validator_value}")
        elif error.validator == "enum" and isinstance(error.validator_value, list):
            allowed = ", ".join(repr(value) for value in error.validator_value[:10])
            problems.append(f"argument {where!r} should be one of {allowed}")
        else:
            problems.append(f"argument {where!r}: {error.message}" if where else error.message)
    return problems[:10]
