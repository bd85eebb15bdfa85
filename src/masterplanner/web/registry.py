"""The registry in the web app: agents (search, versions, edit, delete, lessons), teams and memory.

`api` is the JSON side under `/api/v1`, `pages` the HTML side; both call `RegistryService` only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from markupsafe import Markup

from ..errors import MasterplannerError, NotFoundError, quoted_id
from ..redaction import REMOVED, redacted
from ..registry import AgentSpec, Cohort
from ..service import RegistryService
from .api import REFUSALS, ErrorOut, said_here
from .api_responses import AgentOut, ListedAgentOut, MemoryOut, StoredAgentOut, success
from .graph import plan_svg
from .pages import form_text, templates

__all__ = ["api", "pages"]

api = APIRouter(prefix="/api/v1", responses=REFUSALS)
pages = APIRouter(include_in_schema=False)

MemoryKind = Literal["fact", "episode"]


def _registry(request: Request) -> RegistryService:
    registry: RegistryService = request.app.state.registry
    return registry


async def _agent(registry: RegistryService, agent_id: str, version: int | None = None) -> AgentSpec:
    try:
        return await registry.agent(agent_id, version)
    except NotFoundError:
        what = f"agent {quoted_id(agent_id)}" + (f" version {version}" if version is not None else "")
        raise HTTPException(404, f"no {what} in the registry") from None


async def _team(registry: RegistryService, team_id: str) -> Cohort:
    try:
        return await registry.cohort(team_id)
    except NotFoundError:
        raise HTTPException(404, f"no team {quoted_id(team_id)} in the registry") from None


def _agent_json(spec: AgentSpec) -> dict[str, Any]:
    return spec.model_dump(mode="json") | {
        "success_rate": spec.stats.successes / spec.stats.uses if spec.stats.uses else None,
        "mean_rating": spec.stats.mean_rating,
    }


# ---- JSON


@api.get(
    "/agents",
    summary="Stored agents, or those matching a search",
    **success(list[ListedAgentOut], "The agents"),
)
async def list_agents(
    request: Request, q: Annotated[str | None, Query(max_length=500, description="Search text.")] = None
) -> list[dict[str, Any]]:
    """Every agent (most recently updated first), or with `q` the best matches with their scores."""
    registry = _registry(request)
    if q and q.strip():
        return [_agent_json(spec) | {"score": score} for spec, score in await registry.search_agents(q, 20)]
    return [_agent_json(spec) for spec in await registry.agents()]


@api.get("/agents/{agent_id}", summary="One agent", **success(StoredAgentOut, "The agent"))
async def get_agent(
    request: Request,
    response: Response,
    agent_id: str,
    version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None,
) -> dict[str, Any]:
    """The agent (its latest version, or `version`) and the versions stored.

    Its `ETag` is the version read: sent back as `If-Match` with an edit, the edit is refused
    if another version was stored meanwhile.
    """
    registry = _registry(request)
    spec = await _agent(registry, agent_id, version)
    response.headers["ETag"] = _etag(spec)
    return _agent_json(spec) | {"versions": await registry.versions(spec.id)}


def _etag(spec: AgentSpec) -> str:
    return f'"{spec.version}"'


def _matches(if_match: str, spec: AgentSpec) -> bool:
    """Whether an `If-Match` header names `spec`'s version (or any, `*`)."""
    tags = [tag.strip().removeprefix("W/") for tag in if_match.split(",")]
    return "*" in tags or _etag(spec) in tags


_STALE = {
    412: {
        "model": ErrorOut,
        "description": "`If-Match` named a version of the agent other than its latest: nothing was saved",
    }
}
"""The edit's refusal when the version it was made from is not the latest (an optimistic lock)."""


@api.put(
    "/agents/{agent_id}",
    summary="Edit an agent (a new version)",
    response_model=None,
    responses=success(AgentOut, "The new version")["responses"] | _STALE,
)
async def edit_agent(
    request: Request,
    response: Response,
    agent_id: str,
    body: dict[str, Any],
    if_match: Annotated[
        str | None,
        Header(description="The `ETag` of the version the edit is made from: refused (412) if not latest"),
    ] = None,
) -> dict[str, Any]:
    """Store the body (the agent's JSON form) as its next version; its id and stats stay.

    Without `If-Match` the edit is stored over whatever version is latest (a run's rating may
    have added lessons since the client read it); with it, only over the version it names.
    """
    registry = _registry(request)
    spec = await _agent(registry, agent_id)
    if if_match is not None and not _matches(if_match, spec):
        raise HTTPException(
            412,
            f"agent {spec.id!r} changed since it was read (If-Match {if_match.strip()}, version "
            f"{spec.version} now): nothing was saved; read it again and send the edit made from it",
        )
    edited = {
        key: value for key, value in body.items() if key not in ("success_rate", "mean_rating", "versions")
    }
    saved = await registry.edit_agent(spec.id, edited)
    response.headers["ETag"] = _etag(saved)
    return _agent_json(saved)


@api.delete("/agents/{agent_id}", status_code=204, summary="Delete an agent")
async def delete_agent(request: Request, agent_id: str) -> Response:
    """Remove the agent and every version of it (teams that used it keep their record)."""
    registry = _registry(request)
    await registry.remove_agent((await _agent(registry, agent_id)).id)
    return Response(status_code=204)


@api.get("/teams", summary="Stored teams", **success(list[Cohort], "The teams"))
async def list_teams(request: Request) -> list[dict[str, Any]]:
    """Every stored team (cohort), newest first."""
    return [team.model_dump(mode="json") for team in await _registry(request).cohorts()]


@api.get("/teams/{team_id}", summary="One team", **success(Cohort, "The team"))
async def get_team(request: Request, team_id: str) -> dict[str, Any]:
    """The team: its task, plan, agents by step and outcome."""
    return (await _team(_registry(request), team_id)).model_dump(mode="json")


@api.delete("/teams/{team_id}", status_code=204, summary="Delete a team")
async def delete_team(request: Request, team_id: str) -> Response:
    """Remove the team (its agents stay)."""
    registry = _registry(request)
    await registry.remove_cohort((await _team(registry, team_id)).id)
    return Response(status_code=204)


@api.get("/memories", summary="Agents' long-term memory", **success(list[MemoryOut], "The memories"))
async def list_memories(
    request: Request,
    q: Annotated[str | None, Query(max_length=500, description="Search text.")] = None,
    kind: Annotated[MemoryKind | None, Query(description="Facts or accounts of runs.")] = None,
) -> list[dict[str, str]]:
    """Every memory that has not expired, or with `q` the closest (which renews them)."""
    registry = _registry(request)
    found = await registry.recall(q, 20, kind) if q and q.strip() else await registry.memories(kind)
    return [item.to_json_dict() for item in found]


@api.delete("/memories/{memory_id}", status_code=204, summary="Forget a memory")
async def forget(request: Request, memory_id: str) -> Response:
    """Forget one memory."""
    try:
        await _registry(request).forget(memory_id)
    except NotFoundError:
        raise HTTPException(404, f"no memory {quoted_id(memory_id)}") from None
    return Response(status_code=204)


# ---- pages


@pages.get("/agents", response_class=HTMLResponse)
async def agents_page(request: Request, q: str = "") -> Response:
    """Agents, or a search of them."""
    registry = _registry(request)
    found: list[tuple[AgentSpec, float | None]]
    if q.strip():
        found = [(spec, score) for spec, score in await registry.search_agents(q, 20)]
    else:
        found = [(spec, None) for spec in await registry.agents()]
    return templates.TemplateResponse(request, "agents.html", {"found": found, "q": q})


@pages.get("/agents/{agent_id}", response_class=HTMLResponse)
async def agent_page(
    request: Request, agent_id: str, version: Annotated[int | None, Query(ge=1, le=2**31 - 1)] = None
) -> Response:
    """One agent: its prompt, tools, stats and lessons, its versions, and the edit form."""
    registry = _registry(request)
    spec = await _agent(registry, agent_id, version)
    context = {"agent": spec, "versions": await registry.versions(spec.id), "error": None, "saved": False}
    return templates.TemplateResponse(request, "agent.html", context | {"form": _form_of(spec)})


def _form_of(spec: AgentSpec) -> dict[str, str]:
    """The edit form's fields as the agent has them."""
    return {
        "name": spec.name,
        "role": spec.role,
        "description": spec.description,
        "system_prompt": spec.system_prompt,
        "tools": ", ".join(spec.tools),
        "keywords": ", ".join(spec.keywords),
        "lessons": "\n".join(spec.lessons),
    }


def _same_field(name: str, one: str, other: str) -> bool:
    """Whether two values of the edit form's field `name` say the same (lists item by item)."""
    separator = {"tools": ",", "keywords": ",", "lessons": "\n"}.get(name)
    if separator is None:
        return one.strip() == other.strip()
    return [item.strip() for item in one.split(separator) if item.strip()] == [
        item.strip() for item in other.split(separator) if item.strip()
    ]


async def _stale_edit(
    registry: RegistryService,
    latest: AgentSpec,
    loaded: int,
    form: Any,
    refused: Callable[[str, int, dict[str, str] | None], Response],
) -> Response:
    """The edit of a page loaded at version `loaded`, another version stored since: refused (409).

    The form comes back as the latest version with the person's changes on top: each field they
    left as they loaded it shows the latest version's value (a lesson a rating wrote meanwhile
    stays), each they changed shows theirs, and the message names the fields both changed.
    """
    base = None  # a version never stored (a hand-made form): their edit comes back as typed
    if 1 <= loaded <= latest.version:
        with contextlib.suppress(NotFoundError):
            base = _form_of(await registry.agent(latest.id, loaded))
    now = _form_of(latest)
    merged, both = {}, []
    for name, value in now.items():
        typed = form_text(form, name)
        if base is not None and _same_field(name, typed, base[name]):
            merged[name] = value
            continue
        merged[name] = typed
        theirs_too = base is not None and not _same_field(name, value, base[name])
        if theirs_too and not _same_field(name, typed, value):
            both.append(name)
    version = latest.version
    clash = (
        f" (you and version {version} both changed {', '.join(both)}: the form shows yours)" if both else ""
    )
    return refused(
        f"agent {latest.id} changed since this page was loaded (version {loaded} then, {version} now): "
        f"nothing was saved; the form shows version {version} with your changes on top{clash}, and "
        "saving it stores them",
        409,
        merged if base is not None else None,
    )


@pages.post("/agents/{agent_id}", response_class=HTMLResponse)
async def agent_edit(request: Request, agent_id: str) -> Response:
    """Save the edit form as the agent's next version, or show what is wrong with it.

    The form says which version was the latest when it was loaded (`latest`): when another
    version was stored since (an edit elsewhere, a lesson a rating wrote), the edit is refused
    (409) rather than saved over it, and comes back as that version with the person's changes
    on top (`_stale_edit`).
    """
    registry = _registry(request)
    spec = await _agent(registry, agent_id)
    form = await request.form()
    if form.get("action") == "delete":
        await registry.remove_agent(spec.id)
        return RedirectResponse("/agents", status_code=303)

    def lines(name: str, separator: str = "\n") -> list[str]:
        return [item.strip() for item in form_text(form, name).split(separator) if item.strip()]

    versions = await registry.versions(spec.id)

    def refused(error: str, status: int, typed: dict[str, str] | None = None) -> Response:
        # the form as the person left it (or `typed`), beside what is wrong with it; a secret they
        # typed is not sent back (the edit was not stored): taken out, and said so
        typed = typed or {name: form_text(form, name) for name in _form_of(spec)}
        shown = {name: redacted(value) for name, value in typed.items()}
        if shown != typed:
            error += f"; the form shows your edit with the secret taken out (marked {REMOVED})"
        context = {
            "agent": spec,
            "versions": versions,
            "error": error,
            "saved": False,
            "form": shown,
        }
        return templates.TemplateResponse(request, "agent.html", context, status_code=status)

    loaded = str(form.get("latest", ""))
    if loaded.isascii() and loaded.isdigit() and int(loaded) != spec.version:
        return await _stale_edit(registry, spec, int(loaded), form, refused)
    edited = spec.model_dump(mode="json") | {
        "name": form_text(form, "name").strip(),
        "role": form_text(form, "role").strip(),
        "description": form_text(form, "description"),
        "system_prompt": form_text(form, "system_prompt"),
        "tools": lines("tools", ","),
        "keywords": lines("keywords", ","),
        "lessons": lines("lessons"),
    }
    try:
        saved = await registry.edit_agent(spec.id, edited)
    except MasterplannerError as error:
        return refused(said_here(request, error), 422)
    context = {"agent": saved, "versions": await registry.versions(saved.id), "error": None, "saved": True}
    return templates.TemplateResponse(request, "agent.html", context | {"form": _form_of(saved)})


@pages.get("/teams", response_class=HTMLResponse)
async def teams_page(request: Request) -> Response:
    """Stored teams."""
    return templates.TemplateResponse(request, "teams.html", {"teams": await _registry(request).cohorts()})


@pages.get("/teams/{team_id}", response_class=HTMLResponse)
async def team_page(request: Request, team_id: str) -> Response:
    """One team: its plan drawn, and the agent of each step."""
    team = await _team(_registry(request), team_id)
    graph = Markup(plan_svg(team.plan))
    return templates.TemplateResponse(request, "team.html", {"team": team, "graph": graph})


@pages.post("/teams/{team_id}", response_class=HTMLResponse)
async def team_delete(request: Request, team_id: str) -> Response:
    """Delete the team."""
    registry = _registry(request)
    await registry.remove_cohort((await _team(registry, team_id)).id)
    return RedirectResponse("/teams", status_code=303)


@pages.get("/memory", response_class=HTMLResponse)
async def memory_page(request: Request, q: str = "") -> Response:
    """Agents' memories, or a search of them."""
    registry = _registry(request)
    found = await registry.recall(q, 20) if q.strip() else await registry.memories()
    return templates.TemplateResponse(request, "memory.html", {"memories": found, "q": q})


@pages.post("/memory/{memory_id}", response_class=HTMLResponse)
async def memory_forget(request: Request, memory_id: str) -> Response:
    """Forget one memory."""
    try:
        await _registry(request).forget(memory_id)
    except NotFoundError:
        raise HTTPException(404, f"no memory {quoted_id(memory_id)}") from None
    return RedirectResponse("/memory", status_code=303)
