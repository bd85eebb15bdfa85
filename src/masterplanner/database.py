"""What the stores sharing the one database (runs, registry) have in common.

URLs, timestamps, SQLite settings, transactions with readable errors, and named migrations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from .errors import RunError

__all__ = [
    "Migration",
    "apply_migrations",
    "create_engine",
    "database_now",
    "engine_url",
    "migrate",
    "transaction",
    "utc_now",
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
    try:
        engine = sa.create_engine(engine_url(url))
    except (sa.exc.ArgumentError, ImportError) as exc:
        raise RunError(f"database URL {url!r} is not usable: {exc}") from None
    if engine.dialect.name == "sqlite":
        sa.event.listen(engine, "connect", _sqlite_pragmas)
    return engine


@contextmanager
def transaction(engine: Engine, url: str, action: str) -> Iterator[Connection]:
    """One transaction; database failures become a `RunError` naming the database and the action.

    `IntegrityError` passes through: callers that race on a key handle it.
    """
    try:
        with engine.begin() as connection:
            yield connection
    except sa.exc.IntegrityError:
        raise
    except sa.exc.DBAPIError as exc:  # unreachable, unwritable, full, locked or not a database
        raise RunError(f"database {url}: cannot {action}: {exc.orig}") from None


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
    """
    for attempt in range(1, _MIGRATION_ATTEMPTS + 1):
        try:
            with transaction(engine, url, "create its tables") as connection:
                apply_migrations(connection, migrations)
            return
        except (RunError, sa.exc.IntegrityError):
            if attempt == _MIGRATION_ATTEMPTS:
                raise
            time.sleep(0.1 * attempt)
