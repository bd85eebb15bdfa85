"""click's usage errors (an unknown option, a missing argument, a bad value) in our words.

typer (its own copy of click, or click itself in older versions) said them in three lines of
its own: the usage, "Try 'masterplanner run --help' for help." and "Error: No such option:
--nosuch". `usage_problem` makes one line naming the command, what is wrong and, where it helps,
where to look; `cli.main` prints it as any error (exit code 2). The errors are told apart by
their class names and fields, which both copies of click share.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["is_usage_error", "usage_problem"]

_EXTRA_ARGUMENTS = re.compile(r"^Got unexpected extra argument\S* \((?P<args>.*)\)$", re.DOTALL)
_NO_COMMAND = re.compile(
    r"^No such command (?P<name>'.*'|\".*\")\.(?: Did you mean (?P<close>.*)\?)?$", re.DOTALL
)


def _kinds(error: BaseException) -> set[str]:
    return {kind.__name__ for kind in type(error).__mro__}


def is_usage_error(error: BaseException) -> bool:
    """Whether `error` is click's `UsageError` (a command line typer could not parse)."""
    return "UsageError" in _kinds(error) and hasattr(error, "ctx")


def is_no_args_help(error: BaseException) -> bool:
    """Whether `error` is click's way of showing a group's help when no command was given."""
    return "NoArgsIsHelpError" in _kinds(error)


def usage_problem(error: Any) -> str:
    """What is wrong with a command line, as `error: …` says it (`error`: click's `UsageError`)."""
    kinds = _kinds(error)
    ctx = getattr(error, "ctx", None)
    command = ctx.command_path if ctx is not None else "masterplanner"
    path, help_ = f"`{command}`", f"`{command} --help`"
    message = str(getattr(error, "message", ""))
    if "NoSuchOption" in kinds:
        closest = _closest(getattr(error, "possibilities", None))
        return f"{path} has no option {error.option_name}{closest} ({help_} lists its options)"
    no_command = _NO_COMMAND.match(message)
    if no_command:
        close = no_command["close"]
        closest = f"; the closest: {close.replace(chr(39), '')}" if close else ""
        closest = closest or _closest(getattr(error, "possibilities", None))
        return f"{path} has no command {no_command['name']}{closest} ({help_} lists its commands)"
    param = getattr(error, "param", None)
    if "MissingParameter" in kinds and param is not None:
        kind = getattr(param, "param_type_name", "option")
        return f"{path} needs the {kind} {_name(param)} ({help_} says what it takes)"
    if "BadParameter" in kinds:
        hint = _name(param) if param is not None else getattr(error, "param_hint", None) or "a value"
        return f"{hint} {_lowered(message)}"  # as the run options' own: "--max-parallel must be …"
    if "BadOptionUsage" in kinds:
        option = getattr(error, "option_name", "the option")
        return f"{option} {'takes no value' if 'does not take a value' in message else 'needs a value'}"
    extra = _EXTRA_ARGUMENTS.match(message)
    if extra:
        # click joins them with spaces: `a "b c"` and `a b c` read alike, so they are quoted as one
        return f"{path} takes no more arguments, got: {extra['args']} (text with spaces goes in quotes)"
    if message == "Missing command.":
        return f"{path} needs a command ({help_} lists its commands)"
    return f"{path}: {_lowered(message).rstrip('.')}"


def _name(param: Any) -> str:
    """An option as typed (`--limit`), an argument as the help shows it (`TASK`)."""
    if getattr(param, "param_type_name", None) == "argument":
        return str(param.name or "").upper()
    opts = [opt for opt in getattr(param, "opts", ()) if opt.startswith("--")] or list(
        getattr(param, "opts", ())
    )
    return str(opts[0]) if opts else str(getattr(param, "name", "") or "")


def _closest(possibilities: Any) -> str:
    return f"; the closest: {', '.join(possibilities)}" if possibilities else ""


def _lowered(text: str) -> str:
    return text[:1].lower() + text[1:]
