"""The typer application: thin commands over the library.

Heavy libraries (pydantic-ai, llama.cpp, dbos) are imported inside commands, never at module
level, so `masterplanner --help` starts fast.
"""

from __future__ import annotations

import json
from functools import cache
from typing import TYPE_CHECKING, Annotated

import typer

from .._version import __version__

if TYPE_CHECKING:
    from rich.console import Console

    from ..doctor import Check
    from ..plan import Plan
    from ..settings import Settings

app = typer.Typer(
    name="masterplanner",
    help="Turn a high-level task into a reviewed, executed plan of cooperating LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@cache
def console(*, stderr: bool = False) -> Console:
    """The rich console for stdout or stderr (rich is imported on first use, not at start-up)."""
    from rich.console import Console

    return Console(stderr=stderr)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"masterplanner {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show tracebacks and library logs on errors.")
    ] = False,
) -> None:
    """masterplanner: plan, review and run teams of LLM agents. Works offline with the embedded model."""


@app.command(short_help="Check the model, database and sandbox prerequisites.")
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Check that everything masterplanner needs is installed and working.

    Covers the embedded model file, llama.cpp, the database and the sandbox prerequisites; each
    problem comes with the command that fixes it. Exit code 0 when every required check passes.
    """
    from ..doctor import run_checks
    from ..settings import Settings

    settings = Settings.load()
    if as_json:
        checks = run_checks(settings)
        typer.echo(json.dumps({"checks": [check.to_dict() for check in checks]}, indent=2))
    else:
        with console(stderr=True).status("checking…") as status:
            checks = run_checks(settings, on_start=lambda name: status.update(f"checking {name}…"))
        _print_checks(checks, settings)
    if not all(check.ok for check in checks if check.required):
        raise typer.Exit(1)


def _print_checks(checks: list[Check], settings: Settings) -> None:
    out = console()
    width = max(len(check.name) for check in checks)
    for check in checks:
        if check.ok:
            status = "[green]ok      [/]"
        elif check.required:
            status = "[red]missing [/]"
        else:
            status = "[yellow]optional[/]"
        out.print(f"{status} {check.name:<{width}}  {check.detail}", highlight=False, soft_wrap=True)
        if check.fix and not check.ok:
            out.print(f"         {'':<{width}}  fix: [bold]{check.fix}[/]", highlight=False, soft_wrap=True)
    out.print(f"home {settings.home} · model {settings.model}", style="dim", highlight=False, soft_wrap=True)


@app.command()
def chat(
    prompt: Annotated[str, typer.Argument(help="What to ask the model.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec: local, openai:NAME, scripted:FILE, …")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer and usage as JSON.")] = False,
) -> None:
    """Send one prompt to a model and print the answer.

    The answer goes to stdout and its usage (calls, tokens, seconds) to stderr, or both as JSON
    with --json. Works offline with the embedded model (--model local).
    """
    from ..chat import chat as run_chat

    if as_json:
        result = run_chat(prompt, model=model)
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    with console(stderr=True).status(f"asking {model or 'the configured model'}…"):
        result = run_chat(prompt, model=model)
    typer.echo(result.output)
    usage = result.usage["by_purpose"].get("chat", {})
    console(stderr=True).print(
        f"[dim]model {result.model} · {usage.get('calls', 0)} call(s) · {usage.get('input_tokens', 0)} in / "
        f"{usage.get('output_tokens', 0)} out tokens · {usage.get('seconds', 0)} s[/]"
    )


@app.command(short_help="Plan a task: steps, tools and dependencies.")
def plan(
    task: Annotated[str, typer.Argument(help="The task to plan.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec (default: the model setting).")
    ] = None,
    tools: Annotated[
        str | None, typer.Option("--tools", help="Comma-separated tools the plan may use (default: all).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
) -> None:
    """Break TASK into a dependency graph of steps, each with an agent role and tools.

    The plan is validated (unique ids, known dependencies and tools, no cycles, size limits);
    an invalid proposal goes back to the model for repair, at most twice.
    """
    import asyncio

    from ..errors import ConfigError
    from ..models import resolve_model
    from ..planner import plan as make_plan
    from ..settings import Settings
    from ..tools import builtin_catalog
    from ..usage import UsageLedger

    settings = Settings.load(model=model)
    catalog = builtin_catalog()
    if tools:
        try:
            catalog = catalog.subset(name.strip() for name in tools.split(",") if name.strip())
        except KeyError as exc:
            raise ConfigError(f"--tools: {exc.args[0]}; available: {', '.join(catalog.names)}") from None
    chosen = resolve_model(settings.model, settings)
    ledger = UsageLedger()
    if as_json:
        result = asyncio.run(make_plan(task, catalog, model=chosen, ledger=ledger))
        typer.echo(json.dumps(result.to_json_dict(), indent=2))
        return
    with console(stderr=True).status(f"planning with {settings.model}…"):
        result = asyncio.run(make_plan(task, catalog, model=chosen, ledger=ledger))
    _print_plan(result)
    usage = ledger.by_purpose().get("planner", {})
    console(stderr=True).print(
        f"[dim]{usage.get('calls', 0)} planner call(s) · {usage.get('input_tokens', 0)} in / "
        f"{usage.get('output_tokens', 0)} out tokens · {usage.get('seconds', 0)} s[/]"
    )


def _print_plan(result: Plan) -> None:
    from rich.markup import escape
    from rich.tree import Tree

    from ..plan import topological_order

    tree = Tree(f"[bold]{escape(result.task)}[/]")
    for step_id in topological_order(result):
        step = result.step(step_id)
        after = (
            f" [dim]after {', '.join(step.depends_on)}[/]" if step.depends_on else " [dim](starts at once)[/]"
        )
        branch = tree.add(f"[bold cyan]{step.id}[/] {escape(step.title)}{after}")
        branch.add(f"[dim]role[/] {escape(step.agent_role)}   [dim]tools[/] {', '.join(step.tools) or '—'}")
        branch.add(escape(step.instruction))
        if step.expected_output:
            branch.add(f"[dim]→ {escape(step.expected_output)}[/]")
    console().print(tree)
