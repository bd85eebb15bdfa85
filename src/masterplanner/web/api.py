"""The REST API under `/api/v1`: runs, their events (also as server-sent events) and requests.

Every route is one or two calls of the run service; nothing here touches a store or the engine.
A run created here is executed by this server's process (`Executions`), or queued for the
workers (`serve --workers`); a run another process executes (`masterplanner run` in a terminal,
a worker) is read, followed and answered the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.sse import EventSourceResponse, ServerSentEvent
from pydantic import BaseModel

from ..engine.catalogs import unknown_policy_tool
from ..engine.records import FINISHED_RUN_STATUSES, RunOptions, RunRecord, RunStatus
from ..errors import DatabaseError, MasterplannerError, RequestError, RunError, RunNotFoundError, quoted_id
from ..remedies import FrontEnd, Said
from ..service import Request as StoredRequest
from ..service import RunService, answerer_name
from .api_bodies import AnswerIn, FeedbackIn, RetryIn, RunIn
from .api_responses import (
    AnsweredRequestOut,
    EventOut,
    FeedbackOut,
    HealthOut,
    ListedRunOut,
    RememberedOut,
    RequestOut,
    RunOut,
    RunReportOut,
    success,
)

__all__ = [
    "REFUSALS",
    "ErrorOut",
    "Executions",
    "existing_run",
    "router",
    "streams",
]


class ErrorOut(BaseModel):
    """What every refused request gets: the error in words, and each problem when there are several."""

    error: str
    problems: list[str] | None = None


_REFUSALS = (
    (400, "The request cannot be carried out (a model spec, a task, a run that cannot start)"),
    (401, "The server was started with `--auth` and the request did not send its token"),
    (403, "A request from another site or to a host name other than loopback"),
    (404, "No such run, request or route"),
    (409, "The request or run is not in a state that takes this"),
    (413, "The body is over 4 MiB"),
    (422, "The body or a parameter is invalid; each problem names its field"),
    (
        500,
        "The server failed on it: the database failed the call (a full disk), said in its words, "
        "or another fault, which its log details",
    ),
    (503, "The database cannot be reached (a Postgres server down or restarting)"),
)

REFUSALS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorOut, "description": words} for code, words in _REFUSALS
}
"""The refusals (and the server's failures) every JSON route documents."""

router = APIRouter(prefix="/api/v1", responses=REFUSALS)

_JSON_REFUSALS: dict[int | str, dict[str, Any]] = {
    code: {
        "description": words,
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}},
    }
    for code, words in _REFUSALS
}
"""The refusals of a route whose success is not JSON (the event stream): they still are."""

streams = APIRouter(prefix="/api/v1")
"""The event stream's route: apart, so its refusals are documented as JSON, not as events."""


class Executions:
    """The runs this server executes, each as a task of its event loop until the run ends.

    With `for_workers`, the server executes nothing: the runs it creates are queued for the
    workers sharing its database (`masterplanner worker`), and it only follows and answers them.
    """

    def __init__(self, service: RunService, *, for_workers: bool = False) -> None:
        self.service = service
        self.for_workers = for_workers
        self._tasks: dict[str, asyncio.Task[RunRecord]] = {}

    def start(self, run_id: str, *, again: bool = False) -> bool:
        """Execute the run in the background (not if this server already does, or workers do).

        `again` (a retried run): if this server's execution of it is still finishing, the run
        is executed again once that execution is over. Whether an execution starts (or will).
        """
        if self.for_workers:
            return False
        running = self._tasks.get(run_id)
        if running is not None and not running.done():
            if again:
                running.add_done_callback(lambda _: self.start(run_id))
            return again
        task = asyncio.create_task(self.service.execute(run_id), name=f"run {run_id}")
        self._tasks[run_id] = task
        task.add_done_callback(self._finished)
        return True

    async def resume(self, run_id: str) -> RunRecord:
        """Go on, in this server, with a run no process executes (the one that did stopped).

        `RunError` when the run has ended, is executed by a process, or waits for the workers,
        and when this server executes nothing (`--workers`).
        """
        record = await self.service.get(run_id)
        if record.finished:
            raise RunError(f"run {record.id} has ended ({record.status}): there is nothing to resume")
        idle = (await self.service.idle([record])).get(record.id)
        if idle is None:
            raise RunError(f"run {record.id} is being executed: there is nothing to resume")
        if idle == "queued":
            raise RunError(f"run {record.id} is queued for the workers: one takes it when it runs")
        if self.for_workers:
            raise RunError(
                f"this server executes no runs (it was started with --workers): "
                f"resume run {record.id} with `masterplanner runs resume {record.id}`"
            )
        # of resumes sent at once, each found the run stopped; the first starts it, the others
        # are refused as for a run being executed (they were all taken, one execution started)
        if not self.start(record.id):
            raise RunError(f"run {record.id} is being executed: there is nothing to resume")
        return record

    def _finished(self, task: asyncio.Task[RunRecord]) -> None:
        # the run's outcome is stored with it; an error that stopped the execution is too (run_failed)
        if not task.cancelled():
            task.exception()

    async def stop(self) -> None:
        """Stop executing (the runs stay as they are: `runs resume` or a later server goes on)."""
        tasks = [task for task in self._tasks.values() if not task.done()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


def _service(request: Request) -> RunService:
    service: RunService = request.app.state.service
    return service


def _summary(record: RunRecord) -> dict[str, Any]:
    return {
        "id": record.id,
        "task": record.task,
        "status": record.status,
        "model": record.model,
        "workspace": record.workspace,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "output": record.output,
        "error": record.error,
        "retries": record.retries,
    }


MAX_SEQ = 2**53 - 1
"""The largest event seq a client may give (JSON's exact integers; the database's are larger)."""


def event_seq(last_event_id: str | None) -> int:
    """The seq a client names as text (an EventSource's `Last-Event-ID`, a run page's `?after=`).

    0 for text that names none.
    """
    if not last_event_id or not last_event_id.isascii() or not last_event_id.isdigit():
        return 0
    return min(int(last_event_id[:20]), MAX_SEQ)


def said_here(request: Request, what: MasterplannerError | Said) -> str:
    """`what` said as its asker reads it, what to do included (`remedies`).

    A program's request (a path under `/api/`) is told the API's endpoint, a page's the page's
    button; a server that executes no runs (`--workers`) names the terminal's command for a
    resume, which it would refuse.
    """
    executions: Executions = request.app.state.executions
    front_end: FrontEnd = "api" if request.url.path.startswith("/api/") else "web"
    return what.said(front_end, resumes=not executions.for_workers)


@contextlib.contextmanager
def _conflict(request: Request) -> Iterator[None]:
    """A `RunError` raised inside is the API's 409: the run is not in a state that takes this.

    Not when the database failed (a `DatabaseError`: 500, or 503 when it cannot be reached;
    `app._our_error`): nothing refused it.
    """
    try:
        yield
    except DatabaseError:
        raise
    except RunError as error:
        raise HTTPException(409, said_here(request, error)) from None


async def _run(service: RunService, run_id: str) -> RunRecord:
    """The run, or a 404 naming the id (the store's message names the database, which stays here)."""
    try:
        return await service.get(run_id)
    except RunNotFoundError as error:
        if error.ambiguous:
            raise HTTPException(
                404, f"{quoted_id(run_id)} is the start of more than one run's id: give more of it"
            ) from None
        raise HTTPException(404, f"no run {quoted_id(run_id)}") from None


async def existing_run(request: Request, run_id: str) -> RunRecord:
    """The run `run_id` names, or a 404 before a streaming route starts its stream."""
    return await _run(_service(request), run_id)


@router.get("/health", summary="Whether the server answers", **success(HealthOut, "It answers"))
async def health() -> dict[str, str]:
    """`{"status": "ok"}`."""
    return {"status": "ok"}


@router.get("/runs", summary="Runs, newest first", **success(list[ListedRunOut], "The runs"))
async def list_runs(
    request: Request,
    status: Annotated[RunStatus | None, Query(description="Only runs with this status.")] = None,
    q: Annotated[str | None, Query(max_length=200, description="Only runs whose task has this text.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
) -> list[dict[str, Any]]:
    """The newest runs, filtered by status and by text in the task."""
    service = _service(request)
    records = await service.list_runs(limit, status=status, text=q)
    idle = await service.idle(records)  # unfinished and executed by nobody: queued, or stopped
    return [_summary(record) | {"idle": idle.get(record.id)} for record in records]


@router.post("/runs", status_code=201, summary="Start a run", **success(RunOut, "The run, started", 201))
async def create_run(request: Request, body: RunIn) -> dict[str, Any]:
    """Record the run and execute it in this server (or queue it for the workers, `serve --workers`)."""
    service = _service(request)
    settings = service.settings
    problem = unknown_policy_tool(body.options.tool_policies, settings.mcp_servers)
    if problem is not None:  # a field of the body, named as any other invalid field is (422)
        where = ("body", "options", "tool_policies")
        raise RequestValidationError([{"type": "value_error", "loc": where, "msg": problem}])
    options = RunOptions(
        **body.options.model_dump(exclude={"tool_policies"}),
        tool_policies=dict(body.options.tool_policies),
    )
    workspace = Path(body.workspace) if body.workspace else None
    executions: Executions = request.app.state.executions
    record = await service.create(
        body.task,
        model=body.model if body.model is not None else settings.model,
        options=options,
        workspace=workspace,
        for_workers=executions.for_workers,
        by=answerer_name("web"),
    )
    executions.start(record.id)
    return _summary(record)


@router.get("/runs/{run_id}", summary="A run's report", **success(RunReportOut, "The report"))
async def get_run(request: Request, run_id: str) -> dict[str, Any]:
    """Status, plan, agents' prompts, steps (sub-steps under their step), usage, messages, notes.

    `waiting`: for a run queued for workers that no running worker can take, what it waits for.
    """
    service = _service(request)
    record = await _run(service, run_id)
    report = await service.report(record.id)
    return (
        _summary(record)
        | report
        | {
            "agents": {k: v.to_json_dict() for k, v in record.agents.items()},
            "waiting": None if (said := await service.waiting(record)) is None else said_here(request, said),
        }
    )


@router.get("/runs/{run_id}/events", summary="A run's events", **success(list[EventOut], "The events"))
async def run_events(
    request: Request,
    run_id: str,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="Events after this seq.")] = 0,
) -> list[dict[str, Any]]:
    """The run's events with a sequence number above `after`, in order."""
    service = _service(request)
    record = await _run(service, run_id)
    return [event.to_json_dict() for event in await service.events(record.id, after)]


@streams.get(
    "/runs/{run_id}/events/stream",
    response_class=EventSourceResponse,
    summary="A run's events, live",
    responses=_JSON_REFUSALS,
)
async def stream_events(
    request: Request,
    record: Annotated[RunRecord, Depends(existing_run)],
    after: Annotated[int, Query(ge=0, le=MAX_SEQ, description="Events after this seq.")] = 0,
    last_event_id: Annotated[str | None, Header(description="Set by a reconnecting EventSource.")] = None,
) -> AsyncIterator[ServerSentEvent]:
    """Server-sent events, one per run event (`event` = its kind, `id` = its seq), until the run is over."""
    service = _service(request)
    after = max(after, event_seq(last_event_id))
    async for event in service.follow(record.id, after):
        yield ServerSentEvent(data=event.to_json_dict(), event=event.kind, id=str(event.seq))


@router.post("/runs/{run_id}/cancel", summary="Cancel a run", **success(RunOut, "The run"))
async def cancel_run(request: Request, run_id: str) -> dict[str, Any]:
    """Ask the run to stop; its running steps stop within moments, wherever they run."""
    service = _service(request)
    record = await _run(service, run_id)
    with _conflict(request):  # a run that has ended
        return _summary(await service.cancel(record.id, wait_s=2.0, by=answerer_name("web")))


@router.post("/runs/{run_id}/resume", summary="Go on with a stopped run", **success(RunOut, "The run"))
async def resume_run(request: Request, run_id: str) -> dict[str, Any]:
    """Execute, in this server, a run whose process stopped (`idle` is `stopped`) from where it stopped.

    Refused (409) when the run has ended, is being executed, is queued for the workers, or this
    server executes nothing (`serve --workers`).
    """
    record = await _run(_service(request), run_id)
    executions: Executions = request.app.state.executions
    with _conflict(request):
        return _summary(await executions.resume(record.id))


@router.post(
    "/runs/{run_id}/retry",
    summary="Retry a failed run from where it failed",
    **success(RunOut, "The run, started again"),
)
async def retry_run(request: Request, run_id: str, body: RetryIn | None = None) -> dict[str, Any]:
    """Run a failed run again: its succeeded steps are kept, the others run afresh.

    Executed by this server, or queued for the workers (`serve --workers`). Refused (409) when
    the run did not fail, when it has used up a budget the body does not raise, or when another
    live process holds it (still ending it: named, retry once it lets go).
    """
    service = _service(request)
    record = await _run(service, run_id)
    executions: Executions = request.app.state.executions
    budgets = (body or RetryIn()).model_dump()
    with _conflict(request):
        retried = await service.retry(
            record.id, by=answerer_name("web"), for_workers=executions.for_workers, **budgets
        )
    executions.start(retried.id, again=True)
    return _summary(retried)


@router.post("/runs/{run_id}/feedback", summary="Rate a finished run", **success(FeedbackOut, "What changed"))
async def rate_run(request: Request, run_id: str, body: FeedbackIn) -> dict[str, Any]:
    """Rate the run's agents and team; at 2 or less, lessons are written for its agents."""
    service = _service(request)
    record = await _run(service, run_id)
    if record.status not in FINISHED_RUN_STATUSES:
        raise HTTPException(409, f"run {record.id} is {record.status}: rate it when it has finished")
    with _conflict(request):  # a run with no plan or no agents to rate
        summary = await service.feedback(
            record.id, rating=body.rating, comment=body.comment, by=answerer_name("web")
        )
    return {
        "rated_agents": summary.rated_agents,
        "cohort_rated": summary.cohort_rated,
        "lessons": summary.lessons,
    }


@router.post(
    "/runs/{run_id}/remember",
    summary="Store the team of a run that succeeded",
    **success(RememberedOut, "The team, stored"),
)
async def remember_run(request: Request, run_id: str) -> dict[str, str]:
    """Store the run's agents and team in the registry, as a yes to its remember question does.

    For a team that was not stored (`remember_runs = never`, or storing it failed). Refused (409),
    nothing changed, when the run did not succeed, still asks whether to store its team (answer
    that request), has a team holding what looks like a secret, or has its team stored already.
    Storing it failing is no refusal: the database's failure is a 500 (503 when it cannot be
    reached), a setting the registry refuses (its embedder) a 400, as anywhere in the API.
    """
    service = _service(request)
    record = await _run(service, run_id)
    with _conflict(request):
        return {"cohort": await service.remember(record.id, by=answerer_name("web"))}


@router.get("/requests", summary="Open requests", **success(list[RequestOut], "The requests"))
async def pending_requests(
    request: Request, run_id: Annotated[str | None, Query(description="Only this run's.")] = None
) -> list[dict[str, Any]]:
    """The open requests runs wait on (plan reviews, tool approvals, questions, replans), oldest first."""
    service = _service(request)
    if run_id is not None:
        run_id = (await _run(service, run_id)).id
    return [{**item.to_json_dict(), "summary": item.summary()} for item in await service.pending(run_id)]


@router.get("/requests/{request_id}", summary="A request", **success(RequestOut, "The request"))
async def get_request(request: Request, request_id: str) -> dict[str, Any]:
    """One request in whatever state it is."""
    found = await _request(_service(request), request_id)
    return {**found.to_json_dict(), "summary": found.summary()}


@router.post(
    "/requests/{request_id}/answer",
    summary="Answer a request",
    **success(AnsweredRequestOut, "The request, answered (by this answer, or by this answer sent before)"),
)
async def answer_request(request: Request, request_id: str, body: AnswerIn) -> dict[str, Any]:
    """Answer an open request; the run waiting on it goes on in whichever process runs it.

    The same answer sent again to a request this server's answers answered so (a client that lost
    the reply) is taken once: 200 with the request, `taken_before` true. Another answer to a
    request no longer open, or one another front end gave, is a 409.
    """
    service = _service(request)
    found = await _request(service, request_id)
    by = answerer_name("web")
    try:
        _check_fits(found, body)
        if body.decision is not None:
            answered = await service.answer(found.id, body.decision, by=by)
        else:
            answered = await service.answer_plainly(
                found.id, by=by, approve=body.approve, text=body.text, reason=body.reason
            )
    except RequestError:
        if found.state == "open":  # not taken as it does not fit (422), or lost a race (409)
            raise
        who = f" by {found.answered_by}" if found.answered_by else ""
        raise HTTPException(
            409, f"request {found.id} is {found.state}{who}: it takes no answer now"
        ) from None
    return {
        **answered.to_json_dict(),
        "summary": answered.summary(),
        "taken_before": answered.taken_before,
        "follow_up_failed": answered.follow_up_failed,
    }


async def _request(service: RunService, request_id: str) -> StoredRequest:
    try:
        return await service.request(request_id)
    except RequestError:
        raise HTTPException(404, f"no request {quoted_id(request_id)}") from None


def _check_fits(found: StoredRequest, body: AnswerIn) -> None:
    """`RequestError` when the answer's form does not fit the request's kind (in the API's words)."""
    given = [name for name in ("approve", "text", "decision") if getattr(body, name) is not None]
    if len(given) != 1:
        raise RequestError("answer with exactly one of approve (true or false), text, or decision")
    if body.reason is not None and body.approve is not False:
        raise RequestError("a reason goes with approve false")
    if found.kind == "ask_user" and body.text is None:
        raise RequestError(f"request {found.id} is an agent's question: answer it with a text")
    if found.kind != "ask_user" and body.text is not None:
        raise RequestError(f"request {found.id} asks yes or no: answer it with approve true or false")
    if body.decision is not None and found.kind not in ("plan_review", "replan"):
        raise RequestError(
            f"request {found.id} is a {found.kind}: a decision answers a plan review or a replan"
        )
