"""Runs a stdio MCP server so that it ends with the process that started it, even on kill -9 (Linux).

`python -I -S mcp_guard.py [--report=FILE] PARENT_PID EXECUTABLE ARGV0 [ARG ...]` is what
`tools/mcp.py` starts in place of a server's command. Before, a server outlived a `masterplanner
run` or `worker` killed with SIGKILL (nothing was left to stop it) and ran on, orphaned, for ever.

The guard asks the kernel for SIGHUP when its parent dies (`PR_SET_PDEATHSIG`), then checks its
parent is still `PARENT_PID` (one that died before that request sends nothing), forks the server
(`EXECUTABLE` run with `ARGV0 ARG ...`, its standard streams the guard's) and waits for it,
ending as it ends. On SIGHUP it kills its whole process group with SIGKILL: the MCP library
starts the guard in a session of its own, so the group is the server and whatever the server
started (`npx`, `uvx` and `docker` run the real server as a child), not only the guard's child.

A server that cannot be executed (a script without a `#!` line: "Exec format error"; one whose
`#!` interpreter is missing) only closed its pipes: its starter saw a closed connection, and the
reason was in the server's log alone. The guard writes the `errno` of the failed exec into FILE
(made by the starter, empty until then), which the starter reads once the connection fails and
turns into an error naming the reason (`tools/mcp.py` `_exec_failure`).

A normal stop is as before: the library closes the server's standard input, then sends SIGTERM
and, 2 s later, SIGKILL to the group; the guard lets the server handle SIGTERM and ends with it.
The signal on the parent's death comes when the *thread* that started the guard ends: the
library starts it from the event loop that runs the whole client session, which outlives it.

Run as a file with `-I -S`: nothing of masterplanner nor of the site is imported, so it starts
in a few tens of milliseconds. Only the standard library.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from types import FrameType

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_PARENT_GONE = signal.SIGHUP
_CANNOT_START = 127  # what a shell answers for a command it cannot run


_report_path: str | None = None
"""The starter's report file (`--report`): removed here when the starter dies, which cannot."""


def _end_group(signum: int, frame: FrameType | None) -> None:
    """The parent died: the server and everything it started end now (the guard too).

    The starter's report file goes too: the starter removes it when the session ends, which a
    starter killed with SIGKILL never does (one file a call was left in the temporary folder).
    """
    _forget_report()
    os.killpg(0, signal.SIGKILL)


def _forget_report() -> None:
    if _report_path is not None:
        try:
            os.unlink(_report_path)
        except OSError:
            pass  # gone already (the starter ended its session first); the group is ended regardless


def _let_the_server_stop(signum: int, frame: FrameType | None) -> None:
    """SIGTERM reaches the whole group at a normal stop: the server's to handle, the guard waits for it."""


def _say(message: str) -> None:
    """A line in the server's log (the guard's standard error is the server's)."""
    os.write(2, f"masterplanner (MCP server guard): {message}\n".encode(errors="replace"))


def _run_server(executable: str, argv: list[str], report: str | None) -> None:
    """In the forked child: the signals as a freshly started program has them, then the server.

    An exec that fails is said in the log and, with `report`, its errno written there for the
    starter: before the child ends, so before the starter can see the pipes close.
    """
    for number in (_PARENT_GONE, signal.SIGTERM, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_DFL)  # Python ignores SIGPIPE and SIGXFSZ; exec keeps that
    try:
        os.execv(executable, argv)
    except OSError as exc:
        _say(f"cannot start {argv[0]}: {exc.strerror}")
        if report is not None and exc.errno is not None:
            _report(report, exc.errno)
    os._exit(_CANNOT_START)


def _report(path: str, errno: int) -> None:
    """Write `errno` into the starter's report file (one the starter made: never created here)."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    except OSError as exc:
        _say(f"cannot tell its starter why: {exc.strerror}")
        return
    try:
        os.write(descriptor, f"{errno}\n".encode())
    finally:
        os.close(descriptor)


def _ended_as(pid: int) -> int:
    """Wait for the server; its exit code, or the negative number of the signal that ended it."""
    _, status = os.waitpid(pid, 0)  # a signal handled meanwhile (SIGTERM) resumes the wait
    return os.waitstatus_to_exitcode(status)


def main(arguments: list[str]) -> int:
    """Start the server named by `arguments` (`[--report=FILE] PARENT_PID EXECUTABLE ARGV0 [ARG ...]`).

    Its exit code.
    """
    global _report_path
    report = None
    if arguments and arguments[0].startswith("--report="):
        report, arguments = arguments[0].removeprefix("--report="), arguments[1:]
    _report_path = report
    if len(arguments) < 3 or not arguments[0].isdigit():
        _say("usage: mcp_guard.py [--report=FILE] PARENT_PID EXECUTABLE ARGV0 [ARG ...]")
        return 2
    parent, executable, argv = int(arguments[0]), arguments[1], arguments[2:]
    if os.getpgrp() != os.getpid():  # the library makes it a session's leader; else a group of its own
        os.setpgid(0, 0)  # so that ending "its group" never reaches whoever started it
    signal.signal(_PARENT_GONE, _end_group)  # before the request, so the signal never finds it unset
    signal.signal(signal.SIGTERM, _let_the_server_stop)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(_PARENT_GONE), 0, 0, 0) != 0:
        _say(f"cannot ask to be told of its parent's end: {os.strerror(ctypes.get_errno())}")
        return _CANNOT_START
    if os.getppid() != parent:  # it died before the request: no signal will come
        _say(f"the process that started {argv[0]} ({parent}) has ended; not starting it")
        _forget_report()
        return _CANNOT_START
    pid = os.fork()
    if pid == 0:
        _run_server(executable, argv, report)
    # the server holds the pipes now: the client sees their end when the server ends, not the guard
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    os.close(devnull)
    code = _ended_as(pid)
    if code < 0:  # ended by a signal: so does the guard, so the client sees what it would have
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
