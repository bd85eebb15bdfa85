"""Faults injected into a run's writes: the process dies there, or the database fails there."""

from __future__ import annotations

from typing import Any

import pytest


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
