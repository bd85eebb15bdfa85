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

import json
import logging
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import ConfigError, ToolError
from ..private import create_private_file, private_folder
from .catalog import ToolSpec

# The MCP client library logs what it cannot parse from a server (a line a server prints that is
# not JSON-RPC) as an error with a traceback and pydantic's advice, on stderr, at every call: a
# server's failure reaches the person through our own errors (discovery, tool errors) instead.
logging.getLogger("mcp").addHandler(logging.NullHandler())
logging.getLogger("mcp").propagate = False

__all__ = [
    "McpServer",
    "argument_problems",
    "discover_tools",
    "mcp_client",
    "mcp_tool_name",
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

    @model_validator(mode="after")
    def _one_transport(self) -> McpServer:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either 'command' (stdio) or 'url' (streamable HTTP)")
        return self


def mcp_tool_name(server: str, tool: str) -> str:
    """The catalog name of a server's tool."""
    return f"{server}_{tool}"


def mcp_client(server: McpServer) -> Any:
    """A FastMCP client for the server (not connected yet)."""
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
        command, args = _guarded(server.command, list(server.args), server.env)
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


def _guarded(command: str, args: list[str], env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The command line that starts a stdio server under `mcp_guard.py`, which ends it with us.

    Linux only (the kernel's parent-death signal); elsewhere the server's own command line. A
    command that cannot be found is left as it is: starting it fails as before, in the MCP
    library's words ("No such file or directory: 'x'"), and there is no server to end.
    """
    if not sys.platform.startswith("linux"):
        return command, args
    # found as the library's spawn finds it: on the PATH of the server's environment
    executable = shutil.which(command, path=env.get("PATH", os.environ.get("PATH", os.defpath)))
    if executable is None:
        return command, args
    return sys.executable, ["-I", "-S", str(_GUARD), str(os.getpid()), executable, command, *args]


async def discover_tools(servers: Mapping[str, McpServer]) -> list[ToolSpec]:
    """List every server's tools as catalog entries; `ConfigError` names a server that fails."""
    specs: list[ToolSpec] = []
    for name, server in servers.items():
        try:
            async with mcp_client(server) as client:
                tools = await client.list_tools()
        except Exception as exc:  # any transport or protocol failure: the configuration is at fault
            problem = _silent("it", server) if _timed_out(exc) else f"{type(exc).__name__}: {exc}"
            raise ConfigError(
                f"MCP server {name!r}: cannot list its tools: {problem}{_see_log(server)}"
            ) from None
        for tool in tools:
            specs.append(
                ToolSpec(
                    mcp_tool_name(name, tool.name),
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
    cancelled: the run stopped, or the step timed out). A server that cannot be started, or that
    stops or fails before it replies, or does not reply within its `timeout_s`, is a `ToolError`
    saying so (`name`: the server's name in mcp_servers). A tool's error goes to the
    agent as every tool's failure does (marked, a library's "for further information" advice
    dropped): before, it was a result of its own kind, with the server's validation advice and
    URL in it.
    """
    try:
        async with mcp_client(server) as client:
            result = await client.call_tool(tool, arguments, raise_on_error=False)
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
