"""What every command module shares: the Typer application object, the consoles, the settings.

Command modules (`commands.py`, `runs.py`, `registry.py`) import from here and register their
commands on `app`; `app.py` imports them all, so nothing here imports a command module.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic_core import PydanticCustomError

from .. import __version__
from .terminal import shown

if TYPE_CHECKING:
    from rich.console import Console

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
    """The rich console for stdout or stderr (rich is imported on first use, not at start-up).

    Emoji codes stay text (`:x:` in a model's reply is not an emoji); text from models, tools
    and stores goes in through `terminal.shown`.
    """
    from rich.console import Console

    return Console(stderr=stderr, emoji=False)


def load_settings(**flags: Any) -> Settings:
    """The settings for a command (flags win); warns once about a settings file that was not read."""
    from ..settings import Settings

    settings = Settings.load(**flags)
    if settings.ignored_config and not _warned:
        path, reason = settings.ignored_config
        console(stderr=True).print(
            f"[yellow]warning:[/] {shown(str(path))} is not read: {shown(reason)}",
            highlight=False,
            soft_wrap=True,
        )
        _warned.append(path)
    return settings


_warned: list[Path] = []


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


def whole_number(low: int | None = None, high: int | None = None) -> Callable[[object], int]:
    """The parser of a whole-number option, refusing anything else in our words.

    typer converts option values with pydantic, whose sentences ("Input should be a valid
    integer, unable to parse string as an integer") it showed; `low`/`high` bound the value.
    """

    def parse(value: object) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            digits = text.removeprefix("-")
            if not (digits.isascii() and digits.isdigit()):
                raise PydanticCustomError(
                    "whole_number", "must be a whole number, not '{text}'", {"text": text[:40]}
                )
            number = int(text)
        if (low is not None and number < low) or (high is not None and number > high):
            if low is not None and high is not None:
                bounds = f"from {low:,} to {high:,}"
            else:
                bounds = f"at least {low:,}" if low is not None else f"at most {high:,}"
            raise PydanticCustomError(
                "bounds", "must be {bounds}, not {number}", {"bounds": bounds, "number": number}
            )
        return number

    return parse


def number(value: object) -> float:
    """The parser of a number option (seconds, US dollars), refusing anything else in our words."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip()
    try:
        if not text.isascii():  # float() reads other scripts' digits too
            raise ValueError(text)
        return float(text)
    except ValueError:
        raise PydanticCustomError("number", "must be a number, not '{text}'", {"text": text[:40]}) from None
