"""Which tools a run offers: the catalog its planner sees and the context its step tools work in."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import replace

from ..sandbox import sandbox_problems
from ..settings import Settings
from ..tools import Catalog, builtin_catalog
from ..tools.http import HttpPolicy
from ..tools.images import ImageConfig
from ..tools.mcp import discover_tools
from ..tools.web_search import SearchConfig
from .step_agent import RUNNABLE_TOOLS
from .step_tools import ToolContext

__all__ = ["run_catalog", "tool_context", "with_mcp_tools"]


def run_catalog(settings: Settings | None = None) -> Catalog:
    """The tools a run's planner may assign: those step agents can run here.

    With `settings`, tools that could only fail are left out, so the planner does not pick them:
    `web_search` without a backend, `http_request` without allowed domains, `generate_image`
    without an API key, `code_execution` where the sandbox cannot start. (The embedded model
    otherwise planned a haiku in twelve steps and called `web_search` until its request cap.)
    """
    names = list(RUNNABLE_TOOLS)
    if settings is not None:
        unusable = {
            "web_search": settings.web_search_backend == "none",
            "http_request": not settings.http_allowed_domains,
            "generate_image": not os.environ.get(ImageConfig().api_key_variable),
            "code_execution": bool(sandbox_problems()),
        }
        names = [name for name in names if not unusable.get(name, False)]
    return builtin_catalog().subset(names)


def tool_context(
    settings: Settings, ask_person: Callable[[str], Awaitable[str]] | None = None
) -> ToolContext:
    """The configuration the step tools of a run work with."""
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
        ask_person=ask_person,
    )


async def with_mcp_tools(settings: Settings, context: ToolContext) -> tuple[Catalog, ToolContext]:
    """The run catalog plus the configured MCP servers' tools, and the tool context that can call them."""
    specs = await discover_tools(settings.mcp_servers)
    catalog = Catalog([*run_catalog(settings), *specs])
    return catalog, replace(
        context, mcp_servers=dict(settings.mcp_servers), mcp_specs={spec.name: spec for spec in specs}
    )
