"""The typer application: thin commands over the library.

Heavy libraries (pydantic-ai, llama.cpp, dbos) are imported inside commands, never at module
level, so `masterplanner --help` starts fast.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from .._version import __version__

if TYPE_CHECKING:
    from ..doctor import Check
    from ..settings import Settings

app = typer.Typer(
    name="masterplanner",
    help="Turn a high-level task into a reviewed, executed plan of cooperating LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

stdout = Console()
stderr = Console(stderr=True)


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


@app.command()
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON.")] = False,
) -> None:
    """Check the embedded model, llama.cpp, the database and the sandbox prerequisites."""
    from ..doctor import run_checks
    from ..settings import Settings

    settings = Settings.load()
    if as_json:
        checks = run_checks(settings)
        typer.echo(json.dumps({"checks": [check.to_dict() for check in checks]}, indent=2))
    else:
        with stderr.status("checking…") as status:
            checks = run_checks(settings, on_start=lambda name: status.update(f"checking {name}…"))
        _print_checks(checks, settings)
    if not all(check.ok for check in checks if check.required):
        raise typer.Exit(1)


def _print_checks(checks: list[Check], settings: Settings) -> None:
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 2, 0, 0))
    table.add_column("check")
    table.add_column("status")
    table.add_column("found")
    table.add_column("fix")
    for check in checks:
        if check.ok:
            status = "[green]ok[/]"
        elif check.required:
            status = "[red]missing[/]"
        else:
            status = "[yellow]missing (optional)[/]"
        table.add_row(check.name, status, check.detail, check.fix)
    stdout.print(table)
    stdout.print(f"home: {settings.home}   model: {settings.model}")


@app.command()
def chat(
    prompt: Annotated[str, typer.Argument(help="What to ask the model.")],
    model: Annotated[
        str | None, typer.Option("--model", "-m", help="Model spec: local, openai:NAME, scripted:FILE, …")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the answer and usage as JSON.")] = False,
) -> None:
    """Send one prompt through the model layer and print the answer and its usage."""
    from ..chat import chat as run_chat

    if as_json:
        result = run_chat(prompt, model=model)
        typer.echo(json.dumps(result.to_dict(), indent=2))
        return
    with stderr.status(f"asking {model or 'the configured model'}…"):
        result = run_chat(prompt, model=model)
    typer.echo(result.output)
    usage = result.usage["by_purpose"].get("chat", {})
    stderr.print(
        f"[dim]model {result.model} · {usage.get('calls', 0)} call(s) · {usage.get('input_tokens', 0)} in / "
        f"{usage.get('output_tokens', 0)} out tokens · {usage.get('seconds', 0)} s[/]"
    )
