"""The `masterplanner` command: errors become one line on stderr and an exit code.

Exit codes: 0 success, 1 failure, 2 usage or configuration error. `--debug` adds the traceback.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `masterplanner` console script."""
    from ..errors import MasterplannerError
    from .app import app, console

    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        app(args=args, prog_name="masterplanner")
    except MasterplannerError as exc:
        stderr = console(stderr=True)
        if debug:
            stderr.print_exception()
        stderr.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        console(stderr=True).print("[bold red]interrupted[/]")
        sys.exit(130)
