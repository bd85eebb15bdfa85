"""The run store: runs, their steps, events, usage and review decisions, in SQLite or Postgres.

It lives in the same database as DBOS's system tables (its tables are prefixed `mp_`). Schema
changes go through the named migrations below, applied once each and recorded in
`mp_migrations`. Every write is one transaction, so a failed write leaves earlier data intact.

Ownership: a run is executed by at most one process. The executing process holds a lease
(`owner`, `heartbeat_at`, `lease_until`) that it renews every few seconds; another process may
take the run over only once `lease_until` has passed. The holder sets how long its lease lasts,
so processes configured with other lease lengths still agree. Lease times are the database's
clock, not a process's, so processes on several machines agree on them; no process asks the
operating system whether another one is alive.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.engine import Connection, Engine

from ..database import (
    Migration,
    create_engine,
    database_now,
    engine_url,
    migrate,
    names_nothing,
    reconnecting_methods,
    shown_url,
    transaction,
)
from ..errors import RunError, RunNotFoundError, quoted_id
from ..plan import Plan
from ..remedies import Remedy
from .messages import Messages, add_message_hand_on, create_message_tables, hand_on
from .processes import Processes, add_process_pid_namespace, create_process_table
from .records import (
    EVENT_KINDS,
    FINISHED_RUN_STATUSES,
    Event,
    EventKind,
    PlanChange,
    RunOptions,
    RunRecord,
    RunStatus,
    StepRecord,
    briefs,
    briefs_json,
    utc_now,
)
from .requests import (
    Request,
    RequestKind,
    Requests,
    RunEnded,
    add_answer_call,
    close_open_requests,
    create_requests_table,
    request_of_row,
    requests_table,
)

__all__ = ["MIGRATIONS", "Lease", "RunStore", "Spending", "engine_url", "held_here", "process_identity"]

metadata = sa.MetaData()

runs_table = sa.Table(
    "mp_runs",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("task", sa.Text, nullable=False),
    sa.Column("status", sa.String(24), nullable=False),
    sa.Column("model", sa.Text, nullable=False),
    sa.Column("workspace", sa.Text, nullable=False),
    sa.Column("options", sa.Text, nullable=False),
    sa.Column("plan", sa.Text),
    sa.Column("agents", sa.Text),
    sa.Column("output", sa.Text),
    sa.Column("error", sa.Text),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("updated_at", sa.String(32), nullable=False),
    sa.Column("owner", sa.String(200)),
    sa.Column("heartbeat_at", sa.Float),
    sa.Column("lease_until", sa.Float),
    sa.Column("cancel_requested", sa.Boolean, nullable=False, default=False),
    sa.Column("executor", sa.String(16)),
    sa.Column("retries", sa.Integer, nullable=False, server_default="0"),
    sa.Column("planning", sa.Text),
    sa.Column("task_folded", sa.Text),
    # the task case-folded in Python (`str.casefold`), which `list_runs` searches: SQLite's
    # lower() folds ASCII only and Postgres's follows the database's ctype (none in `C`)
)
steps_table = sa.Table(
    "mp_steps",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("step_id", sa.String(100), primary_key=True),
    sa.Column("position", sa.Integer, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("output", sa.Text),
    sa.Column("error", sa.Text),
    sa.Column("started_at", sa.String(32)),
    sa.Column("finished_at", sa.String(32)),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
)
events_table = sa.Table(
    "mp_events",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("at", sa.String(32), nullable=False),
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("step", sa.String(100)),
    sa.Column("data", sa.Text, nullable=False),
)
usage_table = sa.Table(
    "mp_usage",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("purpose", sa.String(120), primary_key=True),
    sa.Column("calls", sa.Integer, nullable=False),
    sa.Column("input_tokens", sa.Integer, nullable=False),
    sa.Column("output_tokens", sa.Integer, nullable=False),
    sa.Column("seconds", sa.Float, nullable=False),
    sa.Column("cost_usd", sa.Float, nullable=False, server_default="0"),
    sa.Column("unpriced_calls", sa.Integer, nullable=False, server_default="0"),
    sa.Column("failed_calls", sa.Integer, nullable=False, server_default="0"),
)
usage_requests_table = sa.Table(
    "mp_usage_requests",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False, index=True),
)
reservations_table = sa.Table(
    "mp_reservations",
    metadata,
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("run_id", sa.String(64), nullable=False, index=True),
    sa.Column("owner", sa.String(200), nullable=False),
    sa.Column("tokens", sa.BigInteger, nullable=False),
    sa.Column("cost_usd", sa.Float, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)


def _create_run_tables(connection: Connection) -> None:
    for table in (runs_table, steps_table, events_table, usage_table):
        table.create(connection, checkfirst=True)


def _add_usage_cost(connection: Connection) -> None:
    """What a purpose's calls cost in US dollars, and how many had no known price."""
    columns = {column["name"] for column in sa.inspect(connection).get_columns("mp_usage")}
    if "cost_usd" not in columns:
        connection.execute(sa.text("ALTER TABLE mp_usage ADD COLUMN cost_usd FLOAT NOT NULL DEFAULT 0"))
    if "unpriced_calls" not in columns:
        connection.execute(
            sa.text("ALTER TABLE mp_usage ADD COLUMN unpriced_calls INTEGER NOT NULL DEFAULT 0")
        )


def _add_usage_failed_calls(connection: Connection) -> None:
    """Migration `0013_usage_failed_calls`: how many of a purpose's calls were made and failed."""
    if "failed_calls" not in {column["name"] for column in sa.inspect(connection).get_columns("mp_usage")}:
        connection.execute(sa.text("ALTER TABLE mp_usage ADD COLUMN failed_calls INTEGER NOT NULL DEFAULT 0"))


def _add_lease_until(connection: Connection) -> None:
    """The lease's end, set by its holder (databases made before it had only `heartbeat_at`)."""
    if "lease_until" not in {column["name"] for column in sa.inspect(connection).get_columns("mp_runs")}:
        connection.execute(sa.text("ALTER TABLE mp_runs ADD COLUMN lease_until FLOAT"))


def _add_run_executor(connection: Connection) -> None:
    """Who executes the run: NULL, the process that started it; `workers`, whichever worker claims it."""
    if "executor" not in {column["name"] for column in sa.inspect(connection).get_columns("mp_runs")}:
        connection.execute(sa.text("ALTER TABLE mp_runs ADD COLUMN executor VARCHAR(16)"))


def _add_run_retries(connection: Connection) -> None:
    """How many times each run was retried after it failed (`runs retry`)."""
    if "retries" not in {column["name"] for column in sa.inspect(connection).get_columns("mp_runs")}:
        connection.execute(sa.text("ALTER TABLE mp_runs ADD COLUMN retries INTEGER NOT NULL DEFAULT 0"))


def _add_run_planning(connection: Connection) -> None:
    """Migration `0012_run_planning`: the planning work done so far on a run still planning.

    Its plan once made and each step's agent once written (`planning.PlanningWork`), so a run
    stopped while planning goes on from them when resumed instead of asking the model again.
    """
    if "planning" not in {column["name"] for column in sa.inspect(connection).get_columns("mp_runs")}:
        connection.execute(sa.text("ALTER TABLE mp_runs ADD COLUMN planning TEXT"))


def _create_reservations(connection: Connection) -> None:
    """Migration `0011_budget_reservations`: the worst case of each model request in flight.

    One row a request, held from before it is made until its usage is counted (`add_usage`
    deletes it in the same transaction), under the `mp_processes` id of the process making it:
    every process holds the others' requests in flight to the run's budgets, and a dead
    process's are dropped once its lease lapses (`reserve`).
    """
    reservations_table.create(connection, checkfirst=True)


def _create_usage_requests(connection: Connection) -> None:
    """Migration `0014_usage_requests`: the key of each model request whose usage is counted.

    `add_usage` stores it in the usage's transaction, and a write made again (`reconnecting`,
    after its commit's acknowledgement was lost) finds it there and adds nothing.
    """
    usage_requests_table.create(connection, checkfirst=True)


def _index_usage_requests_by_run(connection: Connection) -> None:
    """Migration `0016_usage_requests_run_index`: the run's request keys found by its id.

    The end of a run deletes them (`end_run` or `set_status`, in the end's transaction), which
    read every run's keys without it. (A database whose table `0014_usage_requests` made after this index
    was declared has it already.)
    """
    for index in usage_requests_table.indexes:
        index.create(connection, checkfirst=True)


def _add_run_task_folded(connection: Connection) -> None:
    """Migration `0017_run_task_folded`: each run's task case-folded, for searches in any case.

    Filled in here for the runs already stored, a thousand at a time.
    """
    if "task_folded" not in {column["name"] for column in sa.inspect(connection).get_columns("mp_runs")}:
        connection.execute(sa.text("ALTER TABLE mp_runs ADD COLUMN task_folded TEXT"))
    unfolded = sa.select(runs_table.c.id, runs_table.c.task).where(runs_table.c.task_folded.is_(None))
    while rows := connection.execute(unfolded.limit(1000)).all():
        connection.execute(
            runs_table.update().where(runs_table.c.id == sa.bindparam("run_id")),
            [{"run_id": run_id, "task_folded": task.casefold()} for run_id, task in rows],
        )


MIGRATIONS: list[Migration] = [
    ("0001_runs_steps_events_usage", _create_run_tables),
    ("0002_requests", create_requests_table),
    ("0003_lease_until", _add_lease_until),
    ("0004_messages_notes", create_message_tables),
    ("0005_processes", create_process_table),
    ("0006_run_executor", _add_run_executor),
    ("0007_usage_cost", _add_usage_cost),
    ("0008_run_retries", _add_run_retries),
    ("0009_message_hand_on", add_message_hand_on),
    ("0010_process_pid_namespace", add_process_pid_namespace),
    ("0011_budget_reservations", _create_reservations),
    ("0012_run_planning", _add_run_planning),
    ("0013_usage_failed_calls", _add_usage_failed_calls),
    ("0014_usage_requests", _create_usage_requests),
    ("0015_request_answer_call", add_answer_call),
    ("0016_usage_requests_run_index", _index_usage_requests_by_run),
    ("0017_run_task_folded", _add_run_task_folded),
]
"""Named schema migrations, applied in order, each exactly once per database."""


_this_process: tuple[int, str] | None = None


def _process_prefix() -> str:
    """`host:pid:token-` of this process, the host name as it was when the process first asked.

    The token is this process's own: two containers given one host name may each run
    masterplanner under the same pid (pid 1, say), and without it each would take the other's
    lease for its own (`held_here`) and go on executing a run the other took over.
    """
    global _this_process
    if _this_process is None or _this_process[0] != os.getpid():
        token = uuid.uuid4().hex[:6]
        _this_process = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{token}-")
    return _this_process[1]


def process_identity() -> str:
    """`host:pid:token-token`, unique to this engine in this process, used as the lease owner."""
    return f"{_process_prefix()}{uuid.uuid4().hex[:8]}"


def held_here(owner: str) -> bool:
    """Whether a lease owner (`process_identity`, with or without a suffix) is of this process."""
    return owner.startswith(_process_prefix())


@dataclass(frozen=True)
class Spending:
    """A run's usage so far, and what is held for its model requests in flight (`RunStore.reserve`)."""

    calls: int
    tokens: int
    cost_usd: float
    held_calls: int
    held_tokens: int
    held_cost_usd: float
    unpriced_calls: int = 0
    """The run's calls whose price is not known (a money budget cannot hold them)."""


@dataclass(frozen=True)
class Lease:
    """Who holds a run's lease, how long ago they renewed it and when it runs out (database clock)."""

    owner: str
    renewed_at: float
    age_s: float
    """Seconds since the holder last renewed the lease."""
    left_s: float
    """Seconds until the lease runs out (0 when it has: the run may be taken over)."""

    @property
    def handed_over_by(self) -> str | None:
        """The worker (its process id) that handed the run over as it stopped (`RunStore.hand_over`).

        None for a lease no stopping worker handed over (its holder died, or holds it).
        """
        if not self.owner.endswith(HANDED_OVER):
            return None
        return self.owner.removesuffix(HANDED_OVER).split("/", 1)[0]


def _lapsed(now: float) -> sa.ColumnElement[bool]:
    """Runs whose lease ran out (or that a version before `lease_until` held)."""
    return sa.or_(runs_table.c.lease_until < now, runs_table.c.lease_until.is_(None))


_LEFT_STATUSES = ("running", "succeeded", "failed")
"""The statuses of a run its holder may leave to another process (`_abandoned`): running, or ending."""


HANDED_OVER = "#handed-over"
"""Added to the owner of a run a stopping worker handed over (`RunStore.hand_over`)."""


def _queued() -> sa.ColumnElement[bool]:
    """Runs queued for workers that have not ended (held by a worker or not)."""
    return sa.and_(
        runs_table.c.executor == "workers", runs_table.c.status.not_in(tuple(FINISHED_RUN_STATUSES))
    )


def _held_for_retry(
    run_id: str, owner: str, renewed_at: float | None, lease_until: float | None, now: float
) -> RunError:
    """Why a failed run another process holds, or held until it stopped, cannot be retried now.

    A live holder is ending it (telling the registry how it went), or took it over to finish
    that end: the retry waits for it to let go. One whose lease lapsed stopped with the end cut
    short: the end is finished first (by a process that takes the run over, `runs resume`), or
    it would be lost, the run reset under it.
    """
    if lease_until is not None and lease_until >= now:
        heard = max(0.0, now - float(renewed_at or now))
        return RunError(
            f"run {run_id} is held by another process, {owner} (last heard from {heard:.0f} s ago), "
            "which is still ending it (telling the registry how it went)",
            remedy=Remedy("retry_later", run_id),
        )
    return RunError(
        f"run {run_id} failed, but {owner.removesuffix(HANDED_OVER)}, which was ending it, stopped "
        "before its end was done (telling the registry how it went)",
        remedy=Remedy("retry_again", run_id),
    )


def _abandoned(now: float) -> sa.ColumnElement[bool]:
    """Runs whose holder stopped renewing the lease without giving it up: running, or ending."""
    return sa.and_(
        runs_table.c.status.in_(_LEFT_STATUSES),
        runs_table.c.owner.is_not(None),
        _lapsed(now),
    )


@reconnecting_methods
class RunStore:
    """Reads and writes runs; safe to share between tasks and threads of one process."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.engine: Engine = create_engine(url)
        self._append_lock = threading.Lock()
        migrate(self.engine, url, MIGRATIONS)
        self.requests = Requests(self)
        """The runs' stored requests (plan reviews, tool approvals, questions)."""
        self.messages = Messages(self)
        """Messages between the runs' steps, and the runs' notes."""
        self.processes = Processes(self)
        """The processes executing workflows, and whether each is alive."""

    def begin(self, action: str) -> AbstractContextManager[Connection]:
        """One transaction; a database failure becomes a `RunError` naming `action`."""
        return transaction(self.engine, self.url, action)

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()

    # ---- runs

    def create_run(
        self,
        run_id: str,
        task: str,
        *,
        model: str,
        workspace: str,
        options: RunOptions,
        for_workers: bool = False,
    ) -> None:
        """Record a new run in status `planning` (`for_workers`: queued for whichever worker claims it)."""
        now = utc_now()
        with self.begin("create a run") as connection:
            connection.execute(
                runs_table.insert().values(
                    id=run_id,
                    task=task,
                    task_folded=task.casefold(),
                    status="planning",
                    model=model,
                    workspace=workspace,
                    options=json.dumps(options.to_json_dict()),
                    created_at=now,
                    updated_at=now,
                    cancel_requested=False,
                    executor="workers" if for_workers else None,
                )
            )

    def update_run(
        self,
        run_id: str,
        *,
        unless_cancelled: bool = False,
        unless_finished: bool = False,
        owner: str | None = None,
        **values: Any,
    ) -> bool:
        """Set columns of a run (`plan` as a `Plan`, `agents` as a map of `AgentBrief`s).

        With `unless_cancelled`, a run that is cancelled by then is left as it is; with
        `unless_finished`, one that has ended by then (succeeded, failed or cancelled); with
        `owner`, one whose lease `owner` no longer holds (another process took the run over).
        Whether the run was written (False: no such run, or left as it was).
        """
        with self.begin("update a run") as connection:
            return _update_run(connection, run_id, unless_cancelled, unless_finished, values, owner)

    def set_status(self, run_id: str, status: RunStatus, *, owner: str | None = None, **values: Any) -> bool:
        """Move a run to `status`, setting other columns in the same write.

        A cancelled run stays cancelled: a cancel from another process can land while the
        executing one writes its next status (the review's approval moving it to `running`, on a
        thread the cancel cannot stop), and that write must not bring the run back. And only an
        unfinished run is cancelled: a cancel that read the run running may take its lease just
        after it ended and gave the lease up (it was marking a succeeded run cancelled). Whether
        the status was written: a caller then records nothing of the move it did not make.

        A run that ends carries no cancel still to come: a cancel asked as it ended (recorded as
        asked, in its events) came too late, and its flag, left set, had the next execution of
        the ended run (`runs resume` finishing its end) stopped as cancelled.

        A run that ends forgets the keys of its counted model requests (`mp_usage_requests`, in
        the same transaction): each is made again only by its own write (`add_usage`, repeated by
        `reconnecting` while the database is away), and a run's requests are answered and counted
        before it ends. Kept, they grew by a row a request for ever. A request still in flight as
        the run ends (a worker's step, or an inline step's count on a thread its cancel does not
        stop) writes its key after this delete: it is left (docs/architecture.md, "Left open").

        With `owner`, only while `owner` holds the run's lease (False otherwise): a process that
        lost it does not write over the new holder's work (`planning.plan_run`'s plan).
        """
        if status not in FINISHED_RUN_STATUSES:
            return self.update_run(run_id, unless_cancelled=True, owner=owner, status=status, **values)
        values = {"cancel_requested": False, "status": status, **values}
        with self.begin("update a run") as connection:
            ended = _update_run(
                connection, run_id, status != "cancelled", status == "cancelled", values, owner
            )
            if ended:
                connection.execute(_FORGET_REQUESTS, {"run_id": run_id})
            return ended

    def end_run(
        self,
        run_id: str,
        status: Literal["succeeded", "failed", "cancelled"],
        event: EventKind,
        data: dict[str, Any],
        *,
        requests: Literal["expired", "cancelled"],
        keep_remember: bool,
        unstarted_finished: bool,
        owner: str | None = None,
        **values: Any,
    ) -> bool:
        """End the run in one transaction, with its steps, its requests and its end event.

        Its status moves as `set_status` moves it, its unfinished steps are cancelled, its open
        requests are closed as `requests` and its end `event` is appended. `unstarted_finished`:
        a step never started gets a `finished_at` too (a failed end's way) or none (a cancel's).
        Whether the run ended so (False: it had ended, or was cancelled, and nothing is written).
        With `owner`, only while `owner` holds the run's lease (False otherwise, nothing written).

        A success or failure made again once it was recorded (its workflow's step re-run after a
        crash, or a write `reconnecting` repeats after a lost acknowledgement) finds the run so
        and writes nothing more (True): the run has one end event. A retry moves the run back
        first, so an equal status is this end's. A cancel of a cancelled run writes nothing (False).

        Before, each was a transaction of its own: a store error between them (a full disk) left
        a run ended with no end event for good (its end workflow, recorded as failed, was not
        made again), as did a process that died in `mark_cancelled`; and a reader between them
        (the run's web page) saw it failed with no `run_failed` among its events.
        """
        payload = json.dumps(data, default=str)
        values = {"cancel_requested": False, "status": status, **values}

        def end(connection: Connection, now: Any) -> bool:
            if status != "cancelled" and now.status == status:  # recorded: made again
                return True
            cancel = status == "cancelled"
            if not _update_run(connection, run_id, not cancel, cancel, dict(values), owner):
                return False
            connection.execute(_FORGET_REQUESTS, {"run_id": run_id})
            at = utc_now()
            finished_at = (
                sa.literal(at)
                if unstarted_finished
                else sa.case((steps_table.c.started_at.is_not(None), at), else_=None)
            )
            connection.execute(
                steps_table.update()
                .where(steps_table.c.run_id == run_id, steps_table.c.status.in_(["pending", "running"]))
                .values(status="cancelled", finished_at=finished_at)
            )
            close_open_requests(connection, run_id, requests, keep_remember=keep_remember)
            _insert_event(connection, run_id, at, event, None, payload)
            return True

        return self._as_holder(run_id, owner, "end a run", f"could not end run {run_id}", end)

    def _as_holder(
        self,
        run_id: str,
        owner: str | None,
        action: str,
        failure: str,
        write: Callable[[Connection, Any], bool],
        *,
        no_run: bool = False,
    ) -> bool:
        """`write` in one transaction, only while `owner` holds the run's lease (None: any process).

        `write` gets the connection and the run's status and owner as the transaction read them,
        and says whether it wrote (or found written). False without calling it when there is no
        such run (unless `no_run` and no `owner`: `write` then gets None) or `owner` does not hold
        it. Made again when another process took the seq of an event it appends (or a key it
        inserts); `failure` says what could not be done when that keeps happening.

        With `owner`, the run's row is locked before it is read (Postgres: `FOR UPDATE`; SQLite: a
        write first, which takes the database's writer lock, as SQLite sends `BEGIN` only before a
        transaction's first write and a read before it is no part of it): another process taking
        the lease over waits for this transaction's end. Before, the read was a plain one: a holder
        that had stalled past its lease read itself the owner, the other process took the run over
        and committed, and the write landed under the new holder's.
        """
        sqlite = self.engine.dialect.name == "sqlite"
        read = _STATUS_AND_OWNER.with_for_update() if owner is not None else _STATUS_AND_OWNER
        for _ in range(20):
            with self._append_lock:
                try:
                    with self.begin(action) as connection:
                        if owner is not None and sqlite:
                            connection.execute(_TAKE_WRITER_LOCK, {"run_id": run_id})
                        now = connection.execute(read, {"run_id": run_id}).first()
                        if owner is not None and (now is None or now.owner != owner):
                            return False
                        if now is None and not no_run:
                            return False
                        return write(connection, now)
                except sa.exc.IntegrityError:
                    continue  # another process took the event's seq; try again
        raise RunError(f"{failure}: the event log is too contended")

    def open_request(
        self,
        run_id: str,
        kind: RequestKind,
        payload: dict[str, Any],
        *,
        key: str,
        step_id: str | None,
        event: tuple[EventKind, dict[str, Any]] | None,
        owner: str | None,
    ) -> tuple[Request, bool] | None:
        """Open a request and append the event that announces it, in one transaction (`Requests.open`).

        The request and True, or the one opened under `key` before and False (nothing more is
        written: a step made again after a crash, or a write `reconnecting` repeats after a lost
        acknowledgement). `event` is the announcement's kind and data: it names the request's step,
        and its data the request (`request`: its id). A request found open under `key` with no
        such event (opened by a version that wrote it apart, which died before writing it) gets
        it then; a closed one is left as it is (its answer's event says it was asked).

        With `owner`, only while `owner` holds the run's lease: None, and nothing written, when it
        does not (it stalled past it, and another process took the run over). On a run that has
        ended (cancelled, failed or succeeded), `RunEnded` and nothing written, unless `kind` is
        `remember` (the end of a succeeded run opens it): a step that asked as a cancel ended the
        run opened its request after the end had closed the open ones, and it stayed open for good.
        A request found under `key` is returned as it is (no event is added on an ended run).
        An `event` of no known kind is refused as `step_event` refuses one (`ValueError`).

        Before, the request and its event were two writes: a crash or a store error between them
        left the request with no event for good (found under its key, it was not new, so it was
        not announced): the run's events, its page's live view and its audit never said that a
        person was asked.
        """
        if event is not None and event[0] not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {event[0]!r}")
        opened: list[tuple[Request, bool]] = []
        ended: list[str] = []

        def announce(connection: Connection, request_id: str) -> None:
            if event is not None:
                data = json.dumps({"request": request_id} | event[1], default=str)
                _insert_event(connection, run_id, utc_now(), event[0], step_id, data)

        def open_it(connection: Connection, now: Any) -> bool:
            over = now is not None and now.status in FINISHED_RUN_STATUSES and kind != "remember"
            found = (
                connection.execute(sa.select(requests_table).where(requests_table.c.key == key))
                .mappings()
                .first()
            )
            if found is not None:
                if (
                    event is not None
                    and not over
                    and found["state"] == "open"
                    and not _announces(connection, run_id, event[0], found["id"])
                ):
                    announce(connection, found["id"])
                opened.append((request_of_row(found), False))
                return True
            if over:  # ended meanwhile (a cancel): its end closed the open requests, none opens after it
                ended.append(now.status)
                return False
            request_id = secrets.token_hex(4)  # taken (rarely): the insert fails, and is made again
            row = {
                "id": request_id,
                "key": key,
                "run_id": run_id,
                "step_id": step_id,
                "kind": kind,
                "payload": json.dumps(payload, default=str),
                "state": "open",
                "created_at": utc_now(),
            }
            connection.execute(requests_table.insert().values(**row))
            announce(connection, request_id)
            opened.append(
                (request_of_row(row | {"answer": None, "answered_by": None, "answered_at": None}), True)
            )
            return True

        written = self._as_holder(
            run_id, owner, "open a request", f"could not open a request of run {run_id}", open_it, no_run=True
        )
        if ended:
            raise RunEnded(run_id, ended[-1], kind)
        return opened[-1] if written else None

    def decide_review(
        self,
        run_id: str,
        decision: Literal["approved", "rejected"],
        data: dict[str, Any],
        *,
        owner: str | None,
        edit: PlanChange | None = None,
    ) -> bool:
        """Record a plan review's decision in one transaction: its event (`data`) and the run's move.

        Approved, the run moves to `running` with its `approved` event; rejected, it is cancelled
        as `end_run` cancels a run, its `rejected` event last and its error `rejected: <reason>`
        (`data["reason"]`). With `owner`, only while `owner` holds the run's lease: a process that
        lost it (it stalled past it, and another took the run over) writes nothing. A run that
        ended meanwhile (a cancel recorded) is left as it is. Whether the decision was written
        (True too for an approval made again once recorded, which writes nothing more; False for
        a rejection made again, as for a cancel of a cancelled run).

        An approval's `edit` (the plan, agents and options the person's answer changed) is stored
        in the same transaction, with its `plan_edited` event (the plan's steps and the run's tool
        policies) before `approved`. Before, it was written first, on its own, and then its event:
        a crash or a store error between them left the edited plan with no `plan_edited` for good
        (the answer, taken again, no longer differed from the plan, so it was no edit), and a
        process that had lost the lease wrote its edit over the new holder's run.

        Before, each was two writes, the event and then the move: a store error or a crash between
        them left a run awaiting approval with its decision's event, which its resume recorded a
        second time, or a failed run saying it was approved or rejected.
        """
        if decision == "rejected":
            return self.end_run(
                run_id,
                "cancelled",
                "rejected",
                data,
                requests="cancelled",
                keep_remember=False,
                unstarted_finished=False,
                owner=owner,
                error=f"rejected: {data['reason']}",
            )
        payload = json.dumps(data, default=str)

        def approve(connection: Connection, now: Any) -> bool:
            if now.status == "running":  # recorded: made again
                return True
            values = {"status": "running"} | ({} if edit is None else _changed_run(edit))
            if not _update_run(connection, run_id, True, True, values, owner):
                return False
            at = utc_now()
            if edit is not None:
                options = edit.options.tool_policies if edit.options is not None else {}
                edited = json.dumps({"steps": edit.plan.ids, "tool_policies": options})
                _insert_event(connection, run_id, at, "plan_edited", None, edited)
            _insert_event(connection, run_id, at, "approved", None, payload)
            return True

        return self._as_holder(
            run_id,
            owner,
            "record a plan's approval",
            f"could not record the approval of run {run_id}",
            approve,
        )

    def keep_planning(self, run_id: str, work: Mapping[str, Any], *, owner: str) -> bool:
        """Store the planning work done so far on a run that is still planning (JSON form).

        Only while `owner` holds the run's lease (as a heartbeat renews it): a process that lost
        it (stalled past it, and another took the run over) does not write over the new holder's
        work. Whether it was stored (False: the run is no longer planning, cancelled meanwhile
        say, or `owner` no longer holds it).
        """
        with self.begin("keep a run's planning") as connection:
            kept = connection.execute(
                runs_table.update()
                .where(
                    runs_table.c.id == run_id,
                    runs_table.c.status == "planning",
                    runs_table.c.owner == owner,
                )
                .values(planning=json.dumps(work), updated_at=utc_now())
            )
            return kept.rowcount > 0

    def kept_planning(self, run_id: str) -> dict[str, Any] | None:
        """The planning work `keep_planning` stored for the run (None: none, or planning finished)."""
        with self.begin("read a run's planning") as connection:
            text = connection.scalar(sa.select(runs_table.c.planning).where(runs_table.c.id == run_id))
        if not text:
            return None
        try:
            work = json.loads(text)
        except ValueError as exc:  # written by hand
            raise RunError(f"run {run_id}: its planning work cannot be read: {exc}") from None
        if not isinstance(work, dict):
            raise RunError(f"run {run_id}: its planning work cannot be read: it is not an object")
        return work

    def ask_cancel(self, run_id: str, *, by: str | None) -> bool:
        """Ask an unfinished run to stop: its cancel flag set and, with `by`, a `cancel_requested` event.

        One transaction, taken only while the run has not ended (False when it has: a run that
        ended after its asker read it running is left as it ended, with no request on record).
        """
        payload = json.dumps({"by": by})
        for _ in range(20):
            with self._append_lock:
                try:
                    with self.begin("ask a run to stop") as connection:
                        asked = connection.execute(
                            runs_table.update()
                            .where(
                                runs_table.c.id == run_id,
                                runs_table.c.status.not_in(list(FINISHED_RUN_STATUSES)),
                            )
                            .values(cancel_requested=True, updated_at=utc_now())
                        )
                        if asked.rowcount != 1:
                            return False
                        if by is not None:
                            _insert_event(connection, run_id, utc_now(), "cancel_requested", None, payload)
                except sa.exc.IntegrityError:
                    continue  # another process took the event's seq; try again
            return True
        raise RunError(f"could not ask run {run_id} to stop: the event log is too contended")

    def get_run(self, run_id: str) -> RunRecord:
        """The stored run; `RunError` if there is none with this id (a unique prefix also works)."""
        if names_nothing(run_id):
            raise RunNotFoundError(
                f"no run {quoted_id(run_id)} in {shown_url(self.url)}", remedy=Remedy("list_runs")
            )
        with self.begin("read a run") as connection:
            row = (
                connection.execute(sa.select(runs_table).where(runs_table.c.id == run_id)).mappings().first()
            )
            if row is None and len(run_id) >= 4:
                rows = (
                    connection.execute(
                        sa.select(runs_table)
                        .where(runs_table.c.id.startswith(run_id, autoescape=True))
                        .limit(2)
                    )
                    .mappings()
                    .all()
                )
                if len(rows) > 1:
                    raise RunNotFoundError(
                        f"{quoted_id(run_id)} is the start of more than one run's id: give more of it",
                        ambiguous=True,
                        remedy=Remedy("list_runs"),
                    )
                row = rows[0] if rows else None
        if row is None:
            raise RunNotFoundError(
                f"no run {quoted_id(run_id)} in {shown_url(self.url)}", remedy=Remedy("list_runs")
            )
        return _run_record(row)

    def list_runs(
        self, limit: int = 50, *, status: str | None = None, text: str | None = None
    ) -> list[RunRecord]:
        r"""The newest runs first; only those with `status`, and whose task holds `text` (any case).

        Any case is Unicode's case folding (`str.casefold`: `Ä` finds `ä`, `STRASSE` finds
        `Straße`); `%`, `_` and `\` in `text` are taken as they are.
        """
        query = sa.select(runs_table).order_by(runs_table.c.created_at.desc()).limit(limit)
        if status:
            query = query.where(runs_table.c.status == status)
        if text and names_nothing(text):
            return []
        if text:
            escaped = text.casefold().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            # a run stored by a version before `task_folded` (sharing the database) is searched by
            # its task lowered in SQL, as that version did
            folded = sa.func.coalesce(runs_table.c.task_folded, sa.func.lower(runs_table.c.task))
            query = query.where(folded.like(f"%{escaped}%", escape="\\"))
        with self.begin("list runs") as connection:
            rows = connection.execute(query).mappings().all()
        return [_run_record(row) for row in rows]

    def cancel_requested(self, run_id: str) -> bool:
        """Whether someone asked to cancel the run."""
        with self.begin("read a run") as connection:
            return bool(
                connection.scalar(sa.select(runs_table.c.cancel_requested).where(runs_table.c.id == run_id))
            )

    # ---- ownership

    def retry(
        self,
        run_id: str,
        *,
        options: RunOptions,
        for_workers: bool,
        by: str | None,
        budgets: Mapping[str, Any] | None = None,
        prompt_rounds: int | None = None,
    ) -> list[str]:
        """Put a failed run back where it failed, in one transaction; returns the steps to run again.

        Its failed, skipped and cancelled steps are pending again (the succeeded ones keep their
        outputs); it goes back to `running` if its plan was approved, else to the review or to
        planning; its error goes, `retries` counts one more, `options` replace its options and
        `for_workers` says who executes it now. A `run_retried` event records who asked and the
        `budgets` they changed (and the `prompt_rounds` they set, if they did). Refused
        (`RunError`) unless the run failed and no process holds it: neither a live one (still
        ending it, or taking it over to finish its end) nor one that stopped holding it, its
        end cut short (its execution resumed finishes that end first, `runs resume`).

        The run's row is locked before it is read (Postgres: `FOR UPDATE`; SQLite: a write first,
        which takes the database's writer lock, as SQLite sends `BEGIN` only before a
        transaction's first write), and the reset is one update on the state read: of a retry
        and a claim of the run at once, one waits for the other and exactly one wins. Before, the
        read was a plain one: a process claimed the run after it and the retry wiped its lease,
        the run reset under an execution of it.
        """
        retried: list[str] = []
        for _ in range(20):
            with self._append_lock:
                try:
                    with self.begin("retry a run") as connection:
                        if self.engine.dialect.name == "sqlite":
                            connection.execute(_TAKE_WRITER_LOCK, {"run_id": run_id})
                        retried = self._retry(
                            connection, run_id, options, for_workers, by, budgets, prompt_rounds
                        )
                except sa.exc.IntegrityError:
                    continue  # another process took the event's seq; try again
            return retried
        raise RunError(f"could not retry run {run_id}: the event log is too contended")

    @staticmethod
    def _just_retried(connection: Connection, run_id: str) -> bool:
        """Whether the run's latest event is its retry (nothing has executed it since)."""
        latest = connection.scalar(
            sa.select(events_table.c.kind)
            .where(events_table.c.run_id == run_id)
            .order_by(events_table.c.seq.desc())
            .limit(1)
        )
        return latest == "run_retried"

    def _retry(
        self,
        connection: Connection,
        run_id: str,
        options: RunOptions,
        for_workers: bool,
        by: str | None,
        budgets: Mapping[str, Any] | None,
        prompt_rounds: int | None,
    ) -> list[str]:
        read = sa.select(runs_table).where(runs_table.c.id == run_id)
        if self.engine.dialect.name != "sqlite":
            read = read.with_for_update()
        row = connection.execute(read).mappings().first()
        if row is None:
            raise RunNotFoundError(f"no run {quoted_id(run_id)}")
        now = database_now(connection)
        if row["status"] != "failed":
            state = {"succeeded": "succeeded", "cancelled": "was cancelled"}.get(
                row["status"], f"is {str(row['status']).replace('_', ' ')}"
            )
            held = row["owner"] is not None and row["lease_until"] is not None and row["lease_until"] >= now
            if (
                row["status"] not in FINISHED_RUN_STATUSES
                and not held
                and self._just_retried(connection, run_id)
            ):
                # the losing one of two retries at once: the winner's execution has not taken it yet
                raise RunError(f"run {run_id} is being retried already: it goes on from where it failed")
            if row["status"] not in FINISHED_RUN_STATUSES and row["executor"] != "workers" and not held:
                raise RunError(
                    f"run {run_id} {state} but no process is executing it (the one that was stopped)",
                    remedy=Remedy("resume", run_id),
                )
            raise RunError(f"run {run_id} {state}: only a failed run can be retried")
        if row["owner"] is not None:
            raise _held_for_retry(run_id, row["owner"], row["heartbeat_at"], row["lease_until"], now)
        approved = connection.scalar(
            sa.select(sa.func.count())
            .select_from(events_table)
            .where(events_table.c.run_id == run_id, events_table.c.kind == "approved")
        )
        status: RunStatus = "running" if approved else "awaiting_approval" if row["plan"] else "planning"
        retries = int(row["retries"]) + 1
        updated = connection.execute(
            runs_table.update()
            .where(
                runs_table.c.id == run_id,
                runs_table.c.status == "failed",
                runs_table.c.retries == retries - 1,
                runs_table.c.owner.is_(None),  # nobody took it since it was read
            )
            .values(
                status=status,
                output=None,
                error=None,
                cancel_requested=False,
                retries=retries,
                options=json.dumps(options.to_json_dict()),
                executor="workers" if for_workers else None,
                owner=None,
                heartbeat_at=None,
                lease_until=None,
                updated_at=utc_now(),
            )
        )
        if updated.rowcount != 1:
            raise RunError(f"run {run_id} changed while it was being retried: try again")
        unfinished = ("failed", "skipped", "cancelled", "running", "pending")
        steps = list(
            connection.scalars(
                sa.select(steps_table.c.step_id)
                .where(steps_table.c.run_id == run_id, steps_table.c.status.in_(unfinished))
                .order_by(steps_table.c.position)
            )
        )
        connection.execute(
            steps_table.update()
            .where(steps_table.c.run_id == run_id, steps_table.c.status.in_(unfinished))
            .values(status="pending", output=None, error=None, started_at=None, finished_at=None, attempts=0)
        )
        data: dict[str, Any] = {"retry": retries, "status": status, "steps": steps}
        if status == "planning":  # whether it goes on from a plan it kept or plans afresh (the audit)
            data["planning_kept"] = row["planning"] is not None
        data |= ({"by": by} if by else {}) | ({"budgets": dict(budgets)} if budgets else {})
        data |= {} if prompt_rounds is None else {"prompt_rounds": prompt_rounds}
        _insert_event(connection, run_id, utc_now(), "run_retried", None, json.dumps(data))
        return steps

    def claim(self, run_id: str, owner: str, *, lease_s: float, claimable: bool = False) -> bool:
        """Take the run's lease for `owner` for `lease_s`: if free, already `owner`'s, or run out.

        One conditional update, so of two processes claiming at once exactly one gets it.
        `claimable`: only while the run is one a worker may take (`claimable_runs`): queued for
        workers, or abandoned. A worker claims what it listed a moment before: a run retried
        meanwhile for the terminal that retried it (its lease given up) is no longer its to take.
        """
        with self.begin("claim a run") as connection:
            now = database_now(connection)
            free = sa.or_(runs_table.c.owner.is_(None), runs_table.c.owner == owner, _lapsed(now))
            taken = sa.and_(free, sa.or_(_queued(), _abandoned(now))) if claimable else free
            updated = connection.execute(
                runs_table.update()
                .where(runs_table.c.id == run_id, taken)
                .values(owner=owner, heartbeat_at=now, lease_until=now + lease_s)
            )
            if updated.rowcount == 1:
                return True
            if connection.scalar(sa.select(runs_table.c.id).where(runs_table.c.id == run_id)) is None:
                raise RunNotFoundError(f"no run {quoted_id(run_id)}")
            return False

    def heartbeat(self, run_id: str, owner: str, *, lease_s: float) -> bool:
        """Renew the lease for another `lease_s`; False if `owner` no longer holds it."""
        with self.begin("renew a lease") as connection:
            now = database_now(connection)
            updated = connection.execute(
                runs_table.update()
                .where(runs_table.c.id == run_id, runs_table.c.owner == owner)
                .values(heartbeat_at=now, lease_until=now + lease_s)
            )
            return updated.rowcount == 1

    def watched(self, owners: Mapping[str, str]) -> dict[str, tuple[bool, bool]]:
        """Per run (by id, with the owner that should hold it): (held by that owner, cancel asked).

        One query for all the runs a process executes.
        """
        if not owners:
            return {}
        with self.begin("read leases") as connection:
            rows = connection.execute(
                sa.select(runs_table.c.id, runs_table.c.owner, runs_table.c.cancel_requested).where(
                    runs_table.c.id.in_(list(owners))
                )
            ).all()
        return {row[0]: (row[1] == owners[row[0]], bool(row[2])) for row in rows}

    def heartbeats(self, owners: Mapping[str, str], *, lease_s: float) -> None:
        """Renew the leases of many runs, each for the owner given, in one statement.

        A run another owner holds now is left alone (`watched` says it was lost).
        """
        if not owners:
            return
        with self.begin("renew leases") as connection:
            now = database_now(connection)
            connection.execute(
                runs_table.update()
                .where(sa.tuple_(runs_table.c.id, runs_table.c.owner).in_(list(owners.items())))
                .values(heartbeat_at=now, lease_until=now + lease_s)
            )

    def release(self, run_id: str, owner: str) -> None:
        """Give the lease up."""
        with self.begin("release a lease") as connection:
            connection.execute(
                runs_table.update()
                .where(runs_table.c.id == run_id, runs_table.c.owner == owner)
                .values(owner=None, heartbeat_at=None, lease_until=None)
            )

    def hand_over(self, run_id: str, owner: str) -> None:
        """Give the lease up for another worker to take the run at once (a worker that stops).

        A run queued for workers that has not ended is released, as `release` does: a worker
        claims it as queued. Any other run `owner` holds would then be claimed by nobody (one
        whose `run` process died, which a worker took over; one ended whose end, telling the
        registry, is not done): its lease lapses now instead, an owner kept, so it counts as
        abandoned (`abandoned_runs`) and the next worker's claim round takes it over, as when
        its holder dies. The owner kept is `owner` marked handed over (`HANDED_OVER`): a renewal
        of the stopping worker's guard already under way matches `owner` only, so it cannot
        renew the lapsed lease for another `run_lease_s`. It lapses a second before the
        database's time: "now" held it until the clock moved on (a millisecond on SQLite).
        """
        queued = sa.and_(  # no NULL in it: `left` and its negation must each be true or false
            sa.func.coalesce(runs_table.c.executor, "") == "workers",
            runs_table.c.status.not_in(tuple(FINISHED_RUN_STATUSES)),
        )
        with self.begin("hand a run over") as connection:
            now = database_now(connection)
            held = sa.and_(runs_table.c.id == run_id, runs_table.c.owner == owner)
            left = sa.and_(runs_table.c.status.in_(_LEFT_STATUSES), sa.not_(queued))
            connection.execute(
                runs_table.update().where(held, left).values(owner=owner + HANDED_OVER, lease_until=now - 1)
            )
            connection.execute(
                runs_table.update()
                .where(held, sa.not_(left))
                .values(owner=None, heartbeat_at=None, lease_until=None)
            )

    def unheld(self, run_ids: Collection[str]) -> set[str]:
        """Of these runs, the unfinished ones no process holds (no owner, or its lease lapsed)."""
        if not run_ids:
            return set()
        with self.begin("read leases") as connection:
            now = database_now(connection)
            rows = connection.execute(
                sa.select(runs_table.c.id).where(
                    runs_table.c.id.in_(list(run_ids)),
                    runs_table.c.status.not_in(list(FINISHED_RUN_STATUSES)),
                    sa.or_(runs_table.c.owner.is_(None), _lapsed(now)),
                )
            ).all()
        return {row[0] for row in rows}

    def lease(self, run_id: str) -> Lease | None:
        """The run's lease, or None when no process holds it."""
        with self.begin("read a lease") as connection:
            now = database_now(connection)
            row = connection.execute(
                sa.select(runs_table.c.owner, runs_table.c.heartbeat_at, runs_table.c.lease_until).where(
                    runs_table.c.id == run_id
                )
            ).first()
        if row is None or row[0] is None:
            return None
        renewed = float(row[1] or 0.0)
        until = float(row[2] or 0.0)
        return Lease(
            owner=row[0], renewed_at=renewed, age_s=max(0.0, now - renewed), left_s=max(0.0, until - now)
        )

    def claimable_runs(
        self, limit: int, *, providers: Sequence[str], excluding: Collection[str] = ()
    ) -> list[str]:
        """Runs a worker may take, oldest first: queued for workers and held by nobody, or abandoned.

        Queued ones in any unfinished status (planning, awaiting approval, running); abandoned
        ones as `abandoned_runs` finds them. Only runs whose model is one of `providers`'s (the
        worker coordinates a run with its model: it plans with it), and none of `excluding`. A
        worker still claims each (`claim`): of two workers taking the same run, one gets it.
        """
        if not providers:
            return []
        model = runs_table.c.model
        served = sa.or_(*(sa.or_(model == name, model.startswith(f"{name}:")) for name in providers))
        with self.begin("list runs") as connection:
            now = database_now(connection)
            free = sa.or_(runs_table.c.owner.is_(None), runs_table.c.lease_until < now)
            queued = sa.and_(_queued(), free)
            query = sa.select(runs_table.c.id).where(sa.or_(queued, _abandoned(now)), served)
            if excluding:
                query = query.where(runs_table.c.id.not_in(list(excluding)))
            rows = connection.execute(query.order_by(runs_table.c.created_at).limit(limit)).all()
        return [row[0] for row in rows]

    def abandoned_runs(self) -> list[str]:
        """Runs whose executing process stopped renewing its lease without giving it up (it died).

        Those `running`, and succeeded or failed ones whose end may have been cut short.
        """
        with self.begin("list runs") as connection:
            now = database_now(connection)
            rows = connection.execute(
                sa.select(runs_table.c.id).where(_abandoned(now)).order_by(runs_table.c.created_at)
            ).all()
        return [row[0] for row in rows]

    # ---- steps

    def init_steps(self, run_id: str, step_ids: list[str]) -> None:
        """Record every step of the approved plan as pending (replacing an earlier plan's steps)."""
        with self.begin("record steps") as connection:
            connection.execute(steps_table.delete().where(steps_table.c.run_id == run_id))
            if step_ids:
                connection.execute(
                    steps_table.insert(),
                    [
                        {
                            "run_id": run_id,
                            "step_id": step_id,
                            "position": index,
                            "status": "pending",
                            "attempts": 0,
                        }
                        for index, step_id in enumerate(step_ids)
                    ],
                )

    def record_revision(
        self,
        run_id: str,
        kind: EventKind,
        step_id: str,
        data: dict[str, Any],
        *,
        owner: str | None,
        change: PlanChange | None = None,
    ) -> bool:
        """Record a step of a plan's revision (a replan, a sub-plan) in one transaction: event and change.

        The event `kind` of step `step_id` (`replan_requested`, `replanned`, `replan_failed`,
        `step_expanded`, `expand_failed`) with `data`; with the revised plan `change`: the plan
        and its agents replace the run's, its `added` steps are recorded pending after the steps
        there are, each `retired` step takes its new status (it stays in the record, with what it
        did), and the messages sent to the retired steps are handed on to the added ones
        (`messages.hand_on`). Only while `owner` holds the run's lease: a process that lost it
        (it stalled past it, and another took the run over) writes nothing (False). Nor on a run
        that has ended (False): a replan that ended as the run was cancelled added its steps,
        pending for good, to the cancelled run.

        Made again once recorded (its event of that kind, step and `data["n"]` is there: a write
        `reconnecting` repeats after a lost acknowledgement), it writes nothing more (True).
        Before, the revised plan and its event were two writes: a crash or a store error between
        them left the run going on with the new steps and no `replanned` for good (nor who
        approved it), and its next replan took the same number, so the same recorded proposal
        and answer.
        """
        payload = json.dumps(data, default=str)

        def revise(connection: Connection, now: Any) -> bool:
            if _recorded(connection, run_id, kind, step_id, data.get("n")):
                return True
            if now.status in FINISHED_RUN_STATUSES:  # ended meanwhile (a cancel): no steps after its end
                return False
            if change is not None:
                _revise_steps(connection, run_id, change)
            _insert_event(connection, run_id, utc_now(), kind, step_id, payload)
            return True

        return self._as_holder(
            run_id, owner, "revise the plan", f"could not record the revision of run {run_id}", revise
        )

    def update_step(self, run_id: str, step_id: str, **values: Any) -> None:
        """Set columns of one step."""
        with self.begin("update a step") as connection:
            connection.execute(
                steps_table.update()
                .where(steps_table.c.run_id == run_id, steps_table.c.step_id == step_id)
                .values(**values)
            )

    def steps(self, run_id: str) -> list[StepRecord]:
        """The run's steps in plan order."""
        with self.begin("read steps") as connection:
            rows = (
                connection.execute(
                    sa.select(steps_table)
                    .where(steps_table.c.run_id == run_id)
                    .order_by(steps_table.c.position)
                )
                .mappings()
                .all()
            )
        return [
            StepRecord(
                id=row["step_id"],
                status=row["status"],
                output=row["output"],
                error=row["error"],
                started_at=row["started_at"],
                finished_at=row["finished_at"],
                attempts=row["attempts"],
            )
            for row in rows
        ]

    # ---- events

    def append_event(
        self, run_id: str, kind: EventKind, step: str | None = None, data: dict[str, Any] | None = None
    ) -> Event:
        """Append one event to the run's log and return it with its sequence number."""
        return self.step_event(run_id, step, kind, data)

    def step_event(
        self,
        run_id: str,
        step: str | None,
        kind: EventKind,
        data: dict[str, Any] | None = None,
        **step_values: Any,
    ) -> Event:
        """Append an event and, in the same transaction, set columns of its step (if any are given)."""
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        payload = json.dumps(data or {}, default=str)
        for _ in range(20):
            at = utc_now()
            with self._append_lock:
                try:
                    with self.begin("append an event") as connection:
                        if step_values:
                            connection.execute(
                                steps_table.update()
                                .where(steps_table.c.run_id == run_id, steps_table.c.step_id == step)
                                .values(**step_values)
                            )
                        seq = _insert_event(connection, run_id, at, kind, step, payload)
                except sa.exc.IntegrityError:
                    continue  # another process took this seq; take the next one
            return Event(seq, at, kind, step, json.loads(payload))
        raise RunError(f"could not append an event to run {run_id}: the event log is too contended")

    def append_event_once(
        self, run_id: str, kind: EventKind, data: dict[str, Any] | None = None, *, after: int = 0
    ) -> Event | None:
        """Append an event unless the run has one of `kind` past `after` (a seq); None when it has.

        One transaction that locks the run's row before it reads (Postgres: `FOR UPDATE`;
        SQLite: a write first, which takes the database's writer lock, as in `_as_holder`), so of
        two such calls at once, from any processes, the second sees the first's event and appends
        none: what one thing that happened says once (a team stored: `team_stored`) is said once,
        whoever says it. Without the lock the read came before the other's commit (SQLite reads
        outside the transaction until its first write; Postgres's statements each see what was
        committed when they began), and both appended. Made again when another process took the
        event's seq, as `step_event` is.
        """
        if kind not in EVENT_KINDS:
            raise ValueError(f"unknown event kind {kind!r}")
        payload = json.dumps(data or {}, default=str)
        sqlite = self.engine.dialect.name == "sqlite"
        for _ in range(20):
            at = utc_now()
            with self._append_lock:
                try:
                    with self.begin("append an event") as connection:
                        if sqlite:
                            connection.execute(_TAKE_WRITER_LOCK, {"run_id": run_id})
                        else:
                            connection.execute(_STATUS_AND_OWNER.with_for_update(), {"run_id": run_id})
                        found = connection.scalar(
                            sa.select(events_table.c.seq)
                            .where(
                                events_table.c.run_id == run_id,
                                events_table.c.kind == kind,
                                events_table.c.seq > after,
                            )
                            .limit(1)
                        )
                        if found is not None:
                            return None
                        seq = _insert_event(connection, run_id, at, kind, None, payload)
                except sa.exc.IntegrityError:
                    continue  # another process took this seq; take the next one
            return Event(seq, at, kind, None, json.loads(payload))
        raise RunError(f"could not append an event to run {run_id}: the event log is too contended")

    def last_seq(self, run_id: str) -> int:
        """The seq of the run's latest event (0 when it has none)."""
        with self.begin("read events") as connection:
            return int(
                connection.scalar(
                    sa.select(sa.func.coalesce(sa.func.max(events_table.c.seq), 0)).where(
                        events_table.c.run_id == run_id
                    )
                )
                or 0
            )

    def events(self, run_id: str, after: int = 0) -> list[Event]:
        """The run's events with `seq > after`, in order."""
        with self.begin("read events") as connection:
            rows = connection.execute(
                sa.select(events_table)
                .where(events_table.c.run_id == run_id, events_table.c.seq > after)
                .order_by(events_table.c.seq)
            ).mappings()
            return [
                Event(row["seq"], row["at"], row["kind"], row["step"], json.loads(row["data"]))
                for row in rows
            ]

    def call_started(self, run_id: str, step_id: str, call: str) -> bool:
        """Whether the step recorded a `tool_called` event for the call `call` (`durable_key`)."""
        with self.begin("read events") as connection:
            rows = connection.execute(
                sa.select(events_table.c.data).where(
                    events_table.c.run_id == run_id,
                    events_table.c.step == step_id,
                    events_table.c.kind == "tool_called",
                )
            ).scalars()
            return any(json.loads(data).get("call") == call for data in rows)

    # ---- usage

    def add_usage(
        self,
        run_id: str,
        purpose: str,
        *,
        input_tokens: int,
        output_tokens: int,
        seconds: float,
        cost_usd: float | None = 0.0,
        failed: bool = False,
        request: str,
        reservation: str | None = None,
    ) -> None:
        """Count one model call of `purpose` against the run (one upsert; `cost_usd` None: unpriced).

        `failed`: the call was made and not answered (counted among `failed_calls` as well).
        `request`: the call's own key, stored with its usage: made again with the same key
        (`reconnecting` repeats a call whose commit's acknowledgement was lost with its
        connection), it adds nothing, so the call is counted once.
        `reservation`: the call's reservation (`reserve`), deleted in the same transaction, so
        no process ever sees the call both counted and held, or neither.
        """
        values = {
            "run_id": run_id,
            "purpose": purpose,
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "seconds": seconds,
            "cost_usd": cost_usd or 0.0,
            "unpriced": 1 if cost_usd is None else 0,
            "failed": int(failed),
        }
        with self.begin("record usage") as connection:
            if connection.execute(_COUNT_REQUEST, {"id": request, "run_id": run_id}).rowcount:
                connection.execute(_ADD_USAGE, values)  # else counted already: made again after its commit
            if reservation is not None:
                connection.execute(_DELETE_RESERVATION, {"id": reservation})

    def reserve(
        self,
        run_id: str,
        reservation: str,
        *,
        owner: str,
        hold: Callable[[Spending], tuple[int, float] | None],
    ) -> tuple[int, float] | None:
        """Hold the `(tokens, cost_usd)` `hold` answers for one model request of the run, if any.

        One transaction, one at a time for the run in every process (its row locked on Postgres,
        the writer's lock on SQLite): the reservations of processes whose lease lapsed are
        dropped, `hold` is given the run's usage and what is held for its requests in flight (one
        read, so a request counted meanwhile is seen once: counted or held), and what it answers
        is stored under `reservation` and `owner` (a process's `mp_processes` id) and returned;
        None stores nothing. What `hold` raises (a budget that cannot take the request) leaves
        nothing stored. Made again with the same `reservation` (`reconnecting` repeats a call whose
        commit's acknowledgement was lost with its connection), it answers with what is stored,
        as it did the first time, without asking `hold`.
        """
        postgres = self.engine.dialect.name == "postgresql"
        with self.begin("reserve a model request") as connection:
            # first a write: on SQLite it takes the writer's lock for the whole transaction
            connection.execute(_PURGE_RESERVATIONS[postgres], {"run_id": run_id})
            if postgres:
                connection.execute(_LOCK_RUN, {"run_id": run_id})
            stored = connection.execute(_RESERVED, {"id": reservation}).one_or_none()
            if stored is not None:  # made again after its commit's acknowledgement was lost
                return int(stored[0]), float(stored[1])
            held = hold(_spending(connection, run_id, postgres))
            if held is None:
                return None
            tokens, cost_usd = held
            connection.execute(
                _INSERT_RESERVATION[postgres],
                {"id": reservation, "run_id": run_id, "owner": owner, "tokens": tokens, "cost_usd": cost_usd},
            )
        return held

    def spending(self, run_id: str) -> Spending:
        """The run's usage so far and what its requests in flight hold, by every process (a read)."""
        with self.begin("read usage") as connection:
            return _spending(connection, run_id, self.engine.dialect.name == "postgresql")

    def unreserve(self, reservation: str) -> None:
        """Drop a reservation whose request was not answered (it failed or was cancelled)."""
        with self.begin("release a model request's reservation") as connection:
            connection.execute(_DELETE_RESERVATION, {"id": reservation})

    def usage_totals(self, run_id: str) -> tuple[int, int, float, int]:
        """`(model calls, tokens, US dollars, calls of unknown price)` the run has used so far.

        By every process working on it.
        """
        with self.begin("read usage") as connection:
            row = connection.execute(_USAGE_TOTALS, {"run_id": run_id}).one()
        return int(row[0]), int(row[1]), float(row[2]), int(row[3])

    def usage(self, run_id: str) -> dict[str, Any]:
        """The run's usage: its calls, tokens and cost in all, and `by_purpose`.

        `{"llm_calls", "input_tokens", "output_tokens", "cost_usd", "unpriced_calls", "failed_calls",
        "by_purpose"}`; `by_purpose` has the same fields per purpose (`step:<id>` is a step's
        agent). `failed_calls` are among the calls: requests made that got no answer (no tokens or
        cost counted for them).
        """
        with self.begin("read usage") as connection:
            rows = (
                connection.execute(
                    sa.select(usage_table)
                    .where(usage_table.c.run_id == run_id)
                    .order_by(usage_table.c.purpose)
                )
                .mappings()
                .all()
            )
        by_purpose = {
            row["purpose"]: {
                "calls": row["calls"],
                "input_tokens": row["input_tokens"],
                "output_tokens": row["output_tokens"],
                "seconds": round(row["seconds"], 3),
                "cost_usd": round(row["cost_usd"], 6),
                "unpriced_calls": row["unpriced_calls"],
                "failed_calls": row["failed_calls"],
            }
            for row in rows
        }
        return {
            "llm_calls": sum(entry["calls"] for entry in by_purpose.values()),
            "input_tokens": sum(entry["input_tokens"] for entry in by_purpose.values()),
            "output_tokens": sum(entry["output_tokens"] for entry in by_purpose.values()),
            "cost_usd": round(sum(row["cost_usd"] for row in rows), 6),
            "unpriced_calls": sum(entry["unpriced_calls"] for entry in by_purpose.values()),
            "failed_calls": sum(entry["failed_calls"] for entry in by_purpose.values()),
            "by_purpose": by_purpose,
        }


# Plain SQL, the same in SQLite and Postgres, compiled once (they were SQLAlchemy dialect
# constructs built per model request; see docs/benchmarks.md, engine, 2026-11-25).
_ADD_USAGE = sa.text(
    "INSERT INTO mp_usage (run_id, purpose, calls, input_tokens, output_tokens, seconds, cost_usd, "
    "unpriced_calls, failed_calls) VALUES (:run_id, :purpose, 1, :input_tokens, :output_tokens, :seconds, "
    ":cost_usd, :unpriced, :failed) ON CONFLICT (run_id, purpose) DO UPDATE SET calls = mp_usage.calls + 1, "
    "input_tokens = mp_usage.input_tokens + :input_tokens, "
    "output_tokens = mp_usage.output_tokens + :output_tokens, seconds = mp_usage.seconds + :seconds, "
    "cost_usd = mp_usage.cost_usd + :cost_usd, unpriced_calls = mp_usage.unpriced_calls + :unpriced, "
    "failed_calls = mp_usage.failed_calls + :failed"
)
_FORGET_REQUESTS = sa.text("DELETE FROM mp_usage_requests WHERE run_id = :run_id")
_COUNT_REQUEST = sa.text(
    "INSERT INTO mp_usage_requests (id, run_id) VALUES (:id, :run_id) ON CONFLICT (id) DO NOTHING"
)
_NOW = {
    True: "extract(epoch FROM clock_timestamp())",
    False: "((julianday('now') - 2440587.5) * 86400.0)",
}
"""The database's clock (`database_now`) inside a statement, for Postgres (True) and SQLite."""
_PURGE_RESERVATIONS = {
    postgres: sa.text(
        "DELETE FROM mp_reservations WHERE run_id = :run_id AND owner IN "
        f"(SELECT id FROM mp_processes WHERE stopped OR lease_until < {now})"
    )
    for postgres, now in _NOW.items()
}
_LOCK_RUN = sa.text("SELECT id FROM mp_runs WHERE id = :run_id FOR UPDATE")
_TAKE_WRITER_LOCK = sa.text("UPDATE mp_runs SET owner = owner WHERE id = :run_id")
"""A write that changes nothing: on SQLite it begins the transaction holding the writer's lock."""
_SPENDING = {
    postgres: sa.text(
        "SELECT u.calls, u.tokens, u.cost, r.calls, r.tokens, r.cost, u.unpriced FROM "
        "(SELECT COALESCE(SUM(calls), 0) AS calls, COALESCE(SUM(input_tokens + output_tokens), 0) AS tokens, "
        "COALESCE(SUM(cost_usd), 0) AS cost, COALESCE(SUM(unpriced_calls), 0) AS unpriced "
        "FROM mp_usage WHERE run_id = :run_id) AS u, "
        "(SELECT COUNT(*) AS calls, COALESCE(SUM(tokens), 0) AS tokens, COALESCE(SUM(cost_usd), 0) AS cost "
        "FROM mp_reservations WHERE run_id = :run_id AND owner NOT IN "
        f"(SELECT id FROM mp_processes WHERE stopped OR lease_until < {now})) AS r"
    )
    for postgres, now in _NOW.items()
}
"""A run's usage and its live reservations, in one statement (one snapshot: a request counted
meanwhile is seen counted or held, never neither)."""
_INSERT_RESERVATION = {
    postgres: sa.text(
        "INSERT INTO mp_reservations (id, run_id, owner, tokens, cost_usd, created_at) "
        f"VALUES (:id, :run_id, :owner, :tokens, :cost_usd, {now})"
    )
    for postgres, now in _NOW.items()
}
_STATUS_AND_OWNER = sa.select(runs_table.c.status, runs_table.c.owner).where(
    runs_table.c.id == sa.bindparam("run_id")
)
_DELETE_RESERVATION = sa.text("DELETE FROM mp_reservations WHERE id = :id")
_RESERVED = sa.text("SELECT tokens, cost_usd FROM mp_reservations WHERE id = :id")
_USAGE_TOTALS = sa.text(
    "SELECT COALESCE(SUM(calls), 0), COALESCE(SUM(input_tokens + output_tokens), 0), "
    "COALESCE(SUM(cost_usd), 0), COALESCE(SUM(unpriced_calls), 0) FROM mp_usage WHERE run_id = :run_id"
)


def _update_run(
    connection: Connection,
    run_id: str,
    unless_cancelled: bool,
    unless_finished: bool,
    values: dict[str, Any],
    owner: str | None = None,
) -> bool:
    """`RunStore.update_run` in a transaction of the caller's."""
    if values.get("plan") is not None:
        values["plan"] = json.dumps(values["plan"].to_json_dict())
    if values.get("agents") is not None:
        values["agents"] = json.dumps(briefs_json(values["agents"]))
    which = runs_table.c.id == run_id
    if unless_cancelled:
        which = sa.and_(which, runs_table.c.status != "cancelled")
    if unless_finished:
        which = sa.and_(which, runs_table.c.status.not_in(list(FINISHED_RUN_STATUSES)))
    if owner is not None:
        which = sa.and_(which, runs_table.c.owner == owner)
    update = runs_table.update().where(which).values(updated_at=utc_now(), **values)
    return connection.execute(update).rowcount > 0


def _changed_run(change: PlanChange) -> dict[str, Any]:
    """The run's columns a plan's change sets (for `_update_run`)."""
    values: dict[str, Any] = {"plan": change.plan, "agents": dict(change.agents)}
    if change.options is not None:
        values["options"] = json.dumps(change.options.to_json_dict())
    return values


def _revise_steps(connection: Connection, run_id: str, change: PlanChange) -> None:
    """Store a revised plan in the caller's transaction (`RunStore.record_revision`)."""
    _update_run(connection, run_id, False, False, _changed_run(change))
    last = connection.scalar(
        sa.select(sa.func.coalesce(sa.func.max(steps_table.c.position), -1)).where(
            steps_table.c.run_id == run_id
        )
    )
    if change.added:
        connection.execute(
            steps_table.insert(),
            [
                {
                    "run_id": run_id,
                    "step_id": step_id,
                    "position": int(last or 0) + 1 + index,
                    "status": "pending",
                    "attempts": 0,
                }
                for index, step_id in enumerate(change.added)
            ],
        )
    for step_id, status in change.retired.items():
        connection.execute(
            steps_table.update()
            .where(steps_table.c.run_id == run_id, steps_table.c.step_id == step_id)
            .values(status=status)
        )
    hand_on(connection, run_id, list(change.retired), list(change.added))


def _announces(connection: Connection, run_id: str, kind: EventKind, request_id: str) -> bool:
    """Whether the run has an event `kind` announcing the request `request_id` (its data's `request`)."""
    stored = connection.scalars(
        sa.select(events_table.c.data).where(events_table.c.run_id == run_id, events_table.c.kind == kind)
    )
    return any(json.loads(data).get("request") == request_id for data in stored)


def _recorded(connection: Connection, run_id: str, kind: EventKind, step_id: str, number: object) -> bool:
    """Whether the run has, since its latest retry, an event `kind` of step `step_id` whose `n` is `number`.

    `number` None: any such event. A retry makes its own (a step failed again, replanned again).
    """
    retried = sa.select(sa.func.coalesce(sa.func.max(events_table.c.seq), 0)).where(
        events_table.c.run_id == run_id, events_table.c.kind == "run_retried"
    )
    stored = connection.scalars(
        sa.select(events_table.c.data).where(
            events_table.c.run_id == run_id,
            events_table.c.kind == kind,
            events_table.c.step == step_id,
            events_table.c.seq > retried.scalar_subquery(),
        )
    )
    return any(number is None or json.loads(data).get("n") == number for data in stored)


def _spending(connection: Connection, run_id: str, postgres: bool) -> Spending:
    row = connection.execute(_SPENDING[postgres], {"run_id": run_id}).one()
    return Spending(
        calls=int(row[0]),
        tokens=int(row[1]),
        cost_usd=float(row[2]),
        held_calls=int(row[3]),
        held_tokens=int(row[4]),
        held_cost_usd=float(row[5]),
        unpriced_calls=int(row[6]),
    )


def _insert_event(
    connection: Connection, run_id: str, at: str, kind: EventKind, step: str | None, payload: str
) -> int:
    """Insert an event with the run's next sequence number (`IntegrityError` if another took it)."""
    seq = 1 + (
        connection.scalar(
            sa.select(sa.func.coalesce(sa.func.max(events_table.c.seq), 0)).where(
                events_table.c.run_id == run_id
            )
        )
        or 0
    )
    connection.execute(
        events_table.insert().values(run_id=run_id, seq=seq, at=at, kind=kind, step=step, data=payload)
    )
    return int(seq)


def _run_record(row: Any) -> RunRecord:
    try:
        plan = Plan.model_validate(json.loads(row["plan"])) if row["plan"] else None
        agents = briefs(json.loads(row["agents"]), stored=True) if row["agents"] else {}
    except (ValueError, ValidationError) as exc:  # written by another version, or by hand
        raise RunError(f"run {row['id']}: its stored plan or agents cannot be read: {exc}") from None
    return RunRecord(
        id=row["id"],
        task=row["task"],
        status=row["status"],
        model=row["model"],
        workspace=row["workspace"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        options=RunOptions.from_json_dict(json.loads(row["options"])),
        plan=plan,
        agents=agents,
        output=row["output"],
        error=row["error"],
        for_workers=row["executor"] == "workers",
        retries=row["retries"],
    )
