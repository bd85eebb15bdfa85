"""The engine: a run goes planning → awaiting_approval → running → succeeded | failed | cancelled.

A run is data: its row, steps, events, requests and usage in the database. Whichever process
holds the run's lease (in database time, renewed every few seconds) advances it: it plans
(`planning.py`), waits for the review's answer, then starts each step's self-contained workflow
(`workflows.py`) the moment its dependencies are done, up to `max_parallel` at once
(`scheduler.py`), and ends the run with the answer and the registry (`workflows.end_workflow`).
A process that takes over a run whose holder died rebuilds all of that from the database: it
skips finished steps, resumes interrupted step workflows from their last checkpoint, and finishes
an end that was cut short.

The run itself is not one DBOS workflow: the scheduler starts steps in the order their
dependencies finish, which differs from one execution to the next, and a workflow must make its
durable calls in the same order on replay (see docs/architecture.md, "The engine").
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Literal

import sqlalchemy as sa
from dbos import DBOS, SetWorkflowID, WorkflowHandleAsync, WorkflowStatus
from dbos._error import DBOSAwaitedWorkflowCancelledError
from opentelemetry import context as otel_context

from .. import telemetry
from ..clause_planner import uses_clause_plans
from ..database import database_failure
from ..errors import (
    BudgetExceededError,
    ConfigError,
    MasterplannerError,
    MissingCredentialError,
    PlanError,
    RunError,
    RunStoppedError,
    ToolError,
)
from ..models import resolve_model_or_setting
from ..plan import Plan, Step, tool_problems, validate_task
from ..settings import Settings
from ..tools.workspace import Workspace
from .budget import UNKNOWN_PRICE, RunLedger
from .catalogs import RunCatalog, run_catalog, settings_policy_problem, unknown_policy_tool
from .control import mark_cancelled as _mark_cancelled
from .control import open_run_store, request_cancel, run_report
from .planning import plan_run, review_run
from .processes import Processes, ProcessKind
from .records import (
    WHOLE_OPTION_LIMITS,
    RunOptions,
    RunRecord,
    budget_problem,
    options_problem,
    own_workflow_id,
    workflow_id,
)
from .registries import release_registry
from .resources import RunResources, hold, release, resources_of
from .revisions import PlanRevisions, RevisionLost
from .runtime import (
    executing_here,
    executor_id,
    launch_dbos,
    launched_on,
    next_status,
    note_loop,
    own_queue,
    own_queue_name,
    own_workflow,
    process_lost,
    recover_workflow,
    shutdown_dbos,
    step_queue,
    take_queued_workflow,
    unserved_queue,
)
from .scheduler import StepOutcome, run_dag
from .store import Lease, RunStore, process_identity
from .workflows import (
    AGGREGATE_WORKFLOW,
    END_WORKFLOW,
    after_step_threads,
    aggregate_workflow,
    end_workflow,
    plain_answer,
    step_workflow,
)

__all__ = ["Engine", "run_catalog"]

_GUARD_INTERVAL_S = 0.2
_LIVENESS_INTERVAL_S = 1.0
"""How often a coordinator asks whether the process running a workflow it follows is alive (one
answer per process and interval serves every workflow of that process followed here)."""
_liveness: dict[str, tuple[float, bool]] = {}
_unserved_queues: dict[str, tuple[float, bool]] = {}
_ends_here: set[str] = set()
"""The end workflows this process's executions are running inline now (`_Drive._end`)."""
_handing_back: set[str] = set()
"""The end workflows this process is handing back to DBOS's queue (`_hand_back`), not yet handed."""
_HAND_BACK_RETRY_S = 1.0
_ENDED = ("SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED")


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


class Engine:
    """Creates, executes, resumes and cancels runs stored in the settings' database."""

    def __init__(
        self,
        settings: Settings,
        *,
        debug: bool = False,
        queued_steps: bool = False,
        store: RunStore | None = None,
    ) -> None:
        """An engine over the settings' database.

        `queued_steps`: steps go through the provider's DBOS queue to whichever worker takes them
        (a worker's engine); otherwise this process runs them itself. `store`: the settings' run
        store if the caller opened it already (the run service); the engine closes it.
        """
        self.settings = settings
        self.debug = debug
        self.queued_steps = queued_steps
        self.store = open_run_store(settings) if store is None else store
        self.owner = process_identity()
        self._guards = _Guards(self.store, settings.run_lease_s)
        self._launched = False
        telemetry.configure(settings)

    def close(self) -> None:
        """Stop DBOS in this process (if this engine started it) and release database connections."""
        self.stop()
        telemetry.flush()
        release_registry(self.settings)
        self.store.close()

    def launch(self, *, worker_of: list[str] | None = None) -> list[str]:
        """Launch DBOS in this process for this engine (once); `close` or `stop` stops it.

        `worker_of`: as a worker, taking the steps of those providers from their queues. Returns a
        sentence per provider whose limits, shared by all workers, this worker's settings changed.
        """
        kind: ProcessKind = "process" if worker_of is None else "worker"
        changes = launch_dbos(
            self.settings, self.store, executor_id=self.owner, debug=self.debug, kind=kind, listen=worker_of
        )
        self._launched = True
        return changes

    def stop(self, *, grace_s: float = 0) -> None:
        """Stop DBOS in this process if this engine launched it; running steps get `grace_s` to finish."""
        # not when another engine of this process has launched DBOS on another database since
        if self._launched and launched_on(self.settings.database_url):
            shutdown_dbos(grace_s=grace_s)
        self._launched = False

    def create_run(
        self,
        task: str,
        *,
        model: str | None = None,
        options: RunOptions | None = None,
        workspace: Path | str | None = None,
        for_workers: bool = False,
        by: str | None = None,
    ) -> RunRecord:
        """Record a new run (status `planning`) after checking the task and model spec.

        `for_workers`: the run is queued for workers (`masterplanner worker`); the first to claim
        it executes it. `by`: who created it (`front end@host:pid`), for the audit log.
        """
        task = validate_task(task)
        if model is not None and (not isinstance(model, str) or not model.strip() or "\x00" in model):
            raise ConfigError(
                f"model must be a model spec such as 'local' or 'openai:gpt-4o-mini' (or left out for "
                f"the model setting), got {model!r}"
            )
        if workspace is not None and "\x00" in str(workspace):
            raise ConfigError(
                f"the workspace must be a folder's path, got {str(workspace)!r} (it holds a NUL)"
            )
        if workspace is not None and not str(workspace).strip():
            raise ConfigError("the workspace must be a folder's path, got '' (it is empty)")
        spec = model or self.settings.model
        try:
            small = uses_clause_plans(resolve_model_or_setting(spec, self.settings))
        except MissingCredentialError:
            if not for_workers:
                raise
            # the key lives in the workers' environments, where the model is called; the spec's
            # form is checked before the key, and a hosted model is not a small one
            small = False
        run_id = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        # a link to a folder is the folder it points to (the workspace root itself is never a link)
        # `~` is the person's home for every front end (a folder named `~` was made in the current one)
        try:
            named = None if workspace is None else Path(workspace).expanduser()
        except RuntimeError:  # `~name/…` for a user this machine does not have
            user = str(workspace).split("/", 1)[0]
            raise ConfigError(f"workspace {workspace}: {user} names no user's home on this machine") from None
        folder = (named or self.settings.home / "workspaces" / run_id).resolve()
        options = options or RunOptions()
        if not isinstance(options, RunOptions):
            raise ConfigError(f"options must be RunOptions, got {type(options).__name__}")
        problem = options_problem(options)
        if problem is None:
            # the settings' policies (config file, environment) under the run's own
            problem = unknown_policy_tool(options.tool_policies, self.settings.mcp_servers)
            options = replace(options, tool_policies={**self.settings.tool_policies, **options.tool_policies})
            problem = problem or settings_policy_problem(self.settings)
        if problem is not None:
            raise ConfigError(problem)
        _check_money_budget(spec, options.max_cost_usd)
        growth = options.workspace_max_growth_bytes
        # refused for where it is before anything is made there or measured (the measure of `/`
        # took seconds, for a refusal; a folder was made in /usr/share, then refused)
        self.settings.check_workspace(folder)
        try:
            # a workspace the caller names is made only in a folder that exists
            made = Workspace(folder).create(parents=workspace is None)
            if not os.access(folder, os.W_OK | os.X_OK):
                # each step's writes failed ("permission denied") and the run still succeeded
                raise ConfigError(f"workspace {folder} is not writable")
            start = made.allocated_bytes()
        except ToolError as error:  # the run's configuration, not a step's tool call
            raise ConfigError(str(error)) from None
        options = replace(
            options,
            team_tools=not small if options.team_tools is None else options.team_tools,
            workspace_max_growth_bytes=self.settings.workspace_max_growth_bytes if growth is None else growth,
            workspace_start_bytes=start,
        )
        self.settings.record_workspace(folder)  # once it is checked: a refused run leaves no trace
        self.store.create_run(
            run_id,
            task,
            model=spec,
            workspace=str(folder.resolve()),
            options=options,
            for_workers=for_workers,
        )
        created = {"task": task, "model": spec} | ({"by": by} if by else {})
        self.store.append_event(run_id, "run_created", data=created)
        return self.store.get_run(run_id)

    async def execute(self, run_id: str, *, on_wait: Callable[[Lease], None] | None = None) -> RunRecord:
        """Drive a run to its end in this process (also how a stopped run is resumed).

        Every pause (the plan review, a tool approval, an agent's question) is a stored request
        that any process may answer (`store.requests`); the run waits for it here. When another
        process holds the run's lease, this waits until the lease lapses (that process died;
        `on_wait` is told once) and takes the run over, or raises `RunError` as soon as that
        process renews it (it is alive).
        """
        run = await asyncio.to_thread(self.store.get_run, run_id)
        if run.status == "cancelled":
            return run  # a cancelled or rejected run has nothing left to do
        # A succeeded or failed run goes on below too: its end may have been cut short (the
        # outcome recorded, the registry not yet told); `_Drive` finishes it, or finds it done.
        # each execution holds the lease under a name of its own: two executions of one run in
        # this process exclude each other too, and a cancel never takes it for its own
        owner = f"{self.owner}/{secrets.token_hex(3)}"
        await self._take_lease(run.id, owner, on_wait)
        return await self._drive(run, owner)

    async def execute_if_free(self, run_id: str) -> RunRecord | None:
        """Drive a run to its end if its lease is free or lapsed now; None if another process holds it.

        How a worker takes a run: of two workers claiming the same run, one gets it and the other
        moves on at once. Only while the run is still a worker's to take (queued for workers, or
        abandoned: `RunStore.claim`): one retried meanwhile to run in the terminal that retried it
        is left to that terminal. Cancelled (the worker stops), it hands the run over to the next worker
        (`RunStore.hand_over`) rather than give it up as `execute` does.
        """
        owner = f"{self.owner}/{secrets.token_hex(3)}"
        claim = partial(self.store.claim, run_id, owner, lease_s=self.settings.run_lease_s, claimable=True)
        if not await asyncio.to_thread(claim):  # held, or no longer a worker's (retried meanwhile)
            return None
        run = await asyncio.to_thread(self.store.get_run, run_id)
        if run.status == "cancelled":
            await asyncio.to_thread(self.store.release, run.id, owner)
            return run
        return await self._drive(run, owner, hand_over=True)

    async def finish_end(self, run_id: str) -> bool:
        """Finish here the end of a finished run that its process left undone (it died ending it).

        Its end (telling the registry how the run went) is finished as `execute` finishes it, or
        found done. False, with nothing done, when another process holds the run or the run is
        not finished (retried meanwhile): what was not finished is not driven here.
        """
        owner = f"{self.owner}/{secrets.token_hex(3)}"
        run_id = (await asyncio.to_thread(self.store.get_run, run_id)).id  # a prefix, the run's id
        if not await asyncio.to_thread(self.store.claim, run_id, owner, lease_s=self.settings.run_lease_s):
            return False
        run = await asyncio.to_thread(self.store.get_run, run_id)
        if not run.finished:
            await self._give_up(run.id, owner)
            return False
        await self._drive(run, owner)  # held, it stays finished: no retry resets it meanwhile
        return True

    async def _drive(self, run: RunRecord, owner: str, *, hand_over: bool = False) -> RunRecord:
        """Advance a run whose lease `owner` holds; the lease is given up at the end.

        `hand_over`: if this task is cancelled, the run goes to the next worker instead: given up,
        one no worker would claim then (taken over from a dead `run` process, or ending) was left
        with nobody for good, though the stopping worker said it handed it over.
        """
        try:
            # held before the launch: another engine of this process may not switch DBOS to
            # another database under this run (`runtime._refuse_switch_while_busy`)
            hold(run.id, self.settings, self.store)
            note_loop()
            try:
                await asyncio.to_thread(self.launch)
                drive = _Drive(self, run.id, owner)
                work = asyncio.ensure_future(drive.run())
                self._guards.watch(run.id, owner, work, drive)
                try:
                    await work
                finally:
                    self._guards.forget(run.id)
            finally:
                release(run.id)
        finally:
            task = asyncio.current_task()
            handing_over = hand_over and task is not None and task.cancelling() > 0
            await self._give_up(run.id, owner, hand_over=handing_over)
        return await asyncio.to_thread(self.store.get_run, run.id)

    async def _give_up(self, run_id: str, owner: str, *, hand_over: bool = False) -> None:
        """Give the run's lease up; when the database cannot write that (a full disk), let it lapse.

        `hand_over`: for the next worker to take (`RunStore.hand_over`). Raised, the database's
        failure here replaced the run's own outcome or the failure that stopped it (said as
        "cannot release a lease"); a lease not given up lapses after `run_lease_s`, and the run
        is then any process's to go on with.
        """
        with contextlib.suppress(MasterplannerError):
            await asyncio.to_thread(self.store.hand_over if hand_over else self.store.release, run_id, owner)

    async def _take_lease(self, run_id: str, owner: str, on_wait: Callable[[Lease], None] | None) -> None:
        """Take the run's lease, waiting for a holder that stopped renewing it to lapse."""
        lease_s = self.settings.run_lease_s
        seen: Lease | None = None
        while not await asyncio.to_thread(self.store.claim, run_id, owner, lease_s=lease_s):
            lease = await asyncio.to_thread(self.store.lease, run_id)
            if lease is None:
                continue  # given up meanwhile: claim it now
            if seen is None:
                seen = lease
                if on_wait is not None:
                    on_wait(lease)
            elif (lease.owner, lease.renewed_at) != (seen.owner, seen.renewed_at):
                raise RunError(
                    f"run {run_id} is being executed by another process ({lease.owner}); "
                    "it cannot run twice at once"
                )
            await asyncio.sleep(min(0.25, max(0.02, lease.left_s)))

    def request_cancel(self, run_id: str, *, by: str | None = None) -> RunRecord:
        """Ask for a run to stop; one no process holds (or whose holder's lease lapsed) is cancelled now.

        `by`: who asks (`front end@host:pid`), recorded for the audit log the first time they ask.
        """
        return request_cancel(self.store, run_id, owner=self.owner, lease_s=self.settings.run_lease_s, by=by)

    def retry(
        self,
        run_id: str,
        *,
        by: str | None = None,
        for_workers: bool | None = None,
        max_model_calls: int | None = None,
        max_tokens: int | None = None,
        max_wall_s: float | None = None,
        max_cost_usd: float | None = None,
        prompt_rounds: int | None = None,
    ) -> RunRecord:
        """Make a failed run ready to go on from where it failed; `execute` (or a worker) then runs it.

        Its succeeded steps are kept and not run again; its failed, skipped and cancelled steps
        run afresh, with a replan budget of their own. A run that failed before its plan was
        approved is reviewed (or planned) again. A budget given here replaces the run's (the
        run's model calls, tokens and money count from its start, its seconds from the retry);
        one the run has already used up is refused before anything changes. A process still
        ending the run is waited for (at most `run_lease_s`); a `RunError` names one that holds
        it on, and one that died ending it (its end, undone, is finished first: `finish_end`,
        which `RunService.retry` does). `prompt_rounds` replaces the run's
        critique rounds per prompt: prompts it kept from planning under other rounds are written
        again. `for_workers`: queue it for workers, or (False) execute it in this process; None
        keeps it as it was. `by`: who asks (`front end@host:pid`), for the audit log.
        """
        run = self.store.get_run(run_id)
        changed: dict[str, Any] = {
            key: value
            for key, value in (
                ("max_model_calls", max_model_calls),
                ("max_tokens", max_tokens),
                ("max_wall_s", max_wall_s),
                ("max_cost_usd", max_cost_usd),
            )
            if value is not None
        }
        for key, value in changed.items():
            if (problem := budget_problem(key, value)) is not None:
                raise ConfigError(problem)
        _check_money_budget(run.model, max_cost_usd)  # a budget it could not hold (it took one)
        options = replace(run.options, **changed)
        if prompt_rounds is not None:
            low, high = WHOLE_OPTION_LIMITS["prompt_rounds"]
            if (
                not isinstance(prompt_rounds, int)
                or isinstance(prompt_rounds, bool)
                or not low <= prompt_rounds <= high
            ):
                raise ConfigError(
                    f"prompt_rounds must be a whole number from {low} to {high}, got {prompt_rounds!r}"
                )
            options = replace(options, prompt_rounds=prompt_rounds)
        if run.status == "failed":  # otherwise the store says why it cannot be retried
            _check_budget_left(self.store, run.id, options)
            # the process that ran it may still be ending it (telling the registry): wait for it
            # to let go, or for its lease to lapse if it died meanwhile
            deadline = time.monotonic() + self.settings.run_lease_s + 1.0
            while time.monotonic() < deadline:
                lease = self.store.lease(run.id)
                if lease is None or lease.left_s <= 0:
                    break
                time.sleep(0.05)
        self.store.retry(
            run.id,
            options=options,
            for_workers=run.for_workers if for_workers is None else for_workers,
            by=by,
            budgets=changed,
            prompt_rounds=prompt_rounds,
        )
        return self.store.get_run(run.id)

    def abandoned_runs(self) -> list[str]:
        """Runs a process died executing: their lease lapsed without being given up."""
        return self.store.abandoned_runs()

    def report(self, run_id: str) -> dict[str, Any]:
        """The JSON report of a run (`control.run_report`)."""
        return run_report(self.store, run_id)


class _Refused(Exception):
    """A worker cannot build a run's resources with its settings: the run is left as it is."""

    def __init__(self, error: ConfigError) -> None:
        super().__init__(str(error))
        self.error = error


class _Guards:
    """The leases and cancel flags of every run an engine executes, watched in one loop.

    Each run renews its lease every fifth of `run_lease_s` and stops when someone asks to
    cancel it or another process took its lease. One read of all of them every
    `_GUARD_INTERVAL_S`, and one renewal for all every beat: a loop per run made the queries grow
    with the runs a worker coordinates (bench/scale.py: 200 runs on one worker starved it).
    """

    def __init__(self, store: RunStore, lease_s: float) -> None:
        self.store = store
        self.lease_s = lease_s
        self.runs: dict[str, tuple[str, asyncio.Future[None], _Drive]] = {}
        self.task: asyncio.Task[None] | None = None

    def watch(self, run_id: str, owner: str, work: asyncio.Future[None], drive: _Drive) -> None:
        self.runs[run_id] = (owner, work, drive)
        if self.task is None or self.task.done() or self.task.get_loop() is not asyncio.get_running_loop():
            self.task = asyncio.ensure_future(self._loop())

    def forget(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

    async def _loop(self) -> None:
        last_beat = time.monotonic()
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(_GUARD_INTERVAL_S)
            runs = {run_id: held for run_id, held in self.runs.items() if held[1].get_loop() is loop}
            if not runs:
                return
            owners = {run_id: held[0] for run_id, held in runs.items()}
            try:
                if time.monotonic() - last_beat >= self.lease_s / 5:
                    last_beat = time.monotonic()
                    await asyncio.to_thread(self.store.heartbeats, owners, lease_s=self.lease_s)
                watched = await asyncio.to_thread(self.store.watched, owners)
            except MasterplannerError:  # the database is away: the next round tries again
                continue
            for run_id, (held, cancel) in watched.items():
                _owner, work, drive = runs[run_id]
                if work.done() or drive.stop_reason is not None or (held and not cancel):
                    continue  # stopped once: a second cancel would cut its clean-up short
                if drive.ending and not process_lost():
                    # a cancel asked as the run ends comes too late: its end records how it ended
                    # (a cancel recorded before stands, `end_workflow`) and then tells the
                    # registry; cut there, the end was left unfinished with nobody to finish it.
                    # A lease lost meanwhile (this process stalled past it) does not cut it either:
                    # whoever took the run over follows the end this live process still runs
                    # (`_follow_end`), and an end cut here would wait for this process to stop.
                    # Not in a worker that found its own lease lapsed: others may be running
                    # that end already (they recover a dead executor's), and it stops at once
                    continue
                drive.stop_reason = "cancelled" if cancel else "lease lost"
                work.cancel()


async def _unserved(store: RunStore, queue_name: str) -> bool:
    """Whether no live process will dequeue that queue (`unserved_queue`), asked at most once a while.

    At most once per `_LIVENESS_INTERVAL_S`: one answer per queue and interval serves every
    workflow followed here.
    """
    now = time.monotonic()
    seen = _unserved_queues.get(queue_name)
    if seen is not None and now - seen[0] < _LIVENESS_INTERVAL_S:
        return seen[1]
    unserved = await asyncio.to_thread(unserved_queue, queue_name, store)
    _unserved_queues[queue_name] = (now, unserved)
    return unserved


async def _alive(processes: Processes, executor: str) -> bool:
    """Whether the process `executor` is alive, asked at most once per `_LIVENESS_INTERVAL_S`."""
    now = time.monotonic()
    seen = _liveness.get(executor)
    if seen is not None and now - seen[0] < _LIVENESS_INTERVAL_S:
        return seen[1]
    alive = await asyncio.to_thread(processes.alive, executor)
    _liveness[executor] = (now, alive)
    return alive


def _check_budget_left(store: RunStore, run_id: str, options: RunOptions) -> None:
    """Refuse a retry that would stop at its first model call: a budget the run has used up.

    The same check the run's ledger makes before every model request, in words for the retry.
    """
    try:
        RunLedger(store, run_id, options).check()
    except BudgetExceededError as error:
        advice = "" if UNKNOWN_PRICE in str(error) else "; retry it with a larger budget"
        raise BudgetExceededError(
            f"run {run_id} cannot go on: {error}{advice}", budget=error.budget
        ) from None


def _check_tools(plan: Plan, done: set[str], catalog: RunCatalog) -> None:
    """Refuse to start when a step still to run names a tool that is not available here.

    The plan was checked when it was made, but settings can change before it runs (it is
    approved or resumed later, or by another process): say which setting enables the tool
    before any step starts, rather than let a step fail on its first call.
    """
    problems = [
        problem for step in plan.steps if step.id not in done for problem in tool_problems(step, catalog)
    ]
    if problems:
        raise PlanError(problems, context="the plan cannot run here")


class _Drive:
    """This process's turn at advancing one run, from wherever its stored state says it is."""

    def __init__(self, engine: Engine, run_id: str, owner: str) -> None:
        self.engine = engine
        self.store = engine.store
        self.run_id = run_id
        self.owner = owner
        """The name this execution holds the run's lease under."""
        self.interrupted: set[str] = set()
        self.stop_reason: str | None = None
        self.ending = False
        """Whether the run's end workflow has been started (it is never started twice)."""
        self.model = ""
        """The run's model spec: which provider's queue its steps go through."""
        self.retries = 0
        """How many times the run was retried: its workflows' ids say which retry they belong to."""

    async def run(self) -> None:
        run = await asyncio.to_thread(self.store.get_run, self.run_id)
        self.model, self.retries = run.model, run.retries
        # this task's spans (planning, the review, inline steps) join the run's trace
        token = otel_context.attach(telemetry.run_context(self.run_id, run.retries))
        try:
            await self._run(run)
        finally:
            otel_context.detach(token)

    async def _advance(self, run: RunRecord) -> None:
        """Take the run on from where its stored state says it is, to its end."""
        if run.finished:
            self.ending = True
            await self._finish_end()
            return
        _attempt, _end_id, end = await self._latest_end()
        if end is not None and end.status in _ENDED:
            # DBOS recorded the run's end and the run's store did not (its write of the outcome
            # failed: a full disk, the database away): the run ends as that end was to end it,
            # and is not taken on again (planned again, say) towards another end
            status, text, tell_registry = _recorded_end(self.run_id, end)
            await self._end(status, text, tell_registry=tell_registry)
            return
        try:
            resources = await resources_of(run.id, self.engine.settings, self.store)
        except ConfigError as error:
            if self.engine.queued_steps:
                # a worker's own settings (a model file not on its disk): the worker refuses
                # the run and leaves it, as it is, for another worker (`Worker`)
                raise _Refused(error) from None
            raise  # the person's own process: the run fails, saying why (retry it once fixed)
        if run.status == "planning":
            planned = await plan_run(resources, run, owner=self.owner, process=self.engine.owner)
            if planned is None:
                return  # another process took the run over (or it was cancelled): it goes on
            run = planned
        if run.status == "awaiting_approval":
            reviewed = await review_run(resources, run, owner=self.owner)
            if reviewed is None:
                return  # another process took the run over: it applies the review's answer
            run = reviewed
        if run.status == "running":
            await self._run_steps(run, resources)

    async def _run(self, run: RunRecord) -> None:
        try:
            await self._advance(run)
        except asyncio.CancelledError:
            if self.stop_reason == "cancelled" and not self.ending:  # an end goes on where it stopped
                await self._cancel_step_workflows()
                await asyncio.to_thread(_mark_cancelled, self.store, run.id)
                return
            # the execution stopped (its caller gave up, or another process took the run): the
            # steps it ran inline stopped with it, and whichever execution goes on with the run
            # resumes them
            await self._cancel_step_workflows(only_here=True)
            raise
        except RevisionLost:
            # a revision's write found another process holding the run (this one stalled past its
            # lease), or the run ended (a revision's write, or a step that asked: `_run_step`): it
            # stops as when its guard sees the lease taken, and the holder goes on (the reason only
            # stops the guard and `_goes_on`; nothing shows it)
            self.stop_reason = "lease lost"
            await self._cancel_step_workflows(only_here=True)
        except _Refused as refused:
            raise refused.error from None
        except MasterplannerError as exc:
            if self.ending:
                await self._end_failed(exc)
            # steps still running (on workers too) or queued stop: none finishes after the run failed
            await self._stop_or_fail(str(exc), cancel_steps=True)
        except sa.exc.DBAPIError as exc:  # DBOS's own writes (a full disk, say); our stores raise RunError
            if exc.connection_invalidated:
                raise  # a lost connection (Postgres restarting): the run's lease and recovery go on
            text = database_failure(exc, self.engine.settings.database_url)
            if self.ending:
                raise RunStoppedError(text) from None
            await self._stop_or_fail(text, cancel_steps=False)
        except Exception as exc:  # a bug: the run stayed `running`, and nobody took it over
            await self._fail_for_bug(exc)
            raise  # its traceback goes where the caller's errors go (the terminal, the server's log)

    async def _end_failed(self, exc: MasterplannerError) -> None:
        """Raise the error of the run's end workflow: a run it left unfinished stops, to resume later.

        The store could not record the run's outcome (a full disk): the run is left as it was,
        and `RunStoppedError` says so, with the resume hint, as when the end of a run that failed
        cannot be recorded (`_stop_or_fail`). Before, an end that failed on resume (the disk still
        full), or an answer that could not be recorded, raised the store's own error, with no
        hint. An end that recorded the outcome and failed after (telling the registry) raises
        its error as it is: the run has ended.
        """
        try:
            ended = (await asyncio.to_thread(self.store.get_run, self.run_id)).finished
        except MasterplannerError:
            ended = False  # the database cannot even be read: nothing says the run ended
        if ended or isinstance(exc, RunStoppedError):
            raise exc
        raise RunStoppedError(str(exc)) from None

    async def _fail_for_bug(self, exc: Exception) -> None:
        """End the run failed, naming an error that is not ours (unless its end is under way).

        Before, the error left the driver and the run stayed `running` (or awaiting approval),
        with no event and no error; its lease was given up, so no process took it over.
        """
        if self.ending:
            return  # the end workflow records its own outcome
        from ..redaction import redacted

        text = f"an unexpected error stopped the run (a bug in masterplanner): {type(exc).__name__}: {exc}"
        if isinstance(exc, ExceptionGroup):  # from a library's task group: ours inside say it all
            ours, others = exc.split(MasterplannerError)
            if ours is not None and others is None:
                first: BaseException = ours
                while isinstance(first, BaseExceptionGroup):
                    first = first.exceptions[0]
                text = str(first)
        with contextlib.suppress(MasterplannerError, sa.exc.DBAPIError):  # the bug is what is said
            await self._stop_or_fail(redacted(text), cancel_steps=True)

    async def _stop_or_fail(self, text: str, *, cancel_steps: bool) -> None:
        """End the run failed with `text`; if its database cannot record that, stop, saying `text`.

        A full disk fails the run's work and then, often, the writes that end it too: the run is
        then left unfinished (`RunStoppedError`), to resume once there is room. Before, the
        driver's error of the second failure (a traceback) replaced the first.
        """
        try:
            if cancel_steps:
                await self._cancel_step_workflows()
            await self._end("failed", text, tell_registry=False)
        except sa.exc.DBAPIError as exc:
            if exc.connection_invalidated:
                raise
            raise RunStoppedError(text) from None
        except MasterplannerError:
            raise RunStoppedError(text) from None

    async def _finish_end(self) -> None:
        """Finish the end of a run that a crash cut short (its outcome recorded, the registry not told).

        Or wait for it: the end may still run where it began (its process alive, the run's lease
        lapsed: a holder that stalled past it, a worker that stopped and handed the run over),
        or wait on a queue (`_follow_end`).
        """
        _attempt, end_id, status = await self._latest_end()
        if status is not None and status.status in ("PENDING", "ENQUEUED"):
            await self._follow_end(end_id, status)

    async def _follow_end(self, end_id: str, status: WorkflowStatus) -> None:
        """Wait for the run's end workflow that an earlier execution started, resumed if nobody runs it.

        Followed (`_follow`): it is recovered only once its executor's process lease lapsed.
        Before, an end whose run was finished was resumed at once: where its process was alive
        and still running it, the end ran twice at once (the registry told twice). An execution
        here that stops as it ends hands its end back to DBOS's queue (`_hand_back`), and one
        being handed back is followed; one this process's executions left without handing it
        back (a `BaseException` raised inside it) has nobody to run it while this process lives:
        it is resumed here, as before.
        """
        here = executor_id()
        if (
            status.status == "PENDING"
            and here is not None
            and status.executor_id == here
            and end_id not in _ends_here
            and end_id not in _handing_back
            and not executing_here(end_id)
        ):
            handle = await DBOS.resume_workflow_async(end_id)
            await handle.get_result()
            return
        await self._follow(end_id, None)

    async def _latest_end(self) -> tuple[int, str, WorkflowStatus | None]:
        """The run's latest end workflow: which attempt, its id and its status (None: none started).

        `<run>._end`, then `<run>._end-2`, `<run>._end-3`, … for each end made again (`_end`).
        """
        attempt, end_id = 1, await own_workflow(self.run_id, "end", self.retries, END_WORKFLOW)
        status = await DBOS.get_workflow_status_async(end_id)
        for later in itertools.count(2):
            if status is None or status.status not in _ENDED:
                break
            again = own_workflow_id(self.run_id, f"end-{later}", self.retries)
            found = await DBOS.get_workflow_status_async(again)
            if found is None:
                break
            attempt, end_id, status = later, again, found
        return attempt, end_id, status

    async def _end(self, status: Literal["succeeded", "failed"], text: str, *, tell_registry: bool) -> None:
        """End the run as `status` with `text` (its output or its error) through its end workflow.

        An end workflow that ended while the run did not (DBOS recorded it, the store's write of
        the outcome failed) is made again under the next attempt's id with the outcome it was
        given: under its own id it only raised its recorded error again, and the run never ended.
        """
        self.ending = True
        attempt, end_id, earlier = await self._latest_end()
        if earlier is not None and earlier.status in ("PENDING", "ENQUEUED"):
            await self._follow_end(end_id, earlier)  # cut short before it recorded the outcome
            return
        if earlier is not None:
            status, text, tell_registry = _recorded_end(self.run_id, earlier)
            end_id = own_workflow_id(self.run_id, f"end-{attempt + 1}", self.retries)
        _ends_here.add(end_id)
        try:
            with SetWorkflowID(end_id):
                await end_workflow(self.run_id, status, text, tell_registry)
        except (Exception, asyncio.CancelledError):
            # stopped unfinished in a process that goes on (its caller gave up, its write failed
            # and DBOS could not record that): handed back, or nobody here would finish it while
            # this process lives, and another process resuming the run would follow it for ever.
            # Not on a `BaseException` such as a `KeyboardInterrupt` raised inside it: the process
            # is going, and once its lease lapses whoever resumes the run recovers the end.
            await _hand_back(end_id)
            raise
        finally:
            _ends_here.discard(end_id)

    async def _goes_on(self) -> bool:
        """Whether the run goes on: this execution is not stopping, no cancel was asked, it has not ended."""
        if self.stop_reason is not None or self.ending:
            return False
        run = await asyncio.to_thread(self.store.get_run, self.run_id)
        return not run.finished and not await asyncio.to_thread(self.store.cancel_requested, self.run_id)

    async def _cancel_step_workflows(self, *, only_here: bool = False) -> None:
        """Cancel the DBOS workflows of unfinished steps (also those queued), so nothing runs them later.

        `only_here`: those this process executes, when this execution, which ran them inline,
        stops but the run goes on. Left pending, such a workflow was waited for for ever: its
        executor, this process, is alive. Cancelled, it is resumed by the next execution (`_follow`).
        So are those queued on this process's own queue (steps it took over, `own_queue`): taken
        from there once the run's lease is gone, their first tool call would stop them pending
        here (`keep_lease`). A worker's steps run on its queue, not in the execution: they go on,
        and finish.
        """
        if only_here and self.engine.queued_steps:
            return
        for step in await asyncio.to_thread(self.store.steps, self.run_id):
            step_workflow_id = workflow_id(self.run_id, step.id, self.retries)
            status = await DBOS.get_workflow_status_async(step_workflow_id)
            if step.status not in ("running", "pending") or status is None or status.status in _ENDED:
                continue
            here = (status.status == "PENDING" and status.executor_id == self.engine.owner) or (
                status.status == "ENQUEUED" and status.queue_name == own_queue_name()
            )
            if not only_here or here:
                await DBOS.cancel_workflow_async(step_workflow_id)

    async def _run_steps(self, run: RunRecord, resources: RunResources) -> None:
        plan = run.plan
        if plan is None:
            raise RunError(f"run {run.id} has no plan to run")
        stored = await asyncio.to_thread(self.store.steps, run.id)
        finished = {
            step.id: StepOutcome(step.status, step.output, step.error)
            for step in stored
            if step.status in ("succeeded", "failed", "skipped")
        }
        _check_tools(plan, set(finished), resources.catalog)
        resumed = bool(stored)
        if not resumed:
            await asyncio.to_thread(self.store.init_steps, run.id, plan.ids)
        # A step's workflow is recorded before its `step_started` event, so in a resumed run any
        # unfinished step, not only a "running" one, may have a workflow a crash left pending:
        # starting it again under its id would wait on the dead process for ever.
        self.interrupted = {step.id for step in stored if resumed and step.id not in finished}
        revisions = PlanRevisions(resources, owner=self.owner)
        try:
            async with asyncio.timeout(await self._wall_time_left(run)):
                outcomes = await run_dag(
                    plan,
                    self._run_step,
                    max_parallel=run.options.max_parallel,
                    finished=finished,
                    on_skip=self._skip,
                    on_failure=revisions.on_failure,
                    on_expand=revisions.on_expand,
                )
                unfinished = {step_id: o for step_id, o in outcomes.items() if o.status != "succeeded"}
                if unfinished:
                    why_not = await self._replans_not_made()
                    problems = [
                        f"step {step_id} {outcome.status}: {outcome.error}{why_not.get(step_id, '')}"
                        for step_id, outcome in unfinished.items()
                    ]
                    await self._end("failed", "; ".join(problems), tell_registry=True)
                    return
                output = await self._aggregate(outcomes)
        except TimeoutError:
            raise BudgetExceededError(
                f"the run used its wall-time budget of {run.options.max_wall_s:g} s", budget="max_wall_s"
            ) from None
        await self._end("succeeded", output, tell_registry=True)

    async def _replans_not_made(self) -> dict[str, str]:
        """Why each failed step's replan did not happen (since the last retry), as the run's error says it.

        The run's error named only the step's own failure: a replan the person rejected, or one
        a budget stopped, was in the events alone.
        """
        events = await asyncio.to_thread(self.store.events, self.run_id)
        retried = max((event.seq for event in events if event.kind == "run_retried"), default=0)
        said: dict[str, str] = {}
        for event in events:
            if event.kind != "replan_failed" or event.seq <= retried or event.step is None:
                continue
            data = event.data
            if "rejected" in data:
                who = data.get("by", "the person")
                said[event.step] = f" (its replan was rejected by {who}: {data['rejected']})"
            elif "error" in data:
                said[event.step] = f" (it could not be replanned: {data['error']})"
            elif "problems" in data:  # no valid plan (the first execution failed with them)
                said[event.step] = f" (it could not be replanned: {'; '.join(map(str, data['problems']))})"
        return said

    async def _aggregate(self, outcomes: dict[str, StepOutcome]) -> str:
        """The run's answer: a step's output as it is, or composed by the aggregate workflow.

        A final step's or an only sink's output is the answer with no model request, so no
        workflow records it (a run that resumes takes it again from the stored outputs); an
        aggregate workflow an earlier execution left is followed.
        """
        run = await asyncio.to_thread(self.store.get_run, self.run_id)
        outputs = {step_id: outcome.output or "" for step_id, outcome in outcomes.items()}
        answer = plain_answer(run.plan, outputs) if run.plan is not None else None
        if answer is not None:
            return answer
        aggregate_id = await own_workflow(self.run_id, "aggregate", self.retries, AGGREGATE_WORKFLOW)
        status = await DBOS.get_workflow_status_async(aggregate_id)
        if status is not None and status.status in ("PENDING", "ENQUEUED"):
            return str(await self._follow(aggregate_id, None))
        with SetWorkflowID(aggregate_id):
            return await aggregate_workflow(self.run_id)

    async def _wall_time_left(self, run: RunRecord) -> float | None:
        if run.options.max_wall_s is None:
            return None
        events = await asyncio.to_thread(self.store.events, run.id)
        # counted from the approval, or from the latest retry: the time between them is not the run's
        starts = [event.at for event in events if event.kind == "run_retried"] or [
            event.at for event in events if event.kind == "approved"
        ][:1]
        started = _parse_time(starts[-1]) if starts else time.time()
        return max(0.0, run.options.max_wall_s - (time.time() - started))

    async def _skip(self, step: Step, reason: str) -> None:
        await asyncio.to_thread(self.store.update_step, self.run_id, step.id, status="skipped", error=reason)

    async def _run_step(self, step: Step) -> StepOutcome:
        step_workflow_id = workflow_id(self.run_id, step.id, self.retries)
        status = (
            await DBOS.get_workflow_status_async(step_workflow_id) if step.id in self.interrupted else None
        )
        if status is not None and status.status in ("PENDING", "ENQUEUED", "CANCELLED"):
            # started by an earlier execution of the run: it may be running in a live process
            # (a worker), have been left by a dead one, or stopped with its execution; it is
            # followed (and resumed), never started twice
            result = await self._follow(step_workflow_id, step.id)
        elif self.engine.queued_steps and status is None:
            with SetWorkflowID(step_workflow_id):
                await step_queue(self.model).enqueue_async(step_workflow, self.run_id, step.id)
            result = await self._follow(step_workflow_id, step.id)
        else:
            # A new step runs here; a finished one returns its recorded outcome without running.
            try:
                with SetWorkflowID(step_workflow_id):
                    result = await step_workflow(self.run_id, step.id)
            except DBOSAwaitedWorkflowCancelledError:
                # the step cancelled its own workflow: it asked on a run that had ended (`step_pause`)
                if not await self._goes_on():
                    # ended by another process (a cancel once this one's hold lapsed): this
                    # execution stops as on a lost lease, and starts no other step on the ended run
                    raise RevisionLost from None
                result = await self._follow(step_workflow_id, step.id)
        return StepOutcome(result["status"], result.get("output"), result.get("error"))

    async def _follow(self, workflow_id: str, step_id: str | None) -> Any:
        """The result of a run's workflow (a step's, the aggregate, the end) another process runs.

        It may also still wait to run, or have been left by a process that died: if the process
        running it stops renewing its lease, the workflow is handed back to its queue, where a
        live process takes it and replays it from its last checkpoint. A step's workflow
        cancelled when its execution stopped (`_cancel_step_workflows(only_here=True)`) is resumed
        from its last checkpoint while the run goes on; cancelled otherwise it is the step's
        failure, and any other workflow's is the run's error.
        """
        processes = self.store.processes
        checked = 0.0
        status = await DBOS.get_workflow_status_async(workflow_id)
        while True:
            if status is None:
                raise RunError(f"workflow {workflow_id} is not recorded")
            if status.status == "CANCELLED" and step_id is not None and await self._goes_on():
                await DBOS.resume_workflow_async(workflow_id, queue_name=await self._taking_queue())
                status = await DBOS.get_workflow_status_async(workflow_id)
                continue
            if status.status in _ENDED:
                if status.status == "CANCELLED":
                    if step_id is None:
                        raise RunError(f"workflow {workflow_id} was cancelled")
                    return {"status": "failed", "error": "its workflow was cancelled"}
                handle: WorkflowHandleAsync[Any] = await DBOS.retrieve_workflow_async(workflow_id)
                return await handle.get_result()
            executor = status.executor_id
            if status.status == "PENDING" and executor and time.monotonic() - checked >= _LIVENESS_INTERVAL_S:
                checked = time.monotonic()
                if executor != self.engine.owner and not await _alive(processes, executor):
                    # not a worker: this process takes it, on a queue only it dequeues
                    here = None if self.engine.queued_steps else await asyncio.to_thread(own_queue)
                    recovered = await asyncio.to_thread(
                        recover_workflow, workflow_id, executor, to_queue=here
                    )
                    if recovered and step_id is not None:
                        data = {"from": executor}
                        await asyncio.to_thread(
                            self.store.append_event, self.run_id, "step_recovered", step_id, data
                        )
            queue_name = status.queue_name
            if (
                status.status == "ENQUEUED"
                and queue_name
                and time.monotonic() - checked >= _LIVENESS_INTERVAL_S
            ):
                checked = time.monotonic()
                if await _unserved(self.store, queue_name):
                    # left queued where no live process will take it (a worker that died, with
                    # none left serving its provider): taken where this process dequeues it
                    await asyncio.to_thread(
                        take_queued_workflow, workflow_id, queue_name, await self._taking_queue()
                    )
            status = await next_status(workflow_id)  # one read for every workflow followed here

    async def _taking_queue(self) -> str:
        """The queue a step taken over goes to: the run's provider's in a worker, else this process's own."""
        if self.engine.queued_steps:
            return step_queue(self.model).name
        return await asyncio.to_thread(own_queue)


async def _hand_back(end_id: str) -> None:
    """Hand an end workflow that stopped unfinished here back to DBOS's queue, for a live process.

    Every process with DBOS launched dequeues DBOS's internal queue: one of them (this one,
    often) takes the end exactly once and finishes it from its last checkpoint, and a process
    following it (`_follow_end`) sees it queued, not pending under a live process that will never
    go on with it. Conditional on the end still being PENDING under this process's executor id
    (`recover_workflow`): one that ended, or that DBOS runs here, is left alone. Shielded from a
    second cancellation. When the thread of its step (telling the registry) still runs, it is
    handed back once that thread returns: replayed meanwhile, the registry was told by two calls
    at once. One the database refuses now (it is away) is tried again every
    `_HAND_BACK_RETRY_S` while DBOS runs here under this executor id; until it is handed back,
    no execution here resumes it (`_follow_end`).
    """
    here = executor_id()
    if here is None or executing_here(end_id):
        return
    _handing_back.add(end_id)

    def in_background() -> None:
        threading.Thread(
            target=_give_back,
            args=(end_id, here),
            kwargs={"again": True},
            name=f"hand back {end_id}",
            daemon=True,
        ).start()

    if not after_step_threads(end_id, in_background):
        return
    handing = asyncio.ensure_future(asyncio.to_thread(_give_back, end_id, here, again=False))

    def refused(done: asyncio.Future[bool]) -> None:
        if done.cancelled() or done.exception() is not None or not done.result():
            in_background()  # the database refused it now: tried again until it takes it

    handing.add_done_callback(refused)
    await asyncio.shield(handing)  # cancelled again, this task stops waiting; the hand-back goes on


def _give_back(end_id: str, here: str, *, again: bool) -> bool:
    """`_hand_back`'s write; whether it was made, or had nothing left to do. `again`: until it is."""
    while True:
        try:
            # once DBOS stopped here, the process's stop is recorded: others recover the end
            if executor_id() == here and not executing_here(end_id):
                recover_workflow(end_id, here)
        except Exception:  # the database is away
            if not again:
                return False
            time.sleep(_HAND_BACK_RETRY_S)
            continue
        _handing_back.discard(end_id)
        return True


def _recorded_end(run_id: str, end: WorkflowStatus) -> tuple[Literal["succeeded", "failed"], str, bool]:
    """The outcome a run's end workflow was given: `(status, text, tell_registry)`."""
    args = tuple(end.input["args"]) if end.input is not None else ()
    if len(args) == 4 and args[1] in ("succeeded", "failed") and isinstance(args[2], str):
        return ("succeeded" if args[1] == "succeeded" else "failed"), args[2], bool(args[3])
    raise RunError(
        f"run {run_id} cannot end: its end workflow {end.workflow_id} holds no outcome to end it with"
    )


def _check_money_budget(spec: str, max_cost_usd: float | None) -> None:
    """Refuse a money budget for a model whose calls would have no known price: it could not hold.

    It let every call through as free: a budget of $0.01 ran a million tokens.
    """
    from ..models.pricing import estimated_cost

    if max_cost_usd is None:
        return
    if estimated_cost(spec, 1_000, 1_000, base_url=os.environ.get("OPENAI_BASE_URL")) is None:
        raise ConfigError(
            f"a money budget needs a model whose price is known, and {spec} is not in the price table: "
            "budget its model calls or tokens instead"
        )
