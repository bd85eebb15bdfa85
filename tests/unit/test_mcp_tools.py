"""MCP servers from the settings: their tools join the catalog as <server>_<tool> and steps call them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _cli import mp, run_events
from _plans import step

from masterplanner import ConfigError, Settings
from masterplanner.redaction import REMOVED
from masterplanner.tools import mcp_guard
from masterplanner.tools.mcp import McpServer, argument_problems, call_mcp_tool, discover_tools

SERVER = str(Path(__file__).with_name("mcp_notes_server.py"))
CONTENT_SERVER = str(Path(__file__).with_name("mcp_content_server.py"))
CONTENT_TOOLS = ["content_mixed", "content_empty", "content_structured"]


async def test_discovery_names_tools_after_their_server() -> None:
    specs = await discover_tools({"notes": McpServer(command=sys.executable, args=[SERVER])})
    assert [(spec.name, spec.description, spec.approval) for spec in specs] == [
        ("notes_shout", "Return the text in capital letters.", "ask")
    ]
    assert specs[0].args_schema["required"] == ["text"]
    with pytest.raises(ConfigError, match="MCP server 'broken': cannot list its tools"):
        await discover_tools(
            {"broken": McpServer(command=sys.executable, args=["-c", "raise SystemExit(3)"])}
        )


async def test_a_tool_name_model_providers_refuse_is_mapped_to_one_they_take() -> None:
    """Before, `fs.read` became `notes_fs.read` (a dot, a space, 73 characters...), which model
    providers refuse (^[a-zA-Z0-9_-]{1,64}$): the run failed at its first model request."""
    tools = ["fs.read", "read file", "fs_read", "shout", "résumé"]
    specs = await discover_tools({"notes": McpServer(command=sys.executable, args=[SERVER, *tools])})
    assert [(spec.name, spec.mcp_tool) for spec in specs] == [
        # fs.read's name is fs_read's as well: the one changed is told apart by its name's hash
        ("notes_fs_read_4074bc02", "fs.read"),
        ("notes_read_file", "read file"),
        ("notes_fs_read", "fs_read"),
        ("notes_shout", "shout"),
        ("notes_r_sum_", "résumé"),
    ]
    server = "s" * 30  # a name of up to 32 begins its tools' names as it is
    long_tools = McpServer(command=sys.executable, args=[SERVER, "x" * 40, "y" * 20])
    specs = await discover_tools({server: long_tools})
    assert [(spec.name, spec.mcp_tool) for spec in specs] == [
        (f"{server}_{'x' * 24}_bd913ff6", "x" * 40),
        (f"{server}_{'y' * 20}", "y" * 20),
    ]
    assert len(specs[0].name) == 64


async def test_discovery_refuses_two_servers_tools_it_cannot_name_apart_naming_both() -> None:
    """What a run does where `doctor` fails the two servers (`discover_each`): it fails, in these words."""
    servers = {
        "notes": McpServer(command=sys.executable, args=[SERVER]),
        "a": McpServer(command=sys.executable, args=[SERVER, "b_c"]),  # tagged a_b_c_10fba79c
        "a_b": McpServer(command=sys.executable, args=[SERVER, "c", "c_10fba79c"]),
    }
    with pytest.raises(ConfigError) as caught:
        await discover_tools(servers)
    assert str(caught.value) == (
        "MCP servers 'a' and 'a_b' offer tools 'b_c' and 'c_10fba79c': they cannot both be called "
        "'a_b_c_10fba79c'"
    )


def test_a_run_calls_a_tool_by_its_mapped_name_and_the_server_by_its_own(
    write_script: Callable[..., Path],
) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("loud", tools=["notes_fs_read"])]}},
            {"purpose": "step:loud", "tool_calls": [{"name": "notes_fs_read", "args": {"text": "hello"}}]},
            {"purpose": "step:loud", "output": "shouted"},
            {"purpose": "*", "repeat": True},
        ]
    )
    result = _run_with_servers(script, {"notes": {"command": sys.executable, "args": [SERVER, "fs.read"]}})
    assert result.returncode == 0, result.stderr
    assert _tool_results(result) == [{"tool": "notes_fs_read", "result": "HELLO"}]


async def test_a_server_that_never_answers_is_given_up_on_after_its_timeout_s_saying_so() -> None:
    """Before, discovery waited 10 s for the library's own probe, then timeout_s more (15 to 20 s
    in all, whatever timeout_s), and a call past it read "Request 'tools/call' timed out"."""
    import time

    from masterplanner.errors import ToolError

    silent = McpServer(command=sys.executable, args=["-c", "import time; time.sleep(60)"], timeout_s=1)
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        await discover_tools({"silent": silent})
    assert (
        str(caught.value)
        == "MCP server 'silent': cannot list its tools: it did not answer within 1 s (its timeout_s)"
    )
    assert time.monotonic() - started < 6  # 1 s, and the 2 s the library gives a stdio server to stop
    notes = McpServer(command=sys.executable, args=[SERVER], timeout_s=5)
    with pytest.raises(ToolError) as failed:
        await call_mcp_tool("notes", notes, "shout", {"text": "never"})
    assert str(failed.value) == "the MCP server 'notes' did not answer within 5 s (its timeout_s)"


def _commands_that_cannot_be_executed() -> dict[str, str]:
    """Commands in the working directory that exist but cannot be executed, each with the reason given."""
    work = Path.cwd()
    no_shebang = work / "serve.sh"
    no_shebang.write_text("echo started > started.txt\n")
    no_shebang.chmod(0o755)
    not_executable = work / "notes.py"
    not_executable.write_text("#!/bin/sh\necho started > started.txt\n")
    not_executable.chmod(0o644)
    (work / "servers").mkdir()
    missing_interpreter = work / "lost.sh"
    missing_interpreter.write_text("#!/nonexistent/bin/sh\necho started > started.txt\n")
    missing_interpreter.chmod(0o755)
    return {
        "./serve.sh": "exec format error (a script needs a first line like #!/bin/sh)",
        "./notes.py": "permission denied (the file is not executable; chmod +x makes it so)",
        "./servers": "it is a folder, not a program",
        "./lost.sh": "the interpreter its first line names (/nonexistent/bin/sh) was not found",
        "/nonexistent/mcp-server": "no such file",
        "no-such-mcp-server": "no program of that name is on the PATH",
    }


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard tells what the exec said")
async def test_a_server_whose_command_cannot_be_executed_is_named_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a script without a `#!` line (or with a missing interpreter) failed as "Connection
    closed", and the reason ("Exec format error") was in the server's log alone; a file without
    execute permission, a folder or a missing command failed in the MCP library's words."""
    from masterplanner.errors import ToolError

    reports = tmp_path / "tmp"  # where the guard's report files are made (and removed)
    reports.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(reports))
    for command, reason in _commands_that_cannot_be_executed().items():
        server = McpServer(command=command, timeout_s=10)
        error = f"MCP server 'notes': its command {command} could not be started: {reason}"
        with pytest.raises(ConfigError) as caught:
            await discover_tools({"notes": server})
        assert str(caught.value) == error
        with pytest.raises(ToolError) as failed:
            await call_mcp_tool("notes", server, "shout", {"text": "never"})
        assert str(failed.value) == error
    assert not (Path.cwd() / "started.txt").exists()
    assert list(reports.iterdir()) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard tells what the exec said")
def test_a_run_whose_mcp_server_cannot_be_executed_fails_naming_it_and_why(
    write_script: Callable[..., Path],
) -> None:
    script = write_script([{"purpose": "*", "repeat": True}])
    _commands_that_cannot_be_executed()
    result = _run_with_servers(script, {"notes": {"command": "./serve.sh"}})
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert (report["status"], report["error"]) == (
        "failed",
        "MCP server 'notes': its command ./serve.sh could not be started: exec format error (a script "
        "needs a first line like #!/bin/sh)",
    )


GUARD = str(Path(mcp_guard.__file__))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_the_guard_runs_the_server_on_its_streams_and_ends_as_it_ends(tmp_path: Path) -> None:
    """What starts a stdio server (the ends of a run it outlives are the fault suite's)."""
    server = [sys.executable, "-c", "import sys; print(sys.stdin.readline().upper(), end=''); sys.exit(3)"]
    ran = subprocess.run(
        [sys.executable, "-I", "-S", GUARD, str(os.getpid()), server[0], *server],
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, "HELLO\n", "")
    ended = subprocess.run(
        [sys.executable, "-I", "-S", GUARD, str(os.getpid()), "/bin/sh", "sh", "-c", "kill -TERM $$"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (ended.returncode, ended.stderr) == (-15, "")  # as the server ended: by SIGTERM
    missing = str(tmp_path / "no-such-server")
    failed = subprocess.run(
        [sys.executable, "-I", "-S", GUARD, str(os.getpid()), missing, missing],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (failed.returncode, failed.stderr) == (
        127,
        f"masterplanner (MCP server guard): cannot start {missing}: No such file or directory\n",
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_the_guard_does_not_start_a_server_whose_starter_has_already_ended(tmp_path: Path) -> None:
    """A parent that died before the guard asked for the signal would never send it."""
    made = tmp_path / "started"
    not_the_parent = os.getppid()  # pytest's parent, not the guard's
    ran = subprocess.run(
        [sys.executable, "-I", "-S", GUARD, str(not_the_parent), "/bin/touch", "touch", str(made)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (ran.returncode, ran.stderr) == (
        127,
        f"masterplanner (MCP server guard): the process that started touch ({not_the_parent}) has "
        "ended; not starting it\n",
    )
    assert not made.exists()


def test_arguments_are_checked_against_the_declared_schema_in_our_words() -> None:
    schema = {
        "type": "object",
        "properties": {"text": {"type": "string"}, "mode": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    assert argument_problems(schema, {"text": "x", "mode": "a", "n": 2}) == []
    assert argument_problems(schema, {"mode": "c", "n": "2", "extra": 1}) == [
        "missing argument 'text'",
        "unexpected argument 'extra'",
        "argument 'mode' should be one of 'a', 'b'",
        "argument 'n' should be of type integer",
    ]
    assert (
        argument_problems({"type": "nonsense"}, {"a": 1}) == []
    )  # a schema that cannot be read: the server decides


def test_server_settings_need_exactly_one_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTERPLANNER_MCP_SERVERS", json.dumps({"x": {"command": "a", "url": "http://b"}}))
    with pytest.raises(ConfigError, match="give either 'command' \\(stdio\\) or 'url'"):
        Settings.load()


def test_an_unknown_key_of_a_server_is_answered_with_a_server_s_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, the known keys listed were the top-level settings (agent_reuse_threshold, …)."""
    known = "known: args, command, env, log_file, timeout_s, url"
    toml = Path.cwd() / "masterplanner.toml"
    toml.write_text('[mcp_servers.v]\ncommand = "python"\nbogus = 1\n')
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == f"invalid settings: unknown setting 'mcp_servers.v.bogus' in {toml}; {known}"
    toml.unlink()
    monkeypatch.setenv("MASTERPLANNER_MCP_SERVERS", json.dumps({"v": {"command": "python", "bogus": 1}}))
    with pytest.raises(ConfigError) as caught:
        Settings.load()
    assert str(caught.value) == (
        f"invalid settings: unknown setting 'mcp_servers.v.bogus' from MASTERPLANNER_MCP_SERVERS; {known}"
    )


def _run_with_servers(
    script: Path, servers: dict[str, object], policies: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "masterplanner",
            "run",
            "shout it",
            "--model",
            f"scripted:{script}",
            "--yes",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **os.environ,
            "MASTERPLANNER_MCP_SERVERS": json.dumps(servers),
            "MASTERPLANNER_TOOL_POLICIES": json.dumps(policies or {}),
        },
    )


def test_a_run_calls_an_mcp_tool(write_script: Callable[..., Path]) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("loud", tools=["notes_shout"])]}},
            # arguments that do not fit the server's schema go back to the model, not to the server
            {"purpose": "step:loud", "tool_calls": [{"name": "notes_shout", "args": {"txt": "hello"}}]},
            {
                "purpose": "step:loud",
                "expect": ["the arguments do not fit notes_shout: missing argument 'text'"],
                "tool_calls": [{"name": "notes_shout", "args": {"text": "hello"}}],
            },
            {"purpose": "step:loud", "output": "shouted"},
            {"purpose": "*", "repeat": True},
        ]
    )
    result = _run_with_servers(script, {"notes": {"command": sys.executable, "args": [SERVER]}})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    events = run_events(report["run_id"])
    results = [e["data"] for e in events if e["kind"] == "tool_result"]
    assert results == [{"tool": "notes_shout", "result": "HELLO"}]


def test_what_a_run_makes_in_a_home_the_person_made_is_only_its_owner_s(
    write_script: Callable[..., Path], isolated: Path, tmp_path: Path
) -> None:
    """Before, the home was 0700 only when masterplanner made it: in one the person made (0755
    here), `logs/` and the servers' logs in it, `workspaces/` and a run's workspace took the
    umask's mode, readable by every user of the machine."""
    import stat

    isolated.mkdir(mode=0o755)
    isolated.chmod(0o755)
    theirs = tmp_path / "their-logs"  # a folder of their own for one server's log
    theirs.mkdir(mode=0o755)
    theirs.chmod(0o755)
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("loud", tools=["notes_shout", "other_shout"])]}},
            {"purpose": "step:loud", "tool_calls": [{"name": "notes_shout", "args": {"text": "a"}}]},
            {"purpose": "step:loud", "tool_calls": [{"name": "other_shout", "args": {"text": "b"}}]},
            {"purpose": "step:loud", "output": "shouted"},
            {"purpose": "*", "repeat": True},
        ]
    )
    servers = {
        "notes": {"command": sys.executable, "args": [SERVER]},
        "other": {"command": sys.executable, "args": [SERVER], "log_file": str(theirs / "new" / "other.log")},
    }
    result = _run_with_servers(script, servers, {"notes_shout": "auto", "other_shout": "auto"})
    assert result.returncode == 0, result.stderr
    workspace = Path(json.loads(result.stdout)["workspace"])

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert {
        str(path.relative_to(tmp_path)): oct(mode(path))
        for path in (
            isolated,
            isolated / "logs",
            isolated / "logs" / "mcp-notes.log",
            isolated / "workspaces",
            workspace,
            isolated / "masterplanner.sqlite",
            theirs,
            theirs / "new",
            theirs / "new" / "other.log",
        )
    } == {
        "home": "0o755",  # theirs: kept
        "home/logs": "0o700",
        "home/logs/mcp-notes.log": "0o600",
        "home/workspaces": "0o700",
        str(workspace.relative_to(tmp_path)): "0o700",
        "home/masterplanner.sqlite": "0o600",
        "their-logs": "0o755",  # theirs: kept
        "their-logs/new": "0o700",
        "their-logs/new/other.log": "0o600",
    }


@pytest.mark.parametrize(
    ("servers", "error"),
    [
        (
            {"bad": {"command": "/nonexistent/mcp-server"}},
            "MCP server 'bad': its command /nonexistent/mcp-server could not be started: no such file",
        ),
        (
            {"notes": {"command": sys.executable, "args": [SERVER]}, "notes_shout": {"command": "x"}},
            "MCP server 'notes_shout': its command x could not be started: no program of that name is "
            "on the PATH",
        ),
        (  # a server called "write" offering "file": write_file is a built-in tool
            {"write": {"command": sys.executable, "args": [SERVER, "file"]}},
            "MCP tool 'write_file' (tool 'file' of the MCP server 'write') has the name of a built-in "
            "tool; give its server another name in mcp_servers (a server's tools are called <server>_<tool>)",
        ),
        (  # a server called "set" offering "note": set_note is a team tool
            {"set": {"command": sys.executable, "args": [SERVER, "note"]}},
            "MCP tool 'set_note' (tool 'note' of the MCP server 'set') has the name of a team tool; "
            "give its server another name in mcp_servers (a server's tools are called <server>_<tool>)",
        ),
    ],
    ids=[
        "does-not-start",
        "second-does-not-start",
        "name-of-a-built-in-tool",
        "name-of-a-team-tool",
    ],
)
def test_a_run_whose_mcp_servers_cannot_be_used_fails_saying_why(
    write_script: Callable[..., Path], servers: dict[str, object], error: str
) -> None:
    """Before, the run was left `planning` for ever (its end needed the tools it failed to list),
    and a tool named like a built-in one was a traceback."""
    script = write_script([{"purpose": "*", "repeat": True}])
    result = _run_with_servers(script, servers)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert (report["status"], report["error"]) == (
        "failed",
        error.replace("{home}", str(Settings.load().home)),
    )


def test_a_policy_for_a_tool_its_mcp_server_does_not_offer_fails_the_run_before_any_step(
    write_script: Callable[..., Path],
) -> None:
    """Before, `notes_shuot = "deny"` was taken (only the `notes_` part was checked): `notes_shout`
    kept its default policy, and under `--yes` it ran without asking."""
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("loud", tools=["notes_shout"])]}},
            {"purpose": "step:loud", "tool_calls": [{"name": "notes_shout", "args": {"text": "hello"}}]},
            {"purpose": "*", "repeat": True},
        ]
    )
    servers = {"notes": {"command": sys.executable, "args": [SERVER, "add", "shout", "shoot"]}}
    result = _run_with_servers(script, servers, {"notes_shuot": "deny"})
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert (report["status"], report["error"]) == (
        "failed",
        "tool_policies names 'notes_shuot', which is not a tool of this run: the MCP server 'notes' "
        "offers no such tool (it offers: notes_shout, notes_shoot, notes_add)",
    )
    events = run_events(report["run_id"])
    assert [e for e in events if e["kind"] in ("step_started", "tool_call", "tool_result")] == []


def test_a_server_that_prints_a_line_of_its_own_does_not_fill_the_terminal(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """The MCP library logged the line it could not parse, with a traceback, at every call."""
    banner = tmp_path / "banner.py"
    banner.write_text(f"print('Starting notes server v1.0', flush=True)\nexec(open({SERVER!r}).read())\n")
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("loud", tools=["notes_shout"])]}},
            # arguments that do not fit the server's schema go back to the model, not to the server
            {"purpose": "step:loud", "tool_calls": [{"name": "notes_shout", "args": {"txt": "hello"}}]},
            {
                "purpose": "step:loud",
                "expect": ["the arguments do not fit notes_shout: missing argument 'text'"],
                "tool_calls": [{"name": "notes_shout", "args": {"text": "hello"}}],
            },
            {"purpose": "step:loud", "output": "shouted"},
            {"purpose": "*", "repeat": True},
        ]
    )
    result = _run_with_servers(script, {"notes": {"command": sys.executable, "args": [str(banner)]}})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "Failed to parse" not in result.stderr
    assert json.loads(result.stdout)["output"] == "shouted"


def test_a_tool_error_of_a_server_reaches_the_agent_as_a_failure_without_a_library_s_advice(
    write_script: Callable[..., Path],
) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("loud", tools=["notes_shout"])]}},
            {"purpose": "step:loud", "tool_calls": [{"name": "notes_shout", "args": {"text": ""}}]},
            {
                "purpose": "step:loud",
                "output": "gave up",
                "expect": ["[tool error]\nthe tool reported an error: "],
            },
            {"purpose": "*", "repeat": True},
        ]
    )
    result = _run_with_servers(script, {"notes": {"command": sys.executable, "args": [SERVER]}})
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    events = run_events(report["run_id"])
    [failed] = [e["data"] for e in events if e["kind"] == "tool_result"]
    assert failed["error"].startswith("the tool reported an error: ")
    assert "http" not in failed["error"] and "further information" not in failed["error"]
    # the server's own traceback went to its log, not into the terminal's view of the run
    assert "Traceback" not in result.stderr and "there is nothing to shout" not in result.stderr
    log = Settings.load().home / "logs" / "mcp-notes.log"
    assert "there is nothing to shout" in log.read_text()


def test_a_tool_error_quoting_a_secret_from_the_settings_file_reaches_neither_model_nor_record(
    write_script: Callable[..., Path],
) -> None:
    """The server's token is set only in masterplanner.toml and has no credential's shape; the
    server's error quotes it. Before, the model was shown it and the events kept it."""
    token = "plainwordsvalue"
    home = Settings.load().home
    home.mkdir(parents=True, exist_ok=True)
    (home / "masterplanner.toml").write_text(
        f"[mcp_servers.notes]\ncommand = {json.dumps(sys.executable)}\nargs = [{json.dumps(SERVER)}]\n"
        f'env = {{ NOTES_TOKEN = "{token}" }}\n'
    )
    shown = (
        "[tool error]\nthe tool reported an error: Error executing tool shout: the service refused "
        f"NOTES_TOKEN {REMOVED}"
    )
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("loud", tools=["notes_shout"])]}},
            {"purpose": "step:loud", "tool_calls": [{"name": "notes_shout", "args": {"text": "token"}}]},
            {"purpose": "step:loud", "output": "gave up", "expect": [shown]},
            {"purpose": "*", "repeat": True},
        ]
    )
    result = mp("run", "shout it", "--model", f"scripted:{script}", "--yes", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["output"] == "gave up"  # the step's model was shown the error as expected
    run_id = report["run_id"]
    [failed] = [e["data"] for e in run_events(run_id) if e["kind"] == "tool_result"]
    assert failed["error"] == shown.removeprefix("[tool error]\n")
    audit = mp("runs", "audit", run_id, "--json")
    shown_run = mp("runs", "show", run_id, "--json")
    assert audit.returncode == shown_run.returncode == 0, audit.stderr + shown_run.stderr
    for text in (result.stdout, result.stderr, audit.stdout, shown_run.stdout):
        assert token not in text
    # what a person types holding it is refused, as one holding a secret variable's value
    typed = mp("run", f"use {token} to shout", "--model", f"scripted:{script}", "--yes")
    assert typed.returncode == 2
    assert "the task holds what looks like a secret" in typed.stderr and token not in typed.stderr


def _tool_results(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The `tool_result` events of the run a `_run_with_servers` made."""
    assert result.returncode == 0, result.stderr
    events = run_events(json.loads(result.stdout)["run_id"])
    return [e["data"] for e in events if e["kind"] == "tool_result"]


def test_a_tool_goes_to_the_server_that_offers_it_when_one_server_s_name_begins_another_s(
    write_script: Callable[..., Path],
) -> None:
    """Server "a" offers "b_d", server "a_b" offers "c". Before, a_b_d went to "a_b" as "d" (the
    longest server name it begins with): "Unknown tool: d", and "a"'s tool could never be called."""
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("loud", tools=["a_b_d", "a_b_c"])]}},
            {
                "purpose": "step:loud",
                "tool_calls": [
                    {"name": "a_b_d", "args": {"text": "from a"}},
                    {"name": "a_b_c", "args": {"text": "from a_b"}},
                ],
            },
            {"purpose": "step:loud", "output": "shouted"},
            {"purpose": "*", "repeat": True},
        ]
    )
    result = _run_with_servers(
        script,
        {
            "a": {"command": sys.executable, "args": [SERVER, "b_d"]},
            "a_b": {"command": sys.executable, "args": [SERVER, "c"]},
        },
    )
    assert sorted(_tool_results(result), key=lambda data: data["tool"]) == [
        {"tool": "a_b_c", "result": "FROM A_B"},
        {"tool": "a_b_d", "result": "FROM A"},
    ]


LONG_SERVER = "n" * 40
LONG_PREFIX = f"{'n' * 23}_527ccc3e"  # cut to 23, and 8 hex digits of the name's SHA-256


def _labelled(label: str, *tools: str) -> dict[str, object]:
    """The notes server offering `tools`, each answer beginning with `label` (which server it is)."""
    return {"command": sys.executable, "args": [SERVER, *tools], "env": {"NOTES_LABEL": label}}


def test_a_long_server_name_and_tools_of_one_name_on_two_servers_are_offered_apart_and_called_on_their_own(
    write_script: Callable[..., Path],
) -> None:
    """A server name of 40 characters was refused when the settings loaded (a configuration that
    worked elsewhere stopped loading): its tools are offered under a shortened start instead.
    Server "a"'s `b_c` and server "a_b"'s `c` were both `a_b_c`: both are tagged apart."""
    tools = [f"{LONG_PREFIX}_shout", "notes_shout", "a_b_c_10fba79c", "a_b_c_2e7d2c03"]
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("loud", tools=tools)]}},
            {
                "purpose": "step:loud",
                "tool_calls": [{"name": tool, "args": {"text": f"to {tool}"}} for tool in tools],
            },
            {"purpose": "step:loud", "output": "shouted"},
            {"purpose": "*", "repeat": True},
        ]
    )
    servers = {
        LONG_SERVER: _labelled("long: ", "shout"),
        "notes": _labelled("notes: ", "shout"),
        "a": _labelled("a: ", "b_c"),
        "a_b": _labelled("a_b: ", "c"),
    }
    result = _run_with_servers(script, servers, {f"{LONG_PREFIX}_shout": "auto"})
    assert sorted(_tool_results(result), key=lambda data: data["tool"]) == [
        {"tool": "a_b_c_10fba79c", "result": "a: TO A_B_C_10FBA79C"},
        {"tool": "a_b_c_2e7d2c03", "result": "a_b: TO A_B_C_2E7D2C03"},
        {"tool": f"{LONG_PREFIX}_shout", "result": f"long: TO {LONG_PREFIX.upper()}_SHOUT"},
        {"tool": "notes_shout", "result": "notes: TO NOTES_SHOUT"},
    ]


def test_a_misspelt_policy_for_a_long_named_server_s_tool_says_what_the_server_offers(
    write_script: Callable[..., Path],
) -> None:
    """Before, the server was looked for by its whole name (its tools begin with the shortened one):
    "no configured MCP server offers it", though the server was configured and running."""
    script = write_script([{"purpose": "*", "repeat": True}])
    servers = {LONG_SERVER: {"command": sys.executable, "args": [SERVER, "shout", "add"]}}
    result = _run_with_servers(script, servers, {f"{LONG_PREFIX}_shuot": "deny"})
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert (report["status"], report["error"]) == (
        "failed",
        f"tool_policies names '{LONG_PREFIX}_shuot', which is not a tool of this run: the MCP server "
        f"'{LONG_SERVER}' offers no such tool (it offers: {LONG_PREFIX}_shout, {LONG_PREFIX}_add)",
    )


def test_a_policy_naming_a_long_named_server_s_tool_by_the_whole_name_is_told_the_offered_name(
    write_script: Callable[..., Path],
) -> None:
    """Before, the refusal said to write <server>_<tool>, which is what the policy said."""
    script = write_script([{"purpose": "*", "repeat": True}])
    servers = {LONG_SERVER: {"command": sys.executable, "args": [SERVER]}}
    result = _run_with_servers(script, servers, {f"{LONG_SERVER}_shout": "deny"})
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "error: setting 'tool_policies' (from MASTERPLANNER_TOOL_POLICIES): tool_policies names "
        f"'{LONG_SERVER}_shout', which is not a tool; the MCP server '{LONG_SERVER}' has a name of "
        f"more than 32 characters, so its tools are named {LONG_PREFIX}_<tool>: did you mean "
        f"'{LONG_PREFIX}_shout'?"
    )


def test_a_tool_s_content_other_than_text_reaches_the_agent_described(
    write_script: Callable[..., Path],
) -> None:
    """Before, an image or a resource's text came as '' and an empty text as "{'result': ''}"."""
    mixed = "\n".join(
        [
            "here it is",
            "[image/png, 1,234 bytes]",
            "[audio/wav, 5 bytes]",
            "resource text here",
            "[resource file:///data.bin, application/octet-stream, 10 bytes]",
            "[resource https://example.com/report.pdf]",
        ]
    )
    structured = '{"count": 2, "names": ["ä", "b"]}'
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("look", tools=CONTENT_TOOLS)]}},
            {"purpose": "step:look", "tool_calls": [{"name": name, "args": {}} for name in CONTENT_TOOLS]},
            {"purpose": "step:look", "output": "looked", "expect": [mixed, structured]},
            {"purpose": "*", "repeat": True},
        ]
    )
    result = _run_with_servers(script, {"content": {"command": sys.executable, "args": [CONTENT_SERVER]}})
    assert sorted(_tool_results(result), key=lambda data: data["tool"]) == [
        {"tool": "content_empty", "result": ""},
        {"tool": "content_mixed", "result": mixed},
        {"tool": "content_structured", "result": structured},
    ]


async def test_a_review_edit_giving_a_policy_to_a_tool_its_server_lacks_is_refused_and_asked_again(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the edit was applied: `notes_shuot` got the policy, and `notes_shout` kept its own."""
    import asyncio

    from masterplanner import Engine, RunOptions
    from masterplanner.service import RunService

    monkeypatch.setenv(
        "MASTERPLANNER_MCP_SERVERS", json.dumps({"notes": {"command": sys.executable, "args": [SERVER]}})
    )
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("loud")]}},
            {"purpose": "step:loud", "output": "done"},
            {"purpose": "*", "repeat": True},
        ]
    )
    engine = Engine(Settings.load())
    service = RunService(engine.settings)
    run = engine.create_run("shout it", model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
    execution = asyncio.ensure_future(engine.execute(run.id))

    async def review(besides: str = "") -> Any:
        while True:
            found = [r for r in await service.pending(run.id) if r.kind == "plan_review" and r.id != besides]
            if found:
                return found[0]
            await asyncio.sleep(0.05)

    try:
        first = await asyncio.wait_for(review(), 60)
        await service.answer(
            first.id, {"action": "approve", "tool_policies": {"notes_shuot": "auto"}}, by="t"
        )
        again = await asyncio.wait_for(review(besides=first.id), 60)
        assert again.payload["refused_edit"] == (
            "tool_policies names 'notes_shuot', which is not a tool of this run: the MCP server 'notes' "
            "offers no such tool (it offers: notes_shout)"
        )
        await service.answer(
            again.id, {"action": "approve", "tool_policies": {"notes_shout": "deny"}}, by="t"
        )
        final = await asyncio.wait_for(execution, 60)
    finally:
        if not execution.done():
            execution.cancel()
        service.close()
        engine.close()
    assert final.status == "succeeded", final.error
    assert final.options.tool_policies == {"notes_shout": "deny"}
