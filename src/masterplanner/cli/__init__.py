"""The `masterplanner` command: errors become one line on stderr and an exit code.

Exit codes: 0 success, 1 failure, 2 usage or configuration error. `--debug` adds the traceback.
Text the CLI did not write (model and tool output, stored plans and agents, error messages) is
printed through `terminal.shown` / `terminal.visible`: escape sequences are shown, not obeyed.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import NoReturn

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `masterplanner` console script."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    problem = _not_utf8(args)
    if problem is not None:
        from ..errors import ConfigError

        _fail(ConfigError(problem), debug)
    try:
        _dispatch(args, debug)
    except Exception as error:  # not ours (a bug): Python's traceback, printed as raised before
        _redacted_traceback(error)
        sys.exit(1)


def _dispatch(args: list[str], debug: bool) -> None:
    """Run the command `args` name; an error of ours is one line (`_fail`), a stop by a signal too."""
    import typer

    from ..errors import MasterplannerError
    from .app import app
    from .usage import is_no_args_help, is_usage_error, usage_problem

    terminated = _stop_on_sigterm()
    # pydantic-ai's first-run console banner is not ours to show (it landed inside the live view)
    os.environ.setdefault("PYDANTIC_AI_NO_BANNER", "1")
    try:
        # not standalone: click's usage errors come here to be said in our words (`usage.py`),
        # and an exit code (`typer.Exit`) comes back as the result
        code = app(args=args, prog_name="masterplanner", standalone_mode=False)
    except typer.Abort:  # standard input ended (EOF) where a command read it: typer said "Aborted!"
        _fail(RuntimeError("standard input ended before the command was done"), debug)
    except MasterplannerError as exc:
        _fail(exc, debug)
    except ExceptionGroup as group:  # raised from a task group: one of ours inside is still one line
        ours, others = group.split(MasterplannerError)
        if ours is None or others is not None:
            raise
        first: BaseException = ours
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        _fail(first, debug, trace=group)
    except KeyboardInterrupt:
        _interrupted(bool(terminated))
    except Exception as exc:  # click's usage errors (typer's copy of click has no public name for them)
        if is_no_args_help(exc):  # a group without its command: its help, as typer shows it
            exc.show()  # type: ignore[attr-defined]
            sys.exit(2)
        if not is_usage_error(exc):
            raise
        from ..errors import ConfigError

        _fail(ConfigError(usage_problem(exc)), False)  # nothing was raised: no traceback to show
    if code == 130:  # typer's (silent) exit for a KeyboardInterrupt
        _interrupted(bool(terminated))
    if isinstance(code, int) and not isinstance(code, bool):
        sys.exit(code)


def _redacted_traceback(error: BaseException) -> None:
    """Print the traceback of an error that is not ours (a bug), redacted, as Python would print it.

    Python printed it as raised: a library's exception quoting a key or a URL's password went
    to stderr whole, with or without `--debug`. (Not a `sys.excepthook`: typer sets its own.)
    """
    import traceback

    from ..redaction import redacted_traceback

    sys.stderr.write(redacted_traceback("".join(traceback.format_exception(error))))
    sys.stderr.flush()


def _not_utf8(args: list[str]) -> str | None:
    """What is wrong with the first argument that is not UTF-8 text, or None.

    Python keeps such bytes as lone surrogates, which every later write (the database, a
    message, a file name) refused with a traceback.
    """
    for number, arg in enumerate(args, start=1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raw = arg.encode("utf-8", "surrogateescape")
            return f"argument {number} ({raw!r}) is not UTF-8 text; give it in UTF-8"
    return None


def _interrupted(by_sigterm: bool) -> NoReturn:
    """Say the command was stopped (Ctrl-C, or SIGTERM) and exit with the shell's code for it."""
    from ..logs import json_lines, log
    from .app import console

    if json_lines():  # `worker` or `serve` with log_format = json: the last line is JSON too
        log("cli", "terminated (SIGTERM)" if by_sigterm else "interrupted", event="stopped")
        sys.exit(128 + (signal.SIGTERM if by_sigterm else signal.SIGINT))
    err = console(stderr=True)
    # a spinner stopped by the interrupt (the one beside a question, say) may have left the
    # terminal's cursor hidden
    err.show_cursor(True)
    if by_sigterm:
        err.print("[bold red]terminated[/] (SIGTERM)")
        sys.exit(128 + signal.SIGTERM)
    err.print("[bold red]interrupted[/]")
    sys.exit(128 + signal.SIGINT)


def _stop_on_sigterm() -> list[int]:
    """Make SIGTERM stop a command as Ctrl-C does; the list returned gets the signal when it comes.

    Without this a SIGTERM (`kill`, a service manager stopping the process) ended the process
    where it stood, without the clean stop Ctrl-C gets: the run's hold released, open requests
    left open for `runs resume`. `worker` and `serve` put their own handlers in its place.
    """
    received: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        ctrl_c = signal.getsignal(signal.SIGINT)  # asyncio's own while a loop runs
        if callable(ctrl_c):
            ctrl_c(signal.SIGINT, frame)  # raises KeyboardInterrupt, or cancels the loop's main task
            return
        raise KeyboardInterrupt  # Ctrl-C ignored here (a background job of a shell)

    signal.signal(signal.SIGTERM, stop)
    return received


def _fail(error: BaseException, debug: bool, trace: BaseException | None = None) -> NoReturn:
    """Print `error` as one sanitised line (after the traceback with --debug) and exit with its code."""
    import traceback

    from ..redaction import redacted, redacted_traceback
    from .app import console
    from .terminal import shown

    stderr = console(stderr=True)
    if debug:
        # the message may quote model output: printed through the same sanitiser as the rest;
        # and the exceptions it chains may quote a key a server echoed or a URL with its password
        # (ours are redacted, a library's are not): redacted as a whole, as logs are
        lines = redacted_traceback("".join(traceback.format_exception(trace or error)).rstrip("\n"))
        stderr.print(shown(lines, lines=True), highlight=False, soft_wrap=True)
    # one line, whatever the message holds (newlines, escape sequences, rich markup), and no
    # secret in it: the traceback's last line took out a key the message quoted, and the line
    # below it showed the key whole
    stderr.print(f"[bold red]error:[/] {shown(redacted(str(error)))}", highlight=False, soft_wrap=True)
    sys.exit(getattr(error, "exit_code", 1))
