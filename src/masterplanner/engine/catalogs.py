"""Which tools a run offers: the catalog its planner sees and the context its step tools work in."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ..settings import Settings
from ..tools.catalog import Catalog, ToolSpec
from ..tools.mcp_names import MAX_TOOL_PREFIX, mcp_tool_prefix, names_server_tool
from ..tools.names import BUILTIN_TOOL_NAMES, TEAM_TOOL_NAMES

if TYPE_CHECKING:
    from ..tools.context import ToolContext

# The tools' definitions (pydantic-ai) and their configurations (httpx) are imported by the
# functions that make a run's catalog and tool context: checking tool names, as answering a
# plan review does (`RunService.answer`), needs only the names.

__all__ = [
    "RunCatalog",
    "run_catalog",
    "settings_policy_problem",
    "tool_context",
    "unknown_policy_tool",
    "unoffered_policy_tools",
    "with_mcp_tools",
]


class RunCatalog(Catalog):
    """A run's tools, which also knows why the tools it leaves out are missing here.

    Plan validation (`plan.tool_problems`) asks `why_missing`, so a plan naming a tool that
    cannot run here says which setting enables it, wherever the plan came from: the planner,
    a review edit, a reused team.
    """

    def __init__(
        self, tools: Iterable[ToolSpec], *, missing: Mapping[str, str], mcp_servers: Iterable[str] = ()
    ) -> None:
        super().__init__(tools)
        self.missing = dict(missing)
        """Built-in tool -> what enables it, for the ones left out."""
        self.mcp_servers = tuple(mcp_servers)
        """The configured MCP servers (their tools are named `<server>_<tool>`)."""

    def why_missing(self, name: str) -> str | None:
        """What would make tool `name` available here, or None when nothing would."""
        if name in self:
            return None
        if name in BUILTIN_TOOL_NAMES:
            return self.missing.get(name)
        servers = [server for server in self.mcp_servers if name.startswith(mcp_tool_prefix(server) + "_")]
        if servers:
            offered = ", ".join(
                _closest_first(name, [tool.name for tool in self if tool.mcp_server in servers])
            )
            offered = offered or "none"
            if len(servers) == 1:
                return f"the MCP server {servers[0]!r} offers no such tool (it offers: {offered})"
            named = " and ".join(repr(server) for server in servers)
            return f"the MCP servers {named} offer no such tool (they offer: {offered})"
        shortened = _by_whole_server_name(name, self.mcp_servers)
        if shortened is not None:
            return shortened
        if "_" not in name:
            return None  # not the name of an MCP server's tool either
        configured = ", ".join(self.mcp_servers) or "none"
        return (
            f"no configured MCP server offers it (configured: {configured}); a server's tools are "
            "named SERVER_TOOL once mcp_servers configures it (a [mcp_servers.SERVER] table in "
            "masterplanner.toml, or MASTERPLANNER_MCP_SERVERS)"
        )


def unknown_policy_tool(
    policies: Iterable[str], mcp_servers: Iterable[str], *, field: str = "tool_policies"
) -> str | None:
    """What is wrong with tool policies (or another `field` of tool names) naming a tool that does not exist.

    A typo (`code-execution`) left the tool it meant under its default policy, silently. Any
    built-in or team tool may have a policy, and `<server>_<tool>` for the MCP servers named.
    """
    from difflib import get_close_matches

    known = [*BUILTIN_TOOL_NAMES, *TEAM_TOOL_NAMES]
    servers = list(mcp_servers)
    for name in policies:
        if name in known or names_server_tool(name, servers):
            continue
        shortened = _by_whole_server_name(name, servers)
        if shortened is not None:
            return f"{field} names {name!r}, which is not a tool; {shortened}"
        close = get_close_matches(name, known, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return (
            f"{field} names {name!r}, which is not a tool; {hint}tools are "
            f"{', '.join(sorted(known))}, and <server>_<tool> for the MCP servers in mcp_servers"
        )
    return None


def _by_whole_server_name(name: str, servers: Iterable[str]) -> str | None:
    """What a tool name beginning with a long server's whole name is offered as (its shortened one)."""
    for server in sorted(servers, key=len, reverse=True):
        prefix = mcp_tool_prefix(server)
        if prefix != server and name.startswith(server + "_"):
            offered = f"{prefix}_{name[len(server) + 1 :]}"
            return (
                f"the MCP server {server!r} has a name of more than {MAX_TOOL_PREFIX} characters, so its "
                f"tools are named {prefix}_<tool>: did you mean {offered!r}?"
            )
    return None


def settings_policy_problem(settings: Settings) -> str | None:
    """What is wrong with the `tool_policies` setting, naming where it came from (every run refuses it)."""
    problem = unknown_policy_tool(settings.tool_policies, settings.mcp_servers)
    return None if problem is None else settings.problem_in("tool_policies", problem)


def unoffered_policy_tools(
    policies: Iterable[str], agent_policies: Mapping[str, Iterable[str]], catalog: RunCatalog
) -> list[str]:
    """What is wrong with tool policies naming `<server>_<tool>` for a tool its server does not offer.

    `policies` are the run's, `agent_policies` each step's agent's (by step id). `unknown_policy_tool`
    checks only the `<server>_` part (a run is created without listing the servers' tools): a
    misspelt `notes_shuot` left `notes_shout` under its default policy, and under `--yes` it ran
    without asking. Checked once the run's catalog lists the servers' tools.
    """
    named = [("tool_policies", policies)] + [
        (f"agents.{step_id}.tool_policies", own) for step_id, own in agent_policies.items()
    ]
    return [problem for field, names in named for problem in _unoffered(names, catalog, field)]


def _unoffered(names: Iterable[str], catalog: RunCatalog, field: str) -> list[str]:
    problems = []
    for name in names:
        if name in catalog or name in BUILTIN_TOOL_NAMES or name in TEAM_TOOL_NAMES:
            continue
        why = catalog.why_missing(name)
        if why is not None and names_server_tool(name, catalog.mcp_servers):
            problems.append(f"{field} names {name!r}, which is not a tool of this run: {why}")
    return problems


def _closest_first(name: str, names: list[str]) -> list[str]:
    """`names` with the ones most like `name` first (a misspelling's likely meaning)."""
    from difflib import get_close_matches

    close = get_close_matches(name, names, n=len(names)) if names else []
    return [*close, *(other for other in names if other not in close)]


def run_catalog(settings: Settings | None = None) -> RunCatalog:
    """The tools a run's planner may assign: those step agents can run here.

    With `settings`, tools that could only fail are left out, so the planner does not pick them
    (each tool's definition says what it needs: `BuiltinTool.unavailable`): `web_search` without
    a backend, `http_request` without allowed domains, `generate_image` without an API key,
    `code_execution` where the sandbox cannot start. (The embedded model otherwise planned a
    haiku in twelve steps and called `web_search` until its request cap.) The catalog remembers
    what would enable each of them, for plan validation to say.
    """
    from ..tools.builtin import BUILTIN_TOOLS

    if settings is None:
        return RunCatalog((tool.spec for tool in BUILTIN_TOOLS), missing={})
    missing: dict[str, str] = {}
    for tool in BUILTIN_TOOLS:
        why = tool.unavailable(settings) if tool.unavailable is not None else None
        if why is not None:
            missing[tool.name] = why
    return RunCatalog(
        (tool.spec for tool in BUILTIN_TOOLS if tool.name not in missing),
        missing=missing,
        mcp_servers=settings.mcp_servers,
    )


def tool_context(settings: Settings) -> ToolContext:
    """The configuration the step tools of a run work with."""
    from ..tools.context import ToolContext
    from ..tools.http import HttpPolicy
    from ..tools.images import ImageConfig
    from ..tools.web_search import SearchConfig

    return ToolContext(
        http=HttpPolicy(
            allowed_domains=tuple(settings.http_allowed_domains), allow_loopback=settings.http_allow_loopback
        ),
        search=SearchConfig(
            backend=settings.web_search_backend,
            folder=settings.web_search_folder,
            searxng_url=settings.searxng_url,
        ),
        images=ImageConfig(model=settings.image_model, base_url=settings.image_base_url),
    )


async def with_mcp_tools(settings: Settings, context: ToolContext) -> tuple[RunCatalog, ToolContext]:
    """The run catalog plus the configured MCP servers' tools, and the tool context that can call them.

    `discover_tools` refuses a tool named like a built-in or team tool, as `doctor` reports it.
    """
    from ..tools.mcp import discover_tools

    specs = await discover_tools(settings.mcp_servers)
    base = run_catalog(settings)
    catalog = RunCatalog([*base, *specs], missing=base.missing, mcp_servers=base.mcp_servers)
    return catalog, replace(
        context, mcp_servers=dict(settings.mcp_servers), mcp_specs={spec.name: spec for spec in specs}
    )
