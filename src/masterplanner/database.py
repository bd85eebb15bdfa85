"""What the stores sharing the one database (runs, registry) have in common.

URLs, timestamps, SQLite settings, transactions with readable errors, and named migrations.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, ParamSpec, TypeVar
from urllib.parse import unquote

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .errors import ConfigError, DatabaseError, DatabaseUnavailableError, RunError
from .redaction import CREDENTIAL_PARAMETER, REMOVED

_P = ParamSpec("_P")
_R = TypeVar("_R")

POOL_SIZE = 4
"""Connections a store keeps open to Postgres (as many more while busy): runs and registry, per process."""
RECONNECT_S = 60.0
"""How long a store call waits for a Postgres server that went away (a restart) before failing."""

__all__ = [
    "Migration",
    "apply_migrations",
    "create_engine",
    "database_failure",
    "database_now",
    "engine_url",
    "migrate",
    "names_nothing",
    "reconnecting",
    "reconnecting_methods",
    "repeats_itself",
    "shown_url",
    "transaction",
    "utc_now",
    "without_password",
]

Migration = tuple[str, Callable[[Connection], None]]
"""A named schema change, applied once per database and recorded in `mp_migrations`."""


def utc_now() -> str:
    """The current time as ISO 8601 UTC with milliseconds, e.g. `2026-11-22T03:04:05.678Z`."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def engine_url(url: str) -> str:
    """The SQLAlchemy URL for a settings database URL (Postgres goes through psycopg 3)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def database_now(connection: Connection) -> float:
    """The database's clock, in seconds since the epoch (leases are kept in it, not a process's)."""
    if connection.dialect.name == "postgresql":
        return float(connection.scalar(sa.text("SELECT extract(epoch FROM clock_timestamp())")))
    return float(connection.scalar(sa.text("SELECT (julianday('now') - 2440587.5) * 86400.0")))


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def create_engine(url: str) -> Engine:
    """An engine for a settings database URL; SQLite connections in WAL with `synchronous=NORMAL`."""
    full_url = engine_url(url)
    # Postgres: a pooled connection the server dropped (it restarted) is found at checkout and
    # replaced; at most 8 connections a store, so several workers stay within a server's 100
    options: dict[str, Any] = (
        {"pool_pre_ping": True, "pool_size": POOL_SIZE, "max_overflow": POOL_SIZE}
        if full_url.startswith("postgresql")
        else {}
    )
    if not full_url.startswith(("sqlite://", "postgresql+psycopg://")):
        raise ConfigError(
            f"database URL {shown_url(url)!r} is not usable: masterplanner stores runs in SQLite "
            "(sqlite:///PATH) or PostgreSQL (postgresql://USER@HOST:PORT/DATABASE)"
        )
    try:
        engine = sa.create_engine(full_url, **options)
    except (sa.exc.ArgumentError, ImportError, ValueError) as exc:
        problem = (
            "its port is not a number" if "invalid literal for int()" in str(exc) else "it cannot be read"
        )
        raise ConfigError(f"database URL {shown_url(url)!r} is not usable: {problem}") from None
    if engine.dialect.name == "sqlite":
        if engine.url.database in (None, "", ":memory:"):
            # a database of each connection's own: tables made on one were missing on the next
            # ("no such table: mp_runs"), after tracebacks of connections closed across threads
            raise ConfigError(
                f"database_url {shown_url(url)!r} names no file: give SQLite one (sqlite:///PATH)"
            )
        _create_private(engine.url.database)
        sa.event.listen(engine, "connect", _sqlite_pragmas)
    elif (
        not engine.url.database and not engine.url.query.get("dbname") and not engine.url.query.get("service")
    ):
        # libpq's defaults chose one (PGDATABASE, else the user's name): the tables were made in
        # whichever database that was. A missing host stays libpq's choice: the local socket; a
        # `?service=` entry of pg_service.conf names its database there.
        raise ConfigError(
            f"database_url {shown_url(url)!r} names no database: give PostgreSQL one "
            "(postgresql://USER@HOST:PORT/DATABASE, or postgresql:///DATABASE through the local "
            "server's socket)"
        )
    return engine


def _create_private(database: str | None) -> None:
    """A SQLite database file not there yet, created empty and its owner's only (0600).

    It holds what people typed. SQLite gives its `-wal` and `-shm` files the database file's
    permissions.
    """
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    try:
        os.close(os.open(database, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:  # there already, or its folder missing: SQLite says so in its own words
        pass


def names_nothing(text: str) -> bool:
    """Whether `text`, an id or a search from outside, can match nothing stored: it holds a NUL.

    No id, task or text stored holds one (the HTTP API refuses a JSON body with a NUL in any
    string, naming the field: `web.app._no_nul_in_body`), and the databases
    cannot be asked: Postgres refuses a NUL in any text it is sent (its error, which names the
    database, was the answer to `GET /api/v1/runs/a%00b`), and SQLite ends a `LIKE` pattern at
    one (a search for a NUL matched every run).
    """
    return "\x00" in text


@contextmanager
def transaction(
    engine: Engine, url: str, action: str, *, connecting: str | None = None
) -> Iterator[Connection]:
    """One transaction; database failures become a `DatabaseError` naming the database and the action.

    `IntegrityError` passes through: callers that race on a key handle it. A Postgres server that
    cannot be reached or dropped the connection is a `DatabaseUnavailableError`: the transaction
    did not commit, so the store call may be made again (`reconnecting`). `connecting`: what is
    said cannot be done when no connection could be made (`action` by default): a store being
    opened says it cannot open the database, not the tables it would have created (`runs list`
    said `cannot create its tables`).
    """
    connected = False
    try:
        with engine.begin() as connection:
            connected = True
            yield connection
    except sa.exc.IntegrityError:
        raise
    except sa.exc.DBAPIError as exc:  # unreachable, unwritable, full, locked or not a database
        action = action if connected or connecting is None else connecting
        cause = _unreachable(exc, url) if engine.dialect.name == "postgresql" else None
        if cause is not None:
            raise DatabaseUnavailableError(
                f"the database at {shown_url(url)} cannot be reached ({cause}): cannot {action}"
            ) from None
        message = f"database {shown_url(url)}: cannot {action}: {_server_words(exc, url)}"
        if engine.dialect.name == "postgresql" and (
            exc.connection_invalidated or isinstance(exc, sa.exc.OperationalError)
        ):
            raise DatabaseUnavailableError(message) from None
        raise DatabaseError(message) from None


def reconnecting(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A store call made again, with growing pauses, while the database is unavailable (up to `RECONNECT_S`).

    For calls that are one transaction, or several that are each safe to make again (keyed
    writes, reads): a transaction the server dropped never committed.
    """

    @functools.wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        deadline = time.monotonic() + RECONNECT_S
        pause = 0.1
        while True:
            try:
                return method(*args, **kwargs)
            except DatabaseUnavailableError:
                if time.monotonic() + pause > deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 2.0)

    return call


_C = TypeVar("_C", bound=type)

_REPEATING_ITSELF: set[object] = set()
"""The store methods `reconnecting_methods` leaves as they are (`repeats_itself`)."""


def repeats_itself(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A store method `reconnecting_methods` does not make `reconnecting` as a whole.

    For a call that must know a try of its own from another's: a transaction whose COMMIT
    reached the server before the connection dropped did commit, and a call made again whole
    finds what it stored as if someone else had. Such a method makes its repeatable part
    `reconnecting` itself, with what tells its tries from other calls made once, outside it
    (`Requests.answer`: a token stored with the answer).
    """
    _REPEATING_ITSELF.add(method)
    return method


def reconnecting_methods(cls: _C) -> _C:
    """Every public method of a store class made `reconnecting` (its calls are each safe to repeat).

    Not those marked `repeats_itself`.
    """
    for name, value in list(vars(cls).items()):
        if name.startswith("_") or name == "begin" or not callable(value) or value in _REPEATING_ITSELF:
            continue
        setattr(cls, name, reconnecting(value))
    return cls


def database_failure(exc: sa.exc.DBAPIError, url: str) -> str:
    """A database driver's error raised outside our stores (DBOS's own writes) in our words.

    Its first line only, without `url`'s password: never the statement, its parameters (a step's
    whole output) or a link.
    """
    cause = _unreachable(exc, url)
    if cause is not None:
        return f"the run's database at {shown_url(url)} cannot be reached ({cause})"
    return f"the run's database failed: {_server_words(exc, url)}"


_UNREACHABLE = (
    ("Connection refused", "the connection was refused"),
    ("timeout expired", "it did not answer in time"),
    ("No route to host", "there is no route to its host"),
    ("Network is unreachable", "its network cannot be reached"),
)
"""What libpq says when no server could be reached, and what we say instead."""


_ALL_FAILURES = "\nMultiple connection attempts failed. All failures were:\n"
_ATTEMPT = re.compile(r"^- host: .*?, port: .*?, hostaddr: .*?: ", re.MULTILINE)


def _attempts(error: object) -> list[str]:
    """What each connection attempt in `error` failed with, in the order they were made.

    psycopg tries every host of the URL and every address of each host's name, and when all
    failed lists each failure after the last one's (`connection failed: … Multiple connection
    attempts failed. All failures were:` then `- host: '…', port: '…', hostaddr: '…': …`). Any
    other error is one attempt's.
    """
    text = str(error)
    _, listed, failures = text.partition(_ALL_FAILURES)
    attempts = [attempt.strip() for attempt in _ATTEMPT.split(failures) if attempt.strip()]
    return attempts if listed and attempts else [text]


def _unreachable(exc: sa.exc.DBAPIError, url: str) -> str | None:
    """Why `url`'s Postgres server could not be reached, in our words; None if it answered, or not that.

    libpq's own words (`connection failed: connection to server at "127.0.0.1", port 1 failed:
    Connection refused`, then its advice on a line of its own) were what a command printed. A
    server that answered, refusing the connection (`FATAL:  database "x" does not exist`, `server
    does not support SSL, but SSL was required`, `fe_sendauth: no password supplied`), is not one
    that could not be reached: its words stay, also when another of the URL's hosts or of its
    name's addresses refused the connection (every attempt has to have reached nothing; the
    last one's cause is said).
    """
    if not isinstance(exc, sa.exc.OperationalError):
        return None
    causes = [_attempt_unreachable(attempt, url) for attempt in _attempts(exc.orig)]
    return None if None in causes else causes[-1]


def _attempt_unreachable(text: str, url: str) -> str | None:
    """Why one connection attempt reached no server (`_UNREACHABLE`), or None if one answered."""
    if "FATAL:" in text:
        return None
    host = re.search(r"(?:failed to resolve host|could not translate host name) [\"']([^\"']*)", text)
    if host is not None:  # a password holding `@` splits the URL elsewhere: the host shows it
        return f"its host name '{without_password(host.group(1), url)}' is not known"
    if "on socket" in text and "No such file or directory" in text:
        return "no server's socket is at that path"
    return next((ours for theirs, ours in _UNREACHABLE if theirs in text), None)


def _server_words(exc: sa.exc.DBAPIError, url: str) -> str:
    """The first line of a driver's error, without `url`'s password; a server's answer if one answered.

    Of several connection attempts, the error's first line is the last one's, which may be an
    address that refused the connection: the server that answered is the one to quote.
    """
    answered = [attempt for attempt in _attempts(exc.orig) if _attempt_unreachable(attempt, url) is None]
    return without_password(_first_line(answered[-1] if answered else exc.orig), url)


def _first_line(error: object) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def shown_url(url: str) -> str:
    """A URL (a database's, a collector's) as it may be shown in a message or log: no password in it.

    Its password, and credential parameters' values, are `[secret removed]` (`redaction.REMOVED`).

    Read from the text itself, not a parser's idea of it: the password as written (percent-encoded,
    or holding `@`, `/` or `?` unescaped) goes, and so does the value of a credential-named query
    parameter (`password=`, `sslpassword=`, `token=`, `key=`: `redaction.CREDENTIAL_PARAMETER`).
    The credentials end at the URL's last `@`: a password holding `?` was shown whole when the
    query was cut off first. (An `@` in the query hides a little more than the password: never
    less.) Before, an encoded password (`p%40ss`) was compared in its decoded form, not found, and
    shown; a URL given without its `scheme://` (`alice:PW@collector:4318`), refused for that, was
    echoed password and all. The marker is `redaction.redacted`'s: before, `***` here, and the same
    URL read `[secret removed]` in a log line, which redacts what it is given again.
    """
    scheme, sep, rest = url.partition("://") if "://" in url else ("", "", url)
    userinfo, at, host = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:{REMOVED}@{host}"
    return CREDENTIAL_PARAMETER.sub(lambda found: found["name"] + REMOVED, f"{scheme}{sep}{rest}")


def without_password(text: str, url: str) -> str:
    """`text` (a driver's message about `url`'s database) with the URL's password and each piece of it hidden.

    A password holding an unescaped `@` or `/` splits the URL elsewhere than meant, and the
    driver then names a piece of it as a host ("failed to resolve host 'PW@127.0.0.1'").
    """
    secrets = [found.group("value") for found in CREDENTIAL_PARAMETER.finditer(url) if found.group("value")]
    userinfo = (url.partition("://")[2] or url).rpartition("@")[0]
    if ":" in userinfo:
        secrets.append(userinfo.split(":", 1)[1])
    pieces = {
        piece for secret in secrets for piece in (secret, unquote(secret), *re.split(r"[@/?#:&=]", secret))
    }
    shown = sorted((piece for piece in pieces if len(piece) >= 2), key=len, reverse=True)
    if not shown:
        return text
    # in one pass, longest first: a piece replaced after another could be a part of the marker
    return re.sub("|".join(map(re.escape, shown)), REMOVED, text)


def apply_migrations(connection: Connection, migrations: list[Migration]) -> None:
    """Apply the migrations not yet recorded in `mp_migrations`, in order, recording each."""
    connection.execute(
        sa.text(
            "CREATE TABLE IF NOT EXISTS mp_migrations "
            "(name VARCHAR(100) PRIMARY KEY, applied_at VARCHAR(32) NOT NULL)"
        )
    )
    applied = set(connection.scalars(sa.text("SELECT name FROM mp_migrations")))
    for name, migrate in migrations:
        if name not in applied:
            migrate(connection)
            connection.execute(
                sa.text("INSERT INTO mp_migrations (name, applied_at) VALUES (:name, :at)"),
                {"name": name, "at": utc_now()},
            )


_MIGRATION_ATTEMPTS = 5


def migrate(engine: Engine, url: str, migrations: list[Migration]) -> None:
    """Apply `migrations` to the database, also when another process does the same at that moment.

    SQLite runs each `CREATE TABLE` outside the migration's transaction, so two processes
    starting together (a `run` and a `runs pending` beside it) may both find a table missing
    and one fail to create it; that one tries again and then finds the migration recorded.
    A Postgres server that could not be connected to (not reached, or refusing the connection)
    is told at once, not tried again: no other process raced this one there, and a command
    should not keep the person waiting 1 s before saying so (a store's calls once it is open
    do wait for a server that went away: `reconnecting`).
    """
    for attempt in range(1, _MIGRATION_ATTEMPTS + 1):
        connected = False
        try:
            with transaction(engine, url, "create its tables", connecting="open it") as connection:
                connected = True
                apply_migrations(connection, migrations)
            return
        except (RunError, sa.exc.IntegrityError) as exc:
            not_connected = isinstance(exc, DatabaseUnavailableError) and not connected
            if attempt == _MIGRATION_ATTEMPTS or not_connected:
                raise
            time.sleep(0.1 * attempt)
