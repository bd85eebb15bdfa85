"""A run's workspace grows by at most `workspace_max_growth_bytes`, whichever tool writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.security

BIG_WRITE = "open('big.bin', 'wb').write(b'x' * 3_000_000)\nprint('wrote')\n"


@pytest.mark.usefixtures("sandbox_available")
def test_write_file_and_code_share_one_allowance_per_run(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    step: dict[str, Any] = {
        "id": "fill",
        "title": "fill the workspace",
        "instruction": "Write files",
        "agent_role": "writer",
        "tools": ["write_file", "code_execution"],
        "depends_on": [],
        "expected_output": "files",
    }
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step]}},
            {
                "purpose": "step:fill",
                "tool_calls": [
                    {"name": "write_file", "args": {"path": "a.txt", "content": "a" * 600_000}},
                    {"name": "write_file", "args": {"path": "b.txt", "content": "b" * 600_000}},
                    {"name": "code_execution", "args": {"code": BIG_WRITE}},
                ],
            },
            {"purpose": "step:fill", "output": "done"},
            {"purpose": "*", "repeat": True},
        ]
    )
    workspace = tmp_path / "ws"
    result = subprocess.run(
        [
            sys.executable,
            *("-m", "masterplanner", "run", "fill", "--model", f"scripted:{script}"),
            *("--workspace", str(workspace), "--yes", "--json"),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "MASTERPLANNER_WORKSPACE_MAX_GROWTH_BYTES": "1000000"},
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    run_id = json.loads(result.stdout)["run_id"]
    shown = subprocess.run(
        [sys.executable, "-m", "masterplanner", "runs", "show", run_id, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    results = [e["data"] for e in json.loads(shown.stdout)["events"] if e["kind"] == "tool_result"]
    assert [r["tool"] for r in results] == ["write_file", "write_file", "code_execution"]
    # the two writes of one reply run concurrently: whichever comes first takes the allowance
    written = results[0]["result"]
    assert written in ("wrote 600,000 bytes to a.txt", "wrote 600,000 bytes to b.txt")
    kept, refused = ("a.txt", "b.txt") if written.endswith("a.txt") else ("b.txt", "a.txt")
    assert "the workspace may grow by only" in results[1]["error"]
    assert "setting workspace_max_growth_bytes" in results[1]["error"]
    # What is left (about 400 kB) is both the file-size limit and the watchdog's allowance: the
    # write stops at EFBIG, or the watchdog kills the program first — either way the cap holds.
    code_result = results[2]["result"]
    assert (
        "killed: the workspace grew by more than" in code_result or "[Errno 27] File too large" in code_result
    ), code_result
    assert not (workspace / refused).exists()
    assert (workspace / kept).stat().st_size == 600_000
    big = workspace / "big.bin"
    assert not big.exists() or big.stat().st_size <= 400_000


async def test_programs_running_at_once_share_the_room_left(tmp_path: Path) -> None:
    """Each program's watchdog measures the whole workspace, so together they stay under the cap.

    Two programs each writing 6 MiB, a MiB at a time, into a workspace with 8 MiB of room: the
    workspace passes the cap while both run, so both are stopped, and neither is said to have
    written it all alone.
    """
    import asyncio

    from masterplanner.tools.code_execution import execute_code
    from masterplanner.tools.workspace import Workspace

    mib = 1 << 20
    workspace = Workspace(tmp_path / "shared")
    workspace.create()
    workspace.max_bytes = workspace.allocated_bytes() + 8 * mib
    code = (
        "import time\n"
        "with open({name!r}, 'wb') as out:\n"
        "    for _ in range(6):\n"
        "        out.write(b'x' * (1 << 20)); out.flush(); time.sleep(0.3)\n"
        "print('all written')\n"
    )

    async def write(name: str) -> str:
        room = workspace.room()
        result = await execute_code(workspace, "python", code.format(name=name), max_growth_bytes=room)
        return result.killed or f"exit {result.exit_code}: {result.stdout.strip()}"

    outcomes = await asyncio.gather(write("a.bin"), write("b.bin"))
    assert outcomes == ["the workspace grew by more than 8 MiB while the program ran"] * 2
    # what one poll (50 ms) lets both write past the cap, at most a MiB each
    assert workspace.allocated_bytes() <= workspace.max_bytes + 2 * mib
