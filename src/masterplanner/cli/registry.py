"""`masterplanner agents …`, `cohorts …` and `memory …`: the agent registry from the command line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from .common import app, console, load_settings
from .runs import RunId
from .terminal import json_text, shown

if TYPE_CHECKING:
    from ..registry import AgentSpec, RegistryStore
    from ..registry.memory import MemoryItem, MemoryKind, MemoryStore

agents_app = typer.Typer(
    help="List, inspect, search, edit, remove, export and import agents.", no_args_is_help=True
)
cohorts_app = typer.Typer(
    help="List, inspect and remove cohorts (teams that ran a task).", no_args_is_help=True
)
memory_app = typer.Typer(
    help="List, search and remove what agents remembered and the accounts of past runs.", no_args_is_help=True
)
app.add_typer(agents_app, name="agents")
app.add_typer(cohorts_app, name="cohorts")
app.add_typer(memory_app, name="memory")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _store() -> RegistryStore:
    from ..registry import open_registry

    settings = load_settings()
    settings.ensure_home()
    return open_registry(settings)


def _row(agent: AgentSpec) -> dict[str, object]:
    return agent.model_dump(mode="json") | {
        "success_rate": agent.stats.success_rate,
        "mean_rating": agent.stats.mean_rating,
    }


@agents_app.command("list")
def agents_list(as_json: JsonFlag = False) -> None:
    """Every agent, most recently updated first."""
    from rich.table import Table

    agents = _store().list_agents()
    if as_json:
        typer.echo(json_text([_row(agent) for agent in agents]))
        return
    table = Table("id", "name", "role", "version", "uses", "success", "rating")
    for agent in agents:
        rate, rating = agent.stats.success_rate, agent.stats.mean_rating
        table.add_row(
            shown(agent.id),
            shown(agent.name),
            shown(agent.role),
            str(agent.version),
            str(agent.stats.uses),
            "—" if rate is None else f"{rate:.0%}",
            "—" if rating is None else f"{rating:.1f}",
        )
    console().print(table, highlight=False)


@agents_app.command("show")
def agents_show(
    agent_id: Annotated[str, typer.Argument(help="The agent's id.")],
    version: Annotated[int | None, typer.Option("--version", help="An older version.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """One agent: prompt, tools, origin, stats, lessons, versions."""
    store = _store()
    agent = store.get_agent(agent_id, version)
    versions = store.versions(agent_id)
    if as_json:
        typer.echo(json_text(_row(agent) | {"versions": versions}))
        return
    out = console()
    out.print(
        f"[bold]{shown(agent.name)}[/] ({shown(agent.id)}, version {agent.version} of {shown(versions)})",
        highlight=False,
        soft_wrap=True,
    )
    tools = shown(", ".join(agent.tools) or "—")
    out.print(f"[dim]role[/] {shown(agent.role)}   [dim]tools[/] {tools}", highlight=False, soft_wrap=True)
    if agent.description:
        out.print(shown(agent.description, lines=True), highlight=False)
    out.print("[bold]prompt[/]")
    out.print(shown(agent.system_prompt, lines=True), highlight=False)
    for lesson in agent.lessons:
        out.print(f"[yellow]lesson[/] {shown(lesson, lines=True)}", highlight=False)


@agents_app.command("search")
def agents_search(
    query: Annotated[str, typer.Argument(help="What the agent should do.")],
    limit: Annotated[int, typer.Option("--limit", help="How many results.")] = 5,
    as_json: JsonFlag = False,
) -> None:
    """Agents whose role, description, keywords or prompt match QUERY (BM25 with a track-record prior)."""
    results = _store().search_agents(query, limit)
    if as_json:
        typer.echo(json_text([_row(agent) | {"score": round(score, 4)} for agent, score in results]))
        return
    for agent, score in results:
        console().print(
            f"{score:7.3f}  {shown(agent.id)}  {shown(agent.name)} — {shown(agent.role)}",
            highlight=False,
            soft_wrap=True,
        )


@agents_app.command("edit")
def agents_edit(agent_id: Annotated[str, typer.Argument(help="The agent's id.")]) -> None:
    """Edit an agent in $VISUAL or $EDITOR (JSON); saving makes a new version, older ones stay readable."""
    from pydantic import ValidationError

    from ..errors import ConfigError
    from ..registry import AgentSpec
    from ..review import edit_in_editor

    store = _store()
    agent = store.get_agent(agent_id)
    editable = json_text(agent.model_dump(mode="json", exclude={"stats", "version"}))
    try:
        edited = edit_in_editor(editable, extension=".json")
    except ConfigError as exc:
        raise ConfigError(f"{exc}; agent {agent.id} is unchanged") from None
    if edited.strip() == editable.strip():
        console(stderr=True).print("no change")
        return
    try:
        data = json.loads(edited)
        if not isinstance(data, dict):
            raise ConfigError("the edit is not a valid agent, nothing changed: it must be a JSON object")
        spec = AgentSpec.model_validate({**data, "id": agent.id, "stats": agent.stats.model_dump()})
    except json.JSONDecodeError as exc:
        raise ConfigError(f"the edit is not valid JSON, nothing changed: {exc}") from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'agent'}: {error['msg']}"
            for error in exc.errors()
        )
        raise ConfigError(f"the edit is not a valid agent, nothing changed: {problems}") from None
    stored = store.put_agent(spec)
    console(stderr=True).print(
        f"agent {shown(stored.id)} is now version {stored.version}", highlight=False, soft_wrap=True
    )


@agents_app.command("rm")
def agents_rm(agent_id: Annotated[str, typer.Argument(help="The agent's id.")]) -> None:
    """Remove an agent and every version of it."""
    _store().delete_agent(agent_id)
    console(stderr=True).print(f"removed agent {shown(agent_id)}", highlight=False, soft_wrap=True)


@agents_app.command("export")
def agents_export(path: Annotated[Path, typer.Argument(help="The JSON-lines file to write.")]) -> None:
    """Write every agent to a JSON-lines file (import reads it back exactly)."""
    count = _store().export_agents(path)
    console(stderr=True).print(f"exported {count} agent(s) to {shown(path)}", highlight=False, soft_wrap=True)


@agents_app.command("import")
def agents_import(
    path: Annotated[Path, typer.Argument(help="A JSON-lines file from `agents export`.")],
) -> None:
    """Read agents from a JSON-lines file: all of them, or none if any line is invalid."""
    from ..errors import ConfigError

    if not path.is_file():
        raise ConfigError(f"{path} is not a file")
    count = _store().import_agents(path)
    console(stderr=True).print(
        f"imported {count} agent(s) from {shown(path)}", highlight=False, soft_wrap=True
    )


@cohorts_app.command("list")
def cohorts_list(as_json: JsonFlag = False) -> None:
    """Every cohort, newest first."""
    cohorts = _store().list_cohorts()
    if as_json:
        typer.echo(json_text([cohort.model_dump(mode="json") for cohort in cohorts]))
        return
    for cohort in cohorts:
        console().print(
            f"{shown(cohort.id)}  {shown(cohort.outcome)}  {shown(cohort.task[:80])}",
            highlight=False,
            soft_wrap=True,
        )


@cohorts_app.command("show")
def cohorts_show(
    cohort_id: Annotated[str, typer.Argument(help="The cohort's id.")], as_json: JsonFlag = False
) -> None:
    """One cohort: task, plan shape, agents, outcome, rating."""
    cohort = _store().get_cohort(cohort_id)
    typer.echo(json_text(cohort.model_dump(mode="json"), indent=2 if as_json else 1))


@cohorts_app.command("rm")
def cohorts_rm(cohort_id: Annotated[str, typer.Argument(help="The cohort's id.")]) -> None:
    """Remove a cohort (its agents stay)."""
    _store().delete_cohort(cohort_id)
    console(stderr=True).print(f"removed cohort {shown(cohort_id)}", highlight=False, soft_wrap=True)


@app.command(short_help="Rate a finished run; a rating of 2 or less teaches its agents lessons.")
def feedback(
    run_id: RunId,
    rating: Annotated[int, typer.Option("--rating", help="1 (bad) to 5 (excellent).")],
    comment: Annotated[str, typer.Option("--comment", help="What went wrong or right.")] = "",
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model for the failure analysis.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Rate RUN_ID: its agents' and its team's ratings change.

    At 2 or less a failure analysis writes lessons onto the agents involved, which their prompts
    carry from the next run on (see `agents show`).
    """
    import asyncio

    from ..service import RunService

    async def rate() -> Any:
        service = RunService(load_settings())
        try:
            return await service.feedback(run_id, rating=rating, comment=comment, model=model)
        finally:
            service.close()

    result = asyncio.run(rate())
    if as_json:
        typer.echo(
            json_text(
                {
                    "rated_agents": result.rated_agents,
                    "cohort_rated": result.cohort_rated,
                    "lessons": result.lessons,
                }
            )
        )
        return
    out = console(stderr=True)
    out.print(f"rated {len(result.rated_agents)} agent(s){' and the team' if result.cohort_rated else ''}")
    for agent_id, lessons in result.lessons.items():
        for lesson in lessons:
            out.print(f"lesson for {shown(agent_id)}: {shown(lesson, lines=True)}", highlight=False)


def _memory() -> MemoryStore:
    from ..registry.memory import MemoryStore

    settings = load_settings()
    return MemoryStore(_store(), ttl_days=settings.memory_ttl_days, max_items=settings.memory_max_items)


def _print_memories(items: list[MemoryItem], as_json: bool) -> None:
    if as_json:
        typer.echo(json_text([item.to_json_dict() for item in items]))
        return
    for item in items:
        console().print(
            f"{shown(item.id)}  {shown(f'{item.kind:<7}')}  {shown(item.created_at[:10])}  "
            f"{shown(item.text[:100])}",
            highlight=False,
            soft_wrap=True,
        )


KindOption = Annotated[
    str | None, typer.Option("--kind", help="Only facts (kept by agents) or episodes (past runs).")
]


def _kind(kind: str | None) -> MemoryKind | None:
    from ..errors import ConfigError

    if kind not in (None, "fact", "episode"):
        raise ConfigError(f"--kind must be fact or episode, got {kind!r}")
    return kind  # type: ignore[return-value]


@memory_app.command("list")
def memory_list(kind: KindOption = None, as_json: JsonFlag = False) -> None:
    """Every memory that has not expired, most recently used first."""
    _print_memories(_memory().list(_kind(kind)), as_json)


@memory_app.command("search")
def memory_search(
    query: Annotated[str, typer.Argument(help="What to look for.")],
    kind: KindOption = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=100, help="How many results.")] = 5,
    as_json: JsonFlag = False,
) -> None:
    """The memories most like QUERY (as an agent's recall finds them; this renews them too)."""
    _print_memories(_memory().recall(query, limit, _kind(kind)), as_json)


@memory_app.command("rm")
def memory_rm(memory_id: Annotated[str, typer.Argument(help="The memory's id.")]) -> None:
    """Forget one memory."""
    _memory().forget(memory_id)
    console(stderr=True).print(f"forgot {shown(memory_id)}", highlight=False, soft_wrap=True)
