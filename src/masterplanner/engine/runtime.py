"""Starting and stopping DBOS, the durable-execution library, for one database.

DBOS recovers, at launch, every pending workflow recorded under its executor id. Several
masterplanner processes share one database (a `run` in one terminal, `runs list` in another),
so each process launches DBOS under an executor id of its own: DBOS's launch recovery then
finds nothing, and a run is resumed only by the process holding its lease (see `store.py`).
Read-only commands never launch DBOS at all.

The workflows take only ids; the settings and run store they work with are those of the engine
that launched DBOS in this process (`launched_host`).

Steps shared between workers go through DBOS queues, one per provider (`steps-openai`,
`steps-local`, …), so a provider's limits (`provider_limits`: steps at once and per minute)
hold across every worker. Only workers dequeue them: every other process launches listening to
none (DBOS's own internal queue is listened to by all). Each process that
launches DBOS renews a lease of its own (`processes.py`), so the coordinator of a run can tell a
step held by a dead process from one held by a live one, and hand the first back to its queue.
A coordinator that is not a worker takes such steps itself, through a queue of its own that no
other process dequeues (`own_queue`), as it does a step left queued where no live process will
take it (`unserved_queue`, `take_queued_workflow`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import sqlite3
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig, Queue, WorkflowStatus
from dbos import _sys_db as dbos_system_database
from dbos._error import DBOSWorkflowConflictIDError

from .._version import __version__
from ..errors import RunError
from ..logs import REDACTING, WORKFLOW_OUTCOMES
from ..settings import PROVIDERS, Settings, provider_of
from .processes import Heartbeat, ProcessKind, step_queue_name
from .records import own_workflow_id
from .records import workflow_id as step_workflow_id
from .store import RunStore, engine_url, held_here

__all__ = [
    "STATUS_POLL_S",
    "dbos_launched",
    "executor_id",
    "keep_lease",
    "launch_dbos",
    "launched_host",
    "launched_on",
    "next_status",
    "note_loop",
    "own_queue",
    "own_queue_name",
    "own_workflow",
    "process_lost",
    "recover_workflow",
    "shutdown_dbos",
    "step_queue",
    "step_queue_name",
    "stop_taking_steps",
    "take_queued_workflow",
    "unserved_queue",
]

_launched_url: str | None = None
_loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
"""Event loops that drove runs while DBOS ran (`note_loop`)."""
_host: tuple[Settings, RunStore] | None = None
_heartbeat: Heartbeat | None = None
_executor: str | None = None
_worker = False
"""Whether this process launched DBOS as a worker."""
_queues: dict[str, Queue] = {}
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


def launch_dbos(
    settings: Settings,
    store: RunStore,
    *,
    executor_id: str,
    debug: bool = False,
    kind: ProcessKind = "process",
    listen: list[str] | None = None,
) -> list[str]:
    """Launch DBOS on the settings' database in this process (once; relaunches if the URL changes).

    `settings` and `store` become what workflows started in this process work with. A worker
    (`kind`) dequeues the step queues of the providers in `listen` (all by default); any other
    process dequeues none. Returns what a worker changed for the workers already running: a
    sentence per provider whose shared limits its settings changed (`_limits_change`).
    """
    with _lock:
        return _launch(settings, store, executor_id=executor_id, debug=debug, kind=kind, listen=listen)


def _launch(
    settings: Settings,
    store: RunStore,
    *,
    executor_id: str,
    debug: bool,
    kind: ProcessKind,
    listen: list[str] | None,
) -> list[str]:
    global _launched_url, _host, _heartbeat, _executor, _worker
    database_url = settings.database_url
    if _launched_url == database_url:
        _host = (settings, store)
        return []
    if _launched_url is not None:
        _refuse_switch_while_busy(database_url)
        shutdown_dbos()
    _host = (settings, store)
    level = "DEBUG" if debug else "ERROR"
    config: DBOSConfig = {
        "name": "masterplanner",
        "system_database_url": engine_url(database_url),
        "executor_id": executor_id,
        "application_version": f"masterplanner-{__version__}",
        "log_level": level,
        "console_log_level": level,
        "notification_listener_polling_interval_sec": 0.05,
        # DBOS's own connections, beside the run store's and the registry's (8 each at most)
        "sys_db_pool_size": 8,
    }
    if engine_url(database_url).startswith("sqlite"):
        config["db_engine_kwargs"] = {"connect_args": {"factory": _WalConnection}}
    logging.getLogger("dbos").addFilter(REDACTING)  # it logs the database URL it is given
    if not debug:
        logging.getLogger("dbos").setLevel(logging.ERROR)
        logging.getLogger("dbos").addFilter(WORKFLOW_OUTCOMES)
    providers = list(PROVIDERS) if listen is None else listen
    queues = [step_queue_name(provider) for provider in providers] if kind == "worker" else []
    with _limits_lock:
        _own_limits.clear()
        _read_queues.clear()
        if kind == "worker":
            _own_limits.update({step_queue_name(each): _own_limit(settings, each) for each in providers})
    DBOS(config=config)
    DBOS.listen_queues(queues)
    DBOS.launch()
    _launched_url = database_url
    _executor = executor_id
    _worker = kind == "worker"
    changes = _register_worker_queues(settings, store, providers) if kind == "worker" else []
    store.processes.register(
        executor_id,
        kind,
        lease_s=settings.run_lease_s,
        queues=queues,
        concurrency=settings.worker_concurrency if kind == "worker" else None,
    )
    _heartbeat = Heartbeat(
        store.processes, executor_id, lease_s=settings.run_lease_s, worker=kind == "worker"
    )
    _heartbeat.start()
    return changes


def _refuse_switch_while_busy(database_url: str) -> None:
    """`RunError` when runs of another database are executed in this process now.

    DBOS runs one database's workflows per process: launching it on another database stops
    the first one's, so it is switched only when nothing is executed on the first.
    """
    from ..database import shown_url
    from .resources import held_runs

    busy = sorted(run_id for run_id, url in held_runs().items() if url != database_url)
    if busy and _launched_url is not None:
        raise RunError(
            f"this process is executing run {busy[0]} on the database {shown_url(_launched_url)}, and "
            f"executes one database's runs at a time: execute runs of {shown_url(database_url)} "
            "in another process, or once that run has ended"
        )


def note_loop() -> None:
    """The running event loop drives runs: it gets a thread pool of its own again when DBOS stops.

    DBOS makes itself the default executor of every event loop it is awaited in (what
    `asyncio.to_thread` uses) and shuts that executor down when it stops, so a loop that goes
    on after `shutdown_dbos` (a program that closes one service and opens another) could not
    run anything on a thread any more.
    """
    _loops.add(asyncio.get_running_loop())


def _renew_default_executors() -> None:
    for loop in list(_loops):
        if not loop.is_closed():
            loop.set_default_executor(ThreadPoolExecutor(thread_name_prefix="asyncio"))
    _loops.clear()


def launched_on(database_url: str) -> bool:
    """Whether DBOS runs in this process on that database."""
    return _launched_url is not None and _launched_url == database_url


def _own_limit(settings: Settings, provider: str) -> tuple[int, float]:
    """This worker's limits on a provider's step queue: steps at once here, and the polling interval.

    A worker never runs more of a provider's steps than all workers together may.
    """
    limit = settings.provider_limits.get(provider)
    overall = None if limit is None else limit.concurrency
    at_once = settings.worker_concurrency if overall is None else min(settings.worker_concurrency, overall)
    return at_once, settings.queue_poll_s


_own_limits: dict[str, tuple[int, float]] = {}
"""A worker's own limits per step queue (`_own_limit`), applied to every read of the queue's row."""
_read_queues: weakref.WeakSet[Queue] = weakref.WeakSet()
"""The queues read with this worker's own limits and still held (by DBOS's dequeuing threads)."""
_limits_lock = threading.Lock()


def _queue_with_own_limits(*args: Any, **kwargs: Any) -> Queue:
    """DBOS's reading of a queue's database row, with this worker's own per-worker limits.

    DBOS 3.4 keeps a queue's configuration, per-worker concurrency and polling interval included,
    in one database row that every process's dequeuing thread reads again before each poll; it
    offers no per-process value. Written there, `worker --concurrency` would be the last started
    worker's for all of them. So the row holds what is shared (the provider's global concurrency
    and rate), and each worker applies its own values to the queue it reads, before DBOS's
    dequeuing checks them (in memory, against this process's running count). Pinned by the
    `dbos` version range in pyproject.toml; `test_each_worker_keeps_its_own_concurrency` proves it.
    """
    queue: Queue = _read_queue_row(*args, **kwargs)
    with _limits_lock:
        own = _own_limits.get(queue.name)
        if own is not None:
            queue._worker_concurrency, queue._polling_interval_sec = own
            _read_queues.add(queue)
    return queue


def stop_taking_steps() -> None:
    """A worker that stops takes no more steps from its step queues, at once; those running go on.

    Its own concurrency on each becomes 0, which DBOS's dequeuing takes as no room: on the
    queues read from now on, and on those its dequeuing threads read before (they check it
    again before each claim, which is one transaction). Before, they went on dequeuing until
    DBOS stopped, after the worker's wait for its ended runs: a step started meanwhile was cut
    short by the shutdown and replayed elsewhere, its model requests made twice. DBOS's internal
    queue and this process's own one are dequeued until DBOS stops (a run's end resumed here, or
    handed back as its coordination is cancelled, is taken from DBOS's). Pinned by the `dbos`
    version range in pyproject.toml.
    """
    with _limits_lock:
        for name, (_at_once, polling_s) in _own_limits.items():
            _own_limits[name] = (0, polling_s)
        for queue in list(_read_queues):
            queue._worker_concurrency = 0


_read_queue_row = dbos_system_database.queue_from_db_row
dbos_system_database.queue_from_db_row = _queue_with_own_limits


def _limits_text(at_once: int | None, per_minute: int | None) -> str:
    return (
        f"{'no limit' if at_once is None else at_once} at once and "
        f"{'no limit' if per_minute is None else per_minute} a minute"
    )


def _limits_change(settings: Settings, provider: str) -> str | None:
    """What this worker's settings change of the provider's shared limits, which running workers hold.

    The queue's row holds one global concurrency and rate for all workers, and the last started
    worker writes its own (`_register_queue`); a worker started with other settings than those
    running changes theirs too, so it says so (None when nothing changes). Asked only when a
    worker that is running serves the queue (`Processes.running_workers`): before, a worker
    killed a moment ago (its lease not lapsed yet) counted, so one restarted at once said it
    changed the limits of "the workers already running" when none was.
    """
    queue = DBOS.retrieve_queue(step_queue_name(provider))
    if queue is None:
        return None
    limiter = queue.limiter
    before = (queue.global_concurrency, None if limiter is None else int(limiter["limit"]))
    limit = settings.provider_limits.get(provider)
    after = (None, None) if limit is None else (limit.concurrency, limit.per_minute)
    if before == after:
        return None
    return (
        f"provider_limits.{provider}: the workers already running held {_limits_text(*before)}; "
        f"this worker's settings say {_limits_text(*after)}, which now hold for all of them"
    )


def _register_worker_queues(settings: Settings, store: RunStore, providers: list[str]) -> list[str]:
    """Write a starting worker's limits into its providers' queue rows; what that changed for others."""
    served = {queue for each in store.processes.running_workers() for queue in each.queues}
    changes = []
    for provider in providers:
        change = _limits_change(settings, provider) if step_queue_name(provider) in served else None
        changes += [change] if change else []
        _register_queue(settings, provider, worker=True)
    return changes


def _register_queue(settings: Settings, provider: str, *, worker: bool) -> Queue:
    """Register (or update) the provider's step queue with the settings' shared limits.

    A worker writes its settings' global concurrency and rate for the provider (the last started
    worker's hold for all; they are meant to be the same). A process that only enqueues keeps
    what the workers set. Per-worker values are not stored here (`_queue_with_own_limits`).
    """
    name = step_queue_name(provider)
    limit = settings.provider_limits.get(provider)
    per_minute = None if limit is None else limit.per_minute
    overall = None if limit is None else limit.concurrency
    queue = DBOS.register_queue(
        name,
        global_concurrency=overall,
        limiter=None if per_minute is None else {"limit": per_minute, "period": 60.0},
        polling_interval_sec=settings.queue_poll_s,
        on_conflict="always_update" if worker else "never_update",
    )
    _queues[name] = queue
    return queue


def step_queue(model: str) -> Queue:
    """The step queue of this model spec's provider (registered on first use in this process)."""
    name = step_queue_name(model)
    with _lock:
        queue = _queues.get(name)
        if queue is None:
            settings, _store = launched_host()
            queue = _register_queue(settings, provider_of(model), worker=False)
        return queue


_OWN_QUEUE_PREFIX = "process-"
"""The queue of the process `process-<executor id>` (`own_queue`)."""


def own_queue() -> str:
    """The name of this process's own queue, which only this process dequeues (made on first use).

    A coordinator that is not a worker takes a step over (one a dead process left, or one left
    queued where no live process will take it) by moving it here. DBOS's internal queue, which
    it used before, is dequeued by every process launched on the database (a `serve`, another
    terminal's `run`): one that took the step found the run's lease not held there at its first
    tool call (`keep_lease`), and left the step pending under a live process that never finished
    it. DBOS keeps such a queue in this process's memory only (no row in the database, as its
    own internal queues), and its queue thread starts dequeuing it within a second. Pinned by the
    `dbos` version range in pyproject.toml.
    """
    from dbos._dbos import _get_dbos_instance

    settings, _store = launched_host()
    name = own_queue_name()
    registry = _get_dbos_instance()._registry
    with _lock:
        registry._register_internal_queue(name, polling_interval_sec=settings.queue_poll_s)
    return name


def own_queue_name() -> str:
    """The name of this process's own queue (`own_queue`), whether made yet or not."""
    return f"{_OWN_QUEUE_PREFIX}{_executor}"


def unserved_queue(queue_name: str | None, store: RunStore) -> bool:
    """Whether a workflow ENQUEUED on that queue waits where no live process will take it.

    A provider's step queue is served while a running worker lists it
    (`Processes.running_workers`); a process's own queue while that process is alive. This
    process's own queues, DBOS's internal queue (every process dequeues it), no queue and any
    other are served: what is waited for there is never taken over.
    """
    if queue_name is None or queue_name in _listened():
        return False
    if queue_name.startswith(_OWN_QUEUE_PREFIX):
        return not store.processes.alive(queue_name.removeprefix(_OWN_QUEUE_PREFIX))
    if queue_name.startswith("steps-"):
        return not any(queue_name in worker.queues for worker in store.processes.running_workers())
    return False


def _listened() -> set[str]:
    """The queues this process dequeues, besides DBOS's internal one."""
    from dbos._utils import INTERNAL_QUEUE_NAME

    own = {own_queue_name(), INTERNAL_QUEUE_NAME}
    return own | set(_own_limits) if _worker else own


def take_queued_workflow(workflow_id: str, from_queue: str, to_queue: str) -> bool:
    """Move a workflow still ENQUEUED on `from_queue` to `to_queue`; whether it was moved.

    Conditional on the row still being ENQUEUED on `from_queue`: a process dequeuing it at the
    same moment marks it PENDING first (and this moves nothing), or finds it gone from its queue,
    so the workflow is started exactly once either way.
    """
    return _update_workflow(
        workflow_id, {"status": "ENQUEUED", "queue_name": from_queue}, queue_name=to_queue
    )


def _update_workflow(workflow_id: str, found: dict[str, str], **values: Any) -> bool:
    """Update DBOS's row of the workflow if its columns still hold `found`; whether it was.

    One conditional statement of DBOS's system database (pinned by the `dbos` version range in
    pyproject.toml), its `updated_at` set as DBOS sets it.
    """
    from dbos._dbos import _get_dbos_instance

    sys_db = _get_dbos_instance()._sys_db
    table = sys_db.tables.workflow_status
    held = [table.c[column] == value for column, value in found.items()]
    with sys_db.engine.begin() as connection:
        moved = connection.execute(
            sa.update(table)
            .where(table.c.workflow_uuid == workflow_id, *held)
            .values(updated_at=sys_db._now_ms_sql(), **values)
        )
    return bool(moved.rowcount)


def recover_workflow(workflow_id: str, executor_id: str, *, to_queue: str | None = None) -> bool:
    """Hand a workflow left PENDING by a dead process back to its queue; whether it was.

    DBOS's recovery re-enqueue (its queue kept, the internal one if it had none), conditional on
    the workflow still being PENDING under that executor: a live worker dequeues it exactly once
    and replays it from its last checkpoint, and a second call for the same dead process does
    nothing. DBOS exposes this only for a whole executor at launch, so this uses its system
    database's call for one workflow (pinned by the `dbos` version range in pyproject.toml).
    `to_queue`: to that queue, whatever the workflow's own was (its same update, made here).
    """
    from dbos._dbos import _get_dbos_instance
    from dbos._utils import INTERNAL_QUEUE_NAME

    dbos = _get_dbos_instance()
    if to_queue is None:
        return bool(dbos._sys_db.reenqueue_for_recovery(workflow_id, [executor_id], INTERNAL_QUEUE_NAME))
    # the same update, to the given queue: a process that is not a worker (`runs resume`) takes
    # the step itself (`own_queue`), instead of leaving it on a provider's queue that no live
    # process may serve (resume waited for ever for a worker)
    return _update_workflow(
        workflow_id,
        {"status": "PENDING", "executor_id": executor_id},
        status="ENQUEUED",
        owner_xid=None,
        started_at_epoch_ms=None,
        queue_name=to_queue,
    )


STATUS_POLL_S = 0.1
"""How often the statuses of the workflows this process follows are read (all in one query)."""


class _StatusPoll:
    """The statuses of every workflow followed in one event loop, read in one query per interval.

    A coordinator follows each step it queued until a worker finishes it. Each following its own
    workflow with its own query every 0.1 s made the queries grow with the steps in flight: one
    worker coordinating 200 runs spent itself polling (0.4 steps/s, bench/scale.py). Here every
    follower waits for the next read, and one read answers them all.
    """

    def __init__(self) -> None:
        self.waiting: dict[str, list[asyncio.Future[WorkflowStatus | None]]] = {}
        self.task: asyncio.Task[None] | None = None

    async def next(self, workflow_id: str) -> WorkflowStatus | None:
        future: asyncio.Future[WorkflowStatus | None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(workflow_id, []).append(future)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._poll())
        return await future

    async def _poll(self) -> None:
        while self.waiting:
            await asyncio.sleep(STATUS_POLL_S)
            waiting, self.waiting = self.waiting, {}
            try:
                found = await DBOS.list_workflows_async(
                    workflow_ids=list(waiting), load_input=False, load_output=False
                )
            except Exception as error:  # each follower gets it, as its own query would have raised it
                for futures in waiting.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(error)
                continue
            statuses = {status.workflow_id: status for status in found}
            for workflow_id, futures in waiting.items():
                for future in futures:
                    if not future.done():
                        future.set_result(statuses.get(workflow_id))


_status_polls: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _StatusPoll] = weakref.WeakKeyDictionary()


async def next_status(workflow_id: str) -> WorkflowStatus | None:
    """The workflow's status at the process's next read (at most `STATUS_POLL_S` from now)."""
    loop = asyncio.get_running_loop()
    poll = _status_polls.get(loop)
    if poll is None:
        poll = _status_polls[loop] = _StatusPoll()
    return await poll.next(workflow_id)


async def own_workflow(run_id: str, name: str, retries: int, function: str) -> str:
    """The id of the run's own workflow `name`, whose DBOS function is `function` (`masterplanner.end`).

    `records.own_workflow_id`, unless an earlier version recorded that workflow under its old
    id, the form of a step's (`<run>.end`): a run started before and resumed now follows it
    (a crash cut it short) or returns what it recorded, never runs it afresh. A workflow under
    the old id whose function is another (a step named `end`) is not it.
    """
    old = step_workflow_id(run_id, name, retries)
    status = await DBOS.get_workflow_status_async(old)
    return old if status is not None and status.name == function else own_workflow_id(run_id, name, retries)


def executor_id() -> str | None:
    """This process's DBOS executor id (its row in `mp_processes`), if DBOS runs here."""
    return _executor


def executing_here(workflow_id: str) -> bool:
    """Whether DBOS executes that workflow in this process now (one it dequeued here).

    A workflow called inline (an execution's end) is not among them: `runner` keeps those.
    DBOS's own count of what it runs here (pinned by the `dbos` version range in pyproject.toml).
    """
    from dbos._dbos import _get_dbos_instance

    return workflow_id in _get_dbos_instance()._active_workflows_set.activeList()


def keep_lease(run_id: str) -> None:
    """Before a tool call's side effect: make sure no other process may be making this step's calls.

    In a worker: renew the worker's lease, or stop this execution. A worker whose lease lapsed
    (suspended or starved past it, its heartbeat thread included) may already have had its
    steps handed to another worker (`recover_workflow`), which replays them and makes their
    calls: a call made here as well would be made twice. A renewal succeeds only while the
    lease has not lapsed, and after it no coordinator hands this worker's steps over for another
    `run_lease_s`. When it has lapsed, the heartbeat is told (the worker stops and hands over).

    In any other process (`run`, `serve`, `runs resume`), whose steps run inline under the run's
    lease: the run's lease must still be held in this process (by any of its engines). A process
    suspended past it (a laptop that slept) carries on when nobody took the run meanwhile, and
    stops when a worker took it over as abandoned (the run's guard would notice within
    `_GUARD_INTERVAL_S`; the fence closes that window for the calls).

    Stopping raises DBOS's own `DBOSWorkflowConflictIDError` (a `BaseException`, so no step
    records it as its outcome), on which DBOS waits for the outcome recorded by the execution
    that owns the workflow instead of writing one.
    """
    if _heartbeat is None:
        return
    if _worker:
        if not _heartbeat.renew():
            raise DBOSWorkflowConflictIDError(DBOS.workflow_id or "")
        return
    if _host is not None:
        lease = _host[1].lease(run_id)
        if lease is None or not held_here(lease.owner):
            raise DBOSWorkflowConflictIDError(DBOS.workflow_id or "")


def process_lost() -> bool:
    """Whether this process failed to renew its lease in time (others may be taking its work)."""
    return _heartbeat is not None and _heartbeat.lost.is_set()


def launched_host() -> tuple[Settings, RunStore]:
    """The settings and run store of the engine that launched DBOS in this process."""
    if _host is None or _launched_url is None:
        raise RunError("no engine runs workflows in this process (DBOS is not launched)")
    return _host


def dbos_launched() -> bool:
    """Whether DBOS runs in this process."""
    return _launched_url is not None


def shutdown_dbos(*, grace_s: float = 0) -> None:
    """Stop DBOS in this process; workflows not finished stay pending in the database.

    With `grace_s`, steps already running get that long to finish (no new ones are taken),
    rounded up to whole seconds: DBOS takes whole seconds, and looks whether any is still
    running once a second (`int` made a `--grace 0.5` no grace at all).
    The process's lease is given up, so others may take what it left at once.
    """
    global _launched_url, _host, _heartbeat, _executor, _worker
    with _lock:
        if _launched_url is None:
            return
        DBOS.destroy(workflow_completion_timeout_sec=math.ceil(grace_s))
        _renew_default_executors()
        if _heartbeat is not None:
            _heartbeat.stop()
        _launched_url = None
        _host = None
        _heartbeat = None
        _executor = None
        _worker = False
        _queues.clear()
        with _limits_lock:
            _own_limits.clear()
            _read_queues.clear()
