"""What any process does to runs it does not execute: open the run store, cancel a run, report one.

The run service (every front end) reads and cancels runs through these, so a command that
only reads, answers or cancels (`runs list`, `runs show`, `runs cancel`, …) imports the store
over SQLAlchemy and nothing of DBOS, pydantic-ai or the models; `Engine` (`runner.py`) uses the
same functions.
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from .. import telemetry
from ..errors import RunError
from ..settings import Settings
from .records import RunRecord, nested_steps
from .store import RunStore

__all__ = ["mark_cancelled", "open_run_store", "request_cancel", "run_report"]


def open_run_store(settings: Settings) -> RunStore:
    """The run store of the settings' database; an SQLite file's folder is made if missing."""
    if settings.database_url.startswith("sqlite:///"):
        folder = Path(settings.database_url.removeprefix("sqlite:///")).parent
        try:  # the home, by default: its owner's only (Settings.ensure_home), as what holds the database
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise RunError(f"database folder {folder}: cannot create: {exc.strerror}") from None
    return RunStore(settings.database_url)


def request_cancel(
    store: RunStore, run_id: str, *, owner: str, lease_s: float, by: str | None = None
) -> RunRecord:
    """Ask for a run to stop; one no process holds (or whose holder's lease lapsed) is cancelled now.

    `owner`: the asking process's identity (`store.process_identity`), under which it holds the
    run's lease for a moment to cancel it; `by`: who asks (`front end@host:pid`), recorded for
    the audit log the first time they ask.
    """
    run = store.get_run(run_id)
    if run.finished:
        raise RunError(f"run {run.id} already {run.status}")
    if not store.ask_cancel(run.id, by=by):  # it ended since it was read
        raise RunError(f"run {run.id} already {store.get_run(run.id).status}")
    canceller = f"{owner}/cancel-{secrets.token_hex(3)}"  # never an execution's name
    if store.claim(run.id, canceller, lease_s=lease_s):
        try:
            mark_cancelled(store, run.id)
        finally:
            store.release(run.id, canceller)
    return store.get_run(run.id)


def mark_cancelled(store: RunStore, run_id: str, reason: str = "cancelled on request") -> None:
    """Record a run as cancelled: its unfinished steps and its open requests too.

    One transaction with its `run_cancelled` event (`RunStore.end_run`); a run that has ended
    by then is left as it ended.
    """
    ended = store.end_run(
        run_id,
        "cancelled",
        "run_cancelled",
        {"reason": reason},
        requests="cancelled",
        keep_remember=False,
        unstarted_finished=False,
        error=reason,
    )
    if not ended:
        return
    if telemetry.exporting():
        run = store.get_run(run_id)
        telemetry.record_run(
            run_id, retries=run.retries, status="cancelled", created_at=run.created_at, model=run.model
        )


def run_report(store: RunStore, run_id: str) -> dict[str, Any]:
    """The JSON report of a run: id, status, output, error, plan, steps, usage (and its workspace).

    `retries`: how many times the run was retried after it failed.

    An expanded step's sub-steps are under it (`sub_steps`); messages between steps and
    the run's notes are there too.
    """
    run = store.get_run(run_id)
    return {
        "run_id": run.id,
        "status": run.status,
        "task": run.task,
        "output": run.output,
        "error": run.error,
        "workspace": run.workspace,
        "created_at": run.created_at,
        "retries": run.retries,
        "plan": None if run.plan is None else run.plan.to_json_dict(),
        "steps": nested_steps([step.to_json_dict() for step in store.steps(run.id)]),
        "usage": store.usage(run.id),
        "messages": [message.to_json_dict() for message in store.messages.of_run(run.id)],
        "notes": [note.to_json_dict() for note in store.messages.notes(run.id)],
    }
