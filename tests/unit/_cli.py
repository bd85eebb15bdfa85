"""The `masterplanner` command as the CLI tests drive it: in a real process, one request at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

LEASE_S = 2.0
"""The run lease the CLI tests set (MASTERPLANNER_RUN_LEASE_S): a killed run is taken over 2 s on."""


def mp(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `masterplanner ARGS` to its end."""
    return subprocess.run(
        [sys.executable, "-m", "masterplanner", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=120,
    )


def start(*args: str) -> subprocess.Popen[str]:
    """`masterplanner ARGS` in the background with no terminal input (stdin is /dev/null)."""
    return subprocess.Popen(
        [sys.executable, "-m", "masterplanner", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def pending(kind: str, timeout: float = 90.0) -> dict[str, Any]:
    """Wait until `runs pending --json` lists an open request of `kind`; return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        listed = mp("runs", "pending", "--json")
        assert listed.returncode == 0, listed.stderr
        found = [request for request in json.loads(listed.stdout) if request["kind"] == kind]
        if found:
            assert len(found) == 1
            return dict(found[0])
        time.sleep(0.2)
    raise AssertionError(f"no open {kind} request within {timeout:g} s")


def answer(request_id: str, *flags: str) -> None:
    """`runs answer REQUEST FLAGS`, which must succeed."""
    answered = mp("runs", "answer", request_id, *flags)
    assert answered.returncode == 0, answered.stderr
    assert answered.stderr.strip().startswith(f"request {request_id} of run ")


def shown(run_id: str) -> dict[str, Any]:
    """`runs show RUN --json`."""
    result = mp("runs", "show", run_id, "--json")
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def run_events(run_id: str) -> list[dict[str, Any]]:
    """The run's events as `runs show --json` lists them."""
    return list(shown(run_id)["events"])
