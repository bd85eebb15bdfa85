"""The retry layer of model-server requests: what is tried again, how long it waits, what it says."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
import ssl
from typing import Any

import pytest
from pydantic_ai import exceptions as api
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.settings import ModelSettings

from masterplanner import ModelRetriesExhaustedError
from masterplanner.models.retries import MAX_WAIT_S, RetriedModel, RetryNote


class Failing(Model):
    """Raises each of `failures` in turn (a number: never answers), then answers "ok"; records the
    settings it was sent."""

    def __init__(self, *failures: BaseException | float) -> None:
        super().__init__()
        self.failures = list(failures)
        self.sent: list[ModelSettings | None] = []

    @property
    def model_name(self) -> str:
        return "failing"

    @property
    def system(self) -> str:
        return "test"

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        self.sent.append(model_settings)
        if self.failures:
            failure = self.failures.pop(0)
            if isinstance(failure, float):
                await asyncio.Event().wait()  # a server that never answers
            else:
                raise failure
        return ModelResponse(parts=[TextPart("ok")])


def rate_limited(retry_after: float | None = None) -> api.ModelHTTPError:
    return api.ModelHTTPError.for_category(
        api.ModelRateLimitError,
        status_code=429,
        model_name="m",
        body={"error": {"message": "slow down"}},
        retry_after=retry_after,
    )


def http(status: int, category: Any, message: str = "bad") -> api.ModelHTTPError:
    return api.ModelHTTPError.for_category(
        category, status_code=status, model_name="m", body={"error": {"message": message}}
    )


async def ask(model: RetriedModel) -> str:
    response = await model.request([], None, ModelRequestParameters())
    part = response.parts[0]
    assert isinstance(part, TextPart)
    return part.content


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The waits between tries (not slept)."""
    slept: list[float] = []
    real = asyncio.sleep

    async def sleep(delay: float, *args: Any) -> None:
        slept.append(delay)
        await real(0)

    monkeypatch.setattr("masterplanner.models.retries.asyncio.sleep", sleep)
    return slept


async def test_waits_as_the_server_asks_at_most_a_minute_and_reports_each_wait(waits: list[float]) -> None:
    notes: list[RetryNote] = []

    async def report(note: RetryNote) -> None:
        notes.append(note)

    inner = Failing(
        rate_limited(3.0), rate_limited(600.0), http(503, api.ModelUnavailableError, "overloaded")
    )
    model = RetriedModel(inner, attempts=4, timeout_s=None).reporting(report)
    assert await ask(model) == "ok"
    assert waits == [3.0, MAX_WAIT_S, 4.0]  # the third has no Retry-After: 1, 2, 4 s
    assert notes == [
        RetryNote("the model provider is rate limiting requests (HTTP 429)", 3.0, 2, 4),
        RetryNote("the model provider is rate limiting requests (HTTP 429)", MAX_WAIT_S, 3, 4),
        RetryNote("the model server failed (HTTP 503: overloaded)", 4.0, 4, 4),
    ]
    # the SDK's own retries are off for every try
    assert [settings and settings.get("max_retries") for settings in inner.sent] == [0, 0, 0, 0]


async def test_gives_up_after_its_tries_saying_what_the_server_kept_doing(waits: list[float]) -> None:
    model = RetriedModel(
        Failing(*(http(500, api.ModelServerError, "boom") for _ in range(3))), attempts=3, timeout_s=None
    )
    with pytest.raises(ModelRetriesExhaustedError) as caught:
        await ask(model)
    assert str(caught.value) == "the model server failed (HTTP 500: boom); gave up after 3 tries"
    assert waits == [1.0, 2.0]


async def test_a_request_that_does_not_answer_in_time_is_tried_again(waits: list[float]) -> None:
    model = RetriedModel(Failing(5.0), attempts=2, timeout_s=0.05)
    assert await ask(model) == "ok"
    model = RetriedModel(Failing(5.0), attempts=1, timeout_s=0.05)
    with pytest.raises(
        ModelRetriesExhaustedError,
        match=r"^the model server did not answer within 0.05 s; gave up after one try$",
    ):
        await ask(model)


@pytest.mark.parametrize(
    "failure",
    [
        http(400, api.ModelRequestRejectedError),
        http(401, api.ModelAuthenticationError),
        http(429, api.ModelQuotaExceededError),  # credits ran out: waiting does not help
        ValueError("a bug"),
    ],
)
async def test_failures_that_another_try_cannot_fix_are_raised_at_once(
    waits: list[float], failure: BaseException
) -> None:
    inner = Failing(failure)
    with pytest.raises(type(failure)):
        await ask(RetriedModel(inner, attempts=4, timeout_s=None))
    assert (waits, len(inner.sent)) == ([], 1)


async def test_a_model_retried_event_that_cannot_be_stored_leaves_the_request_tried_again_and_is_logged(
    isolated: Any, write_script: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The event only says the request is tried again: its write failing failed the request (and its step).

    As for a `model_waiting` event (`test_pricing.py`), the request goes on and the failure is logged.
    """
    import logging

    from masterplanner import RunError, Settings
    from masterplanner.engine import Engine, resources
    from masterplanner.purpose import using_purpose

    inner = Failing(rate_limited(0.0))
    monkeypatch.setattr(
        resources, "resolve_model", lambda spec, settings: RetriedModel(inner, attempts=2, timeout_s=None)
    )
    engine = Engine(Settings.load())
    try:
        run = engine.create_run("x", model=f"scripted:{write_script([])}")
        made = await resources.resources_of(run.id, engine.settings, engine.store)
        written: list[str] = []

        def failing(run_id: str, kind: str, *args: object, **kwargs: object) -> None:
            written.append(kind)
            raise RunError("the run's database failed: disk I/O error")

        monkeypatch.setattr(engine.store, "append_event", failing)
        with using_purpose("step:a"), caplog.at_level(logging.WARNING, logger="masterplanner"):
            response = await made.model.request([], None, ModelRequestParameters())
    finally:
        engine.close()
    assert response.parts == [TextPart("ok")]
    assert len(inner.sent) == 2  # tried again after the 429
    assert written == ["model_retried"]
    assert [(record.levelname, record.getMessage()) for record in caplog.records] == [
        (
            "WARNING",
            f"run {run.id}: could not store the model_retried event of a model request of step:a (it is "
            "tried again all the same): the run's database failed: disk I/O error",
        )
    ]


def _served(reply: bool) -> tuple[int, Any]:
    """A local port: nobody listens there (`reply` False), or a server that reads each request
    and closes the connection without answering (True). Returns (port, the socket to close).

    The server ends its side first and reads until the client has closed: closing with part of
    the request still unread would send a reset instead, and the client would see "the
    connection was reset" (it did, in a loaded CI run)."""
    import socket
    import threading

    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    if not reply:
        listening.close()
        return port, listening

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                connection, _ = listening.accept()
                with connection:
                    connection.settimeout(10)
                    connection.recv(65536)
                    connection.shutdown(socket.SHUT_WR)
                    while connection.recv(65536):
                        pass

    threading.Thread(target=serve, daemon=True).start()
    return port, listening


@pytest.mark.parametrize(
    ("reply", "reason"), [(False, "connection refused"), (True, "it closed the connection without answering")]
)
async def test_a_model_server_out_of_reach_is_said_in_our_words_with_its_address_and_no_secret(
    waits: list[float], monkeypatch: pytest.MonkeyPatch, reply: bool, reason: str
) -> None:
    """It said "could not reach the model server (Connection error.)", the OpenAI client's own
    words, which neither name the server nor what went wrong (found by a fuzz review, 2026-11-28)."""
    from pydantic_ai import models
    from pydantic_ai.messages import ModelRequest, UserPromptPart
    from pydantic_ai.providers.openai import OpenAIProvider

    from masterplanner.models.openai_compat import OpenAICompatibleModel

    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)  # a local port, no hosted API
    port, listening = _served(reply)
    url = f"http://someone:pass-word-1@127.0.0.1:{port}/v1?token=tok-en-2"
    server = OpenAICompatibleModel("m", provider=OpenAIProvider(base_url=url, api_key="sk-key-3"))
    try:
        with pytest.raises(ModelRetriesExhaustedError) as caught:
            await RetriedModel(server, attempts=2, timeout_s=30).request(
                [ModelRequest(parts=[UserPromptPart("hi")])], None, ModelRequestParameters()
            )
    finally:
        listening.close()
    assert str(caught.value) == (
        f"could not reach the model server at 127.0.0.1:{port} ({reason}); gave up after 2 tries"
    )
    assert waits == [1.0]


def _attempts_failed(*failures: OSError) -> OSError:
    """anyio's error when each address of a host was tried and failed, raised while httpcore's is handled."""
    failed = OSError("All connection attempts failed")
    failed.__cause__ = ExceptionGroup("multiple connection attempts failed", list(failures))
    handling = OSError("All connection attempts failed")
    handling.__context__ = failed
    return handling


@pytest.mark.parametrize(
    ("cause", "reason"),
    [
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "no such host"),
        (
            socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
            "its name could not be looked up",
        ),
        (ConnectionResetError(104, "Connection reset by peer"), "the connection was reset"),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "network is unreachable"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "no route to host"),
        (TimeoutError("timed out"), "timed out"),
        (ssl.SSLCertVerificationError(1, "certificate verify failed"), "its TLS certificate was not trusted"),
        (ValueError("something else"), "the connection failed"),
        (
            _attempts_failed(ConnectionRefusedError(111, "refused"), OSError(101, "unreachable")),
            "connection refused",
        ),
    ],
)
async def test_why_a_model_server_was_out_of_reach_is_read_from_the_transport_s_error(
    waits: list[float], cause: BaseException, reason: str
) -> None:
    """What the transport raised, under the SDK's "Connection error." (the `__cause__` chain)."""
    import httpx

    failure = api.ModelConnectionError("m", "Connection error.")
    transport = httpx.ConnectError(
        str(cause), request=httpx.Request("POST", "https://models.example:8443/v1/chat")
    )
    transport.__cause__ = cause
    failure.__cause__ = transport
    with pytest.raises(ModelRetriesExhaustedError) as caught:
        await ask(RetriedModel(Failing(failure), attempts=1, timeout_s=None))
    assert str(caught.value) == (
        f"could not reach the model server at models.example:8443 ({reason}); gave up after one try"
    )
