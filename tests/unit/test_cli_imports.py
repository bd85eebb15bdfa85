"""The commands that read, answer or cancel runs import the store, not the engine.

`masterplanner runs list` imported pydantic-ai, DBOS and the model code (4 s of CPU on a loaded
machine), so a `runs cancel` landed 14 s late. Each command here runs in a real process, which
then says which of the heavy modules it imported; none may be there. The registry's commands
that read it (and `feedback`, which rates a run) imported NumPy, pydantic-ai and the default
embedder's model code because opening the registry made its embedder at once.
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
REGISTRY_HEAVY = (*HEAVY, "numpy", "masterplanner.registry.smollm2", "masterplanner.registry.minilm")
"""What reading the registry has no use for either: the vectors and the embedders' code."""

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


def imported(
    tmp_path: Path, *args: str, heavy: tuple[str, ...] = HEAVY, env: dict[str, str] | None = None
) -> tuple[int, list[str], subprocess.CompletedProcess[str]]:
    """`masterplanner ARGS` in a new process: its exit code, the `heavy` modules it imported, the process."""
    report = tmp_path / "imported.json"
    report.unlink(missing_ok=True)
    done = subprocess.run(
        [sys.executable, "-c", _WRAPPER, str(report), json.dumps(heavy), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
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


def test_reading_the_registry_and_rating_a_run_import_nothing_heavy(
    tmp_path: Path, write_script: Callable[..., Path]
) -> None:
    """With the default embedder (smollm2) or a provider's set, reading loads no embedder or vectors."""
    from masterplanner.registry import open_registry
    from masterplanner.registry.memory import MemoryStore

    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("summary", tools=[])]}},
            {"purpose": "prompt_creator", "output": "You summarise.", "repeat": True},
            {"purpose": "step:summary", "output": "ten pages", "repeat": True},
            {"purpose": "*", "repeat": True},
        ]
    )
    # the run itself searches the registry by words alone: no model loads in this test
    ran = mp("run", "Summarise notes.txt", "--model", f"scripted:{script}", "--yes", "--json",
             env={"MASTERPLANNER_EMBEDDER": "none"})  # fmt: skip
    run_id = json.loads(ran.stdout)["run_id"]
    agent_id = f"{run_id}.summary"
    settings = Settings.load()
    assert settings.embedder == "smollm2"  # what the commands below open the registry with
    registry = open_registry(settings)
    try:
        memories = MemoryStore(registry, ttl_days=30, max_items=100)
        fact = memories.remember("The notes are in notes.txt", source="test").id
        remembered = {item.id: item.text for item in memories.list()}
    finally:
        registry.close()
    assert remembered[fact] == "The notes are in notes.txt"

    def read(*args: str) -> subprocess.CompletedProcess[str]:
        code, heavy, done = imported(tmp_path, *args, heavy=REGISTRY_HEAVY)
        assert (code, heavy) == (0, []), (args, done.stderr)
        return done

    assert [agent["id"] for agent in json.loads(read("agents", "list", "--json").stdout)] == [agent_id]
    assert agent_id in read("agents", "list").stdout
    shown = json.loads(read("agents", "show", agent_id, "--json").stdout)
    assert (shown["id"], shown["system_prompt"], shown["versions"]) == (agent_id, "You summarise.", [1])
    assert "You summarise." in read("agents", "show", agent_id).stdout
    assert [cohort["id"] for cohort in json.loads(read("cohorts", "list", "--json").stdout)] == [run_id]
    assert read("cohorts", "list").stdout.startswith(f"{run_id}  succeeded  Summarise notes.txt")
    assert json.loads(read("cohorts", "show", run_id, "--json").stdout)["task"] == "Summarise notes.txt"
    listed = {item["id"]: item["text"] for item in json.loads(read("memory", "list", "--json").stdout)}
    assert listed == remembered
    rated = json.loads(read("feedback", run_id, "--rating", "4", "--json").stdout)
    assert rated == {"rated_agents": [agent_id], "cohort_rated": True, "lessons": {}}
    assert json.loads(read("cohorts", "show", run_id, "--json").stdout)["rating"] == 4

    # a provider's embedder is made on first use too: these commands neither import pydantic-ai nor
    # reach the provider (its address is a closed port here, so a call would fail the command)
    again = mp("run", "Summarise notes.txt", "--model", f"scripted:{script}", "--yes", "--json",
               env={"MASTERPLANNER_EMBEDDER": "none"})  # fmt: skip
    unrated = json.loads(again.stdout)["run_id"]  # a run is rated once
    provider = {
        "MASTERPLANNER_EMBEDDER": "openai:text-embedding-3-small",
        "OPENAI_API_KEY": "sk-masterplanner-test-not-a-key",
        "OPENAI_BASE_URL": "http://127.0.0.1:9/v1",
    }
    for args in [
        ("agents", "list", "--json"),
        ("agents", "show", agent_id),
        ("cohorts", "list"),
        ("cohorts", "show", run_id, "--json"),
        ("memory", "list", "--json"),
        ("feedback", unrated, "--rating", "3"),
    ]:
        code, heavy, done = imported(tmp_path, *args, heavy=REGISTRY_HEAVY, env=provider)
        assert (code, heavy) == (0, []), (args, done.stderr)
    assert json.loads(read("cohorts", "show", unrated, "--json").stdout)["rating"] == 3

    # a setting that cannot work is still refused when the registry opens, before anything is read
    code, _heavy, done = imported(
        tmp_path, "agents", "list", heavy=REGISTRY_HEAVY, env={"MASTERPLANNER_EMBEDDER": "openai:text-embed"}
    )
    assert (code, done.stdout, done.stderr) == (
        2,
        "",
        "error: embedder 'openai:text-embed' needs the environment variable OPENAI_API_KEY, "
        "which is not set\n",
    )


def test_the_tool_names_kept_apart_are_the_tools_defined() -> None:
    """`tools.names` lets a check of tool names skip the definitions (pydantic-ai); it must not drift."""
    from masterplanner.tools import builtin, names, team

    assert names.BUILTIN_TOOL_NAMES == tuple(tool.name for tool in builtin.BUILTIN_TOOLS)
    assert names.TEAM_TOOL_NAMES == tuple(tool.name for tool in team.TEAM_TOOLS)
