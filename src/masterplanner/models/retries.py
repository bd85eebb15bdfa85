"""One retry layer for requests to model servers: transient failures are tried again, visibly.

A model server over HTTP fails in passing: it rate-limits (429, often saying when to come back
in `Retry-After`), has a bad moment (500, 502, 503, 504), does not answer in time, drops the
connection, or sends a reply that is not JSON. `RetriedModel` tries such a request again — after
the wait the server asked for, else after 1, 2, 4 … s — up to `attempts` tries in all, and tells
a reporter before each wait (the engine records it as a `model_retried` event, so a person
watching a run sees why it waits). The provider SDKs' own retries are turned off where the
model is made (`resolve_model`): one layer, which a person can see and configure
(`model_attempts`, `model_timeout_s`), instead of a hidden one under it.

When the tries run out the request fails with `ModelRetriesExhaustedError`, whose message says what
the server kept doing; the engine does not try that step again (its tries were these). Any
other failure — a refused request (400, 401, 404), a reply in the wrong form — is not retried
here.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from pydantic_ai import exceptions as api
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from ..errors import ModelRetriesExhaustedError
from ..redaction import redacted

__all__ = ["MAX_WAIT_S", "Problem", "Reporter", "RetriedModel", "RetryNote", "transient_problem"]

MAX_WAIT_S = 60.0
"""The longest wait between two tries, whatever a server's `Retry-After` asks for."""

_TRANSIENT_STATUS = frozenset({408, 409, 425})
"""Statuses pydantic-ai leaves uncategorised that still pass: timeout, conflict, too early."""


@dataclass(frozen=True)
class RetryNote:
    """What a reporter is told before a wait: the problem, the wait, and the try that comes next."""

    problem: str
    delay_s: float
    attempt: int
    attempts: int


Reporter = Callable[[RetryNote], Awaitable[None]]


@dataclass(frozen=True)
class Problem:
    """A failure worth another try, in our words, and the wait the server asked for (if it did)."""

    text: str
    retry_after_s: float | None = None


def transient_problem(error: BaseException, timeout_s: float | None = None) -> Problem | None:
    """The failure in our words when trying again may help, else None.

    pydantic-ai sorts providers' failures into categories (rate limit, unavailable, server
    error, connection, timeout) and reads `Retry-After`; a reply whose body is not JSON reaches
    us as a `ModelAPIError` caused by the decoder's error.
    """
    status = getattr(error, "status_code", None)
    http = f"HTTP {status}" if isinstance(status, int) else ""
    if isinstance(error, TimeoutError | api.ModelRequestTimeout | api.ModelTimeoutError):
        within = f" within {timeout_s:g} s" if timeout_s else " in time"
        return Problem(f"the model server did not answer{within}")
    if isinstance(error, api.ModelRateLimitError):
        return Problem(
            f"the model provider is rate limiting requests ({http or 'rate limit'})", error.retry_after
        )
    if isinstance(error, api.ModelUnavailableError | api.ModelServerError) or (
        isinstance(error, api.ModelHTTPError) and error.status_code in _TRANSIENT_STATUS
    ):
        detail = ": ".join(part for part in (http, _error_message(error.body)) if part)
        return Problem(f"the model server failed ({detail or 'no reason given'})", error.retry_after)
    if isinstance(error, api.ModelConnectionError):
        causes = _causes(error)
        where = _address(causes)
        at = f" at {where}" if where else ""
        return Problem(f"could not reach the model server{at} ({_unreachable(causes)})", error.retry_after)
    if isinstance(error, json.JSONDecodeError) or isinstance(error.__cause__, json.JSONDecodeError):
        return Problem("the model server's reply was not valid JSON")
    return None


def _causes(error: BaseException) -> list[BaseException]:
    """`error` and what it was raised from, outermost first (a chain that loops is read once).

    httpcore raises its errors while handling the transport's (`__context__`, not `__cause__`);
    of a group (each address of a host tried, all failed) the first is read.
    """
    chain: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and current not in chain:
        chain.append(current)
        if isinstance(current, BaseExceptionGroup):
            current = current.exceptions[0]
        else:
            current = current.__cause__ or current.__context__
    return chain


def _address(causes: list[BaseException]) -> str:
    """`host:port` of the request the transport failed to make ('' if no error names it).

    Only the host and port: the URL's user name, password, path and query (which may hold a
    key) are left out.
    """
    for cause in causes:
        url = getattr(getattr(cause, "request", None), "url", None)
        host = getattr(url, "host", None)
        if isinstance(host, str) and host:
            port = getattr(url, "port", None)
            shown = f"[{host}]" if ":" in host else host
            return f"{shown}:{port}" if isinstance(port, int) else shown
    return ""


_NO_SUCH_HOST = frozenset(
    getattr(socket, name) for name in ("EAI_NONAME", "EAI_NODATA", "EAI_ADDRFAMILY") if hasattr(socket, name)
)


def _unreachable(causes: list[BaseException]) -> str:
    """Why the server could not be reached, in our words.

    Read from the transport's error under the SDK's own words ("Connection error.", which say
    nothing of it): the innermost, the operating system's, says the most.
    """
    for cause in reversed(causes):
        if isinstance(cause, socket.gaierror):
            return "no such host" if cause.errno in _NO_SUCH_HOST else "its name could not be looked up"
        if isinstance(cause, ssl.SSLCertVerificationError):
            return "its TLS certificate was not trusted"
        if isinstance(cause, ssl.SSLError):
            return "the TLS handshake failed"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, ConnectionResetError):
            return "the connection was reset"
        if isinstance(cause, TimeoutError):
            return "timed out"
        if isinstance(cause, OSError) and cause.errno is not None and cause.errno in errno.errorcode:
            return os.strerror(cause.errno).lower()
    for cause in causes:  # httpx's words for a server that closed the connection
        if type(cause).__name__ == "RemoteProtocolError" and "disconnected" in str(cause):
            return "it closed the connection without answering"
    return "the connection failed"


def _error_message(body: object) -> str:
    if isinstance(body, dict):
        inner = body.get("error", body)
        message = inner.get("message") if isinstance(inner, dict) else inner
        if isinstance(message, str):
            return redacted(_first_line(message))[:200]
    return ""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else "no reason given"


class RetriedModel(WrapperModel):
    """A model server's requests, each tried again on transient failures (see the module docstring)."""

    def __init__(
        self,
        wrapped: Model,
        *,
        attempts: int,
        timeout_s: float | None,
        reporter: Reporter | None = None,
        backoff_s: float = 1.0,
    ) -> None:
        super().__init__(wrapped)
        self.attempts = attempts
        self.timeout_s = timeout_s
        self.reporter = reporter
        self.backoff_s = backoff_s

    def reporting(self, reporter: Reporter) -> RetriedModel:
        """This model, telling `reporter` about each wait."""
        return RetriedModel(
            self.wrapped,
            attempts=self.attempts,
            timeout_s=self.timeout_s,
            reporter=reporter,
            backoff_s=self.backoff_s,
        )

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """The wrapped request, tried again after transient failures up to `attempts` tries."""
        # the SDK's own retries off: these are the only ones (pydantic-ai passes this on to the SDK)
        settings: ModelSettings = {**(model_settings or {}), "max_retries": 0}
        for attempt in range(1, self.attempts + 1):
            try:
                async with asyncio.timeout(self.timeout_s):
                    return await self.wrapped.request(messages, settings, model_request_parameters)
            except Exception as error:
                problem = transient_problem(error, self.timeout_s)
                if problem is None:
                    raise
                if attempt == self.attempts:
                    tries = f"{self.attempts} tries" if self.attempts > 1 else "one try"
                    raise ModelRetriesExhaustedError(f"{problem.text}; gave up after {tries}") from error
                delay = problem.retry_after_s
                if delay is None:
                    delay = self.backoff_s * 2 ** (attempt - 1)
                delay = min(delay, MAX_WAIT_S)
                if self.reporter is not None:
                    await self.reporter(RetryNote(problem.text, delay, attempt + 1, self.attempts))
                await asyncio.sleep(delay)
        raise AssertionError("unreachable: the last try returns or raises")

    def __repr__(self) -> str:
        return f"RetriedModel({self.wrapped!r}, attempts={self.attempts})"
