"""The web app: the pages and the REST API over the run service, errors in our words, its access rules."""

from __future__ import annotations

import contextlib
import email.message
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlencode, urlsplit

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._version import __version__
from ..errors import (
    NUL_PROBLEM,
    AgentEditError,
    DatabaseError,
    DatabaseUnavailableError,
    MasterplannerError,
    PlanError,
    RequestClosedError,
    RequestError,
    known_fields,
    nul_at,
    problem_in_our_words,
)
from ..service import RegistryService, RunService
from . import files, login, pages
from . import registry as registry_routes
from .api import Executions, router, said_here, streams
from .auth import COOKIE, is_loopback, same_token, token_matches

__all__ = ["MAX_BODY_BYTES", "create_app"]

MAX_BODY_BYTES = 4 * 1024 * 1024
"""The largest request body taken (a plan edit with every prompt is far smaller); larger is a 413."""

_log = logging.getLogger("masterplanner.web")


def create_app(
    service: RunService,
    *,
    token: str | None = None,
    registry: RegistryService | None = None,
    for_workers: bool = False,
) -> FastAPI:
    """The app over `service`; with `token`, every request must carry it (`Authorization: Bearer`).

    With `for_workers`, runs created through it are queued for the workers (`masterplanner
    worker`) and the request returns at once; otherwise this server executes them.

    Without a token the app answers only requests addressed to a loopback name (`Host`), so a
    web page elsewhere cannot reach it through a name that resolves to 127.0.0.1; and it refuses
    every state-changing request a browser marks as coming from another site.
    """

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await app.state.executions.stop()
        app.state.registry.close()

    app = FastAPI(
        title="masterplanner",
        version=__version__,
        summary="Plan a task into cooperating agents, review it, run it.",
        lifespan=lifespan,
        dependencies=[Depends(_no_nul_in_body)],
    )
    app.state.service = service
    app.state.token = token
    app.state.registry = registry or RegistryService(service.settings)
    app.state.executions = Executions(service, for_workers=for_workers)
    app.include_router(router)
    app.include_router(streams)
    app.include_router(login.router)
    app.include_router(pages.router)
    app.include_router(files.router)
    app.include_router(registry_routes.api)
    app.include_router(registry_routes.pages)
    app.mount("/static", StaticFiles(packages=[("masterplanner.web", "static")]), name="static")
    app.add_exception_handler(RequestValidationError, _invalid_request)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(MasterplannerError, _our_error)
    app.add_exception_handler(Exception, _unexpected)
    app.add_middleware(_BodyLimit)  # innermost: its error reaches the app's handlers as it is
    app.add_middleware(_HeadAsGet)
    if token is not None:
        app.middleware("http")(_require(token))
    app.middleware("http")(_same_site_only(loopback_only=token is None))  # outermost
    return app


def _error(status: int, message: str, **more: Any) -> JSONResponse:
    return JSONResponse({"error": message, **more}, status_code=status)


_HEADINGS = {404: "Not found", 500: "Something failed", 503: "The database cannot be reached"}


def _opens_a_page(request: Request) -> bool:
    """Whether a browser is opening a page: not the API, nor a page's own requests (HTMX, its stream)."""
    return (
        request.method in ("GET", "HEAD")
        and not request.url.path.startswith(("/api/", "/static/"))
        and "hx-request" not in request.headers
        and "text/html" in request.headers.get("accept", "")
    )


def _sends_a_form(request: Request) -> bool:
    """Whether a browser is sending a page's plain form (not the API, nor a page's HTMX request)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    return (
        request.method == "POST"
        and not request.url.path.startswith("/api/")
        and "hx-request" not in request.headers
        and "text/html" in request.headers.get("accept", "")
        and kind in ("application/x-www-form-urlencoded", "multipart/form-data")
    )


async def _fields(request: Request) -> list[tuple[str, Any]] | None:
    """A form's fields, read only when it says it is within `MAX_BODY_BYTES` (else None).

    (Read before `_BodyLimit`, which stops a longer one as it arrives.)
    """
    declared = request.headers.get("content-length", "")
    if not (declared.isascii() and declared.isdigit()) or int(declared) > MAX_BODY_BYTES:
        return None
    try:
        return list((await request.form()).multi_items())
    except (HTTPException, ValueError):  # a body that is not the form it says it is
        return None


def _refused(request: Request, status: int, message: str, **more: Any) -> Response:
    """A refusal as the asker reads it: a page for a browser opening a page, else JSON.

    A stale link or a mistyped address (`/runs/nope`, `/runs?status=bogus`) showed a browser a
    bare JSON document; the API, and the page's own HTMX requests, keep the JSON.
    """
    if not _opens_a_page(request):
        return _error(status, message, **more)
    heading = _HEADINGS.get(status, "That cannot be shown")
    context = {"heading": heading, "message": message}
    return pages.templates.TemplateResponse(request, "error.html", context, status_code=status)


def _known_fields(request: Request, item: Any) -> str:
    """`; known: …`, the fields the body takes where an unknown one was sent (else nothing)."""
    location = tuple(item.get("loc", ()))
    body = getattr(request.scope.get("route"), "body_field", None)
    if item.get("type") != "extra_forbidden" or body is None or location[:1] != ("body",):
        return ""
    known = known_fields(body.field_info.annotation, location[1:-1])
    return f"; known: {', '.join(known)}" if known else ""


async def _invalid_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    problems = []
    json_sent = request.headers.get("content-type", "").split(";")[0].strip().lower() == "application/json"
    for item in exc.errors():
        if item.get("type") == "json_invalid":
            at = item.get("loc", ())[-1]
            problems.append(f"the body is not valid JSON (near character {at})")
            continue
        if tuple(item.get("loc", ())) == ("body",) and isinstance(item.get("input"), bytes) and not json_sent:
            problems.append("body: should be JSON, sent with the header Content-Type: application/json")
            continue
        where = ".".join(str(part) for part in item.get("loc", ()))
        problem = problem_in_our_words(item) + _known_fields(request, item)
        problems.append(f"{where}: {problem}" if where else problem)
    return _refused(request, 422, "the request is invalid: " + "; ".join(problems), problems=problems)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
        # FastAPI's words for a body it could not decode (a charset other than UTF-8, nesting
        # deeper than the JSON reader goes, an integer longer than Python reads): the same answer
        # as any other body that is not JSON
        problem = (
            "the body could not be read as JSON: it is not UTF-8, nests too deep or holds a number "
            "of more than 4,300 digits"
        )
        return _refused(request, 422, f"the request is invalid: {problem}", problems=[problem])
    words = {
        404: "no such page or resource",
        405: "that method is not allowed here",
        413: _TOO_LARGE,
    }
    detail = exc.detail if isinstance(exc.detail, str) and exc.status_code not in (405, 413) else None
    if detail in (None, "Not Found"):
        detail = words.get(exc.status_code, "the request was refused")
    response = _refused(request, exc.status_code, str(detail))
    response.headers.update(exc.headers or {})
    if exc.status_code == 405:  # every method of the path, not only the first route's
        response.headers["Allow"] = ", ".join(sorted(_methods(request)))
    return response


_METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")


def _methods(request: Request) -> set[str]:
    """The methods some route takes at the request's path (HEAD wherever GET is: `_HeadAsGet`)."""
    found = {
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] == Match.FULL
            for route in request.app.router.routes
        )
    }
    return found | ({"HEAD"} if "GET" in found else set())


async def _our_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, MasterplannerError)
    said = said_here(request, exc)  # what to do, as the asker does it
    if isinstance(exc, PlanError | AgentEditError):
        return _refused(request, 422, said, problems=exc.problems)
    if isinstance(exc, RequestClosedError):  # the losing answer of two given at once
        return _refused(request, 409, said)
    if isinstance(exc, RequestError):
        return _refused(request, 422, said)
    if isinstance(exc, DatabaseUnavailableError):
        return _refused(request, 503, said)
    if isinstance(exc, DatabaseError):  # the server's failure (a full disk), said in its words
        return _refused(request, 500, said)
    return _refused(request, 400, said)


async def _unexpected(request: Request, exc: Exception) -> Response:
    _log.exception("unexpected error", exc_info=exc)
    return _refused(request, 500, "the server failed on this request; its log has the details")


_Next = Callable[[Request], Awaitable[Response]]


_OPEN_PATHS = ("/login", "/static/", "/api/v1/health")


def _require(token: str) -> Callable[[Request, _Next], Awaitable[Response]]:
    """Middleware that refuses every request without the token (header or login cookie).

    A page a browser opens without it is sent to the login page instead, and a page's plain form
    a browser sends is answered with the login page, which sends it again once logged in
    (`login.form_not_taken`; it showed a 401 in JSON). Anything else gets a 401 in JSON: a
    program (the API, /openapi.json), and a page's own requests, whose script says the login has
    ended (a run page's refresh followed the redirect and showed the login page inside the run's
    body; an answer it sent was refused as an error of the server's).
    """

    async def check(request: Request, call_next: _Next) -> Response:
        path = request.url.path
        if (
            token_matches(request.headers.get("authorization"), token)
            or same_token(request.cookies.get(COOKIE), token)
            or path.startswith(_OPEN_PATHS)
        ):
            return await call_next(request)
        if _opens_a_page(request):
            asked = path + (f"?{request.url.query}" if request.url.query else "")
            return RedirectResponse(f"/login?{urlencode({'next': asked})}", status_code=303)
        if _sends_a_form(request):
            return login.form_not_taken(request, await _fields(request))
        return _error(
            401,
            "this server needs its token: send `Authorization: Bearer TOKEN` or log in at /login "
            "(the token is in the web-token file of the server's home directory)",
        )

    return check


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def _same_site_only(*, loopback_only: bool) -> Callable[[Request, _Next], Awaitable[Response]]:
    """Middleware against cross-site request forgery and, on loopback, DNS rebinding."""

    async def check(request: Request, call_next: _Next) -> Response:
        host = request.headers.get("host", "")
        if loopback_only and not is_loopback(urlsplit(f"//{host}").hostname or ""):
            return _error(403, f"this server answers only to a loopback address, not to host {host!r}")
        if request.method not in _SAFE_METHODS:
            if request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
                return _error(403, "a request from another site cannot change anything here")
            origin = request.headers.get("origin")
            if origin and origin != "null" and urlsplit(origin).netloc != host:
                return _error(403, f"a request from {origin} cannot change anything here")
        return await call_next(request)

    return check


_TOO_LARGE = f"the request body is over {MAX_BODY_BYTES // (1024 * 1024)} MiB"


async def _no_nul_in_body(request: Request) -> None:
    """Refuses a JSON body with a NUL character in any string, naming the field.

    No text stored holds one (`database.names_nothing`): Postgres refuses it in its own words
    (naming its URL), after an answer had been taken with a 200 and the run then failed on it.
    Every body FastAPI reads as JSON is checked (`_read_as_json`): one sent as
    `application/vnd.api+json` skipped it, and a feedback comment with a NUL was then a 400.
    A body that is not JSON is left to the route, which says so.
    """
    if request.method not in ("POST", "PUT", "PATCH"):
        return
    if not _read_as_json(request.headers.get("content-type")):
        return
    try:
        sent = json.loads(await request.body())
    except (ValueError, RecursionError):
        return
    where = nul_at(sent)
    if where is not None:
        raise RequestValidationError([{"type": "value_error", "loc": ("body", *where), "msg": NUL_PROBLEM}])


def _read_as_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this type as JSON (`fastapi.routing`, strict content types).

    `application/json` and any `application/…+json`, in any case and with any parameters,
    parsed as FastAPI parses it; without a type, no (FastAPI's `strict_content_type`).
    """
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    json_subtype = subtype == "json" or subtype.endswith("+json")
    return message.get_content_maintype() == "application" and json_subtype


class _BodyLimit:
    """Refuses a body over `MAX_BODY_BYTES` with a 413.

    At once when its declared length is over; else when the bytes read pass the limit, as an
    HTTP error the app's handler words.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await _error(413, _TOO_LARGE)(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > MAX_BODY_BYTES:
                    raise HTTPException(413, _TOO_LARGE)
            return message

        await self.app(scope, limited, send)


class _HeadAsGet:
    """Answers HEAD as GET without the body (FastAPI's routes take only the methods they name).

    Uptime checks and link checkers ask with HEAD; it was a 405 for every page and the health check.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        ended = False

        async def headers_only(message: Message) -> None:
            nonlocal ended
            if ended:  # a stream's later parts: the client has its answer
                return
            if message["type"] == "http.response.body":
                ended = True
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)
