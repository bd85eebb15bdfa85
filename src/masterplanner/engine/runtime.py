"""Starting and stopping DBOS, the durable-execution library, for one database.

DBOS recovers, at launch, every pending workflow recorded under its executor id. Several
masterplanner processes share one database (a `run` in one terminal, `runs list` in another),
so each process launches DBOS under an executor id of its own: DBOS's launch recovery then
finds nothing, and a run is resumed only by the process holding its lease (see `store.py`).
Read-only commands never launch DBOS at all.

The workflows take only ids; the settings and run store they work with are those of the engine
that launched DBOS in this process (`launched_host`).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from typing import Any

from dbos import DBOS, DBOSConfig

from .._version import __version__
from ..errors import RunError
from ..settings import Settings
from .store import RunStore, engine_url

__all__ = ["dbos_launched", "launch_dbos", "launched_host", "shutdown_dbos"]

_launched_url: str | None = None
_host: tuple[Settings, RunStore] | None = None
_lock = threading.RLock()
"""Launching runs in a worker thread (it is blocking I/O); two runs starting at once launch once."""


class _WalConnection(sqlite3.Connection):
    """SQLite connections for DBOS in WAL mode with `synchronous=NORMAL`, like the run store's.

    A commit then survives the process being killed (what resuming after `kill -9` needs); only
    an operating-system crash or power loss can drop the last commits, never corrupt the file.
    Measured here: a workflow with one step costs 7.1 ms with SQLite's default (an fsync per
    commit) and 3.7 ms with this.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.execute("PRAGMA journal_mode=WAL")
        self.execute("PRAGMA synchronous=NORMAL")


def launch_dbos(settings: Settings, store: RunStore, *, executor_id: str, debug: bool = False) -> None:
    """Launch DBOS on the settings' database in this process (once; relaunches if the URL changes).

    `settings` and `store` become what workflows started in this process work with.
    """
    with _lock:
        _launch(settings, store, executor_id=executor_id, debug=debug)


def _launch(settings: Settings, store: RunStore, *, executor_id: str, debug: bool) -> None:
    global _launched_url, _host
    database_url = settings.database_url
    _host = (settings, store)
    if _launched_url == database_url:
        return
    if _launched_url is not None:
        shutdown_dbos()
    level = "DEBUG" if debug else "ERROR"
    config: DBOSConfig = {
        "name": "masterplanner",
        "system_database_url": engine_url(database_url),
        "executor_id": executor_id,
        "application_version": f"masterplanner-{__version__}",
        "log_level": level,
        "console_log_level": level,
        "notification_listener_polling_interval_sec": 0.05,
    }
    if engine_url(database_url).startswith("sqlite"):
        config["db_engine_kwargs"] = {"connect_args": {"factory": _WalConnection}}
    if not debug:
        logging.getLogger("dbos").setLevel(logging.ERROR)
    DBOS(config=config)
    DBOS.launch()
    _launched_url = database_url


def launched_host() -> tuple[Settings, RunStore]:
    """The settings and run store of the engine that launched DBOS in this process."""
    if _host is None or _launched_url is None:
        raise RunError("no engine runs workflows in this process (DBOS is not launched)")
    return _host


def dbos_launched() -> bool:
    """Whether DBOS runs in this process."""
    return _launched_url is not None


def shutdown_dbos() -> None:
    """Stop DBOS in this process (workflows not finished stay pending in the database)."""
    global _launched_url, _host
    with _lock:
        if _launched_url is None:
            return
        DBOS.destroy()
        _launched_url = None
        _host = None
