"""The commands that read, answer or cancel runs import the store, not the engine.

`masterplanner runs list` imported pydantic-ai, DBOS and the model code (4 s of CPU on a loaded
machine), so a `runs cancel` landed 14 s late. Each command here runs in a real process, which
then says which of the heavy modules it imported; none may be there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _cli import LEASE_S, mp, pending, start
from _plans import step

from masterplanner import Settings
from masterplanner.engine import Engine

HEAVY = (
    "dbos",
    "llama_cpp",
    "pydantic_ai",
    "sentence_transformers",
    "torch",
    "fastapi",
    "masterplanner.engine.runner",
    "masterplanner.models",
    "masterplanner.web",
)
"""Modules (and their submodules) a command that does not plan or execute has no use for."""

_WRAPPER = """
import json, sys
from masterplanner.cli import main

report, heavy, args = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
try:
    main(args)
    code = 0
except SystemExit as ended:
    code = ended.code
found = sorted(name for name in sys.modules if any(name == h or name.startswith(h + ".") for h in heavy))
with open(report, "w") as file:
    json.dump({"code": code, "heavy": found}, file)
"""


def imported(tmp_path: Path, *args: str) -> tuple[int, list[str], subprocess.CompletedProcess[str]]:
    """`masterplanner ARGS` in a new process: its exit code, the heavy modules it imported, the process."""
    report = tmp_path / "imported.json"
    report.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, str(report), json.dumps(HEAVY), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=120,
    )
    found = json.loads(report.read_text())
    return found["code"], found["heavy"], done


@pytest.fixture(autouse=True)
def short_leases(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTERPLANNER_RUN_LEASE_S", str(LEASE_S))


def test_help_version_and_a_command_s_help_import_nothing_heavy(tmp_path: Path) -> None:
    for args in [("--help",), ("--version",), ("runs", "--help"), ("runs", "cancel", "--help")]:
        code, heavy, done = imported(tmp_path, *args)
        assert (code, heavy) == (0, []), (args, done.stderr)


def test_reading_answering_and_cancelling_runs_import_nothing_heavy(
    tmp_path: Path, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "*", "repeat": True},
        ]
    )
    # a run waiting for its plan review, in a process of its own (input closed: it asks nothing)
    waiting = start("run", "one thing", "--model", f"scripted:{script}")
    try:
        review = pending("plan_review")
        engine = Engine(Settings.load())  # a run no process executes: a cancel ends it at once
        try:
            idle = engine.create_run("another thing", model=f"scripted:{script}").id
        finally:
            engine.close()

        for args, wanted in [
            (("runs", "list"), 0),
            (("runs", "list", "--json"), 0),
            (("runs", "show", review["run_id"]), 0),
            (("runs", "show", idle, "--json"), 0),
            (("runs", "show", review["run_id"], "--timeline"), 0),
            (("runs", "pending"), 0),
            (("runs", "audit", review["run_id"]), 0),
            (("workers",), 0),
            (("runs", "show", "no-such-run"), 2),
            (("runs", "cancel", idle, "--wait", "0"), 0),
            (("runs", "cancel", idle), 1),  # already cancelled: an error, in one line
            (("runs", "answer", review["id"], "--deny", "--reason", "not now"), 0),
            (("runs", "answer", review["id"], "--approve"), 2),  # answered already
        ]:
            code, heavy, done = imported(tmp_path, *args)
            assert (code, heavy) == (wanted, []), (args, done.stderr)
        _out, err = waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    assert waiting.returncode == 1, err  # rejected: cancelled
    assert json.loads(mp("runs", "show", idle, "--json").stdout)["status"] == "cancelled"


def test_the_tool_names_kept_apart_are_the_tools_defined() -> None:
    """`tools.names` lets a check of tool names skip the definitions (pydantic-ai); it must not drift."""
    from masterplanner.tools import builtin, names, team

    assert names.BUILTIN_TOOL_NAMES == tuple(tool.name for tool in builtin.BUILTIN_TOOLS)
    assert names.TEAM_TOOL_NAMES == tuple(tool.name for tool in team.TEAM_TOOLS)
