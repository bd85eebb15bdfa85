"""The catalog names of MCP servers' tools: `<server>_<tool>`, made names model providers take.

A server's name and a tool's own name are not ours to choose, while a model provider takes only
`[A-Za-z0-9_-]{1,64}`: a long server name is cut and tagged (`mcp_tool_prefix`), a tool's name
mapped (`mcp_tool_name`), and the servers' tools named together so that none depends on the order
they are listed in (`catalog_names`). Apart from `tools.mcp`, which discovers and calls the
servers, so that the catalogs and the review can tell a server's tool by its name without it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

from ..errors import ToolNameClashError

__all__ = [
    "MAX_TOOL_NAME",
    "MAX_TOOL_PREFIX",
    "catalog_names",
    "mcp_tool_name",
    "mcp_tool_prefix",
    "names_server_tool",
]


MAX_TOOL_NAME = 64
"""The longest tool name model providers take (OpenAI: ^[a-zA-Z0-9_-]{1,64}$)."""

_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NOT_IN_A_TOOL_NAME = re.compile(r"[^A-Za-z0-9_-]")


MAX_TOOL_PREFIX = 32
"""The longest start of an MCP server's tools' names (`mcp_tool_prefix`): half of `MAX_TOOL_NAME`."""


def mcp_tool_prefix(server: str) -> str:
    """What the catalog names of a server's tools begin with, before their `_`: the server's name.

    A name of more than `MAX_TOOL_PREFIX` characters (a tool name may hold 64) is cut to 23 and
    ends in `_` and 8 hex digits of its SHA-256. Before, settings refused such a server, and a
    configuration that had worked elsewhere stopped loading.
    """
    if len(server) <= MAX_TOOL_PREFIX:
        return server
    tag = hashlib.sha256(server.encode()).hexdigest()[:8]
    return f"{server[: MAX_TOOL_PREFIX - len(tag) - 1]}_{tag}"


def names_server_tool(name: str, servers: Iterable[str]) -> bool:
    """Whether `name` is of the form a tool of one of `servers` is named (`<prefix>_<tool>`)."""
    return any(name.startswith(f"{mcp_tool_prefix(server)}_") for server in servers)


def mcp_tool_name(server: str, tool: str, *, tagged: bool = False) -> str:
    """The catalog name of a server's tool: `<server>_<tool>`, made one model providers take.

    A tool's own name is the server's to choose (`fs.read`, `read file`, 40 characters): before,
    it was used as it came, and a model provider refused the run's first request offering it.
    The server's part is `mcp_tool_prefix` (its name, cut when it is long). Each character other
    than an ASCII letter, a digit, `_` and `-` becomes `_`; a name longer than `MAX_TOOL_NAME` is
    cut and ends in `_` and 8 hex digits of the SHA-256 of the tool's own name, as it also does
    when `tagged` (two tools mapped to one name, `discover_tools`). The server is still called
    with the tool's own name (`ToolSpec.mcp_tool`).
    """
    prefix = mcp_tool_prefix(server)
    name = f"{prefix}_{tool}"
    if _TOOL_NAME.fullmatch(name) and not tagged:
        return name
    readable = _NOT_IN_A_TOOL_NAME.sub("_", tool)
    if len(prefix) + 1 + len(readable) <= MAX_TOOL_NAME and not tagged:
        return f"{prefix}_{readable}"
    tag = hashlib.sha256(tool.encode()).hexdigest()[:8]
    room = MAX_TOOL_NAME - len(prefix) - 1 - len(tag) - 1  # a prefix is at most 32
    return f"{prefix}_{readable[:room]}_{tag}" if readable[:room] else f"{prefix}_{tag}"


def catalog_names(servers: Mapping[str, list[str]]) -> dict[tuple[str, str], str]:
    """Each server's tools' catalog names, by (server, its own name) (`mcp_tool_name`).

    A name that is another tool's too is tagged, so that the name a tool gets depends on its own
    name alone, not on the order servers list them in: of one server's tools, the one whose name
    had to be changed (`fs.read` beside `fs_read`); of two servers' (server `a`'s `b_c` and
    server `a_b`'s `c`: both `a_b_c`), both. A tool whose own name serves as it is, and no other
    tool's name is, keeps it. Two tools that still share a name (a server that lists one name
    twice) are a `ConfigError` naming both.
    """
    names = {
        (server, tool): mcp_tool_name(server, tool) for server, tools in servers.items() for tool in tools
    }
    taken: dict[str, list[tuple[str, str]]] = {}
    for key, name in names.items():
        taken.setdefault(name, []).append(key)
    for (server, tool), name in names.items():
        sharing = taken[name]
        across = len({other for other, _ in sharing}) > 1
        if len(sharing) > 1 and (across or name != f"{mcp_tool_prefix(server)}_{tool}"):
            names[(server, tool)] = mcp_tool_name(server, tool, tagged=True)
    seen: dict[str, tuple[str, str]] = {}
    for server, tools in servers.items():
        for tool in tools:
            name = names[(server, tool)]
            if name in seen:
                first_server, first = seen[name]
                if first_server != server:
                    raise ToolNameClashError(
                        f"MCP servers {first_server!r} and {server!r} offer tools {first!r} and {tool!r}: "
                        f"they cannot both be called {name!r}",
                        (first_server, server),
                    )
                both = f"the tool {tool!r} twice" if first == tool else f"tools {first!r} and {tool!r}"
                raise ToolNameClashError(
                    f"MCP server {server!r} lists {both}: they cannot both be called {name!r}", (server,)
                )
            seen[name] = (server, tool)
    return names
