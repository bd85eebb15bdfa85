"""The pages: runs, a new task, and a run's page (review, requests, steps, live events, files).

Rendered on the server from Jinja templates (`StrictUndefined`); HTMX (vendored in `static/`)
swaps the run's body when the run's server-sent `change` events arrive and posts the forms.
Every action is a run service call, as in the API. The login is `login.py`'s; a run's workspace
files are listed and served by `files.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.sse import EventSourceResponse, ServerSentEvent
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from ..engine.records import (
    BUDGET_LIMITS,
    FINISHED_RUN_STATUSES,
    WHOLE_OPTION_LIMITS,
    Event,
    RunOptions,
    RunRecord,
)
from ..errors import (
    DatabaseError,
    MasterplannerError,
    PlanError,
    RequestClosedError,
    RunError,
    quoted_id,
)
from ..estimate import estimate_run
from ..event_text import clock, event_detail, status_word
from ..feedback import comment_problem
from ..redaction import REMOVED, redacted
from ..review import critique_note
from ..service import Request as StoredRequest
from ..service import RunService, answerer_name, typed_secrets_removed
from ..usage import budget_money, money
from .api import Executions, event_seq, existing_run, said_here
from .api_bodies import workspace_path
from .files import workspace_files
from .graph import plan_svg

__all__ = ["router", "templates"]

router = APIRouter(include_in_schema=False)

templates = Jinja2Templates(
    env=Environment(
        loader=PackageLoader("masterplanner.web", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
    )
)
templates.env.globals["event_detail"] = event_detail  # an event's words, as the terminal says them
templates.env.globals["status_word"] = status_word  # `waiting`, `awaiting approval`: the README's words
templates.env.globals["clock"] = clock  # an event's time, local, as `runs show` says it
templates.env.globals["critique_note"] = critique_note  # the critic's scores, as the terminal says them

STATUSES = ("planning", "awaiting_approval", "running", "succeeded", "failed", "cancelled")
_log = logging.getLogger("masterplanner.web")


def _service(request: Request) -> RunService:
    service: RunService = request.app.state.service
    return service


@router.get("/")
async def home() -> RedirectResponse:
    """The runs page."""
    return RedirectResponse("/runs", status_code=303)


@router.get("/runs", response_class=HTMLResponse)
async def runs_page(request: Request, status: str = "", q: str = "") -> Response:
    """Runs, newest first, filtered by status and by text in the task."""
    service = _service(request)
    shown = await service.list_runs(100, status=status or None, text=q.strip() or None)
    context = {
        "runs": shown,
        "idle": await service.idle(shown),
        "status": status,
        "q": q,
        "statuses": STATUSES,
    }
    return templates.TemplateResponse(request, "runs.html", context)


_DEFAULT = RunOptions()
_NEW_RUN_FIELDS: tuple[tuple[str, str, tuple[int, int], int], ...] = (
    ("max_parallel", "Steps running at once", WHOLE_OPTION_LIMITS["max_parallel"], _DEFAULT.max_parallel),
    (
        "prompt_rounds",
        "Critique-and-revise rounds per prompt",
        WHOLE_OPTION_LIMITS["prompt_rounds"],
        _DEFAULT.prompt_rounds,
    ),
    (
        "max_model_calls",
        "Model calls for the whole run",
        (1, int(BUDGET_LIMITS["max_model_calls"])),
        _DEFAULT.max_model_calls or 0,
    ),
    ("max_replans", "Replans of failed steps", WHOLE_OPTION_LIMITS["max_replans"], _DEFAULT.max_replans),
)
"""The new-task form's whole-number options: name, label, bounds, default (`RunOptions`'s)."""


@router.get("/new", response_class=HTMLResponse)
async def new_page(request: Request) -> Response:
    """The new-task form."""
    settings = _service(request).settings
    return templates.TemplateResponse(request, "new.html", _new_context(model=settings.model))


def _new_context(
    *,
    model: str,
    error: str | None = None,
    task: str = "",
    workspace: str = "",
    yes: bool = False,
    typed: dict[str, str] | None = None,
    check_outputs: bool = False,
    team: str = "",
) -> dict[str, Any]:
    """What `new.html` shows: the form as the person left it, when it comes back with `error`."""
    return {
        "error": error,
        "task": task,
        "model": model,
        "workspace": workspace,
        "yes": yes,
        "fields": _NEW_RUN_FIELDS,
        "typed": typed or {},
        "check_outputs": check_outputs,
        "team": team,
    }


@router.post("/new", response_class=HTMLResponse)
async def create_run(request: Request) -> Response:
    """Start the run this server executes; its page shows the plan for review when it is ready."""
    form = await request.form()
    service = _service(request)
    # a textarea's line breaks come as CRLF: stored as the LF every other front end stores
    task, model = form_text(form, "task").strip(), str(form.get("model", "")).strip()
    workspace, yes = str(form.get("workspace", "")).strip(), form.get("yes") == "on"
    team, check_outputs = str(form.get("team", "")), form.get("check_outputs") == "on"
    typed = {name: str(form.get(name, "")).strip()[:100] for name, *_ in _NEW_RUN_FIELDS}

    def refused(error: str) -> Response:  # the form again as the person left it, with the error
        # a secret typed into the task is not sent back (nothing of it was stored): taken out, and
        # said so; before, the form echoed the task as typed, key included
        shown = redacted(task)
        if shown != task:
            error += f"; the form shows your task with the secret taken out (marked {REMOVED})"
        context = _new_context(
            model=model,
            error=error,
            task=shown,
            workspace=workspace,
            yes=yes,
            typed=typed,
            check_outputs=check_outputs,
            team=team,
        )
        return templates.TemplateResponse(request, "new.html", context, status_code=422)

    try:
        if workspace:
            try:
                workspace_path(workspace)
            except ValueError as problem:
                raise ValueError(f"the workspace folder {problem}") from None
        wholes = {
            name: _whole(form, name, default, *limits, label)
            for name, label, limits, default in _NEW_RUN_FIELDS
        }
        options = RunOptions(
            auto_approve=yes,
            tool_policies=dict(service.settings.tool_policies),
            check_outputs=check_outputs,
            team_tools={"on": True, "off": False}.get(team),
            **wholes,
        )
    except ValueError as problem:
        return refused(str(problem))
    try:
        record = await service.create(
            task,
            model=model or service.settings.model,
            options=options,
            workspace=Path(workspace) if workspace else None,
            for_workers=request.app.state.executions.for_workers,
            by=answerer_name("web"),
        )
    except MasterplannerError as error:
        return refused(said_here(request, error))
    request.app.state.executions.start(record.id)
    return RedirectResponse(f"/runs/{record.id}", status_code=303)


def _whole(form: Any, name: str, default: int, lowest: int, highest: int, label: str | None = None) -> int:
    """A whole-number field of a form (`default` when left empty); ValueError naming it otherwise."""
    text = str(form.get(name, "")).strip()
    if not text:
        return default
    if not (text.isascii() and text.isdigit()) or not lowest <= int(text) <= highest:
        what = label or name.replace("_", " ")
        raise ValueError(f"{what} must be a whole number from {lowest} to {highest}, not {text[:40]!r}")
    return int(text)


def _amount(form: Any, name: str, highest: float, label: str) -> float | None:
    """A positive number field of a form (None when left empty); ValueError naming it otherwise."""
    text = str(form.get(name, "")).strip()
    if not text:
        return None
    try:
        value = float(text) if text.isascii() else float("nan")
    except ValueError:
        value = float("nan")
    if not 0 < value <= highest:  # also NaN and infinity
        raise ValueError(f"{label} must be a number more than 0 and at most {highest:g}, not {text[:40]!r}")
    return value


def _most(budget: str) -> int:
    """The largest whole-number budget `budget` may be (`BUDGET_LIMITS`)."""
    return int(BUDGET_LIMITS[budget])


_RETRY_FIELDS = ("max_model_calls", "max_tokens", "max_cost_usd", "max_wall_s", "prompt_rounds")
"""The retry form's fields (budgets, critique rounds), named as `RunService.retry` takes them."""


@router.get("/runs/{run_id}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: str) -> Response:
    """A run: its review or progress, requests answered inline, live while it runs."""
    record = await existing_run(request, run_id)
    return templates.TemplateResponse(request, "run.html", await _body_context(request, record, None))


@router.get("/runs/{run_id}/body", response_class=HTMLResponse)
async def run_body(request: Request, run_id: str) -> Response:
    """The run page's changing part (what `change` events refresh).

    `?failed=1` is a failed run's page asking whether it was retried elsewhere: if so the whole
    page loads again (its live event stream closed when the run ended); if not, nothing (204).
    """
    record = await existing_run(request, run_id)
    if request.query_params.get("failed") == "1":
        if record.status == "failed":
            return Response(status_code=204)
        return Response(status_code=200, headers={"HX-Refresh": "true"})
    return templates.TemplateResponse(request, "_run_body.html", await _body_context(request, record, None))


@router.get("/runs/{run_id}/changes", response_class=EventSourceResponse)
async def run_changes(
    request: Request, record: Annotated[RunRecord, Depends(existing_run)]
) -> AsyncIterator[ServerSentEvent]:
    """A `change` event whenever the run has new events, then `over` when it has ended.

    `?after=SEQ`: the events the page was rendered with, which need no refetch (a reconnecting
    browser's `Last-Event-ID` goes further). The stream also ends, with no `over`, when the server
    stops (`RunService.stop_following`).
    """
    service = _service(request)
    rendered = event_seq(request.query_params.get("after"))
    after = max(rendered, event_seq(request.headers.get("last-event-id")))
    async for event in service.follow(record.id, after):
        yield ServerSentEvent(data=event.kind, event="change", id=str(event.seq))
    if service.following:  # not when the server stops: the page reconnects to the next one
        yield ServerSentEvent(data="over", event="over")


@router.post("/runs/{run_id}/requests/{request_id}", response_class=HTMLResponse)
async def answer(request: Request, run_id: str, request_id: str) -> Response:
    """Answer a request from its inline form: yes, no (with a reason), or a text.

    An answer that does not fit is 422 and one to a request no longer open 409, shown with the
    run; the database failing to store it is answered as the API answers it (`app._our_error`:
    500, 503 when it cannot be reached), and the page says it was not taken, to send again.
    """
    service = _service(request)
    record = await existing_run(request, run_id)
    form = await request.form()
    choice = str(form.get("choice", ""))
    problem: dict[str, Any] | None = None
    status = 200
    decision: dict[str, Any] | None = None
    edited: dict[str, Any] | None = None
    answered: StoredRequest | None = None
    try:
        found = await service.request(request_id)
        if found.run_id != record.id:
            raise HTTPException(404, f"run {record.id} has no request {quoted_id(request_id)}")
        if found.kind in ("plan_review", "replan") and choice == "approve":
            decision = _review_decision(found, form)
            # shown again if refused, as the person left it; a secret they typed is not sent
            # back (nothing of it was stored): taken out, and said so below
            edited = typed_secrets_removed(found, decision)
            answered = await service.answer(found.id, decision, by=answerer_name("web"))
        elif found.kind == "ask_user":
            text = str(form.get("text", ""))
            answered = await service.answer_plainly(found.id, by=answerer_name("web"), text=text)
        else:
            reason = str(form.get("reason", "")).strip() or None
            approve = choice == "approve"
            answered = await service.answer_plainly(
                found.id, by=answerer_name("web"), approve=approve, reason=None if approve else reason
            )
    except PlanError as error:
        problem = {"request": request_id, "message": said_here(request, error), "problems": error.problems}
        status = 422
    except RequestClosedError as error:  # answered elsewhere meanwhile, or its run cancelled
        message = f"{said_here(request, error)}; yours was not taken"
        problem, status = {"request": request_id, "message": message, "problems": []}, 409
    except DatabaseError:  # the server's failure (500, 503 when unreachable), not the answer's
        raise
    except MasterplannerError as error:  # the answer does not fit the request
        problem, status = {"request": request_id, "message": said_here(request, error), "problems": []}, 422
    if problem is not None and status == 422 and edited != decision:  # the form is shown again
        problem["message"] += f"; the form shows your edit with the secret taken out (marked {REMOVED})"
    if answered is not None:
        if answered.taken_before:  # sent again, by whoever holds the web's one login: not "you"
            by, at = answered.answered_by, answered.answered_at
            note = f"This answer was taken already (by {by}, at {at}): it is not stored twice."
            if answered.follow_up_failed:  # what it was for was tried again, and failed again
                note += f" But {answered.follow_up_failed}."
            return await _body_once_done(request, record.id, "Your answer was taken", note=note)
        if answered.follow_up_failed:
            note = f"Your answer was taken, but {answered.follow_up_failed}."
            return await _body_once_done(request, record.id, "Your answer was taken", note=note)
        return await _body_once_done(request, record.id, "Your answer was taken")
    assert problem is not None
    record = await service.get(record.id)
    context = await _body_context(request, record, problem, edited=edited)
    return templates.TemplateResponse(request, "_run_body.html", context, status_code=status)


TAKEN_EVENT = "runActionTaken"
"""The event (`HX-Trigger`) of a 204 that took what was sent but cannot show the run, or (after the
swap) of a body shown with a note on how what was sent was taken; its value says so."""


async def _body_once_done(request: Request, run_id: str, done: str, *, note: str | None = None) -> Response:
    """The run's body after what the person sent was stored (`done` says what it was).

    `note`: what the page says above the body besides (`TAKEN_EVENT`), as an answer sent again, or
    one whose follow-up failed, is said.

    When the run cannot be read or shown then (the database lost, say), a success still: what
    they sent was taken, and the page is told so (a 204 with `TAKEN_EVENT`: the body stays). Before, it
    was a 5xx: the page said "not sent … send it again", and the answer sent again was refused
    as answered ("yours was not taken").
    """
    try:
        context = await _body_context(request, await _service(request).get(run_id), None)
        # after the swap: the page hides its notes when a form's response is swapped in
        headers = {"HX-Trigger-After-Swap": json.dumps({TAKEN_EVENT: note})} if note else None
        return templates.TemplateResponse(request, "_run_body.html", context, headers=headers)
    except Exception as error:
        if isinstance(error, MasterplannerError):
            why = said_here(request, error)
        else:
            _log.exception(
                "run %s: the body could not be shown after %s", run_id, done.lower(), exc_info=error
            )
            why = "the server failed to read it; its log has the details"
        said = (
            f"{done}, but the page could not show the run as it is now ({why}): it shows it at the "
            "run's next change, or when the page is loaded again."
        )
        said = f"{note} {said}" if note else said
        return Response(status_code=204, headers={"HX-Trigger": json.dumps({TAKEN_EVENT: said})})


@router.post("/runs/{run_id}/feedback", response_class=HTMLResponse)
async def rate(request: Request, run_id: str) -> Response:
    """Rate the finished run from its page; the body says what the rating changed.

    A rating or comment it cannot take is 422, and so is a refusal (a run rated meanwhile from
    another page), shown with the run. A failure to store it is answered as the API answers it
    (`app._our_error`): the database failing 500 (503 when it cannot be reached), a setting (the
    run's model a low rating's analysis needs, the registry's embedder) 400.
    """
    service = _service(request)
    record = await existing_run(request, run_id)
    form = await request.form()
    rating, comment = str(form.get("rating", "")), str(form.get("comment", "")).strip()[:4000]
    context = await _body_context(request, record, None)
    if not (rating.isascii() and rating.isdigit()) or not 1 <= int(rating) <= 5:
        context["rated"] = {"error": "choose a rating from 1 to 5"}
        return templates.TemplateResponse(request, "_run_body.html", context, status_code=422)
    problem = comment_problem(comment)  # what was typed, told apart from a setting's error
    if problem is not None:
        context["rated"] = {"error": problem}
        return templates.TemplateResponse(request, "_run_body.html", context, status_code=422)
    try:
        summary = await service.feedback(
            record.id, rating=int(rating), comment=comment, by=answerer_name("web")
        )
    except DatabaseError:  # the server's failure, not a refusal
        raise
    except RunError as error:  # refused
        # as it is now: rated meanwhile from another page, say
        context = await _body_context(request, await service.get(record.id), None)
        context["rated"] = {"error": said_here(request, error)}
        return templates.TemplateResponse(request, "_run_body.html", context, status_code=422)
    context = await _body_context(request, await service.get(record.id), None)
    lessons = sum(len(items) for items in summary.lessons.values())
    context["rated"] = {
        "message": f"Rated {rating}/5: {len(summary.rated_agents)} agents"
        + (" and the team" if summary.cohort_rated else "")
        + (f"; {lessons} lessons written for next time" if lessons else "")
    }
    return templates.TemplateResponse(request, "_run_body.html", context)


@router.post("/runs/{run_id}/remember", response_class=HTMLResponse)
async def remember(request: Request, run_id: str) -> Response:
    """Store the team of the run that succeeded (`RunService.remember`); the body says it, or why not.

    A refusal (the run asks whether to store its team, the team is stored already: a page that
    showed the button before) is a 409, shown with the run as it is now. A failure to store it is
    answered as the API answers it (`app._our_error`): the database failing 500 (503 when it
    cannot be reached), a setting the registry refuses (its embedder) 400; the page says it was
    not taken, and why.
    """
    service = _service(request)
    record = await existing_run(request, run_id)
    try:
        cohort = await service.remember(record.id, by=answerer_name("web"))
    except DatabaseError:  # the server's failure, not a refusal
        raise
    except RunError as error:  # refused
        context = await _body_context(request, await service.get(record.id), None)
        context["remembered"] = {"error": said_here(request, error)}
        return templates.TemplateResponse(request, "_run_body.html", context, status_code=409)
    context = await _body_context(request, await service.get(record.id), None)
    context["remembered"] = {"cohort": cohort}
    return templates.TemplateResponse(request, "_run_body.html", context)


@router.post("/runs/{run_id}/cancel", response_class=HTMLResponse)
async def cancel(request: Request, run_id: str) -> Response:
    """Cancel the run; the body shows it stopping, or as it is now when it ended meanwhile."""
    service = _service(request)
    found = await existing_run(request, run_id)
    try:
        record = await service.cancel(found.id, wait_s=2.0, by=answerer_name("web"))
    except RunError:
        record = await service.get(found.id)
        if not record.finished:
            raise
        return templates.TemplateResponse(
            request, "_run_body.html", await _body_context(request, record, None)
        )
    return await _body_once_done(request, record.id, "The run was cancelled")


@router.post("/runs/{run_id}/resume", response_class=HTMLResponse)
async def resume(request: Request, run_id: str) -> Response:
    """Go on with a stopped run in this server; the page loads again, following it live.

    Refused (409, shown with the run) as the API refuses it; the database failing is answered as
    the API answers it (`app._our_error`: 500, 503 when it cannot be reached).
    """
    record = await existing_run(request, run_id)
    executions: Executions = request.app.state.executions
    try:
        await executions.resume(record.id)
    except DatabaseError:  # the server's failure (500, 503 when unreachable), not a refusal
        raise
    except RunError as error:  # refused: ended, executed, queued for the workers
        context = await _body_context(request, await _service(request).get(record.id), None)
        context["resume_error"] = said_here(request, error)
        return templates.TemplateResponse(request, "_run_body.html", context, status_code=409)
    # the whole page again: its live event stream may have closed
    return Response(status_code=204, headers={"HX-Redirect": f"/runs/{record.id}"})


@router.post("/runs/{run_id}/retry", response_class=HTMLResponse)
async def retry(request: Request, run_id: str) -> Response:
    """Retry the failed run with the budgets and critique rounds filled in; the page loads again, live.

    A field that is not a number it takes is 422, a budget the run has used up 409, shown under
    the form with what was typed kept. A run that is no longer failed (retried from another page) loads
    again as it is now. The database failing is answered as the API answers it (`app._our_error`:
    500, 503 when it cannot be reached), and the page says the retry was not sent, the form kept.
    """
    service = _service(request)
    record = await existing_run(request, run_id)
    executions: Executions = request.app.state.executions
    form = await request.form()
    typed = {name: str(form.get(name, "")).strip()[:100] for name in _RETRY_FIELDS}
    try:
        given: dict[str, Any] = {  # the budgets (empty: the run's), then the critique rounds
            "max_model_calls": _whole(form, "max_model_calls", 0, 1, _most("max_model_calls"), "model calls")
            or None,
            "max_tokens": _whole(form, "max_tokens", 0, 1, _most("max_tokens"), "tokens") or None,
            "max_cost_usd": _amount(
                form, "max_cost_usd", BUDGET_LIMITS["max_cost_usd"], "the money budget (US dollars)"
            ),
            "max_wall_s": _amount(form, "max_wall_s", BUDGET_LIMITS["max_wall_s"], "seconds"),
        }
        if typed["prompt_rounds"]:  # left empty: the run's (0 is a number of rounds, not "none")
            low, high = WHOLE_OPTION_LIMITS["prompt_rounds"]
            given["prompt_rounds"] = _whole(form, "prompt_rounds", 0, low, high, "critique rounds per prompt")
    except ValueError as error:
        context = await _body_context(request, record, None)
        context["retry"] = {"typed": typed, "error": str(error)}
        return templates.TemplateResponse(request, "_run_body.html", context, status_code=422)
    try:
        record = await service.retry(
            record.id, by=answerer_name("web"), for_workers=executions.for_workers, **given
        )
    except DatabaseError:  # the server's failure (500, 503 when unreachable), not a refusal
        raise
    except MasterplannerError as error:
        now = await service.get(record.id)
        if now.status != "failed":  # retried meanwhile from another page, say: show it as it is
            return Response(status_code=204, headers={"HX-Redirect": f"/runs/{record.id}"})
        context = await _body_context(request, now, None)
        context["retry"] = {"typed": typed, "error": said_here(request, error)}
        return templates.TemplateResponse(request, "_run_body.html", context, status_code=409)
    executions.start(record.id, again=True)
    # the whole page again: its live event stream closed when the run ended
    return Response(status_code=204, headers={"HX-Redirect": f"/runs/{record.id}"})


def form_text(form: Any, name: str) -> str:
    """A form field's text as typed: a browser sends a textarea's line breaks as CRLF.

    Read as sent, an unchanged multi-line prompt differed from the stored one: the review
    marked it edited, and an agent's edit page saved a version that changed nothing.
    """
    return str(form.get(name, "")).replace("\r\n", "\n")


def _as_edited(decision: dict[str, Any] | None) -> dict[str, Any]:
    """The review form's plan, prompts and policies as a refused decision had them (the graph stays)."""
    if decision is None:
        return {}
    return {"plan": decision["plan"], "agents": decision["agents"], "policies": decision["tool_policies"]}


def _review_decision(found: StoredRequest, form: Any) -> dict[str, Any]:
    """The plan review's form as a decision: the plan and prompts as edited, the run's tool policies."""
    payload = found.payload
    plan = dict(payload["plan"])
    agents: dict[str, Any] = {key: dict(value) for key, value in (payload.get("agents") or {}).items()}
    steps = []
    for step in plan["steps"]:
        step_id = step["id"]
        edited = dict(step)
        for field in ("title", "instruction", "agent_role", "expected_output"):
            if f"{field}.{step_id}" in form:
                edited[field] = form_text(form, f"{field}.{step_id}")
        if f"depends_on.{step_id}" in form:
            given = str(form.get(f"depends_on.{step_id}", "")).replace(",", " ").split()
            edited["depends_on"] = list(dict.fromkeys(given))
        if f"tools-shown.{step_id}" in form:
            ticked = [str(tool) for tool in form.getlist(f"tools.{step_id}")]
            kept = [tool for tool in step["tools"] if tool in ticked]  # in the plan's order, new ones after
            edited["tools"] = kept + [tool for tool in ticked if tool not in kept]
        edited["expand"] = form.get(f"expand.{step_id}") == "on"
        steps.append(edited)
        prompt = form_text(form, f"prompt.{step_id}") if f"prompt.{step_id}" in form else None
        if (
            prompt is not None
            and step_id in agents
            and prompt.strip() != str(agents[step_id].get("prompt", "")).strip()
        ):
            agents[step_id] = {**agents[step_id], "prompt": prompt, "edited": True}
    for step in steps:
        prefix = f"steppolicy.{step['id']}."
        chosen = {
            str(key).removeprefix(prefix): str(value)
            for key, value in form.items()
            if str(key).startswith(prefix) and value and str(key).removeprefix(prefix) in step["tools"]
        }
        if step["id"] in agents or chosen:
            agent = {
                key: value for key, value in agents.get(step["id"], {}).items() if key != "tool_policies"
            }
            agents[step["id"]] = agent | ({"tool_policies": chosen} if chosen else {})
    policies = {
        str(key).removeprefix("policy."): str(value)
        for key, value in form.items()
        if str(key).startswith("policy.") and value
    }
    return {
        "action": "approve",
        "plan": {**plan, "steps": steps},
        "agents": agents,
        "tool_policies": policies,
    }


async def _body_context(
    request: Request,
    record: RunRecord,
    problem: dict[str, Any] | None,
    *,
    edited: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What `_run_body.html` shows; `edited`: a refused review decision, shown in the form as typed."""
    service = _service(request)
    # the events first: what is read after them is as new at least, so the page's live stream,
    # which starts after the last of them, misses nothing (read last, an event that came after
    # the run's record was read, its end say, was counted as shown and never sent: the page
    # showed the run running for good)
    events = await service.events(record.id)
    record = await service.get(record.id)
    report = await service.report(record.id)
    requests = await service.pending(record.id)
    states = {step["id"]: step["status"] for step in report["steps"]}
    review = next((item for item in requests if item.kind in ("plan_review", "replan")), None)
    plan = review.payload["plan"] if review is not None else report["plan"]
    agents = (review.payload.get("agents") if review is not None else None) or {
        key: value.to_json_dict() for key, value in record.agents.items()
    }
    reused = {key for key, value in agents.items() if value.get("reused_from") is not None}
    estimate = None
    if review is not None and plan:
        parallel = record.options.max_parallel
        done = {step_id for step_id, state in states.items() if state == "succeeded"}
        estimate = estimate_run(plan, report["usage"], record.model, max_parallel=parallel, done=done)
    step_problems: dict[str, list[str]] = {}
    for text in (problem or {}).get("problems", []):
        head, _, rest = text.partition(": ")
        step_id = head.removeprefix("step ").strip("'") if head.startswith("step ") else ""
        step_problems.setdefault(step_id, []).append(rest if step_id else text)
    finished = record.status in FINISHED_RUN_STATUSES
    return (
        {
            "run": record,
            "report": report,
            "finished": finished,
            "requests": requests,
            "review": review,
            "plan": plan,
            "agents": agents,
            "graph": Markup(plan_svg(plan, reused=reused, states=states)) if plan else None,
            "catalog": (review.payload.get("tools") if review is not None else None) or [],
            "policies": (review.payload.get("tool_policies") if review is not None else None) or {},
        }
        # the refused edit only in the form of the review it answered: one opened since (a
        # replan's, say) is shown as it is
        | (_as_edited(edited) if review is not None and review.id == (problem or {}).get("request") else {})
        | {
            "events": events[-200:],
            "last_seq": events[-1].seq if events else 0,
            "idle": (await service.idle([record])).get(record.id),
            # a server that executes no runs (`--workers`) resumes none: no button it would refuse
            "resumes": not request.app.state.executions.for_workers,
            "resume_error": None,
            "files": await asyncio.to_thread(workspace_files, record.workspace),
            "problem": problem,
            "step_problems": step_problems,
            "rated": None,
            # the service's own question: the page offered a rating it then refused
            "unratable": await service.rating_refusal(record.id) if finished else None,
            "retry": None,
            "remembered": None,
            # the service's own question, as for the rating: a team not stored, that it stores
            "rememberable": await _rememberable(service, record, events),
            "estimate": estimate,
            "waiting": await _waiting(request, service, record),
            "cost": money(report["usage"]["cost_usd"], report["usage"]["unpriced_calls"]),
            "money_budget": None if (most := record.options.max_cost_usd) is None else budget_money(most),
        }
    )


async def _waiting(request: Request, service: RunService, record: RunRecord) -> str | None:
    """Why the run waits (`RunService.waiting`), what to do said with the page's buttons.

    A server that executes no runs (`--workers`) cannot resume one: what to do is the terminal's.
    """
    said = await service.waiting(record)
    return None if said is None else said_here(request, said)


async def _rememberable(service: RunService, record: RunRecord, events: list[Event]) -> bool:
    """Whether the page offers to store the run's team (`RunService.remember` takes it).

    A run that succeeded, that `remember` takes (it is over, asks nothing, holds no secret), and
    whose team no `team_stored` event says stored. A team the registry holds with no such event
    (it was lost) is offered too, and the press is taken: `remember` writes the event then.

    The events are read again after the service's answer: those the page shows were read
    before it, and a run that ended meanwhile has its `team_stored` after them (read only once,
    the page offered the button for a team being stored as its run ended).
    """
    if record.status != "succeeded" or await service.remember_refusal(record.id) is not None:
        return False
    later = await service.events(record.id, events[-1].seq if events else 0)
    return not any(event.kind == "team_stored" for event in [*events, *later])
