"""The database layer: unreachable servers named without their password, calls made again after a drop."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from _cli import mp
from _plans import step

from masterplanner import ConfigError, DatabaseUnavailableError, Remedy, RunError, RunOptions, Said, Settings
from masterplanner.database import reconnecting, shown_url
from masterplanner.engine import Engine
from masterplanner.engine.records import EventKind
from masterplanner.engine.store import RunStore


@pytest.mark.parametrize(
    ("url", "cause"),
    [
        ("postgresql://planner:s3cret-pw@127.0.0.1:1/nowhere", "the connection was refused"),
        (
            "postgresql://planner:s3cret-pw@no-such-host.invalid/nowhere",
            "its host name 'no-such-host.invalid' is not known",
        ),
        ("postgresql://planner:s3cret-pw@/nowhere?host=/nonexistent", "no server's socket is at that path"),
        # psycopg tries each and lists every failure: all of them refused
        (
            "postgresql://planner:s3cret-pw@/nowhere?host=127.0.0.1:1&host=127.0.0.1:2",
            "the connection was refused",
        ),
    ],
)
def test_an_unreachable_postgres_server_is_named_without_its_password_in_our_words(
    url: str, cause: str
) -> None:
    """Before, libpq's words: `connection failed: connection to server at "127.0.0.1", port 1 failed: …`."""
    with pytest.raises(DatabaseUnavailableError) as caught:
        RunStore(url)
    assert str(caught.value) == (
        f"the database at {shown_url(url)} cannot be reached ({cause}): cannot open it"
    )
    assert "s3cret-pw" not in str(caught.value)


class _RefusingServer(socketserver.ThreadingTCPServer):
    """A Postgres server on 127.0.0.1 that answers and refuses: it has no SSL and wants a password.

    Counts the connections made to it.
    """

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        self.connections = 0
        super().__init__(("127.0.0.1", 0), _RefusingHandler)


class _RefusingHandler(socketserver.BaseRequestHandler):
    server: _RefusingServer

    def handle(self) -> None:
        self.server.connections += 1
        while True:
            head = self.request.recv(8, socket.MSG_WAITALL)
            if len(head) < 8:
                return
            length, code = struct.unpack("!ii", head)
            self.request.recv(length - 8, socket.MSG_WAITALL)
            if code in (80877103, 80877104):  # SSLRequest, GSSENCRequest: not here
                self.request.sendall(b"N")
            else:  # the startup message: a password is asked for (AuthenticationCleartextPassword)
                self.request.sendall(b"R" + struct.pack("!ii", 8, 3))


@pytest.fixture
def refusing_server() -> Iterator[_RefusingServer]:
    server = _RefusingServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("query", "answer"),
    [
        ("sslmode=require", "server does not support SSL, but SSL was required"),
        ("sslmode=disable", "fe_sendauth: no password supplied"),
    ],
)
@pytest.mark.parametrize("refused", ["first", "last"])
def test_a_server_that_answered_and_refused_keeps_its_words_beside_an_address_that_refused(
    refusing_server: _RefusingServer, query: str, answer: str, refused: str
) -> None:
    """psycopg tries every host (and each address of a name: IPv6 refused, IPv4 up) and lists
    every failure, the last attempt's on its first line. Before, one refused attempt anywhere in
    that list made it 'cannot be reached (the connection was refused)', the server's answer lost;
    and opening the store tried five times."""
    port = refusing_server.server_address[1]
    hosts = [f"host=127.0.0.1:{port}", "host=127.0.0.1:1"]
    url = f"postgresql://planner@/nowhere?{'&'.join(hosts[::-1] if refused == 'first' else hosts)}&{query}"
    with pytest.raises(DatabaseUnavailableError) as caught:
        RunStore(url)
    assert str(caught.value) == (
        f'database {url}: cannot open it: connection failed: connection to server at "127.0.0.1", '
        f"port {port} failed: {answer}"
    )
    assert refusing_server.connections == 1  # once: a command fails at once, it does not wait


def test_read_commands_say_an_unreachable_database_cannot_be_reached(tmp_path: Path) -> None:
    url = "postgresql://postgres:s3cret-pw@127.0.0.1:1/x"
    for command in (["runs", "list"], ["runs", "show", "r1"], ["agents", "list"]):
        said = subprocess.run(
            [sys.executable, "-m", "masterplanner", *command],
            capture_output=True,
            text=True,
            env={
                **os.environ,
                "MASTERPLANNER_HOME": str(tmp_path / "home"),
                "MASTERPLANNER_DATABASE_URL": url,
                "COLUMNS": "300",
            },
            timeout=120,
        )
        assert (said.returncode, said.stdout) == (1, ""), command
        assert said.stderr == (
            "error: the database at postgresql://postgres:[secret removed]@127.0.0.1:1/x cannot be reached "
            "(the connection was refused): cannot open it\n"
        ), command


@pytest.mark.parametrize("password", ["s3cret?PW", "s3c/ret@PW"])
def test_a_password_with_unescaped_url_characters_is_in_no_message(password: str) -> None:
    """Unescaped, `?` hid the password from the masking, and `@` put a piece of it in the driver's words."""
    with pytest.raises(DatabaseUnavailableError) as caught:
        RunStore(f"postgresql://postgres:{password}@127.0.0.1:5432/mp_no_such_database")
    message = str(caught.value)
    shown = "postgresql://postgres:[secret removed]@127.0.0.1:5432/mp_no_such_database"
    # the server's refusal, or (no server on this machine, or a host split off by `@`) ours
    reached, unreached = f"database {shown}: ", f"the database at {shown} cannot be reached ("
    assert message.startswith((reached, unreached)), message
    assert "PW" not in message and "s3c" not in message, message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql://postgres:p%40ssW0rd@127.0.0.1:5432/x",
            "postgresql://postgres:[secret removed]@127.0.0.1:5432/x",
        ),
        ("postgresql://u:a@b/c@h/db", "postgresql://u:[secret removed]@h/db"),
        (
            "postgresql://postgres:s3cret?PW@127.0.0.1:5432/db",
            "postgresql://postgres:[secret removed]@127.0.0.1:5432/db",
        ),
        ("postgresql://u:pw@h/db?sslmode=require", "postgresql://u:[secret removed]@h/db?sslmode=require"),
        (
            "postgresql://h/db?user=u&password=zz&sslmode=require",
            "postgresql://h/db?user=u&password=[secret removed]&sslmode=require",
        ),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        # without its scheme (refused for that, and echoed): the password still goes
        ("alice:s3cretpass@db.example/runs", "alice:[secret removed]@db.example/runs"),
        # libpq's `sslpassword`, and other credential-named parameters
        (
            "postgresql://h/db?sslpassword=zz&sslmode=require&token=t1",
            "postgresql://h/db?sslpassword=[secret removed]&sslmode=require&token=[secret removed]",
        ),
        # a value holding `#` or a space, as the driver reads it: to the next `&`
        (
            "postgresql://alice@db.example/app?password=s3cr#et99",
            "postgresql://alice@db.example/app?password=[secret removed]",
        ),
        (
            "postgresql://h/db?password=two words&sslmode=require",
            "postgresql://h/db?password=[secret removed]&sslmode=require",
        ),
        ("sqlite:////tmp/a.sqlite", "sqlite:////tmp/a.sqlite"),
    ],
)
def test_a_database_url_is_shown_without_its_password_however_it_is_written(url: str, shown: str) -> None:
    assert shown_url(url) == shown


@pytest.mark.parametrize(
    ("url", "error"),
    [
        (
            "mysql://u:s3cretPW@h/db",
            "database URL 'mysql://u:[secret removed]@h/db' is not usable: masterplanner stores runs in "
            "SQLite (sqlite:///PATH) or PostgreSQL (postgresql://USER@HOST:PORT/DATABASE)",
        ),
        (
            "postgresql://postgres:s3cretPW@127.0.0.1:notaport/x",
            "database URL 'postgresql://postgres:[secret removed]@127.0.0.1:notaport/x' is not usable: "
            "its port is not a number",
        ),
    ],
)
def test_an_unusable_database_url_is_a_configuration_error_without_its_password(url: str, error: str) -> None:
    with pytest.raises(ConfigError) as refused:
        RunStore(url)
    assert str(refused.value) == error


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://", "sqlite:///:memory:"])
def test_an_sqlite_url_without_a_file_is_refused_in_one_line(url: str, tmp_path: Path) -> None:
    """Before, each connection had a database of its own: tracebacks, then "no such table: mp_runs"."""
    listed = subprocess.run(
        [sys.executable, "-m", "masterplanner", "runs", "list"],
        capture_output=True,
        text=True,
        env={
            **os.environ,
            "MASTERPLANNER_HOME": str(tmp_path / "home"),
            "MASTERPLANNER_DATABASE_URL": url,
            "COLUMNS": "200",
        },
        timeout=60,
    )
    assert (listed.returncode, listed.stdout) == (2, "")
    assert listed.stderr == f"error: database_url {url!r} names no file: give SQLite one (sqlite:///PATH)\n"


@pytest.mark.parametrize("url", ["postgresql://", "postgresql:///", "postgres://user@localhost:5432"])
def test_a_postgres_url_without_a_database_name_is_refused_in_one_line(url: str, tmp_path: Path) -> None:
    """Before, libpq's defaults chose the database (PGDATABASE, else the user's name) and the
    tables were made in whichever that was, or the error was libpq's."""
    listed = subprocess.run(
        [sys.executable, "-m", "masterplanner", "runs", "list"],
        capture_output=True,
        text=True,
        env={**os.environ, "MASTERPLANNER_HOME": str(tmp_path / "home"), "MASTERPLANNER_DATABASE_URL": url},
        timeout=60,
    )
    assert (listed.returncode, listed.stdout) == (2, "")
    assert listed.stderr == (
        f"error: database_url {url!r} names no database: give PostgreSQL one "
        "(postgresql://USER@HOST:PORT/DATABASE, or postgresql:///DATABASE through the local "
        "server's socket)\n"
    )


@pytest.mark.parametrize("url", ["postgresql:///?service=team", "postgresql://db.example/?dbname=runs"])
def test_a_postgres_url_naming_its_database_by_a_parameter_is_taken(url: str) -> None:
    """A pg_service.conf entry names the database there: `?service=` was refused as naming none."""
    from masterplanner.database import create_engine

    engine = create_engine(url)  # nothing is connected to yet
    assert engine.dialect.name == "postgresql"
    engine.dispose()


def test_a_call_is_made_again_while_the_database_is_unavailable() -> None:
    attempts: list[int] = []

    @reconnecting
    def write(value: int) -> int:
        attempts.append(value)
        if len(attempts) < 3:
            raise DatabaseUnavailableError("database x: cannot write: server closed the connection")
        return value * 2

    assert write(21) == 42
    assert attempts == [21, 21, 21]

    @reconnecting
    def broken() -> None:
        attempts.append(0)
        raise RunError("database x: cannot write: disk full")

    attempts.clear()
    with pytest.raises(RunError, match="disk full"):
        broken()
    assert attempts == [0]  # other failures are not retried


def test_a_process_stopping_while_the_database_is_away_does_not_wait_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from masterplanner.engine.processes import Heartbeat

    store = RunStore(f"sqlite:///{tmp_path / 'runs.sqlite'}")
    store.processes.register("p1", "worker", lease_s=30)
    heartbeat = Heartbeat(store.processes, "p1", lease_s=30)
    heartbeat.start()
    attempts: list[str] = []

    def away(action: str) -> None:
        attempts.append(action)
        raise DatabaseUnavailableError(f"database x: cannot {action}: connection refused")

    with monkeypatch.context() as patched:  # undone here (not the fixtures' patches too)
        patched.setattr(store, "begin", away)
        heartbeat.stop()  # one try; `Processes.stop` itself would keep trying for RECONNECT_S (60 s)
        assert attempts == ["record a process's stop"]
    assert [record.alive for record in store.processes.listed(include_dead=True)] == [
        True
    ]  # lapses by itself
    store.close()


def test_a_lease_that_lapsed_is_not_renewed_and_the_heartbeat_is_told(tmp_path: Path) -> None:
    import sqlalchemy as sa

    from masterplanner.engine.processes import Heartbeat, processes_table

    store = RunStore(f"sqlite:///{tmp_path / 'runs.sqlite'}")
    store.processes.register("p1", "worker", lease_s=30)
    heartbeat = Heartbeat(store.processes, "p1", lease_s=30)  # renewed by hand here, no thread
    assert heartbeat.renew() and not heartbeat.lost.is_set()
    with store.begin("let the lease lapse") as connection:
        connection.execute(sa.update(processes_table).values(lease_until=0.0))
    # a worker suspended past its lease: others may be taking its steps; it stays lost
    assert not heartbeat.renew() and heartbeat.lost.is_set()
    with store.begin("a renewal in time") as connection:
        connection.execute(sa.update(processes_table).values(lease_until=1e12))
    assert not heartbeat.renew()
    assert [record.alive for record in store.processes.listed(include_dead=True)] == [True]
    store.close()


def test_workers_json_says_the_pid_namespace_each_pid_belongs_to(tmp_path: Path) -> None:
    """A pid means something only in its pid namespace: before, `workers --json` gave the pid
    without it, so two workers of one host name in two containers could not be told apart."""
    import json

    from masterplanner.engine.processes import pid_namespace_of_this_process

    url = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    store = RunStore(url)
    store.processes.register("w1", "worker", lease_s=60, queues=["steps"], concurrency=2)
    store.close()
    listed = subprocess.run(
        [sys.executable, "-m", "masterplanner", "workers", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "MASTERPLANNER_DATABASE_URL": url},
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    (worker,) = json.loads(listed.stdout)
    assert worker["heard_from_s"] >= 0
    del worker["heard_from_s"]
    assert worker == {
        "id": "w1",
        "kind": "worker",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_namespace": pid_namespace_of_this_process(),
        "queues": ["steps"],
        "concurrency": 2,
        "alive": True,
        "stopped": False,
    }


def test_only_workers_that_are_alive_count_as_running(tmp_path: Path) -> None:
    """Before, every live lease counted (`_limits_change`): a worker killed a moment ago, or this
    process in an earlier life, was "already running" beside the worker that replaced it."""
    url = f"sqlite:///{tmp_path / 'runs.sqlite'}"
    register = (
        "import sys, time\n"
        "from masterplanner.engine.store import RunStore\n"
        "store = RunStore(sys.argv[1])\n"
        "store.processes.register(sys.argv[2], 'worker', lease_s=60)\n"
        "print('registered', flush=True)\n"
        "if sys.argv[3] == 'stay':\n"
        "    sys.stdin.readline()\n"
    )
    ended = subprocess.run(
        [sys.executable, "-c", register, url, "ended", "go"], capture_output=True, text=True, timeout=60
    )
    assert ended.returncode == 0, ended.stderr
    alive = subprocess.Popen(
        [sys.executable, "-c", register, url, "alive", "stay"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert alive.stdout is not None and alive.stdout.readline() == "registered\n"
        store = RunStore(url)
        store.processes.register("earlier-life", "worker", lease_s=60)  # this process's pid
        store.processes.register("stopped", "worker", lease_s=60)
        store.processes.stop("stopped")
        store.processes.register("a-run", "process", lease_s=60)
        # every lease but the stopped one's is live; only the process still running is a running worker
        assert sorted(record.id for record in store.processes.listed()) == [
            "a-run",
            "alive",
            "earlier-life",
            "ended",
        ]
        assert [record.id for record in store.processes.running_workers()] == ["alive"]
        store.close()
    finally:
        alive.communicate("\n", timeout=60)


_REGISTER_WORKER = (
    "import os, sys\n"
    "from masterplanner.engine.store import RunStore\n"
    "store = RunStore(sys.argv[1])\n"
    "store.processes.register(sys.argv[2], 'worker', lease_s=60)\n"
    "print(os.getpid(), flush=True)\n"
    "if sys.argv[3] == 'stay':\n"
    "    sys.stdin.readline()\n"
)


def _ended_worker(url: str, process_id: str) -> int:
    """Register a worker from a process of this pid namespace that then ends; its pid."""
    ended = subprocess.run(
        [sys.executable, "-c", _REGISTER_WORKER, url, process_id, "go"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ended.returncode == 0, ended.stderr
    return int(ended.stdout)


def test_a_worker_in_another_pid_namespace_under_this_host_name_counts_as_running(database_url: str) -> None:
    """Before, a worker of this host name whose pid no process here had was left out: a live
    worker in a container beside this one (`--network host`) has a pid of its own namespace."""
    # a new pid namespace whose next pid is one no process of ours has, as in another container
    free = next(pid for pid in range(30000, 1000, -1) if not Path(f"/proc/{pid}").exists())
    container = ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c"]
    first = 'echo "$1" > /proc/sys/kernel/ns_last_pid && shift && "$@"; true'
    if shutil.which("unshare") is None or subprocess.run([*container, first, "sh", "1", "true"]).returncode:
        pytest.skip("cannot start a process in a pid namespace of its own (unshare --pid)")
    register = [sys.executable, "-c", _REGISTER_WORKER, database_url, "in-a-container", "stay"]
    elsewhere = subprocess.Popen(
        [*container, first, "sh", str(free - 1), *register],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert elsewhere.stdout is not None and elsewhere.stdout.readline() == f"{free}\n"
        assert not Path(f"/proc/{free}").exists()  # its pid is no process's here
        _ended_worker(database_url, "ended-here")
        store = RunStore(database_url)
        try:
            store.processes.register("earlier-life", "worker", lease_s=60)  # this process's pid
            workers = {record.id: record for record in store.processes.listed()}
            assert sorted(workers) == ["earlier-life", "ended-here", "in-a-container"]
            assert {record.host for record in workers.values()} == {socket.gethostname()}
            assert workers["in-a-container"].pid == free
            assert [record.id for record in store.processes.running_workers()] == ["in-a-container"]
        finally:
            store.close()
    finally:
        elsewhere.communicate("\n", timeout=60)


def test_a_worker_recorded_before_pid_namespaces_is_judged_by_its_host_name(database_url: str) -> None:
    """Migration `0010_process_pid_namespace` on a database whose workers have no namespace: as
    before it, one of this host name whose pid no process has is not running; one of another is."""
    import sqlalchemy as sa

    dead_pid = _ended_worker(database_url, "written")
    store = RunStore(database_url)
    with store.begin("make the database as versions before the migration left it") as connection:
        for process_id, host in [("ended-here", socket.gethostname()), ("of-another-host", "elsewhere")]:
            connection.execute(
                sa.text(
                    "INSERT INTO mp_processes (id, kind, host, pid, queues, started_at, heartbeat_at, "
                    "lease_until, stopped) SELECT :id, kind, :host, pid, queues, started_at, heartbeat_at, "
                    "lease_until, stopped FROM mp_processes WHERE id = 'written'"
                ),
                {"id": process_id, "host": host},
            )
        connection.execute(sa.text("DELETE FROM mp_processes WHERE id = 'written'"))
        connection.execute(sa.text("ALTER TABLE mp_processes DROP COLUMN pid_namespace"))
        connection.execute(sa.text("DELETE FROM mp_migrations WHERE name = '0010_process_pid_namespace'"))
    store.close()
    store = RunStore(database_url)
    try:
        workers = {record.id: (record.host, record.pid) for record in store.processes.listed()}
        assert workers == {
            "ended-here": (socket.gethostname(), dead_pid),
            "of-another-host": ("elsewhere", dead_pid),
        }
        assert [record.id for record in store.processes.running_workers()] == ["of-another-host"]
        store.processes.register("this-one", "worker", lease_s=60)  # with its namespace: the column is back
        assert sorted(record.id for record in store.processes.listed()) == [
            "ended-here",
            "of-another-host",
            "this-one",
        ]
    finally:
        store.close()


def test_a_worker_is_offered_only_the_queued_runs_of_its_providers(tmp_path: Path) -> None:
    from masterplanner.engine import RunOptions

    store = RunStore(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        for run_id, model in [
            ("r1", "openai:gpt-4o"),
            ("r2", "local"),
            ("r3", "scripted:/tmp/s.json"),
            ("r4", "local:/models/x.gguf"),
            ("r5", "openai-like:x"),  # not openai's: a provider is the whole part before the colon
        ]:
            store.create_run(
                run_id, "a task", model=model, workspace=str(tmp_path), options=RunOptions(), for_workers=True
            )
            time.sleep(0.002)  # oldest first, by the millisecond
        store.create_run("r6", "not queued", model="local", workspace=str(tmp_path), options=RunOptions())
        assert store.claimable_runs(10, providers=["local", "scripted"]) == ["r2", "r3", "r4"]
        assert store.claimable_runs(10, providers=["openai"]) == ["r1"]
        assert store.claimable_runs(10, providers=["local", "scripted"], excluding=["r2"]) == ["r3", "r4"]
        assert store.claimable_runs(1, providers=["local"]) == ["r2"]
        assert store.claimable_runs(10, providers=[]) == []
        assert store.claim("r2", "w1:1:x", lease_s=30)
        assert store.claimable_runs(10, providers=["local"]) == ["r4"]  # r2 is held
    finally:
        store.close()


async def test_a_stopping_worker_hands_each_run_over_to_the_next_worker(
    database_url: str, tmp_path: Path
) -> None:
    """`hand_over`: a run queued for workers is queued again; one taken over from a dead `run`
    process, or ending, is abandoned at once. Before, a worker that stopped gave every lease up,
    and the last two were claimed by no worker (neither queued nor abandoned)."""
    from masterplanner import RunService

    store = RunStore(database_url)
    service = RunService(Settings.load())
    try:
        for run_id, for_workers, status in [
            ("queued-planning", True, "planning"),
            ("queued-running", True, "running"),
            ("left-by-its-run", False, "running"),  # its `run` process died; a worker took it over
            ("ending", True, "succeeded"),  # its end (telling the registry) outlasted the stop
            ("cancelled", False, "cancelled"),
        ]:
            store.create_run(
                run_id,
                "a task",
                model="local",
                workspace=str(tmp_path),
                options=RunOptions(),
                for_workers=for_workers,
            )
            assert store.claim(run_id, f"worker:1:x/{run_id}", lease_s=60)
            assert store.update_run(run_id, status=status)
            await asyncio.sleep(0.002)  # oldest first, by the millisecond
        store.hand_over("ending", "another:2:y/ending")  # not its lease: left as it is
        assert store.lease("ending").owner == "worker:1:x/ending"  # type: ignore[union-attr]
        assert store.claimable_runs(10, providers=["local"]) == []
        for run_id in ("queued-planning", "queued-running", "left-by-its-run", "ending", "cancelled"):
            store.hand_over(run_id, f"worker:1:x/{run_id}")
        # the stopping worker's guard renewing its leases as it hands them over: nothing renewed
        store.heartbeats({"left-by-its-run": "worker:1:x/left-by-its-run"}, lease_s=60)
        assert store.claimable_runs(10, providers=["local"]) == [
            "queued-planning",
            "queued-running",
            "left-by-its-run",
            "ending",
        ]
        assert store.abandoned_runs() == ["left-by-its-run", "ending"]
        assert [store.lease(run_id) for run_id in ("queued-planning", "queued-running", "cancelled")] == [
            None
        ] * 3
        left = store.lease("left-by-its-run")
        assert left is not None and (left.owner, left.left_s) == (
            "worker:1:x/left-by-its-run#handed-over",
            0.0,
        )
        # while no worker runs: as a run whose process died (`runs resume`, or the next worker)
        records = [await service.get(run_id) for run_id in ("queued-running", "left-by-its-run", "ending")]
        assert await service.idle(records) == {"queued-running": "queued", "left-by-its-run": "stopped"}
        assert [await service.waiting(record) for record in records] == [
            Said(
                "no worker is running on this database: "
                "the run waits until one starts (`masterplanner worker`)"
            ),
            Said(
                "no process is executing it (the one that did stopped)", Remedy("resume", "left-by-its-run")
            ),
            None,
        ]
        assert store.claim("left-by-its-run", "worker:2:z/next", lease_s=60)  # the next worker takes it
    finally:
        service.close()
        store.close()


def test_the_sqlite_database_file_is_only_its_owners(tmp_path: Path) -> None:
    path = tmp_path / "masterplanner.sqlite"
    RunStore(f"sqlite:///{path}").list_runs()
    assert (path.stat().st_mode & 0o777) == 0o600


def test_a_database_made_before_planning_was_kept_takes_it_and_its_planning_run_goes_on(
    database_url: str, write_script: Callable[..., Path]
) -> None:
    """Migration `0012_run_planning` on a database whose `mp_runs` has no `planning` column, with
    a run in it stopped while planning (as versions before it left one): the column is added, and
    the run, resumed, is planned, its work kept as it goes and cleared once its plan is ready."""
    import sqlalchemy as sa

    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "*", "repeat": True},
        ]
    )
    engine = Engine(Settings.load())
    try:
        run_id = engine.create_run(
            "one thing", model=f"scripted:{script}", options=RunOptions(auto_approve=True)
        ).id
    finally:
        engine.close()
    store = RunStore(database_url)
    with store.begin("make the database as versions before the migration left it") as connection:
        connection.execute(sa.text("ALTER TABLE mp_runs DROP COLUMN planning"))
        connection.execute(sa.text("DELETE FROM mp_migrations WHERE name = '0012_run_planning'"))
    store.close()
    resumed = mp("runs", "resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert (report["status"], report["output"]) == ("succeeded", "A")
    calls = {purpose: entry["calls"] for purpose, entry in report["usage"]["by_purpose"].items()}
    assert calls == {"planner": 1, "prompt_creator": 2, "critic": 1, "step:a": 1}
    store = RunStore(database_url)
    try:
        with store.begin("read the schema") as connection:
            columns = {column["name"] for column in sa.inspect(connection).get_columns("mp_runs")}
            applied = list(connection.scalars(sa.text("SELECT name FROM mp_migrations")))
        assert "planning" in columns
        assert applied.count("0012_run_planning") == 1
        assert store.kept_planning(run_id) is None  # kept while planning, cleared when the plan was ready
        progress = [event.data for event in store.events(run_id) if event.kind == "planning_progress"]
        assert {"stage": "steps"} in progress and not any(data["stage"] == "resumed" for data in progress)
    finally:
        store.close()


def test_kept_planning_is_written_only_by_the_holder_of_the_run_s_lease(database_url: str) -> None:
    """Before, a process that had lost the run's lease (it stalled past it and another took the
    run over) still wrote its planning work over the new holder's."""
    store = RunStore(database_url)
    try:
        store.create_run("r1", "plan me", model="scripted:x", workspace="/tmp", options=RunOptions())
        assert not store.keep_planning("r1", {"plan": "by nobody"}, owner="first")  # nobody holds it
        assert store.kept_planning("r1") is None
        assert store.claim("r1", "first", lease_s=0.05)
        assert store.keep_planning("r1", {"plan": "by the first"}, owner="first")
        time.sleep(0.2)  # the first stalls past its lease; the second takes the run over
        assert store.claim("r1", "second", lease_s=60)
        assert not store.keep_planning("r1", {"plan": "by the first, late"}, owner="first")
        assert store.kept_planning("r1") == {"plan": "by the first"}
        assert store.keep_planning("r1", {"plan": "by the second"}, owner="second")
        assert store.kept_planning("r1") == {"plan": "by the second"}
        # nor its plan, once made: the run awaits approval of the holder's
        assert not store.set_status("r1", "awaiting_approval", owner="first", planning=None)
        assert store.get_run("r1").status == "planning"
        assert store.set_status("r1", "awaiting_approval", owner="second", planning=None)
        assert store.get_run("r1").status == "awaiting_approval"
    finally:
        store.close()


def test_a_database_made_before_answer_tokens_takes_answers_once_migrated(database_url: str) -> None:
    """Migration `0015_request_answer_call`: the column of the token an answer's call stores with it."""
    import sqlalchemy as sa

    store = RunStore(database_url)
    with store.begin("make the database as versions before the migration left it") as connection:
        connection.execute(sa.text("ALTER TABLE mp_requests DROP COLUMN answer_call"))
        connection.execute(sa.text("DELETE FROM mp_migrations WHERE name = '0015_request_answer_call'"))
    store.close()
    store = RunStore(database_url)
    try:
        request, _ = store.requests.open("r1", "ask_user", {"question": "Which?"}, key="r1:ask")
        answered = store.requests.answer(request.id, {"text": "this"}, by="cli@host:1")
        assert (answered.state, answered.answer) == ("answered", {"text": "this"})
        assert not answered.taken_before
        assert store.requests.answer(request.id, {"text": "this"}, by="cli@host:2").taken_before
        with store.begin("read the schema") as connection:
            columns = {column["name"] for column in sa.inspect(connection).get_columns("mp_requests")}
            applied = list(connection.scalars(sa.text("SELECT name FROM mp_migrations")))
        assert "answer_call" in columns
        assert applied.count("0015_request_answer_call") == 1
    finally:
        store.close()


def test_a_run_s_request_keys_are_found_by_its_id_in_a_database_new_or_made_before(database_url: str) -> None:
    """Migration `0016_usage_requests_run_index`: the end of a run deletes its request keys
    (`DELETE FROM mp_usage_requests WHERE run_id = …`, in the end's transaction), which read the
    whole table, every run's keys, with no index on `run_id`."""
    import sqlalchemy as sa

    def indexed(store: RunStore) -> list[list[str | None]]:
        with store.begin("read the schema") as connection:
            return [
                index["column_names"] for index in sa.inspect(connection).get_indexes("mp_usage_requests")
            ]

    store = RunStore(database_url)
    try:
        assert indexed(store) == [["run_id"]]  # a new database
        with store.begin("make the database as versions before the migration left it") as connection:
            connection.execute(sa.text("DROP INDEX ix_mp_usage_requests_run_id"))
            connection.execute(
                sa.text("DELETE FROM mp_migrations WHERE name = '0016_usage_requests_run_index'")
            )
        assert indexed(store) == []
    finally:
        store.close()
    store = RunStore(database_url)
    try:
        assert indexed(store) == [["run_id"]]
        with store.begin("read the migrations") as connection:
            applied = list(connection.scalars(sa.text("SELECT name FROM mp_migrations")))
        assert applied.count("0016_usage_requests_run_index") == 1
        store.create_run("r1", "x", model="scripted:x", workspace="/tmp", options=RunOptions())
        store.add_usage("r1", "planner", input_tokens=1, output_tokens=1, seconds=0.1, request="k1")
        assert store.set_status("r1", "failed", error="x")
        with store.begin("read the keys") as connection:
            assert connection.scalar(sa.text("SELECT COUNT(*) FROM mp_usage_requests")) == 0
    finally:
        store.close()


def test_an_end_made_again_once_recorded_writes_nothing_more(database_url: str) -> None:
    """A run's end made again after it was recorded (its workflow's step re-run after a crash, a
    write repeated after a lost acknowledgement) appended a second `run_failed`; a cancel of a
    cancelled run writes nothing."""
    store = RunStore(database_url)
    try:

        def end(run_id: str, status: Literal["failed", "cancelled"], event: EventKind) -> bool:
            cancel = status == "cancelled"
            return store.end_run(
                run_id,
                status,
                event,
                {"reason": "x"},
                requests="cancelled" if cancel else "expired",
                keep_remember=not cancel,
                unstarted_finished=not cancel,
                error="x",
            )

        for run_id in ("r1", "r2"):
            store.create_run(run_id, "x", model="scripted:x", workspace="/tmp", options=RunOptions())
        assert (end("r1", "failed", "run_failed"), end("r1", "failed", "run_failed")) == (True, True)
        assert (end("r2", "cancelled", "run_cancelled"), end("r2", "cancelled", "run_cancelled")) == (
            True,
            False,
        )
        assert not end("r2", "failed", "run_failed")  # a cancelled run stays cancelled
        assert [event.kind for event in store.events("r1")].count("run_failed") == 1
        assert [event.kind for event in store.events("r2")][-1:] == ["run_cancelled"]
        assert [event.kind for event in store.events("r2")].count("run_cancelled") == 1
    finally:
        store.close()


def test_a_review_s_decision_is_written_once_and_only_by_the_lease_holder(database_url: str) -> None:
    """`RunStore.decide_review`: the decision's event and the run's move, in one transaction.

    Written only while its writer holds the run's lease; made again once recorded (a write
    repeated after a lost acknowledgement), it writes nothing more; a cancel recorded before it stands.
    """
    from masterplanner.engine.control import mark_cancelled

    store = RunStore(database_url)
    try:
        for run_id in ("r1", "r2", "r3"):
            store.create_run(run_id, "x", model="scripted:x", workspace="/tmp", options=RunOptions())
            assert store.set_status(run_id, "awaiting_approval")
            assert store.claim(run_id, "first", lease_s=0.05)
        time.sleep(0.2)  # the first stalls past its leases; the second takes r1 and r2 over
        for run_id in ("r1", "r2"):
            assert store.claim(run_id, "second", lease_s=60)

        def decisions(run_id: str) -> list[tuple[str, dict[str, object]]]:
            return [(e.kind, e.data) for e in store.events(run_id) if e.kind in ("approved", "rejected")]

        assert not store.decide_review("r1", "approved", {"by": "person"}, owner="first")
        assert (store.get_run("r1").status, decisions("r1")) == ("awaiting_approval", [])
        assert store.decide_review("r1", "approved", {"by": "person"}, owner="second")
        assert store.decide_review("r1", "approved", {"by": "person"}, owner="second")  # made again
        assert not store.decide_review("r1", "approved", {"by": "person"}, owner="first")
        assert (store.get_run("r1").status, decisions("r1")) == ("running", [("approved", {"by": "person"})])

        rejection = {"reason": "no", "by": "person"}
        assert not store.decide_review("r2", "rejected", rejection, owner="first")
        assert (store.get_run("r2").status, decisions("r2")) == ("awaiting_approval", [])
        assert store.decide_review("r2", "rejected", rejection, owner="second")
        assert not store.decide_review("r2", "rejected", rejection, owner="second")  # made again
        rejected = store.get_run("r2")
        assert (rejected.status, rejected.error) == ("cancelled", "rejected: no")
        assert decisions("r2") == [("rejected", rejection)]
        assert [event.kind for event in store.events("r2")][-1] == "rejected"

        mark_cancelled(store, "r3")  # a cancel recorded before the decision stands
        assert not store.decide_review("r3", "approved", {"by": "person"}, owner=None)
        assert not store.decide_review("r3", "rejected", rejection, owner=None)
        cancelled = store.get_run("r3")
        assert (cancelled.status, cancelled.error) == ("cancelled", "cancelled on request")
        assert decisions("r3") == []
    finally:
        store.close()


def test_a_database_made_before_folded_tasks_finds_its_runs_in_any_case(database_url: str) -> None:
    """Migration `0017_run_task_folded`: the runs stored before it are case-folded in batches
    and found by a search in any case; a run a version before it stores afterwards (sharing the
    database, its `task_folded` NULL) is still found as that version found it, ASCII's case."""
    import sqlalchemy as sa

    store = RunStore(database_url)
    with store.begin("make the database as versions before the migration left it") as connection:
        connection.execute(sa.text("ALTER TABLE mp_runs DROP COLUMN task_folded"))
        connection.execute(sa.text("DELETE FROM mp_migrations WHERE name = '0017_run_task_folded'"))
        connection.execute(
            sa.text(
                "INSERT INTO mp_runs (id, task, status, model, workspace, options, created_at, "
                "updated_at, cancel_requested) VALUES (:id, :task, 'failed', 'scripted', '/tmp', '{}', "
                ":at, :at, :no)"
            ),
            [
                {
                    "id": f"old{number:04}",
                    "task": f"ÄRGER number {number}",
                    "at": f"2026-01-01T{number:04}",
                    "no": False,
                }
                for number in range(1001)
            ],
        )
    store.close()
    store = RunStore(database_url)
    try:
        with store.begin("read the migrations") as connection:
            applied = list(connection.scalars(sa.text("SELECT name FROM mp_migrations")))
            assert connection.scalar(sa.text("SELECT COUNT(*) FROM mp_runs WHERE task_folded IS NULL")) == 0
        assert applied.count("0017_run_task_folded") == 1
        assert [run.id for run in store.list_runs(2000, text="ärger")] == [
            f"old{number:04}" for number in reversed(range(1001))
        ]
        assert [run.id for run in store.list_runs(text="ÄRGER NUMBER 1000")] == ["old1000"]
        with store.begin("store a run as a version before the migration does") as connection:
            connection.execute(
                sa.text(
                    "INSERT INTO mp_runs (id, task, status, model, workspace, options, created_at, "
                    "updated_at, cancel_requested) VALUES ('older', 'Write the Report', 'failed', "
                    "'scripted', '/tmp', '{}', '2027', '2027', :no)"
                ),
                {"no": False},
            )
        assert [run.id for run in store.list_runs(text="the REPORT")] == ["older"]
    finally:
        store.close()


def _a_replaced_by_a2() -> tuple[Any, dict[str, Any]]:
    """A replan's revision of step `a` (failed) into `a2`, and its `replanned` event's data."""
    from masterplanner.engine.records import AgentBrief, PlanChange
    from masterplanner.plan import Plan

    revision = PlanChange(
        Plan.model_validate({"task": "x", "steps": [step("a2", tools=[])]}),
        {"a2": AgentBrief(prompt="Do a2.")},
        added=("a2",),
        retired={"a": "replaced"},
    )
    return revision, {"retired": ["a"], "steps": ["a2"], "by": "person", "n": 1}


def _held_by_another(store: RunStore, run_id: str, status: Literal["awaiting_approval", "running"]) -> None:
    """A run of one step `a` whose first holder ("first") stalled past its lease: "second" holds it."""
    from masterplanner.plan import Plan

    store.create_run(run_id, "x", model="scripted:x", workspace="/tmp", options=RunOptions())
    plan = Plan.model_validate({"task": "x", "steps": [step("a", tools=[])]})
    assert store.update_run(run_id, plan=plan, agents={}, status=status)
    assert store.claim(run_id, "first", lease_s=0.05)
    time.sleep(0.2)
    assert store.claim(run_id, "second", lease_s=60)


def test_an_edit_at_review_is_written_with_its_approval_only_by_the_lease_holder(database_url: str) -> None:
    """`RunStore.decide_review(…, edit=…)`: the edited plan, its agents and options, `plan_edited`,
    `approved` and the move to `running`, in one transaction, while its writer holds the lease."""
    from masterplanner.engine.records import AgentBrief, PlanChange
    from masterplanner.plan import Plan

    store = RunStore(database_url)
    try:
        _held_by_another(store, "r1", "awaiting_approval")
        edit = PlanChange(
            Plan.model_validate({"task": "x", "steps": [step("b", tools=[])]}),
            {"b": AgentBrief(prompt="Do b.", edited=True)},
            options=RunOptions(tool_policies={"read_file": "ask"}),
        )

        def written() -> tuple[str, list[str], list[tuple[str, dict[str, object]]]]:
            run = store.get_run("r1")
            assert run.plan is not None
            return run.status, run.plan.ids, [(e.kind, e.data) for e in store.events("r1")]

        assert not store.decide_review("r1", "approved", {"by": "person"}, owner="first", edit=edit)
        assert written() == ("awaiting_approval", ["a"], [])
        assert store.decide_review("r1", "approved", {"by": "person"}, owner="second", edit=edit)
        # made again (a write repeated after a lost acknowledgement): nothing more is written
        assert store.decide_review("r1", "approved", {"by": "person"}, owner="second", edit=edit)
        assert not store.decide_review("r1", "approved", {"by": "person"}, owner="first", edit=edit)
        edited = {"steps": ["b"], "tool_policies": {"read_file": "ask"}}
        assert written() == ("running", ["b"], [("plan_edited", edited), ("approved", {"by": "person"})])
        run = store.get_run("r1")
        assert (run.agents["b"].prompt, run.options.tool_policies) == ("Do b.", {"read_file": "ask"})
    finally:
        store.close()


def test_a_request_and_its_event_are_written_whole_or_not_at_all(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Requests.open(…, event=…)`: the request and the event that announces it, in one transaction.

    Before, they were two writes: a process that died between them left the request with no
    event for good, since the step made again found it under its key (not new: not announced).
    Now nothing is written when the process dies there; made again, it writes both, once. A
    request found open without its event (opened by that older version) gets it then; a closed
    one is left as it is.
    """
    from _faults import Killed, failing_as_the_event_is_written

    store = RunStore(database_url)
    try:
        store.create_run("r1", "x", model="scripted:x", workspace="/tmp", options=RunOptions())
        asked: tuple[EventKind, dict[str, Any]] = ("request_opened", {"kind": "ask_user"})

        def ask() -> tuple[Any, bool]:
            return store.requests.open(
                "r1", "ask_user", {"question": "Which?"}, key="r1:ask", step_id="a", event=asked
            )

        def said() -> list[tuple[str, str | None, dict[str, Any]]]:
            return [(event.kind, event.step, event.data) for event in store.events("r1")]

        killed = failing_as_the_event_is_written(monkeypatch, "request_opened", Killed())
        with pytest.raises(Killed):
            ask()
        assert killed == ["r1"]
        assert (store.requests.find("r1", state=None), said()) == ([], [])
        request, new = ask()  # the step made again after the crash
        assert new and (request.step_id, request.state) == ("a", "open")
        assert ask() == (request, False)  # and again: found under its key, nothing more written
        assert said() == [("request_opened", "a", {"request": request.id, "kind": "ask_user"})]

        call = {"tool": "t", "arguments": {}}
        approval: tuple[EventKind, dict[str, Any]] = ("tool_approval_requested", call)
        # opened by a version that died before announcing them; one answered since
        older, answered = (
            store.requests.open("r1", "tool_approval", call, key=key, step_id="a")[0]
            for key in ("r1:older", "r1:answered")
        )
        store.requests.answer(answered.id, {"approved": True}, by="cli@host:1")
        for _ in range(2):  # found again: the open one gets its event, once; the answered one none
            for key, request in (("r1:older", older), ("r1:answered", answered)):
                found, new = store.requests.open(
                    "r1", "tool_approval", call, key=key, step_id="a", event=approval
                )
                assert (found.id, new) == (request.id, False)
        assert said()[1:] == [("tool_approval_requested", "a", {"request": older.id, **call})]
    finally:
        store.close()


def test_a_request_opened_by_the_lease_holder_is_opened_only_while_it_holds_it(database_url: str) -> None:
    """`Requests.open(…, owner=…)`: a plan review (a replan) opens only while its opener holds the run.

    Before, a process that had stalled past its lease (another took the run over) opened a
    second review beside the holder's. Now it is told `LeaseLost`, and nothing is written.
    """
    from masterplanner.engine.requests import LeaseLost

    store = RunStore(database_url)
    try:
        _held_by_another(store, "r1", "awaiting_approval")
        review: tuple[EventKind, dict[str, Any]] = ("approval_requested", {})

        def open_review(owner: str) -> tuple[Any, bool]:
            return store.requests.open("r1", "plan_review", {}, key="r1#review1", event=review, owner=owner)

        lost = "run r1 is held by another process: its plan_review request was not opened"
        with pytest.raises(LeaseLost, match=lost):
            open_review("first")
        assert (store.requests.find("r1", state=None), store.events("r1")) == ([], [])
        request, new = open_review("second")
        assert new and request.kind == "plan_review"
        assert open_review("second") == (request, False)  # made again: nothing more
        with pytest.raises(LeaseLost):
            open_review("first")  # the holder's request is there: still not the stalled one's
        assert store.requests.find("r1", state=None) == [request]
        assert [(event.kind, event.step, event.data) for event in store.events("r1")] == [
            ("approval_requested", None, {"request": request.id})
        ]
    finally:
        store.close()


def test_no_request_opens_on_a_run_that_has_ended(database_url: str) -> None:
    """`Requests.open` on a cancelled, failed or succeeded run: `RunEnded`, and nothing written.

    A step that asks as a cancel ends the run (a tool approval, an agent's question) opened its
    request after the end had closed the run's open ones: it stayed open for good on the
    cancelled run (`runs pending`, the web's list, the API's requests). A request opened before
    the end is found under its key as it is; the remember question is the end's own, on a
    succeeded run, and opens.
    """
    from masterplanner.engine.control import mark_cancelled
    from masterplanner.engine.requests import RunEnded

    store = RunStore(database_url)
    try:
        for run_id in ("r1", "r2", "r3"):
            store.create_run(run_id, "x", model="scripted:x", workspace="/tmp", options=RunOptions())
        asked: tuple[EventKind, dict[str, Any]] = ("request_opened", {"kind": "ask_user"})

        def ask(run_id: str, key: str) -> tuple[Any, bool]:
            return store.requests.open(
                run_id, "ask_user", {"question": "Which?"}, key=key, step_id="a", event=asked
            )

        before, _ = ask("r1", "r1:before")
        mark_cancelled(store, "r1")
        said = store.events("r1")
        with pytest.raises(
            RunEnded, match=r"^run r1 has ended \(cancelled\): its ask_user request was not opened$"
        ):
            ask("r1", "r1:after")
        call = {"tool": "t", "arguments": {}}
        with pytest.raises(RunEnded, match=r"its tool_approval request was not opened"):
            store.requests.open(
                "r1",
                "tool_approval",
                call,
                key="r1:call",
                step_id="a",
                event=("tool_approval_requested", call),
            )
        # found under its key (the step made again after a crash): as it is, and nothing more
        closed = store.requests.get(before.id)
        assert closed.state == "cancelled"
        assert ask("r1", "r1:before") == (closed, False)
        assert store.requests.find("r1", state=None) == [closed]
        assert store.events("r1") == said

        for run_id, status in (("r2", "failed"), ("r3", "succeeded")):
            ended = store.end_run(
                run_id,
                status,
                f"run_{status}",
                {},
                requests="expired",
                keep_remember=True,
                unstarted_finished=True,
            )
            assert ended
        with pytest.raises(RunEnded, match=r"^run r2 has ended \(failed\): its ask_user request"):
            ask("r2", "r2:after")
        with pytest.raises(RunEnded, match=r"^run r3 has ended \(succeeded\): its ask_user request"):
            ask("r3", "r3:after")
        assert store.requests.find("r2", state=None) == store.requests.find("r3", state=None) == []
        remember, new = store.requests.open(
            "r3", "remember", {"agents": 1}, key="r3#remember", event=("request_opened", {"kind": "remember"})
        )
        assert new and store.requests.find("r3") == [remember]
        assert [(event.kind, event.data) for event in store.events("r3")][-1] == (
            "request_opened",
            {"request": remember.id, "kind": "remember"},
        )
    finally:
        store.close()


def test_a_request_s_event_of_no_known_kind_is_refused(database_url: str) -> None:
    """`Requests.open(…, event=…)` takes the event kinds `RunStore.step_event` takes, and no other.

    A misspelt kind was written as it was, an event no reader knows; now it is refused, and nothing
    is written."""
    store = RunStore(database_url)
    try:
        store.create_run("r1", "x", model="scripted:x", workspace="/tmp", options=RunOptions())
        unknown: Any = ("request_opend", {})
        with pytest.raises(ValueError, match=r"^unknown event kind 'request_opend'$"):
            store.requests.open("r1", "ask_user", {"question": "Which?"}, key="r1:ask", event=unknown)
        assert (store.requests.find("r1", state=None), store.events("r1")) == ([], [])
    finally:
        store.close()


def test_a_plan_s_revision_is_written_once_and_only_by_the_lease_holder(database_url: str) -> None:
    """`RunStore.record_revision`: a replan's plan, agents, steps and event, in one transaction.

    Written only while its writer holds the run's lease; made again once recorded (a write
    repeated after a lost acknowledgement), it writes nothing more: its steps are not added twice
    (their insert failed) and its event is not appended twice. So for an event alone (a replan's
    rejection).
    """

    store = RunStore(database_url)
    try:
        _held_by_another(store, "r1", "running")
        store.init_steps("r1", ["a"])
        store.update_step("r1", "a", status="failed")
        revision, replanned = _a_replaced_by_a2()

        def written() -> tuple[
            list[str], list[tuple[str, str]], list[tuple[str, str | None, dict[str, Any]]]
        ]:
            run = store.get_run("r1")
            assert run.plan is not None
            steps = [(record.id, record.status) for record in store.steps("r1")]
            return run.plan.ids, steps, [(e.kind, e.step, e.data) for e in store.events("r1")]

        assert not store.record_revision("r1", "replanned", "a", replanned, owner="first", change=revision)
        assert written() == (["a"], [("a", "failed")], [])
        assert store.record_revision("r1", "replanned", "a", replanned, owner="second", change=revision)
        assert store.record_revision("r1", "replanned", "a", replanned, owner="second", change=revision)
        assert not store.record_revision("r1", "replanned", "a", replanned, owner="first", change=revision)
        assert written() == (
            ["a2"],
            [("a", "replaced"), ("a2", "pending")],
            [("replanned", "a", replanned)],
        )
        assert set(store.get_run("r1").agents) == {"a2"}

        rejected = {"n": 2, "rejected": "no", "by": "person"}
        assert not store.record_revision("r1", "replan_failed", "a2", rejected, owner="first")
        assert store.record_revision("r1", "replan_failed", "a2", rejected, owner="second")
        assert store.record_revision("r1", "replan_failed", "a2", rejected, owner="second")  # made again
        assert written()[2] == [("replanned", "a", replanned), ("replan_failed", "a2", rejected)]
    finally:
        store.close()


def test_a_revision_is_not_written_to_a_run_that_ended(database_url: str) -> None:
    """A replan that ends as the run is cancelled adds no steps to it (they stayed pending for good)."""

    store = RunStore(database_url)
    try:
        _held_by_another(store, "r1", "running")
        store.init_steps("r1", ["a"])
        store.update_step("r1", "a", status="failed")
        assert store.end_run(
            "r1",
            "cancelled",
            "run_cancelled",
            {},
            requests="cancelled",
            keep_remember=False,
            unstarted_finished=False,
        )
        revision, replanned = _a_replaced_by_a2()
        assert not store.record_revision("r1", "replanned", "a", replanned, owner="second", change=revision)
        run = store.get_run("r1")
        assert run.plan is not None and run.plan.ids == ["a"]
        assert [(record.id, record.status) for record in store.steps("r1")] == [("a", "failed")]
        assert [event.kind for event in store.events("r1")] == ["run_cancelled"]
    finally:
        store.close()


def test_a_lease_taken_over_during_a_revision_waits_for_it(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder's revision reads the run's row locked: a takeover waits for the revision's end.

    Before, the holder read itself the owner, another process took the run over and committed,
    and the holder's revised plan landed under the new holder's. (On SQLite the read came before
    the transaction's `BEGIN`, which pysqlite sends before the first write.)
    """
    import threading

    import sqlalchemy as sa

    from masterplanner.engine import store as store_module

    postgres = database_url.startswith("postgresql")
    store = RunStore(database_url)
    other = sa.create_engine(database_url, connect_args={} if postgres else {"timeout": 0.2})
    taken: list[str] = []
    original = store_module._revise_steps

    def take_over() -> None:
        try:
            with other.begin() as connection:
                if postgres:
                    connection.execute(sa.text("SET LOCAL lock_timeout = '200ms'"))
                connection.execute(sa.text("UPDATE mp_runs SET owner = 'third' WHERE id = 'r1'"))
            taken.append("taken")
        except sa.exc.OperationalError as exc:  # it waited for the revision's end, and gave up
            waited = "lock timeout" in str(exc) or "database is locked" in str(exc)
            taken.append("waited" if waited else str(exc))

    def revising(*args: Any) -> None:  # another process takes the run over as the revision is written
        thread = threading.Thread(target=take_over)
        thread.start()
        thread.join()
        original(*args)

    try:
        _held_by_another(store, "r1", "running")
        store.init_steps("r1", ["a"])
        monkeypatch.setattr(store_module, "_revise_steps", revising)

        revision, replanned = _a_replaced_by_a2()
        assert store.record_revision("r1", "replanned", "a", replanned, owner="second", change=revision)
        assert taken == ["waited"]
    finally:
        other.dispose()
        store.close()
