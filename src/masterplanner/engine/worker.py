"""A worker: executes runs and steps from the shared database until it is told to stop.

`masterplanner worker` launches DBOS listening to the step queues of its providers, so it runs
steps that any coordinator put there, and in a loop claims runs: those queued for workers
(`run --detach`, the web app) and those whose executing process died (their lease lapsed without
being given up). It coordinates each claimed run with an engine whose steps go through the queues,
so the steps of one run may execute on several workers, and a step left by a dead worker is
handed back to its queue by the run's coordinator (`Engine`, `processes.py`).

Stopping (SIGTERM, Ctrl-C): no new runs are claimed, and no new steps are taken from the step
queues, at once (`runtime.stop_taking_steps`: the queued ones wait for the other workers); a run
that has already ended is let finish its bookkeeping (reported as ended, not handed over); the
runs it coordinates are handed over (`RunStore.hand_over`: another worker takes each at its next
claim round, attaching to its queued and running steps — a run queued for workers as queued, one
taken over from a dead process or still ending as abandoned); the steps running here get what
is left of the grace to finish — every model request and tool call inside them is already
checkpointed — and what has not finished by then is left pending, recorded as this worker's, and
taken over by the others as soon as the worker records its stop. The grace, `grace_s`, is one
deadline from the stop for all of it: the ended runs' bookkeeping and the running steps together
(the steps' share rounded up to whole seconds, as DBOS takes it), so a worker given as long to
stop as its grace and a little more (Kubernetes's terminationGracePeriodSeconds) records its stop.

A worker that finds its own lease lapsed (it was suspended or starved past `run_lease_s`) stops
at once, with no grace: others may already be replaying its steps.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from ..errors import ConfigError, MasterplannerError, RunError
from ..models import missing_credential
from ..redaction import redacted
from ..settings import PROVIDERS, Settings, lacking_credential_text
from .catalogs import settings_policy_problem
from .records import RunRecord
from .runner import Engine
from .runtime import process_lost, step_queue_name, stop_taking_steps

__all__ = ["Note", "Worker", "WorkerSummary"]

_CLAIM_INTERVAL_S = 0.25
"""How often a worker looks for runs to take."""


class Note(Protocol):
    """Told what a worker does: a line for a person, and fields for a log collector."""

    def __call__(self, message: str, **fields: Any) -> None:
        """Take in one thing the worker did."""


def _silent(message: str, **fields: Any) -> None:
    return None


@dataclass
class WorkerSummary:
    """What a worker did before it stopped."""

    runs: dict[str, str] = field(default_factory=dict)
    """Each run it coordinated to an end, with the status it ended in."""
    handed_over: list[str] = field(default_factory=list)
    """Runs it was coordinating when it stopped (handed over for another worker to take)."""


class Worker:
    """One worker process's loop over the settings' database."""

    def __init__(
        self,
        settings: Settings,
        *,
        providers: list[str] | None = None,
        max_runs: int = 64,
        grace_s: float = 30.0,
        note: Note | None = None,
        debug: bool = False,
    ) -> None:
        # A misspelt tool in `tool_policies` is refused where a run is made and failed by `doctor`;
        # a worker started with it and said nothing, so the mistake went unseen where it was
        # deployed. It is refused here, naming the setting and where it came from.
        problem = settings_policy_problem(settings)
        if problem is not None:
            raise ConfigError(f"{problem}; this worker does not start until it is fixed")
        unknown = sorted(set(providers or []) - set(PROVIDERS))
        if unknown:
            raise ConfigError(
                f"no provider {unknown[0]!r} to take steps for; providers are {', '.join(PROVIDERS)}"
            )
        lacking = {name: variable for name in PROVIDERS if (variable := missing_credential(name)) is not None}
        for name in providers or []:
            if name in lacking:
                fix = (
                    "set one (OPENAI_BASE_URL alone for a compatible server that needs no key)"
                    if name == "openai"
                    else "set it"
                )
                raise ConfigError(
                    f"this worker cannot take {name} runs or steps: {lacking_credential_text(name)}; "
                    f"{fix}, or leave {name} out of the worker's queues"
                )
        self.settings = settings
        self.providers = list(providers) if providers else [name for name in PROVIDERS if name not in lacking]
        self.left_out: dict[str, str] = {} if providers else lacking
        """Providers left out by default, each with the environment variable it lacks here."""
        self._refused: set[str] = set()
        """Runs whose coordination here stopped on a setting of this worker's: not claimed again."""
        self.max_runs = max(1, max_runs)
        self.grace_s = grace_s
        self.note: Note = note or _silent
        self.engine = Engine(settings, debug=debug, queued_steps=True)

    @property
    def id(self) -> str:
        """The worker's process id in `mp_processes` (its DBOS executor id)."""
        return self.engine.owner

    @property
    def left_out_text(self) -> str:
        """The providers left out by default and what each lacks, as the line the worker starts with ends."""
        return "".join(f"; not {name}'s ({lacking_credential_text(name)})" for name in self.left_out)

    @property
    def queues(self) -> list[str]:
        """The step queues it takes from."""
        return [step_queue_name(provider) for provider in self.providers]

    async def run(self, stop: asyncio.Event) -> WorkerSummary:
        """Work until `stop` is set; then hand over, let running steps finish, and return."""
        engine, summary = self.engine, WorkerSummary()
        changes = await asyncio.to_thread(partial(engine.launch, worker_of=self.providers))
        left_out = self.left_out_text
        self.note(
            f"worker {self.id}: steps from {', '.join(self.queues)}, "
            f"{self.settings.worker_concurrency} at once; runs of those providers queued for workers "
            f"or left by dead processes{left_out}",
            event="worker_started",
            worker=self.id,
            queues=self.queues,
            concurrency=self.settings.worker_concurrency,
            left_out=self.left_out,
        )
        for change in changes:
            self.note(f"worker {self.id}: {change}", event="limits_changed", worker=self.id)
        runs: dict[str, asyncio.Task[RunRecord | None]] = {}
        try:
            while not stop.is_set():
                if process_lost():
                    raise RunError(
                        f"worker {self.id} was not heard from for longer than its lease "
                        f"({self.settings.run_lease_s:g} s); others may be taking its steps, so it stops"
                    )
                await self._reap_and_record(runs, summary)
                room = self.max_runs - len(runs)
                if room > 0:
                    # not those it coordinates: a run whose claim is not made yet (a slow
                    # database) was listed again, and a second coordination replaced the first,
                    # which was then neither handed over nor cancelled when the worker stopped
                    claimable = await asyncio.to_thread(
                        partial(
                            engine.store.claimable_runs,
                            room,
                            providers=self.providers,
                            excluding=(*self._refused, *runs),
                        )
                    )
                    for run_id in claimable:
                        runs[run_id] = asyncio.ensure_future(engine.execute_if_free(run_id))
                try:
                    await asyncio.wait_for(stop.wait(), _CLAIM_INTERVAL_S)
                except TimeoutError:
                    pass
        finally:
            # One deadline for the whole stop: what the ended runs' ends take, the running steps
            # do not get. Before, each had the whole grace, one after the other: a worker took up
            # to twice its grace to stop, past what its operator allowed (Kubernetes's
            # terminationGracePeriodSeconds), and was killed before it recorded its stop.
            deadline = time.monotonic() + self.grace_s
            stop_taking_steps()
            # A worker whose own lease lapsed may already have had its steps handed to others
            # (within a second): nothing more runs here, so it neither waits for its finished
            # runs nor gives its steps any grace; what they did is checkpointed, and they replay
            # elsewhere. A step let run on would make its model requests and write its outcome
            # a second time (only tool calls are fenced, `runtime.keep_lease`).
            lost = process_lost()
            if not lost:
                await self._let_finished_runs_end(runs, deadline - time.monotonic())
            await self._reap_and_record(runs, summary)
            for run_id, task in runs.items():
                task.cancel()
                summary.handed_over.append(run_id)
            await asyncio.gather(*runs.values(), return_exceptions=True)
            if summary.handed_over:
                self.note(
                    f"handed over: {', '.join(summary.handed_over)}",
                    event="runs_handed_over",
                    worker=self.id,
                    runs=summary.handed_over,
                )
            grace_s = 0.0 if lost or process_lost() else max(0.0, deadline - time.monotonic())
            await asyncio.to_thread(partial(engine.stop, grace_s=grace_s))
        return summary

    async def _let_finished_runs_end(
        self, runs: dict[str, asyncio.Task[RunRecord | None]], timeout_s: float
    ) -> None:
        """Wait (up to `timeout_s`) for the coordination of runs that already ended in the store.

        A run's status is written before its coordinator gives its lease up; a stop that comes
        between the two would otherwise cancel a finished run and report it as handed over.
        """
        pending = {run_id: task for run_id, task in runs.items() if not task.done()}
        if not pending:
            return
        store = self.engine.store
        records = await asyncio.gather(*(asyncio.to_thread(store.get_run, run_id) for run_id in pending))
        ending = [pending[record.id] for record in records if record.finished]
        if ending and timeout_s > 0:
            await asyncio.wait(ending, timeout=timeout_s)

    async def _reap_and_record(
        self, runs: dict[str, asyncio.Task[RunRecord | None]], summary: WorkerSummary
    ) -> None:
        """`_reap`, then record on each run this worker refused why (`run_refused`), for its watchers."""
        for run_id, reason in self._reap(runs, summary):
            try:
                await asyncio.to_thread(
                    self.engine.store.append_event,
                    run_id,
                    "run_refused",
                    None,
                    {"process": self.id, "reason": reason},
                )
            except MasterplannerError as error:  # the database is away: the worker's log has it
                self.note(
                    f"run {run_id}: its refusal was not recorded: {error}",
                    event="run_refusal_lost",
                    run=run_id,
                )

    def _reap(
        self, runs: dict[str, asyncio.Task[RunRecord | None]], summary: WorkerSummary
    ) -> list[tuple[str, str]]:
        """Note the runs whose coordination here ended, and forget them; the runs refused, with why."""
        refused: list[tuple[str, str]] = []
        for run_id, task in list(runs.items()):
            if not task.done():
                continue
            del runs[run_id]
            if task.cancelled():
                continue
            error = task.exception()
            if error is not None:
                reason = redacted(  # for the log and the run's events: a key the error quotes goes
                    str(error)
                    if isinstance(error, MasterplannerError)
                    else f"{type(error).__name__}: {error}"
                )
                if isinstance(error, ConfigError):  # this worker's settings: the next try ends the same
                    self._refused.add(run_id)
                    refused.append((run_id, reason))
                    reason += "; this worker does not take it again"
                self.note(
                    f"run {run_id}: stopped here: {reason}", event="run_stopped", run=run_id, reason=reason
                )
                continue
            record = task.result()
            if record is None:
                continue  # another worker took it first
            if record.finished:
                summary.runs[run_id] = record.status
                if record.status == "failed" and record.error:  # why, for whoever reads the log
                    self.note(
                        f"run {run_id}: failed: {record.error}",
                        event="run_ended",
                        run=run_id,
                        status=record.status,
                        reason=record.error,
                    )
                    continue
                self.note(
                    f"run {run_id}: {record.status}", event="run_ended", run=run_id, status=record.status
                )
        return refused

    def close(self) -> None:
        """Stop DBOS here and release database connections."""
        self.engine.close()
