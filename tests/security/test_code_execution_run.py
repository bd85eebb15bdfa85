"""A run whose step computes with `code_execution` and writes the result with `write_file`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from masterplanner.sandbox import sandbox_problems

pytestmark = pytest.mark.security

PRIMES_CODE = (
    "import os\n"
    "primes = [n for n in range(2, 30) if all(n % d for d in range(2, n))][:10]\n"
    "print(' '.join(map(str, primes)))\n"
    "print('uid', os.getuid())\n"
)


def test_primes_computed_in_the_sandbox_land_in_the_workspace(write_script: Callable[..., Path]) -> None:
    if sandbox_problems():
        if os.environ.get("CI"):
            pytest.fail("; ".join(sandbox_problems()))
        pytest.skip("; ".join(sandbox_problems()))
    step = {
        "id": "primes",
        "title": "first ten primes",
        "instruction": "Compute the first 10 primes with Python and write them to primes.txt",
        "agent_role": "programmer",
        "tools": ["code_execution", "write_file"],
        "depends_on": [],
        "expected_output": "primes.txt",
    }
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step]}},
            {
                "purpose": "step:primes",
                "tool_calls": [{"name": "code_execution", "args": {"code": PRIMES_CODE}}],
            },
            {
                "purpose": "step:primes",
                "tool_calls": [
                    {
                        "name": "write_file",
                        "args": {"path": "primes.txt", "content": "2 3 5 7 11 13 17 19 23 29\n"},
                    }
                ],
            },
            {"purpose": "step:primes", "output": "wrote primes.txt"},
            {"purpose": "*", "repeat": True},
        ]
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "masterplanner",
            "run",
            "primes",
            "--model",
            f"scripted:{script}",
            "--yes",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    workspace = Path(report["workspace"])
    assert (workspace / "primes.txt").read_text() == "2 3 5 7 11 13 17 19 23 29\n"
    shown = json.loads(
        subprocess.run(
            [sys.executable, "-m", "masterplanner", "runs", "show", report["run_id"], "--json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    executed = next(e["data"] for e in shown["events"] if e["kind"] == "tool_result")
    assert executed["tool"] == "code_execution"
    stdout = executed["result"].split("--- stdout ---\n")[1].splitlines()
    assert stdout[0] == "2 3 5 7 11 13 17 19 23 29"
    assert stdout[1].startswith("uid ") and stdout[1] != "uid 0"  # it ran as an unprivileged sandbox uid


def test_doctor_reports_the_sandbox_ready() -> None:
    if sandbox_problems():
        if os.environ.get("CI"):
            pytest.fail("; ".join(sandbox_problems()))
        pytest.skip("; ".join(sandbox_problems()))
    result = subprocess.run(
        [sys.executable, "-m", "masterplanner", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    assert checks["sandbox: ready"]["ok"] is True
    assert checks["sandbox: ready"]["detail"].startswith("code runs jailed")


def test_a_hard_link_to_a_settings_file_reads_empty_in_the_sandbox_and_is_refused_by_read_file(
    write_script: Callable[..., Path], isolated: Path, tmp_path: Path
) -> None:
    """Before, code read the home's or the workspace's settings whole through a link of another name."""
    if sandbox_problems():
        if os.environ.get("CI"):
            pytest.fail("; ".join(sandbox_problems()))
        pytest.skip("; ".join(sandbox_problems()))
    isolated.mkdir(parents=True, exist_ok=True)
    (isolated / "masterplanner.toml").write_text('# OPENAI_API_KEY = "sk-home-0123456789abcdef"\n')
    workspace = tmp_path / "ws"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "masterplanner.toml").write_text("# the-workspace-settings-0123456789\n")
    os.link(isolated / "masterplanner.toml", workspace / "notes.txt")
    os.link(workspace / "masterplanner.toml", workspace / "sub" / "kept.txt")
    (workspace / "other.txt").write_text("fine")
    os.link(workspace / "other.txt", workspace / "other-link.txt")  # a link to anything else reads
    step = {
        "id": "peek",
        "title": "read the notes",
        "instruction": "Print notes.txt, sub/kept.txt and other-link.txt",
        "agent_role": "programmer",
        "tools": ["code_execution", "read_file"],
        "depends_on": [],
        "expected_output": "their text",
    }
    code = (
        "for name in ('notes.txt', 'sub/kept.txt', 'other-link.txt'):\n"
        "    print(name, repr(open(name).read()))\n"
    )
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step]}},
            {"purpose": "step:peek", "tool_calls": [{"name": "code_execution", "args": {"code": code}}]},
            {"purpose": "step:peek", "tool_calls": [{"name": "read_file", "args": {"path": "notes.txt"}}]},
            {"purpose": "step:peek", "output": "done"},
            {"purpose": "*", "repeat": True},
        ]
    )
    command = [sys.executable, "-m", "masterplanner", "run", "peek", "--model", f"scripted:{script}"]
    command += ["--workspace", str(workspace), "--yes", "--json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    shown = subprocess.run(
        [sys.executable, "-m", "masterplanner", "runs", "show", report["run_id"], "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    results = [e["data"] for e in json.loads(shown)["events"] if e["kind"] == "tool_result"]
    executed, read = results
    stdout = executed["result"].split("--- stdout ---\n")[1].splitlines()
    assert stdout[:3] == ["notes.txt ''", "sub/kept.txt ''", "other-link.txt 'fine'"]
    assert read["error"] == (
        "'notes.txt' holds masterplanner's settings, which may hold secrets; steps may not read it "
        "(this name is a hard link to it)"
    )
    assert "sk-home" not in shown and "the-workspace-settings" not in shown
    assert (isolated / "masterplanner.toml").read_text().startswith("# OPENAI_API_KEY")  # left as it was
