"""Faults injected into a run's writes: the process dies there, or the database fails there."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine


class Killed(BaseException):
    """The process executing a run dies here (as `kill -9` stops it: nothing after runs)."""


def failing_as_the_event_is_written(
    monkeypatch: pytest.MonkeyPatch, kind: str, failure: BaseException
) -> list[str]:
    """`failure` is raised once as the run's `kind` event is inserted, within the write that holds it.

    Returns the runs it was raised for (one at most), so a test can check it was.
    """
    from masterplanner.engine import store as store_module

    inserting, failed = store_module._insert_event, []

    def insert(connection: Any, run_id: str, at: str, event: str, *args: Any) -> int:
        if event == kind and not failed:
            failed.append(run_id)
            raise failure
        return inserting(connection, run_id, at, event, *args)

    monkeypatch.setattr(store_module, "_insert_event", insert)
    return failed


@contextlib.contextmanager
def sqlite_failing(
    statement: str, words: str = "database or disk is full", *, times: int | None = None
) -> Iterator[list[str]]:
    """SQLite fails the statements holding `statement` with its error in `words`, meanwhile.

    Raised as its driver raises it (a full disk by default; "database is locked" for another
    process's write lock held past the wait), in the cursor's call of any store (the runs', the
    registry's), so the store's transaction says it as it says a real one (`database.transaction`).
    `times`: only the first so many of them fail (all by default). Yields the statements it failed,
    so a test can check one was.
    """
    failed: list[str] = []

    def fail(_connection: Any, _cursor: Any, sent: str, *_: Any) -> None:
        if statement in sent and (times is None or len(failed) < times):
            failed.append(sent)
            raise sqlite3.OperationalError(words)

    sa.event.listen(Engine, "before_cursor_execute", fail)
    try:
        yield failed
    finally:
        sa.event.remove(Engine, "before_cursor_execute", fail)
