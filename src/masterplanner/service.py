"""The services front ends call (the CLI, the web app, the REST API): runs and the registry.

Everything a person does with runs goes through `RunService`: create a run and execute it (or
resume it), read runs, their steps, events and reports, list and answer the requests a run
waits on (plan review, tool approvals, agents' questions, whether to store the team), cancel,
retry a failed run, and give feedback. `RegistryService` is the same for the registry: agents,
stored teams and memories. Front ends never touch the stores, DBOS or the engine's internals.

Every method is async and keeps blocking work (database reads and writes, the registry) off the
event loop, so a web server can share the loop with running runs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, get_args

from . import telemetry
from ._lazy import lazy_names
from .audit import AuditEntry, audit_entries
from .engine.control import open_run_store, request_cancel, run_report
from .engine.processes import ProcessRecord, step_queue_name
from .engine.records import (
    FINISHED_RUN_STATUSES,
    Event,
    RunOptions,
    RunRecord,
    RunStatus,
    StepRecord,
    briefs_json,
)
from .engine.registries import release_registry
from .engine.requests import Request, closed_text, secret_in_answer, typed_secrets_removed
from .engine.store import Lease, process_identity
from .errors import (
    AgentEditError,
    ConfigError,
    MasterplannerError,
    NotFoundError,
    RequestClosedError,
    RequestError,
    RunError,
    json_kind,
    nul_field,
    quoted_id,
    validation_problems,
)
from .plan import validate_plan
from .redaction import secret_parts, secret_refusal
from .remedies import Remedy, Said
from .settings import Settings, needed_credential_text, provider_of
from .tools import ToolSpec
from .tools.catalog import Catalog

if TYPE_CHECKING:
    from .engine.runner import Engine
    from .engine.worker import Note, WorkerSummary
    from .registry import AgentSpec, Cohort, RegistryStore
    from .registry.memory import MemoryItem, MemoryKind, MemoryStore
    from .registry.store import ImportedAgents, Reembedded

_T = TypeVar("_T")

__all__ = [
    "AuditEntry",
    "Event",
    "FeedbackSummary",
    "Lease",
    "ProcessRecord",
    "RegistryService",
    "Request",
    "RunOptions",
    "RunRecord",
    "RunService",
    "StepRecord",
    "WorkerSummary",
    "answerer_name",
    "catalog_of_review",
    "secret_in_answer",
    "typed_secrets_removed",
]

# what a worker's run ends with: its module imports the engine (DBOS, the models), which reading,
# answering and cancelling runs do without
__getattr__ = lazy_names(__name__, {"masterplanner.engine.worker": ("WorkerSummary",)}, __all__)[0]

_FOLLOW_POLL_S = 0.2
_log = logging.getLogger(__name__)


def answerer_name(front_end: str) -> str:
    """Who answers, as requests and events record it: `front end@host:pid`."""
    return f"{front_end}@{socket.gethostname()}:{os.getpid()}"


def catalog_of_review(request: Request) -> Catalog:
    """The run's tool catalog as its plan-review request carries it (to validate an edit with)."""
    from .engine.catalogs import RunCatalog

    specs = [ToolSpec(**spec) for spec in request.payload.get("tools", [])]
    return RunCatalog(
        specs,
        missing=request.payload.get("missing_tools", {}),
        mcp_servers=request.payload.get("mcp_servers", []),
    )


def _check_names_in_decision(request: Request, answer: dict[str, Any]) -> None:
    """`RequestError` for a review's answer naming a tool or a step that is not there.

    A misspelt tool in `tool_policies` left the tool it meant under its old policy (an `ask`
    could silently become no question at all), and prompts for a step the plan does not have
    were stored with the run's agents.
    """
    from .engine.catalogs import unknown_policy_tool

    servers = request.payload.get("mcp_servers", [])
    policies = answer.get("tool_policies")
    if isinstance(policies, dict):
        problem = unknown_policy_tool(policies, servers)
        if problem is not None:
            raise RequestError(f"request {request.id}: {problem}")
    agents = answer.get("agents")
    if not isinstance(agents, dict):
        return
    plan = answer.get("plan") if "plan" in answer else request.payload.get("plan")
    steps = [step.get("id") for step in (plan or {}).get("steps", []) if isinstance(step, dict)]
    for step_id, agent in agents.items():
        if step_id not in steps:
            raise RequestError(
                f"request {request.id}: agents names step {quoted_id(step_id)}, which the plan does not have "
                f"(its steps: {', '.join(map(str, steps)) or 'none'})"
            )
        own = agent.get("tool_policies") if isinstance(agent, dict) else None
        if isinstance(own, dict):
            problem = unknown_policy_tool(own, servers)
            if problem is not None:
                raise RequestError(f"request {request.id}: agents.{step_id}.{problem}")


def _check_search(query: object, limit: object) -> None:
    """`ConfigError` for a search that is not text, or a limit out of 1 to 100."""
    if not isinstance(query, str):
        raise ConfigError(f"the search must be text, got {json_kind(query)}")
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 100:
        raise ConfigError(f"limit must be a whole number from 1 to 100, got {limit!r}")


def _check_kind(kind: object) -> None:
    """`ConfigError` for a memory kind that is not one (it matched nothing)."""
    from .registry.memory import MemoryKind

    if kind is not None and kind not in get_args(MemoryKind):
        raise ConfigError(f"kind must be {' or '.join(get_args(MemoryKind))}, got {kind!r}")


def _items(field: str, texts: list[str]) -> list[tuple[str, str]]:
    """Each text of an agent's list, named as a problem names it (`lessons.0`)."""
    return [(f"{field}.{number}", text) for number, text in enumerate(texts)]


def _agent_problems(spec: AgentSpec, settings: Settings) -> list[str]:
    """What an edited agent has that its JSON form allows but a run could not use."""
    from .engine.catalogs import unknown_policy_tool
    from .registry.specs import MAX_KEYWORD_CHARS, MAX_LESSON_CHARS
    from .settings import PROVIDERS

    problems = []
    for field in ("name", "role"):
        text = getattr(spec, field)
        if not text.strip():
            problems.append(f"{field}: must not be blank")
        elif any(ord(character) < 32 or ord(character) == 127 for character in text):
            problems.append(f"{field}: must be one line of text without control characters")
    # any of its texts (keywords, lessons, tools too): searches stop at it, and Postgres refuses it
    nul = nul_field(spec.model_dump(mode="json", exclude={"id", "stats", "name", "role"}))
    if nul is not None:
        problems.append(nul)
    # each goes into the prompts of the runs that use the agent; keywords are indexed and embedded
    for field, text in (
        [(field, getattr(spec, field)) for field in ("name", "role", "description", "system_prompt")]
        + _items("lessons", spec.lessons)
        + _items("keywords", spec.keywords)
    ):
        if secret_parts(text):
            problems.append(f"{field}: " + secret_refusal("it", not_in="an agent"))
    # (not on reading: an agent stored before these limits keeps its longer ones until edited)
    for what, texts, limit in (
        ("keyword", spec.keywords, MAX_KEYWORD_CHARS),
        ("lesson", spec.lessons, MAX_LESSON_CHARS),
    ):
        problems += [
            f"{item}: is {len(text):,} characters; the limit for a {what} is {limit:,}"
            for item, text in _items(f"{what}s", texts)
            if len(text) > limit
        ]
    if not spec.system_prompt.strip():  # spaces alone: a step would run with no instructions
        problems.append("system_prompt: must not be blank")
    twice = sorted({tool for tool in spec.tools if spec.tools.count(tool) > 1})
    problems += [f"tools: lists {tool} twice" for tool in twice]
    for number, lesson in enumerate(spec.lessons):  # each is a "- " line of the agent's prompt
        if not lesson.strip():
            problems.append(f"lessons.{number}: must not be blank")
    problem = unknown_policy_tool(spec.tools, settings.mcp_servers, field="tools")
    if problem is not None:
        problems.append(problem)
    provider = spec.model.partition(":")[0]
    if spec.model and spec.model != "local" and (provider not in PROVIDERS or ":" not in spec.model):
        problems.append(
            f"model: {spec.model!r} is not a model spec (PROVIDER:NAME, or local; empty: the run's model)"
        )
    return problems


def _plain_answer(
    request: Request, *, approve: bool | None, text: str | None, reason: str | None
) -> dict[str, Any]:
    """A yes, a no (and a reason) or a text as `request`'s kind takes it; `RequestError` if it takes none."""
    if request.kind == "ask_user":
        if text is None:
            raise RequestError(
                f"request {request.id} is an agent's question: answer it with a text, not a yes or no"
            )
        return {"text": text}
    if text is not None:
        raise RequestError(f"request {request.id} asks yes or no: approve or deny it, not a text")
    reason = reason.strip() if reason is not None else None  # blanks alone are no reason
    if request.kind in ("plan_review", "replan"):
        # with no reason, the run says `NO_REASON` as for a rejection from any other front end
        return {"action": "approve" if approve else "reject"} | (
            {"reason": reason} if reason and not approve else {}
        )
    return {"approved": bool(approve)} | ({"reason": reason} if reason and not approve else {})


def _follow_up(request: Request, what: str, error: Exception, then: str = "") -> str:
    """What failed after `request`'s answer was stored, in words (and `then`, what to do next); logged."""
    _log.exception("request %s: answered, but %s failed", request.id, what, exc_info=error)
    why = (
        str(error)
        if isinstance(error, MasterplannerError)
        else "an unexpected error; the log has the details"
    )
    return f"{what} failed ({why})" + (f"; {then}" if then else "")


def _store_again(request: Request) -> str:
    """What to do when storing the team a `remember` answer approved failed."""
    return (
        "your yes stands: once that is fixed, send the same answer again, or run "
        f"`masterplanner runs remember {request.run_id}`, to store the team"
    )


@dataclass(frozen=True)
class FeedbackSummary:
    """What feedback on a run changed."""

    rated_agents: list[str]
    cohort_rated: bool
    lessons: dict[str, list[str]]


class RunService:
    """Runs as a person or a program works with them, over one settings' database."""

    def __init__(self, settings: Settings, *, debug: bool = False) -> None:
        self.settings = settings
        # the store alone: reading, answering and cancelling runs need neither DBOS nor the
        # models, which the engine imports (seconds of CPU) when a run is created or executed
        self._store = open_run_store(settings)
        self._owner = process_identity()
        telemetry.configure(settings)
        self._made: Engine | None = None
        self._making = threading.Lock()
        self._debug = debug
        self._following = threading.Event()
        self._following.set()
        self._known: set[str] = set()

    def close(self) -> None:
        """Stop what this service started (DBOS, database connections)."""
        if self._made is not None:
            self._made.close()  # the store too
            return
        telemetry.flush()
        release_registry(self.settings)
        self._store.close()

    async def _engine(self) -> Engine:
        """The engine over this service's store, made (and its modules imported) off the loop on first use."""
        if self._made is not None:
            return self._made
        return await asyncio.to_thread(self._make_engine)

    def _make_engine(self) -> Engine:
        with self._making:
            if self._made is None:
                from .engine.runner import Engine

                self._made = Engine(self.settings, debug=self._debug, store=self._store)
            return self._made

    def stop_following(self) -> None:
        """End every `follow` within moments, run over or not (a server that is stopping)."""
        self._following.clear()

    @property
    def following(self) -> bool:
        """Whether `follow` goes on until runs are over (until `stop_following`)."""
        return self._following.is_set()

    # ---- runs

    async def create(
        self,
        task: str,
        *,
        model: str | None = None,
        options: RunOptions | None = None,
        workspace: Path | str | None = None,
        for_workers: bool = False,
        by: str | None = None,
    ) -> RunRecord:
        """Record a new run (status `planning`) after checking the task and the model spec.

        `workspace`: the folder its file tools work in (made if missing); by default a new one
        under the home's `workspaces`.

        `for_workers`: queued for the workers (`masterplanner worker`) instead of executed by
        the caller; the first worker to claim it executes it. `by` (`answerer_name(front end)`,
        the library's by default) is who created it, for the audit log.
        """
        engine = await self._engine()
        return await asyncio.to_thread(
            partial(
                engine.create_run,
                task,
                model=model,
                options=options,
                workspace=workspace,
                for_workers=for_workers,
                by=by or answerer_name("library"),
            )
        )

    async def execute(self, run_id: str, *, on_wait: Callable[[Lease], None] | None = None) -> RunRecord:
        """Plan, wait for the review, run: drive the run to its end in this process.

        Also how a stopped run is resumed: finished steps are not run again. Its pauses are
        requests that any process answers (`pending`, `answer`). A run another process held
        when it died is taken over once that process's lease lapses (`on_wait` is told when
        this waits for it); one whose holder is alive is a `RunError`.
        """
        return await (await self._engine()).execute(run_id, on_wait=on_wait)

    async def get(self, run_id: str) -> RunRecord:
        """The run (a unique prefix of its id is enough); `RunNotFoundError` if there is none."""
        record = await asyncio.to_thread(self._store.get_run, run_id)
        self._known.add(record.id)
        return record

    async def _run_id(self, run_id: str) -> str:
        """The whole id of the run `run_id` names (its start is enough); `RunNotFoundError` if none.

        A whole id seen once is taken as it is from then on (runs are never removed), so a front
        end polling a run's events reads no more than before; a start is looked up each time
        (another run's id may come to start so too).
        """
        return run_id if run_id in self._known else (await self.get(run_id)).id

    async def list_runs(
        self, limit: int = 50, *, status: str | None = None, text: str | None = None
    ) -> list[RunRecord]:
        """Runs, newest first; only those with `status`, and whose task holds `text` (any case).

        `ConfigError` for a status that is not one (it matched nothing) or a limit out of 1 to 10,000.
        """
        if status is not None and status not in get_args(RunStatus):
            raise ConfigError(f"status must be one of {', '.join(get_args(RunStatus))}, got {status!r}")
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 10_000:
            raise ConfigError(f"limit must be a whole number from 1 to 10,000, got {limit!r}")
        return await asyncio.to_thread(self._store.list_runs, limit, status=status, text=text)

    async def idle(self, records: Sequence[RunRecord]) -> dict[str, Literal["queued", "stopped"]]:
        """The unfinished runs of `records` that no process executes now, by id.

        `queued`: for workers, waiting for one to take it; `stopped`: the process that executed
        it stopped (Ctrl-C, a crash), and `runs resume` goes on. One query for all of them.
        """
        unheld = await asyncio.to_thread(self._store.unheld, [record.id for record in records])
        idle = [record for record in records if record.id in unheld]
        return {record.id: "queued" if record.for_workers else "stopped" for record in idle}

    async def steps(self, run_id: str) -> list[StepRecord]:
        """The run's steps in plan order."""
        return await asyncio.to_thread(self._store.steps, await self._run_id(run_id))

    async def report(self, run_id: str) -> dict[str, Any]:
        """The JSON report of a run: run_id, status, task, output, error, plan, steps, usage and more."""
        return await asyncio.to_thread(run_report, self._store, run_id)

    async def usage(self, run_id: str) -> dict[str, Any]:
        """The run's model usage: calls, tokens and seconds, in all and by purpose."""
        return await asyncio.to_thread(self._store.usage, await self._run_id(run_id))

    async def events(self, run_id: str, after: int = 0) -> list[Event]:
        """The run's events with a sequence number above `after`."""
        if not isinstance(after, int) or isinstance(after, bool) or after < 0:
            raise ConfigError(f"after must be a whole number of at least 0 (an event's seq), got {after!r}")
        return await asyncio.to_thread(self._store.events, await self._run_id(run_id), after)

    async def follow(self, run_id: str, after: int = 0) -> AsyncIterator[Event]:
        """The run's events from `after` on, as they are appended, until the run is over.

        Over means its status is final and no process is still ending it (recording its outcome,
        then telling the registry: `team_stored` or the `remember` request come after the final
        status), so the last events are never cut off. A finished run whose process died holding
        it is over once that process's lease has lapsed. It also ends, run over or not, once
        `stop_following` is called.
        """
        while True:
            over = await self._over(run_id)
            fresh = await self.events(run_id, after)
            for event in fresh:
                after = event.seq
                yield event
            if over or not self.following:
                return
            await asyncio.sleep(_FOLLOW_POLL_S)

    async def _over(self, run_id: str) -> bool:
        """Whether the run's status is final and no live process still holds it."""
        run = await self.get(run_id)
        if run.status not in FINISHED_RUN_STATUSES:
            return False
        lease = await asyncio.to_thread(self._store.lease, run.id)
        return lease is None or lease.left_s <= 0

    async def cancel(self, run_id: str, *, wait_s: float = 0.0, by: str | None = None) -> RunRecord:
        """Ask a run to stop and wait up to `wait_s` for it to be cancelled.

        The process executing the run stops its steps within moments; a run no process holds is
        cancelled at once, and one whose process died is cancelled when that process's lease
        lapses (`run_lease_s`), if that comes within `wait_s`. `by` (`answerer_name(front end)`,
        the library's by default) is who asked, for the audit log.
        """
        who = by or answerer_name("library")
        ask = partial(request_cancel, self._store, owner=self._owner, lease_s=self.settings.run_lease_s)
        record = await asyncio.to_thread(partial(ask, run_id, by=who))
        deadline = time.monotonic() + wait_s
        while not record.finished and time.monotonic() < deadline:
            await asyncio.sleep(_FOLLOW_POLL_S)
            try:  # again: a process that died holding the run lets go of it when its lease lapses
                record = await asyncio.to_thread(ask, record.id)
            except RunError:  # it ended meanwhile, cancelled or otherwise
                record = await self.get(record.id)
        return record

    async def retry(
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
        """Make a failed run ready to go on from where it failed; then `execute` it (or workers do).

        Its succeeded steps keep their outputs and are not run again; its failed, skipped and
        cancelled steps run afresh. A budget given here replaces the run's; one the run has
        used up is refused (`BudgetExceededError`) before anything changes. `prompt_rounds`
        replaces its critique rounds per prompt (prompts kept from its planning under other
        rounds are written again). A run that did not
        fail is refused (`RunError`). `for_workers`: queue it for the workers, or (False) execute
        it in the caller; None keeps it as it was. `by` is who asked, for the audit log.

        A process still ending the run (telling the registry how it went) is waited for, up to
        `run_lease_s`; one that holds it on is a `RunError` naming it (retry once it lets go). One
        that died ending it left its end undone: that end is finished here first (as `execute`
        finishes it), then the run is retried, so that nothing it was to store is lost. Never
        is the run reset while another process executes it.
        """
        engine = await self._engine()
        retry = partial(
            engine.retry,
            run_id,
            by=by or answerer_name("library"),
            for_workers=for_workers,
            max_model_calls=max_model_calls,
            max_tokens=max_tokens,
            max_wall_s=max_wall_s,
            max_cost_usd=max_cost_usd,
            prompt_rounds=prompt_rounds,
        )
        try:
            return await asyncio.to_thread(retry)
        except RunError:
            cut_short = await self._end_cut_short(run_id)
            if cut_short is None:
                raise
        # its end, left undone: finished here (the registry told), unless another process took
        # it over meanwhile (the retry then waits for that process, or names it)
        await engine.finish_end(cut_short)
        return await asyncio.to_thread(retry)

    async def _end_cut_short(self, run_id: str) -> str | None:
        """The run's full id if it failed and the process that held it stopped before its end was done.

        Its lease lapsed without being given up (`RunStore.abandoned_runs`): nobody ends it but a
        process that takes it over. None otherwise.
        """
        run = await self.get(run_id)
        lease = await self.lease(run.id)
        return run.id if run.status == "failed" and lease is not None and lease.left_s <= 0 else None

    async def audit(self, run_id: str) -> list[AuditEntry]:
        """Who approved, edited, answered or cancelled what in the run, when, from which front end."""
        record = await self.get(run_id)
        requests = await asyncio.to_thread(self._store.requests.find, record.id, state=None)
        events = await self.events(record.id)
        return audit_entries(requests, events)

    async def abandoned_runs(self) -> list[str]:
        """Runs whose executing process died (its lease lapsed): `execute` takes them over.

        And those a stopping worker handed over (`lease(run_id).handed_over_by` names it).
        """
        return await asyncio.to_thread(self._store.abandoned_runs)

    async def lease(self, run_id: str) -> Lease | None:
        """The run's lease: which process holds it (or held it, lapsed), or None when nobody does."""
        return await asyncio.to_thread(self._store.lease, run_id)

    # ---- workers

    async def processes(self, *, include_dead: bool = False) -> list[ProcessRecord]:
        """The processes executing workflows on this database (workers first); the dead ones too if asked."""
        return await asyncio.to_thread(self._store.processes.listed, include_dead=include_dead)

    async def waiting(self, record: RunRecord) -> Said | None:
        """Why a run queued for workers is not being executed, when no running worker can take it.

        None when the run is over, is held by a process, or is queued for workers and a live
        worker takes runs of its provider and has not refused this one (it claims the run within
        moments). A run not queued for workers that no process holds was stopped (Ctrl-C, a
        crash): it says how to resume it. A run whose cancel was asked and is not over yet says
        who asked and what it waits for (before, `runs show` said nothing of a cancel asked
        while the run's worker was dead). What to do is a `Remedy` where a front end offers it
        (resume, cancel); starting a worker is said as the command, which only a terminal runs.
        """
        if record.finished:
            return None
        lease = await asyncio.to_thread(self._store.lease, record.id)
        (_held, cancelling) = (await asyncio.to_thread(self._store.watched, {record.id: ""}))[record.id]
        asked = (
            [event for event in await self.events(record.id) if event.kind == "cancel_requested"]
            if cancelling
            else []
        )
        if asked:
            who = f"{asked[-1].data.get('by', 'someone')} at {asked[-1].at}"
            if lease is not None and lease.left_s > 0:
                return Said(
                    f"a cancel was asked ({who}): {lease.owner}, which executes the run (last heard "
                    f"from {lease.age_s:.0f} s ago), stops it within moments; if that process died, "
                    f"the run is cancelled when the next process takes it, once its hold lapses "
                    f"(in {lease.left_s:.0f} s)"
                )
            return Said(
                f"a cancel was asked ({who}): the run is cancelled when the next process takes it",
                Remedy("cancel_again" if record.for_workers else "resume_or_cancel", record.id),
            )
        if lease is not None and lease.left_s > 0:
            return None
        if not record.for_workers:
            # the process that executed it stopped (Ctrl-C, a crash) and nothing else will take it
            return Said("no process is executing it (the one that did stopped)", Remedy("resume", record.id))
        workers = [process for process in await self.processes() if process.kind == "worker"]
        provider = provider_of(record.model)
        if not workers:
            return Said(
                "no worker is running on this database: "
                "the run waits until one starts (`masterplanner worker`)"
            )
        serving = {worker.id for worker in workers if step_queue_name(record.model) in worker.queues}
        if not serving:
            needed = needed_credential_text(provider)
            where = f", where {needed} is set" if needed else ""
            return Said(
                f"no worker running on this database takes {provider} runs: the run waits until one does "
                f"(`masterplanner worker --queues {provider}`{where})"
            )
        refusals = {
            str(event.data.get("process")): str(event.data.get("reason"))
            for event in await self.events(record.id)
            if event.kind == "run_refused"
        }
        if serving <= set(refusals):
            reasons = sorted({refusals[worker] for worker in serving})
            return Said(
                f"every running worker that takes {provider} runs refused it ({'; '.join(reasons)}): "
                "the run waits for a worker that can take it"
            )
        return None

    async def work(
        self,
        stop: asyncio.Event,
        *,
        providers: list[str] | None = None,
        max_runs: int = 64,
        grace_s: float = 30.0,
        note: Note | None = None,
    ) -> WorkerSummary:
        """Be a worker until `stop` is set: take queued steps and runs, and those of dead processes.

        `providers` limits the step queues it takes from (all by default); `note` is told what
        it does, a line at a time with fields for a log collector. See `masterplanner.engine.worker`.
        """
        from .engine.worker import Worker

        worker = Worker(
            self.settings,
            providers=providers,
            max_runs=max_runs,
            grace_s=grace_s,
            note=note,
            debug=self._debug,
        )
        try:
            return await worker.run(stop)
        finally:
            # not in a thread: DBOS's shutdown (at the end of `run`) closed the loop's thread pool
            worker.close()

    # ---- requests

    async def pending(self, run_id: str | None = None) -> list[Request]:
        """Open requests of one run (or of every run), oldest first."""
        if run_id is not None:
            run_id = (await self.get(run_id)).id
        return await asyncio.to_thread(self._store.requests.find, run_id)

    async def request(self, request_id: str) -> Request:
        """One request, in whatever state it is (a unique prefix of its id is enough)."""
        return await asyncio.to_thread(self._store.requests.get, request_id)

    async def answer(self, request_id: str, answer: dict[str, Any], *, by: str) -> Request:
        """Answer an open request; the run waiting on it goes on (in whichever process runs it).

        `RequestError` (nothing changes) when the request is unknown or not open any more, or
        the answer does not fit it; an edited plan that does not validate is a `PlanError` (one
        without `task` keeps the run's).
        Of two answers given at once exactly one is taken; the other gets a `RequestError`. The
        same answer sent again by the same answerer (`same_answerer`: a browser that lost the
        reply, a script run twice) is no refusal: the request as answered, `taken_before`.
        What fails once the answer is stored (its `request_answered` event, storing the team a
        `remember` answer approved) is logged and said in `follow_up_failed`: the answer stands
        (before, it was a refusal, and the answer sent again was refused as answered). A
        `remember` answer whose team was neither stored nor said not stored (storing it failed)
        is carried out again when sent again: the team is stored then, once (`remember`).
        """
        request = await self.request(request_id)
        if request.kind in ("plan_review", "replan") and isinstance(answer, dict) and "plan" in answer:
            reviewed = request.payload.get("plan") or {}
            if isinstance(answer["plan"], dict) and "task" not in answer["plan"] and "task" in reviewed:
                # an edit without the task keeps the run's, as the terminal's edit does
                answer = {**answer, "plan": {"task": reviewed["task"], **answer["plan"]}}
        if request.state == "open" and request.kind in ("plan_review", "replan") and isinstance(answer, dict):
            if "plan" in answer:
                validate_plan(
                    answer["plan"],
                    catalog_of_review(request),
                    task=(request.payload.get("plan") or {}).get("task"),
                )
            _check_names_in_decision(request, answer)
        answered = await asyncio.to_thread(self._store.requests.answer, request.id, answer, by=by)
        if answered.taken_before:  # stored, and its run told, when it was first sent
            if answered.kind == "remember" and not await asyncio.to_thread(self._team_told, answered):
                # what that answer was for did not happen (storing the team failed): again now
                try:
                    await asyncio.to_thread(self._remember, answered)
                except Exception as error:
                    again = _follow_up(answered, "storing the run's team", error, _store_again(answered))
                    return dataclasses.replace(answered, follow_up_failed=again)
            return answered
        failed = []
        try:
            await asyncio.to_thread(
                self._store.append_event,
                answered.run_id,
                "request_answered",
                answered.step_id,
                {"request": answered.id, "kind": answered.kind, "by": by},
            )
        except Exception as error:
            failed.append(_follow_up(answered, "recording it in the run's events", error))
        if answered.kind == "remember":
            try:
                await asyncio.to_thread(self._remember, answered)
            except Exception as error:
                failed.append(_follow_up(answered, "storing the run's team", error, _store_again(answered)))
        return dataclasses.replace(answered, follow_up_failed="; ".join(failed)) if failed else answered

    async def answer_plainly(
        self,
        request_id: str,
        *,
        by: str,
        approve: bool | None = None,
        text: str | None = None,
        reason: str | None = None,
    ) -> Request:
        """Answer with a yes, a no (and a reason) or a text, in the form the request's kind takes.

        A plan review takes yes (approve) or no (reject); a tool approval and the remember
        question yes or no; an agent's question a text. As `answer`: the same answer sent again
        by the same answerer is `taken_before`.
        """
        if (approve is None) == (text is None):
            raise RequestError("answer with exactly one of: approve, deny, or a text")
        if text is not None and reason is not None:
            raise RequestError("a reason goes with a denial, not with a text answer")
        request = await self.request(request_id)
        try:
            answer = _plain_answer(request, approve=approve, text=text, reason=reason)
        except RequestError:
            # closed first: the form of an answer it cannot take is beside the point
            if request.state != "open":
                raise RequestClosedError(closed_text(request)) from None
            raise
        return await self.answer(request.id, answer, by=by)

    async def decide(self, run_id: str, decision: dict[str, Any], *, by: str) -> Request:
        """Answer the run's open plan review: `{"action": "approve" | "reject", "reason"?, "plan"?, …}`."""
        run = await self.get(run_id)
        reviews = [request for request in await self.pending(run.id) if request.kind == "plan_review"]
        if not reviews:
            raise RequestError(f"run {run.id} is {run.status}: it has no plan review waiting for an answer")
        return await self.answer(reviews[-1].id, decision, by=by)

    def _team_told(self, request: Request) -> bool:
        """Whether the run's events say what came of the `remember` answer (team stored or not)."""
        return any(
            event.kind in ("team_stored", "team_not_stored") and event.data.get("request") == request.id
            for event in self._store.events(request.run_id)
        )

    def _remember(self, request: Request) -> None:
        """Apply an answered `remember` request: store the run's team, or record that it was not."""
        from .engine.reuse import secret_in_team

        assert request.answer is not None
        if not request.answer.get("approved"):
            self._store.append_event(request.run_id, "team_not_stored", data={"request": request.id})
            return
        run = self._store.get_run(request.run_id)
        if run.plan is None:
            raise RunError(f"run {run.id} has no plan: there is no team to store")
        secret = secret_in_team(run.plan, briefs_json(run.agents))
        if secret is not None:  # asked before the run's end stopped asking about such a team
            self._store.append_event(
                request.run_id, "team_not_stored", data={"request": request.id, "reason": secret}
            )
            return
        # stored before (this answer sent again after its event was lost): said now, not stored again
        self._store_team(run, {"cohort": run.id, "request": request.id})

    def _store_team(self, run: RunRecord, told: dict[str, Any]) -> bool:
        """Store the run's team (its new agents and its cohort) once, and say so once.

        All or nothing, and once (`remember_run`); reused agents' outcomes, counted when the
        run ended, are not counted again. Then a `team_stored` event (`told` its data) says it,
        unless one says it already (`RunStore.append_event_once`): the storing's own, or that of
        a call at once that found the team stored by this one. A team the registry holds with no
        such event (stored, and the run's database failed before its event was written) is said
        stored now. False when nothing was done: the team stored, and said stored, already.

        Before, a team stored whose event was lost stayed so: `remember` was refused (stored
        already) while the run's page offered its button for good; and two at once could each
        write a `team_stored` (one stored the team, the other found it stored with no event yet).
        """
        from .engine.reuse import remember_run
        from .registry import open_registry

        assert run.plan is not None
        # an event past this one is of this storing (the cohort is claimed after it): an older
        # one says a storing of a team removed since
        before = self._store.last_seq(run.id)
        registry = open_registry(self.settings)
        try:
            stored = remember_run(
                registry,
                run_id=run.id,
                model=run.model,
                plan=run.plan,
                agents=briefs_json(run.agents),
                succeeded=True,
                store_new=True,
                count_reused=False,
            )
        finally:  # its connections (a server answers many requests)
            registry.close()
        said = self._store.append_event_once(run.id, "team_stored", told, after=before if stored else 0)
        return stored or said is not None

    async def remember(self, run_id: str, *, by: str | None = None) -> str:
        """Store the team of a run that succeeded, as a `remember` answer's yes does; the cohort's id.

        For a team not stored when the run ended (`remember_runs = never`, or storing it failed
        then) or when a yes was given (storing it failed). Refused (`RunError`), nothing changed,
        when the run did not succeed, still asks whether to store its team (answer that), has a
        team with what looks like a secret, or has its team stored already and said so. A
        `team_stored` event says who asked (`by`, the library's by default); a team stored whose
        event was lost (the run's database failed just after the registry stored it) is not
        stored again but said stored now, with `by`, and taken (`_store_team`).
        """
        run = await self.get(run_id)
        refusal = await self._remember_refusal(run)
        if refusal is not None:
            raise RunError(refusal.reason, remedy=refusal.remedy)
        who = by or answerer_name("library")
        if not await asyncio.to_thread(self._store_team, run, {"cohort": run.id, "by": who}):
            raise RunError(f"run {run.id}: its team is stored already", remedy=Remedy("show_team", run.id))
        return run.id

    async def remember_refusal(self, run_id: str) -> Said | None:
        """Why `remember` refuses to store the run's team now, in its words; None if it tries to.

        A run that succeeded is refused until it is over (`follow`'s over: no process is still
        ending it), as its process stores its team then, or asks whether to. A team stored
        already is not asked here: the registry says so when `remember` stores it, and `remember`
        refuses it only when a `team_stored` event says so too (one lost is written then).
        One definition: `remember` asks it, and the run's web page offers its "Remember this team"
        button only when it says nothing and no `team_stored` event says the team was stored, so
        a press on it is taken.
        """
        return await self._remember_refusal(await self.get(run_id))

    async def _remember_refusal(self, run: RunRecord) -> Said | None:
        from .engine.reuse import secret_in_team

        if run.status != "succeeded" or run.plan is None:
            return Said(f"run {run.id} is {run.status}: only a run that succeeded has a team to store")
        if not await self._over(run.id):  # its process stores its team, or asks, in a moment
            return Said(
                f"run {run.id} is still ending (its team is being stored or asked about): "
                "try again in a moment"
            )
        asking = [request for request in await self.pending(run.id) if request.kind == "remember"]
        if asking:
            question = asking[0].id
            return Said(
                f"run {run.id} asks whether to store its team: answer its request {question}",
                Remedy("answer_remember", run.id, question),
            )
        secret = secret_in_team(run.plan, briefs_json(run.agents))
        if secret is not None:
            return Said(f"run {run.id}: its team is not stored: {secret}")
        return None

    # ---- feedback

    async def rating_refusal(self, run_id: str) -> str | None:
        """Why `feedback` refuses to rate the run now, in the words it refuses with; None if it rates it.

        A run is rated once it has ended after some of its steps ran, when some of its agents are
        in the registry, and only once. One definition: `feedback` asks it, and the run's web page
        offers its rating form only when it says nothing (it offered it to runs refused then).
        """
        from .feedback import registry_refusal
        from .registry import open_registry

        run = await self.get(run_id)
        if not run.finished:
            return f"run {run.id} is {run.status}: a run is rated once it has ended"
        events = await self.events(run.id)
        if run.plan is None or not any(event.kind == "step_started" for event in events):
            return f"run {run.id} was {run.status} before any step ran: there is nothing to rate"
        rated = [event for event in events if event.kind == "run_rated"]  # before the registry kept it
        if rated:
            earlier = rated[-1]
            return (
                f"run {run.id} was rated {earlier.data.get('rating')} already (by "
                f"{earlier.data.get('by', 'someone')} at {earlier.at}): a run is rated once"
            )
        registry = await asyncio.to_thread(open_registry, self.settings)
        try:
            agents = briefs_json(run.agents)
            return await asyncio.to_thread(registry_refusal, registry, run.id, run.plan, agents)
        finally:
            registry.close()

    async def feedback(
        self, run_id: str, *, rating: int, comment: str = "", model: str | None = None, by: str | None = None
    ) -> FeedbackSummary:
        """Rate a finished run: its agents' and team's ratings change; a low rating teaches lessons.

        Only a run that ended after some of its steps ran is rated. A run is rated once: the
        registry records the rating with its effects in one transaction (`give_feedback`), so a
        rating sent again, or two at once, is a `RunError` and no agent's rating counts twice; a
        `run_rated` event (with `by`, the library's by default) puts it in the run's audit. The
        model is used only for a low rating's failure analysis (`model`, else the run's).
        """
        from .feedback import LOW_RATING, check_rating, give_feedback
        from .registry import open_registry

        check_rating(rating)
        run = await self.get(run_id)
        refusal = await self.rating_refusal(run.id)
        if refusal is not None:
            raise RunError(refusal)
        assert run.plan is not None  # a run that never had one is refused above
        analyst = None
        if rating <= LOW_RATING:  # the failure analysis's model; a higher rating needs none
            from .models import resolve_model

            analyst = resolve_model(model or run.model, self.settings)
        outputs = {step.id: step.output or "" for step in await self.steps(run.id)}
        rater = by or answerer_name("library")
        registry = await asyncio.to_thread(open_registry, self.settings)
        try:
            result = await give_feedback(
                registry,
                run_id=run.id,
                plan=run.plan,
                agents=briefs_json(run.agents),
                outputs=outputs,
                rating=rating,
                comment=comment,
                model=analyst,
                by=rater,
            )
        finally:  # its connections (a server rates many runs)
            registry.close()
        await asyncio.to_thread(
            self._store.append_event, run.id, "run_rated", None, {"rating": rating, "by": rater}
        )
        return FeedbackSummary(result.rated_agents, result.cohort_rated, result.lessons)


class RegistryService:
    """The agent registry and memory as front ends work with them: agents, teams, memories.

    Every method is async and keeps the registry's blocking work (database, embeddings) off the
    event loop. The registry is opened on first use.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._registry: RegistryStore | None = None
        self._opening = threading.Lock()

    def close(self) -> None:
        """Release the registry's database connections."""
        if self._registry is not None:
            self._registry.close()
            self._registry = None

    def _store(self) -> RegistryStore:
        with self._opening:  # calls run in worker threads: the registry is opened once
            if self._registry is None:
                from .registry import open_registry

                self.settings.ensure_home()
                self._registry = open_registry(self.settings)
            return self._registry

    def _memory(self) -> MemoryStore:
        from .registry.memory import MemoryStore

        return MemoryStore(
            self._store(), ttl_days=self.settings.memory_ttl_days, max_items=self.settings.memory_max_items
        )

    async def _run(self, action: Callable[[], _T]) -> _T:
        return await asyncio.to_thread(action)

    # ---- agents

    async def agents(self) -> list[AgentSpec]:
        """Every agent, most recently updated first."""
        return await self._run(lambda: self._store().list_agents())

    async def agent(self, agent_id: str, version: int | None = None) -> AgentSpec:
        """One agent (its latest version, or `version`); a `RunError` naming it if there is none."""
        return await self._run(lambda: self._store().get_agent(agent_id, version))

    async def versions(self, agent_id: str) -> list[int]:
        """The agent's stored versions, oldest first; `NotFoundError` for an agent there is not."""

        def read() -> list[int]:
            found = self._store().versions(agent_id)
            if not found:  # as `agent` says it (an empty list read as "an agent with no versions")
                raise NotFoundError(f"no agent {quoted_id(agent_id)} in the registry")
            return found

        return await self._run(read)

    async def search_agents(self, query: str, limit: int = 5) -> list[tuple[AgentSpec, float]]:
        """Agents matching `query` (text index, with embeddings when configured, and a track-record prior)."""
        _check_search(query, limit)
        return await self._run(lambda: self._store().search_agents(query, limit))

    async def edit_agent(self, agent_id: str, edited: object) -> AgentSpec:
        """Store `edited` (an agent's JSON form) as the agent's next version; its id and stats stay.

        `AgentEditError` naming every problem when the edit is not a valid agent, or changes its
        id or origin; nothing changes then. An edit that changes nothing stores no new version.
        One that changes the prompt marks it a person's (`AgentSpec.prompt_by_person`, never
        cleared by an edit).
        """
        from pydantic import ValidationError

        from .registry import AgentSpec
        from .registry.specs import with_prompt_author

        current = await self.agent(agent_id)
        if not isinstance(edited, dict):
            raise AgentEditError(["it must be a JSON object"])
        # what names the agent and where it came from: sent back as they are (an API client's
        # GET answer) they are fine; changed, the edit was taken and they silently were not.
        # (Stats and version change under an edit as runs count and edits save: those stay ignored.)
        kept = {
            "id": (current.id, "it names the agent"),
            "origin": (current.origin, "it is where the agent was made"),
        }
        fixed = [
            f"{field}: cannot be edited ({why})"
            for field, (value, why) in kept.items()
            if field in edited and edited[field] != value
        ]
        try:
            spec = AgentSpec.model_validate(
                {**edited, "id": current.id, "stats": current.stats.model_dump(), "version": current.version}
            )
        except ValidationError as exc:
            problems = validation_problems(exc.errors(), whole="agent", model=AgentSpec)
            raise AgentEditError(fixed + problems) from None
        problems = fixed + _agent_problems(spec, self.settings)
        if problems:
            raise AgentEditError(problems)
        # a prompt a person writes here is theirs: runs reusing the agent put it before the model
        spec = with_prompt_author(spec.model_copy(update={"origin": current.origin}), current)
        if spec == current:  # nothing changed: no version that repeats the last
            return current
        return await self._run(lambda: self._store().put_agent(spec))

    async def remove_agent(self, agent_id: str) -> None:
        """Remove an agent and every version of it."""
        await self._run(lambda: self._store().delete_agent(agent_id))

    async def export_agents(self, path: Path | str) -> int:
        """Write every agent to a JSON-lines file; returns how many."""
        return await self._run(lambda: self._store().export_agents(Path(path)))

    async def import_agents(self, path: Path | str) -> ImportedAgents:
        """Read agents from a JSON-lines file: all of them, or none if any line is invalid.

        A line is invalid when it is not an agent, holds what an agent edit is refused for
        (`edit_agent`), or has a track record no agent can have (`AgentStats.problems`: its
        stats rank it in searches). An agent stored already gets the imported one as its next version, its
        history and lessons kept; a lesson removed from it since is not brought back
        (`RegistryStore.import_agents`).
        """

        def read() -> ImportedAgents:
            store = self._store()
            specs = store.read_agents(Path(path))
            for number, spec in specs:
                problems = [
                    *_agent_problems(spec, self.settings),
                    *(f"stats.{problem}" for problem in spec.stats.problems()),
                ]
                if problems:
                    raise ConfigError(f"{path}: line {number}: {'; '.join(problems)}; nothing was imported")
            return store.import_agents([spec for _, spec in specs])

        return await self._run(read)

    # ---- vectors

    async def reembed(self, progress: Callable[[int, int], None] | None = None) -> Reembedded:
        """Make every agent's, team's and memory's vector again with the configured embedder.

        `progress(done, total)` as it goes (from a worker thread); `ConfigError` with no embedder
        (`RegistryStore.reembed`).
        """
        return await self._run(lambda: self._store().reembed(progress))

    # ---- teams

    async def cohorts(self) -> list[Cohort]:
        """Every stored team (cohort), newest first."""
        return await self._run(lambda: self._store().list_cohorts())

    async def cohort(self, cohort_id: str) -> Cohort:
        """One stored team."""
        return await self._run(lambda: self._store().get_cohort(cohort_id))

    async def remove_cohort(self, cohort_id: str) -> None:
        """Remove a stored team (its agents stay)."""
        await self._run(lambda: self._store().delete_cohort(cohort_id))

    # ---- memory

    async def memories(self, kind: MemoryKind | None = None) -> list[MemoryItem]:
        """Every memory that has not expired, most recently used first."""
        _check_kind(kind)
        return await self._run(lambda: self._memory().list(kind))

    async def recall(self, query: str, limit: int = 5, kind: MemoryKind | None = None) -> list[MemoryItem]:
        """The memories most like `query`, as an agent's `recall` finds them (this renews them)."""
        _check_search(query, limit)
        _check_kind(kind)
        return await self._run(lambda: self._memory().recall(query, limit, kind))

    async def forget(self, memory_id: str) -> None:
        """Forget one memory; a `ToolError` naming it if there is none (as an agent's tool is told)."""
        await self._run(lambda: self._memory().forget(memory_id))
