"""An MCP server (stdio) for the fault tests: tools that leave a trace, take their time, or crash.

Each call appends a line to the file named by `FAULTS_TALLY`, so a test can count side effects.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("faults")


def _tally(line: str) -> None:
    with Path(os.environ["FAULTS_TALLY"]).open("a") as tally:
        tally.write(line + "\n")


@server.tool()
def tally(label: str) -> str:
    """Count one call under the label."""
    _tally(label)
    return f"counted {label}"


@server.tool()
def slow(label: str) -> str:
    """Count the start of the call, take a while, count its end.

    Like a server that notices its client is gone, it ends (without counting the end) once the
    process that started it has died.
    """
    return _slowly(label)


@server.tool(annotations=ToolAnnotations(idempotentHint=True))
def slow_idempotent(label: str) -> str:
    """As `slow`, declared idempotent: making it twice has the effect of making it once."""
    return _slowly(label)


def _slowly(label: str) -> str:
    _tally(f"start {label}")
    parent = os.getppid()
    deadline = time.monotonic() + float(os.environ.get("FAULTS_SLOW_S", "30"))
    while time.monotonic() < deadline:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.05)
    _tally(f"end {label}")
    return f"done {label}"


@server.tool()
def linger(label: str) -> str:
    """Start a program of its own and wait for it, minding nothing else (as `npx` runs its server).

    Counts `linger <label> <own pid> <program's pid>` first, so a test can look for both.
    """
    program = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; time.sleep(float(sys.argv[1]))",
            os.environ["FAULTS_SLOW_S"],
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    _tally(f"linger {label} {os.getpid()} {program.pid}")
    program.wait()
    return f"lingered {label}"


@server.tool()
def crash(label: str) -> str:
    """Count the call, then end the server's process without a reply."""
    _tally(f"crash {label}")
    os._exit(3)


if __name__ == "__main__":
    server.run()
