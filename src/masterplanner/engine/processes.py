"""Which processes executing workflows are alive, told by a lease each renews in database time.

Every process that launches DBOS (a `run`, a web server executing runs, a worker) has a row in
`mp_processes` under its DBOS executor id, renewed every `run_lease_s`/5 for another
`run_lease_s`, in the database's clock like a run's lease. A process whose lease lapsed died (or
was suspended past it); one that stopped cleanly says so (`stopped`) and is dead at once.

Why: DBOS re-runs, at launch, only the pending workflows of its own executor id, and every
process launches under an id of its own, so the steps a dead worker had taken off a queue stay
PENDING under an id nobody launches again. The coordinator of their run (the holder of the
run's lease) asks `alive` about a step it waits for that is PENDING, and hands a dead process's
step back to its queue (`runtime.recover_workflow`), where a live worker takes it and replays it
from its last checkpoint. Nothing is recovered for a run nobody coordinates: a run stopped with
Ctrl-C waits for `runs resume`, as before.

A pid means something only in its pid namespace, so each row says which one (`pid_namespace`,
`pid_namespace_of_this_process`): containers sharing a host name (`--network host`, or given
the same one) each have their own, and a pid of another's need not exist in ours.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..database import database_now, reconnecting_methods
from ..errors import RunError
from ..settings import provider_of

if TYPE_CHECKING:
    from .store import RunStore

__all__ = [
    "Heartbeat",
    "ProcessKind",
    "ProcessRecord",
    "Processes",
    "add_process_pid_namespace",
    "create_process_table",
    "pid_namespace_of_this_process",
    "step_queue_name",
]

ProcessKind = Literal["worker", "process"]
"""A worker takes steps and runs from queues; any other process executes the runs it was given."""


def step_queue_name(model: str) -> str:
    """The queue that steps of a run with this model spec go through (a worker lists it in `queues`)."""
    return f"steps-{provider_of(model)}"


metadata = sa.MetaData()

processes_table = sa.Table(
    "mp_processes",
    metadata,
    sa.Column("id", sa.String(200), primary_key=True),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("host", sa.String(200), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("pid_namespace", sa.String(200)),
    sa.Column("queues", sa.Text, nullable=False),
    sa.Column("concurrency", sa.Integer),
    sa.Column("started_at", sa.Float, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    sa.Column("lease_until", sa.Float, nullable=False),
    sa.Column("stopped", sa.Boolean, nullable=False, default=False),
)


def create_process_table(connection: Connection) -> None:
    """Migration `0005_processes`: the processes executing workflows, and their leases."""
    processes_table.create(connection, checkfirst=True)


def add_process_pid_namespace(connection: Connection) -> None:
    """Migration `0010_process_pid_namespace`: the pid namespace a process's pid belongs to.

    Rows written before it have none (NULL); `running_workers` judges them as it did then.
    """
    columns = {column["name"] for column in sa.inspect(connection).get_columns("mp_processes")}
    if "pid_namespace" not in columns:
        connection.execute(sa.text("ALTER TABLE mp_processes ADD COLUMN pid_namespace VARCHAR(200)"))


def pid_namespace_of_this_process() -> str:
    """Which pids this process's pid is among: the machine's boot and its pid namespace.

    On Linux, `BOOT_ID/pid:[DEVICE:INODE]`: the kernel's id of this boot and the namespace's
    inode (two processes share a pid namespace exactly when both are equal; inodes are reused
    across boots and machines, hence the boot id). Where either cannot be read (not Linux, or
    /proc hidden) it is `unknown:PLATFORM`, the same for every such process of the platform:
    those of one host name are then told apart by the host name alone, as before namespaces
    were recorded (right where a host has one pid space, as without Linux's namespaces).
    """
    try:
        boot_id = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.stat("/proc/self/ns/pid")
    except OSError:
        return f"unknown:{sys.platform}"
    return f"{boot_id}/pid:[{namespace.st_dev}:{namespace.st_ino}]"


@dataclass(frozen=True)
class ProcessRecord:
    """One process as `masterplanner workers` lists it."""

    id: str
    kind: ProcessKind
    host: str
    pid: int
    pid_namespace: str | None
    """The pid namespace `pid` belongs to (`pid_namespace_of_this_process`); None for a row of
    before it was recorded (migration 0010)."""
    queues: list[str]
    concurrency: int | None
    age_s: float
    """Seconds since it last renewed its lease."""
    alive: bool
    stopped: bool

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form `workers --json` prints."""
        return {
            "id": self.id,
            "kind": self.kind,
            "host": self.host,
            "pid": self.pid,
            "pid_namespace": self.pid_namespace,
            "queues": self.queues,
            "concurrency": self.concurrency,
            "heard_from_s": round(self.age_s, 1),
            "alive": self.alive,
            "stopped": self.stopped,
        }


@reconnecting_methods
class Processes:
    """The `mp_processes` rows of the run store's database."""

    def __init__(self, store: RunStore) -> None:
        self._store = store

    def register(
        self,
        process_id: str,
        kind: ProcessKind,
        *,
        lease_s: float,
        queues: list[str] | None = None,
        concurrency: int | None = None,
    ) -> None:
        """Record this process as alive for `lease_s` (again, if it registered before)."""
        with self._store.begin("register a process") as connection:
            now = database_now(connection)
            values = {
                "kind": kind,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "pid_namespace": pid_namespace_of_this_process(),
                "queues": json.dumps(queues or []),
                "concurrency": concurrency,
                "heartbeat_at": now,
                "lease_until": now + lease_s,
                "stopped": False,
            }
            updated = connection.execute(
                processes_table.update().where(processes_table.c.id == process_id).values(**values)
            )
            if updated.rowcount == 0:
                connection.execute(processes_table.insert().values(id=process_id, started_at=now, **values))

    def renew(self, process_id: str, *, lease_s: float, lapsed_too: bool = False) -> bool:
        """Renew the lease for another `lease_s`; False once it lapsed (others may be taking its work).

        `lapsed_too`: a lapsed one is renewed as well (not a stopped one).
        """
        with self._store.begin("renew a process's lease") as connection:
            now = database_now(connection)
            held = [processes_table.c.id == process_id, processes_table.c.stopped.is_(False)]
            if not lapsed_too:
                held.append(processes_table.c.lease_until >= now)
            updated = connection.execute(
                processes_table.update().where(*held).values(heartbeat_at=now, lease_until=now + lease_s)
            )
            return updated.rowcount == 1

    def stop(self, process_id: str) -> None:
        """This process stops: its unfinished workflows may be taken by others at once."""
        self._stop_once(process_id)

    def _stop_once(self, process_id: str) -> None:
        """`stop` without waiting for a database that is away (not `reconnecting`)."""
        with self._store.begin("record a process's stop") as connection:
            connection.execute(
                processes_table.update()
                .where(processes_table.c.id == process_id)
                .values(stopped=True, lease_until=database_now(connection))
            )

    def alive(self, process_id: str) -> bool:
        """Whether the process holds a lease that has not lapsed (an unknown one is not alive)."""
        with self._store.begin("read a process's lease") as connection:
            now = database_now(connection)
            row = connection.execute(
                sa.select(processes_table.c.lease_until, processes_table.c.stopped).where(
                    processes_table.c.id == process_id
                )
            ).first()
        return row is not None and not row[1] and float(row[0]) >= now

    def listed(self, *, include_dead: bool = False) -> list[ProcessRecord]:
        """The processes, workers first, newest first; the dead ones only with `include_dead`."""
        with self._store.begin("list processes") as connection:
            now = database_now(connection)
            rows = connection.execute(
                sa.select(processes_table).order_by(
                    processes_table.c.kind.desc(), processes_table.c.started_at.desc()
                )
            ).mappings()
            records = [_record(row, now) for row in rows]
        return [record for record in records if include_dead or record.alive]

    def running_workers(self) -> list[ProcessRecord]:
        """The workers running now, as far as can be told; stricter than a live lease.

        A lease lasts `run_lease_s` after its last renewal, so a worker killed a moment ago still
        holds one: a worker restarted at once (under systemd, say) counted the one it replaces,
        or itself in an earlier life, as running beside it. Left out are, besides the dead and
        stopped: a worker not heard from for more than half its lease (renewed every fifth of
        it: two renewals and more missed), and on this host, in this pid namespace, one of this
        process's pid (an earlier life: this one has not registered yet) or of a pid no process
        has (any more). A worker of another pid namespace under the same host name (a container
        beside this one) is not judged by its pid, which means nothing here; nor is one on a
        host of another name. A row written before the namespace was recorded (NULL, by a
        version before `0010_process_pid_namespace`) is judged by its host name alone, as that
        version did. Not for taking work over, which waits for the lease to lapse (`alive`): a
        worker only suspended would resume it.
        """
        with self._store.begin("list running workers") as connection:
            now = database_now(connection)
            rows = connection.execute(
                sa.select(processes_table).where(
                    processes_table.c.kind == "worker",
                    processes_table.c.stopped.is_(False),
                    processes_table.c.lease_until >= now,
                )
            ).mappings()
            here = (socket.gethostname(), pid_namespace_of_this_process())
            running = []
            for row in rows:
                heard, until = float(row["heartbeat_at"]), float(row["lease_until"])
                if now - heard > (until - heard) / 2:
                    continue  # renewals missed
                if _among_our_pids(row, *here) and not _another_live_process(int(row["pid"])):
                    continue
                running.append(_record(row, now))
        return running


def _record(row: sa.RowMapping, now: float) -> ProcessRecord:
    """A process's row as a record, its lease judged at `now` (the database's time)."""
    return ProcessRecord(
        id=row["id"],
        kind=row["kind"],
        host=row["host"],
        pid=int(row["pid"]),
        pid_namespace=row["pid_namespace"],
        queues=list(json.loads(row["queues"])),
        concurrency=row["concurrency"],
        age_s=max(0.0, now - float(row["heartbeat_at"])),
        alive=not row["stopped"] and float(row["lease_until"]) >= now,
        stopped=bool(row["stopped"]),
    )


def _among_our_pids(row: sa.RowMapping, host: str, pid_namespace: str) -> bool:
    """Whether the row's pid is one of this process's pid namespace (NULL: of its host name)."""
    return row["host"] == host and row["pid_namespace"] in (None, pid_namespace)


def _another_live_process(pid: int) -> bool:
    """Whether a process of this host other than this one has that pid, and has not ended (a zombie)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    if not Path("/proc/self/stat").exists():  # no /proc (not Linux): the signal's answer
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # it ended just now
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"  # the state follows the parenthesised name


class Heartbeat:
    """Renews this process's lease from a thread of its own, whatever its event loops are doing.

    In a worker, a renewal that finds the lease lapsed means others may already be taking its
    steps: `lost` is set, for good, and the heartbeat stops renewing (the worker stops at once,
    `worker.py`; a tool call finding it lapsed is not made, `runtime.keep_lease`).

    Any other process (`run`, `serve`, `runs resume`) renews a lapsed lease too (a database away
    for longer than it), and goes on: it executes only runs whose own leases it holds, and a run
    another process took over meanwhile is stopped here by that run's guard and fence, not by
    this lease. Before, its heartbeat stopped at the first lapse and nothing else looked: the
    process was listed dead while it went on executing runs, and a step it took from DBOS's
    internal queue (which every process dequeues) was handed to another process again every
    second while it still ran here.
    """

    def __init__(self, processes: Processes, process_id: str, *, lease_s: float, worker: bool = True) -> None:
        self._processes = processes
        self._id = process_id
        self._lease_s = lease_s
        self._worker = worker
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="masterplanner-heartbeat", daemon=True)
        self.lost = threading.Event()

    def start(self) -> None:
        """Start renewing."""
        self._thread.start()

    def _beat(self) -> None:
        every = self._lease_s / 5
        while not self._stop.wait(every):
            try:
                if not self.renew():
                    return
            except RunError:  # the database is away for a moment: try again on the next beat
                continue

    def renew(self) -> bool:
        """Renew the lease now (also from outside the thread); False, and `lost` set, once it lapsed.

        In a worker; any other process's lease is renewed even when it lapsed.
        """
        if self.lost.is_set():
            return False
        renewed = self._processes.renew(self._id, lease_s=self._lease_s, lapsed_too=not self._worker)
        if not renewed:
            self.lost.set()
        return renewed

    def stop(self) -> None:
        """Stop renewing and record the stop, so others may take unfinished work at once."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        try:
            # one try: a process stopping while the database is away would otherwise wait for it
            # for up to RECONNECT_S (60 s); unrecorded, the stop is told by the lease lapsing
            self._processes._stop_once(self._id)
        except RunError:
            pass
