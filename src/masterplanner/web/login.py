"""The login (a server started with `--auth`): the token form, its cookie, and a form carried through it.

A browser without the login is sent here (`app._require`); a plain form it sent meanwhile is
answered with the login page holding what was typed (`form_not_taken`), sent on once the token
is taken.
"""

from __future__ import annotations

import re
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ..redaction import redacted
from .auth import COOKIE, same_token
from .pages import templates

__all__ = ["form_not_taken", "router"]

router = APIRouter(include_in_schema=False)

_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
"""Characters no local path to go on to after a login holds (a backslash reads as a slash)."""


def _after_login(asked: object) -> str:
    """Where a login goes on to: the page asked for, if it is one of this server's, else the runs."""
    text = asked if isinstance(asked, str) else ""
    # a path on this server only: "//host" (and "/\\host", a browser reads "\\" as "/") is another site
    local = text.startswith("/") and not text.startswith("//") and not _CONTROL.search(text)
    return text if local else "/runs"


@router.get("/login", response_class=HTMLResponse)
async def login_page(request: Request, then: Annotated[str, Query(alias="next")] = "/runs") -> Response:
    """The token form (only a server started with --auth asks for one)."""
    if request.app.state.token is None:
        return RedirectResponse(_after_login(then), status_code=303)
    return templates.TemplateResponse(request, "login.html", _login_context(None, _after_login(then)))


def _login_context(
    error: str | None, after: str, carried: list[tuple[str, str]] | None = None
) -> dict[str, Any]:
    """What `login.html` shows; `carried`: a form sent without the login, sent again once logged in."""
    return {"error": error, "next": after, "carried": carried or [], "resend": carried is not None}


_CARRIED_NOT = ("token", "next", "resend")
"""The login form's own fields: a form holding one of these is not carried through it."""
_NOT_TAKEN = "Not saved: your login to this server has ended, so the form you sent was not taken."


def form_not_taken(request: Request, fields: list[tuple[str, Any]] | None) -> Response:
    """The login page (401) for a plain form a browser sent without the login; `fields`: what it sent.

    What was typed is carried in the login form, which sends it on to where it was sent once the
    token is taken (`login`: a 307, the browser posts it again). A form holding a secret is not sent
    back: the login goes on to the form's page, to fill in again. (Before, the browser showed a
    bare 401 in JSON, and what was typed was gone.)
    """
    typed = [(name, value) for name, value in fields or [] if isinstance(value, str)]
    secret = any(redacted(value) != value for _, value in typed)
    if (
        fields is not None
        and _sent_from_here(request)
        and len(typed) == len(fields)
        and not secret
        and not any(name in _CARRIED_NOT for name, _ in typed)
    ):
        asked = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        message = f"{_NOT_TAKEN} Log in and it is sent again, as you filled it in."
        context = _login_context(message, _after_login(asked), typed)
    else:
        held = " What you typed holds a secret, which this page does not send back:" if secret else ""
        message = f"{_NOT_TAKEN}{held} {'log' if secret else 'Log'} in, then fill the form in again."
        referer = urlsplit(request.headers.get("referer", ""))
        same = referer.netloc == request.headers.get("host")
        back = referer.path + (f"?{referer.query}" if referer.query else "") if same else ""
        context = _login_context(message, _after_login(back))
    return templates.TemplateResponse(request, "login.html", context, status_code=401)


def _sent_from_here(request: Request) -> bool:
    """Whether the browser says the form came from this server's own page (`Sec-Fetch-Site` or `Origin`).

    Only such a form is carried through the login: a form another site posted (which an older
    browser may send with no `Sec-Fetch-Site` and `Origin: null`) would otherwise be sent again,
    by the person's own login, from this server's origin, past every cross-site check.
    """
    if request.headers.get("sec-fetch-site") == "same-origin":
        return True
    origin = request.headers.get("origin", "")
    return origin not in ("", "null") and urlsplit(origin).netloc == request.headers.get("host")


@router.post("/login", response_class=HTMLResponse)
async def login(request: Request) -> Response:
    """Check the token and keep it in an HttpOnly, same-site cookie for this browser."""
    token: str | None = request.app.state.token
    form = await request.form()
    after = _after_login(form.get("next"))
    # a form sent without the login, carried through it (`form_not_taken`): posted again (307)
    carried = [(name, str(value)) for name, value in form.multi_items() if name not in _CARRIED_NOT]
    resend = form.get("resend") == "post"
    if token is None:
        return RedirectResponse(after, status_code=307 if resend else 303)
    given = str(form.get("token", ""))
    if not same_token(given, token):
        error = "that is not this server's token (see the web-token file in its home directory)"
        context = _login_context(error, after, carried if resend else None)
        return templates.TemplateResponse(request, "login.html", context, status_code=401)
    response = RedirectResponse(after, status_code=307 if resend else 303)
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", max_age=30 * 24 * 3600)
    return response
