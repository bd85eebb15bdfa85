"""`masterplanner agents …`, `cohorts …`, `memory …`, `registry …`: the agent registry from the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from ..usage import counted
from .common import app, console, load_settings, whole_number
from .runs import RunId
from .terminal import json_text, shown

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from ..registry import AgentSpec
    from ..registry.memory import MemoryItem, MemoryKind
    from ..service import RegistryService

agents_app = typer.Typer(
    help="List, inspect, search, edit, remove, export and import agents.", no_args_is_help=True
)
cohorts_app = typer.Typer(
    help="List, inspect and remove cohorts (teams that ran a task).", no_args_is_help=True
)
memory_app = typer.Typer(
    help="List, search and remove what agents remembered and the accounts of past runs.",
    short_help="List, search and remove agents' memories.",
    no_args_is_help=True,
)
registry_app = typer.Typer(
    help="Look after the registry as a whole: make its search vectors again.",
    short_help="Make the registry's search vectors again.",
    no_args_is_help=True,
)
app.add_typer(agents_app, name="agents")
app.add_typer(cohorts_app, name="cohorts")
app.add_typer(memory_app, name="memory")
app.add_typer(registry_app, name="registry")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON.")]
_T = TypeVar("_T")


def _registry(call: Callable[[RegistryService], Awaitable[_T]]) -> _T:
    """Run one call of the registry service (then close it)."""
    import asyncio

    from ..service import RegistryService

    service = RegistryService(load_settings())

    async def run() -> _T:
        return await call(service)

    try:
        return asyncio.run(run())
    finally:
        service.close()


def _row(agent: AgentSpec) -> dict[str, object]:
    return agent.model_dump(mode="json") | {
        "success_rate": agent.stats.success_rate,
        "mean_rating": agent.stats.mean_rating,
    }


@agents_app.command("list")
def agents_list(as_json: JsonFlag = False) -> None:
    """Every agent, most recently updated first."""
    from rich.table import Column, Table

    agents = _registry(lambda service: service.agents())
    if as_json:
        typer.echo(json_text([_row(agent) for agent in agents]))
        return
    if not agents:
        console(stderr=True).print("no agents yet (a run that succeeds stores its team's)", highlight=False)
        return
    table = Table(Column("id", overflow="fold"), "name", "role", "version", "uses", "success", "rating")
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
    agent_id: Annotated[str, typer.Argument(metavar="AGENT_ID", help="The agent's id.")],
    version: Annotated[
        int | None, typer.Option("--version", parser=whole_number(1), help="An older version.")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """One agent: prompt, tools, origin, stats, lessons, versions."""

    async def read(service: RegistryService) -> tuple[AgentSpec, list[int]]:
        agent = await service.agent(agent_id, version)
        return agent, await service.versions(agent.id)

    agent, versions = _registry(read)
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
    out.print("[bold]prompt[/]" + (" [yellow](written by a person)[/]" if agent.prompt_by_person else ""))
    out.print(shown(agent.system_prompt, lines=True), highlight=False)
    for lesson in agent.lessons:
        out.print(f"[yellow]lesson[/] {shown(lesson, lines=True)}", highlight=False)


@agents_app.command("search")
def agents_search(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What the agent should do.")],
    limit: Annotated[int, typer.Option("--limit", parser=whole_number(), help="How many results.")] = 5,
    as_json: JsonFlag = False,
) -> None:
    """Agents whose role, description, keywords or prompt match QUERY (BM25 with a track-record prior)."""
    results = _registry(lambda service: service.search_agents(query, limit))
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
def agents_edit(agent_id: Annotated[str, typer.Argument(metavar="AGENT_ID", help="The agent's id.")]) -> None:
    """Edit an agent in $VISUAL or $EDITOR (JSON); saving makes a new version, older ones stay readable."""
    from ..errors import ConfigError
    from ..review import edit_in_editor
    from ..text_files import json_problem

    agent = _registry(lambda service: service.agent(agent_id))
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
    except json.JSONDecodeError as exc:
        raise ConfigError(f"the edit is not valid JSON, nothing changed: {json_problem(exc)}") from None
    stored = _registry(lambda service: service.edit_agent(agent.id, data))
    console(stderr=True).print(
        f"agent {shown(stored.id)} is now version {stored.version}", highlight=False, soft_wrap=True
    )
    if isinstance(data, dict) and data.get("prompt_by_person") is False and stored.prompt_by_person:
        why = "stays true" if agent.prompt_by_person else "is now true (its prompt is yours)"
        console(stderr=True).print(
            f"prompt_by_person {why}: runs that reuse the agent have the model work under its prompt"
        )


@agents_app.command("rm")
def agents_rm(agent_id: Annotated[str, typer.Argument(metavar="AGENT_ID", help="The agent's id.")]) -> None:
    """Remove an agent and every version of it."""
    _registry(lambda service: service.remove_agent(agent_id))
    console(stderr=True).print(f"removed agent {shown(agent_id)}", highlight=False, soft_wrap=True)


@agents_app.command("export")
def agents_export(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="The JSON-lines file to write.")],
) -> None:
    """Write every agent to a JSON-lines file (import reads it back exactly)."""
    count = _registry(lambda service: service.export_agents(path))
    console(stderr=True).print(
        f"exported {counted(count, 'agent')} to {shown(path)}", highlight=False, soft_wrap=True
    )


@agents_app.command("import")
def agents_import(
    path: Annotated[Path, typer.Argument(metavar="PATH", help="A JSON-lines file from `agents export`.")],
) -> None:
    """Read agents from a JSON-lines file: all of them, or none if any line is invalid.

    An agent not stored yet is added; one stored already gets the imported one as its next
    version (its history, track record and lessons here are kept), unless they are the same.
    Of the file's lessons it gains only those none of its versions had: a lesson removed since
    (by an edit, or let go as it learned) stays removed.
    """
    done = _registry(lambda service: service.import_agents(path))
    parts = [f"{len(done.added)} new", f"{len(done.updated)} updated (a new version)"]
    parts.append(f"{len(done.unchanged)} unchanged")
    console(stderr=True).print(f"imported {shown(path)}: {', '.join(parts)}", highlight=False, soft_wrap=True)


@cohorts_app.command("list")
def cohorts_list(as_json: JsonFlag = False) -> None:
    """Every cohort, newest first."""
    cohorts = _registry(lambda service: service.cohorts())
    if as_json:
        typer.echo(json_text([cohort.model_dump(mode="json") for cohort in cohorts]))
        return
    if not cohorts:
        console(stderr=True).print("no cohorts yet (a run that succeeds stores its team)", highlight=False)
    for cohort in cohorts:
        console().print(
            f"{shown(cohort.id)}  {shown(cohort.outcome)}  {shown(cohort.task[:80])}",
            highlight=False,
            soft_wrap=True,
        )


@cohorts_app.command("show")
def cohorts_show(
    cohort_id: Annotated[str, typer.Argument(metavar="COHORT_ID", help="The cohort's id.")],
    as_json: JsonFlag = False,
) -> None:
    """One cohort: task, plan shape, agents, outcome, rating."""
    cohort = _registry(lambda service: service.cohort(cohort_id))
    typer.echo(json_text(cohort.model_dump(mode="json"), indent=2 if as_json else 1))


@cohorts_app.command("rm")
def cohorts_rm(
    cohort_id: Annotated[str, typer.Argument(metavar="COHORT_ID", help="The cohort's id.")],
) -> None:
    """Remove a cohort (its agents stay)."""
    _registry(lambda service: service.remove_cohort(cohort_id))
    console(stderr=True).print(f"removed cohort {shown(cohort_id)}", highlight=False, soft_wrap=True)


@app.command(short_help="Rate a finished run; a rating of 2 or less teaches its agents lessons.")
def feedback(
    run_id: RunId,
    rating: Annotated[int, typer.Option("--rating", parser=whole_number(), help="1 (bad) to 5 (excellent).")],
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

    from ..service import RunService, answerer_name

    async def rate() -> Any:
        service = RunService(load_settings())
        try:
            return await service.feedback(
                run_id, rating=rating, comment=comment, model=model, by=answerer_name("cli")
            )
        finally:
            service.close()

    if as_json:
        result = asyncio.run(rate())
    else:  # a low rating waits on a model call, a minute or more with the embedded model
        from ..feedback import LOW_RATING

        analysis = " and asking its model what went wrong" if rating <= LOW_RATING else ""
        with console(stderr=True).status(f"rating run {shown(run_id)}{analysis}…"):
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
    out.print(
        f"rated {counted(len(result.rated_agents), 'agent')}{' and the team' if result.cohort_rated else ''}",
        highlight=False,
    )
    for agent_id, lessons in result.lessons.items():
        for lesson in lessons:
            out.print(f"lesson for {shown(agent_id)}: {shown(lesson, lines=True)}", highlight=False)


def _print_memories(items: list[MemoryItem], as_json: bool, *, none: str) -> None:
    if as_json:
        typer.echo(json_text([item.to_json_dict() for item in items]))
        return
    if not items:
        console(stderr=True).print(none, highlight=False)
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
    chosen = _kind(kind)
    _print_memories(_registry(lambda service: service.memories(chosen)), as_json, none="no memories")


@memory_app.command("search")
def memory_search(
    query: Annotated[str, typer.Argument(metavar="QUERY", help="What to look for.")],
    kind: KindOption = None,
    limit: Annotated[int, typer.Option("--limit", parser=whole_number(1, 100), help="How many results.")] = 5,
    as_json: JsonFlag = False,
) -> None:
    """The memories most like QUERY (as an agent's recall finds them; this renews them too)."""
    chosen = _kind(kind)
    found = _registry(lambda service: service.recall(query, limit, chosen))
    _print_memories(found, as_json, none="no memories match")


@memory_app.command("rm")
def memory_rm(
    memory_id: Annotated[str, typer.Argument(metavar="MEMORY_ID", help="The memory's id.")],
) -> None:
    """Forget one memory."""
    _registry(lambda service: service.forget(memory_id))
    console(stderr=True).print(f"forgot {shown(memory_id)}", highlight=False, soft_wrap=True)


@registry_app.command("reembed")
def registry_reembed(as_json: JsonFlag = False) -> None:
    """Embed every agent, team and memory again with the configured embedder, replacing their vectors.

    Searches make the vectors an item lacks, and those made before a change to how texts are
    embedded, by themselves; this makes all of them now (progress on stderr), for vectors made
    wrongly all the same: by a server that answered wrongly, or another model served under the
    embedder's name.
    """
    import time

    from rich.progress import Progress, TimeElapsedColumn

    from ..service import RegistryService

    settings = load_settings()
    service = RegistryService(settings)
    title = shown(f"embedding with {settings.embedder}")
    started = time.monotonic()
    try:
        with Progress(
            *Progress.get_default_columns(), TimeElapsedColumn(), console=console(stderr=True)
        ) as progress:
            bar = progress.add_task(title, total=None)

            def show(done: int, total: int) -> None:
                progress.update(bar, completed=done, total=total)

            import asyncio

            done = asyncio.run(service.reembed(show))
    finally:
        service.close()
    seconds = round(time.monotonic() - started, 1)
    if as_json:
        typer.echo(
            json_text(
                {
                    "embedder": done.embedder,
                    "agents": done.made["agent"],
                    "cohorts": done.made["cohort"],
                    "memories": done.made["memory"],
                    "changed_meanwhile": done.changed,
                    "seconds": seconds,
                }
            )
        )
        return
    counts = (
        f"{counted(done.made['agent'], 'agent')}, {counted(done.made['cohort'], 'team')} and "
        f"{counted(done.made['memory'], 'memory', 'memories')}"
    )
    line = f"re-embedded {counts} with {done.embedder} in {seconds:g} s"
    if done.changed:
        line += f"; {done.changed} changed while embedded, left for the next search to embed"
    console(stderr=True).print(shown(line), highlight=False, soft_wrap=True)
