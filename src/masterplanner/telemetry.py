"""Traces of runs: OpenTelemetry spans in the GenAI semantic conventions, exported over OTLP/HTTP.

Export is on when the `otel_endpoint` setting or the standard `OTEL_EXPORTER_OTLP_ENDPOINT`
(or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set; otherwise nothing is recorded. The spans:

```
invoke_workflow masterplanner   the run, from its creation to its end (emitted when it ends)
├── chat <model>                a planning request (planner, Prompt Creator, critic, …)
└── invoke_agent <role>         a step's execution in one process (its attempts and retries)
    ├── chat <model>            a model request (a request replayed from a checkpoint is not)
    └── execute_tool <tool>     a tool call
```

One trace per run, whichever processes executed it: the trace id is made from the run id, and
the run span's id from the run id and how many times it was retried, so a step's span on any
worker names the same parent, and the run span, emitted by whichever process ends the run, has
the id they named. A retried run ends again: each end is a run span of its own in the same trace
(the steps run after the retry under it). Spans carry names, ids,
counts, costs and outcomes, never prompts, outputs or tool arguments (they may hold secrets).

A receiver that is down or slow never holds a process up for long: each export has
`EXPORT_TIMEOUT_S` (retries included), and a process that could not send its spans says so
once, in one line of its log (`traces could not be sent to URL: connection refused`).
"""

from __future__ import annotations

import contextvars
import hashlib
import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

if TYPE_CHECKING:
    from .settings import Settings

__all__ = [
    "EXPORT_TIMEOUT_S",
    "configure",
    "exporting",
    "flush",
    "record_run",
    "run_context",
    "span",
    "tracer",
]

EXPORT_TIMEOUT_S = 2.0
"""Seconds one export of spans may take, its retries included (unless OTEL_EXPORTER_OTLP_TIMEOUT says)."""
_EXPORTER_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"

_lock = threading.Lock()
_provider: Any = None
"""The SDK's TracerProvider when export is on (the SDK is imported only then)."""
_endpoint: str | None = None
_pinned: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("pinned_ids", default=None)
"""`(trace id, span id)` the next span started gets: the run span's, made from the run id."""


def _ids(run_id: str, retries: int) -> tuple[int, int]:
    """The run's trace id, and the id of its span for the `retries`-th retry (0: before any)."""
    digest = hashlib.sha256(f"masterplanner run {run_id}".encode()).digest()
    span_id = int.from_bytes(digest[16:24], "big")
    if retries:  # before, every end of a retried run had the same span id as the first
        span_id = int.from_bytes(
            hashlib.sha256(f"masterplanner run {run_id} retry {retries}".encode()).digest()[:8], "big"
        )
    return int.from_bytes(digest[:16], "big") or 1, span_id or 1


def _exporter_endpoint(settings: Settings) -> str | None:
    """Where spans go: the setting (a base URL, `/v1/traces` added), else the standard variables.

    The traces variable is the whole URL; the general one a base, `/v1/traces` added (as the
    OpenTelemetry exporter reads them).
    """
    if settings.otel_endpoint:
        return settings.otel_endpoint.rstrip("/") + "/v1/traces"
    if traces := os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        return traces
    if base := os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return base.removesuffix("/") + "/v1/traces"
    return None


def _problem(error: BaseException | None, seen: int = 0) -> str:
    """What went wrong in a failed request, in a few words (the library's exception, unwrapped)."""
    if error is None or seen > 8:
        return "the request failed"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, socket.gaierror):
        return "host not found"
    if isinstance(error, TimeoutError) or "Timeout" in type(error).__name__:
        return "no answer in time"
    inner = [getattr(error, "reason", None), error.__cause__, error.__context__, *error.args]
    for cause in inner:
        if isinstance(cause, BaseException):
            problem = _problem(cause, seen + 1)
            if problem != "the request failed":
                return problem
    if isinstance(error, OSError) and error.strerror:
        return error.strerror.lower()
    return "the request failed"


class _ExportFailures(logging.Filter):
    """The exporter's reports of failed exports, said once in our words.

    The library logged every retry and every failed batch (`Transient error
    HTTPConnectionPool(…) encountered while exporting spans batch, retrying in 1.09s.`), lines
    that broke JSON logs and said nothing a person could act on beyond the endpoint and why.
    """

    def __init__(self) -> None:
        super().__init__()
        self.endpoint = ""
        self.said = False
        self._last: str | None = None
        """Why the current export's last try failed (a retry's report says it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Drop the retries; turn the first failure into our line, drop the later ones."""
        message = str(record.msg)
        args = record.args if isinstance(record.args, tuple) else ()
        if message.startswith("Transient error"):
            self._last = _problem(args[0]) if args and isinstance(args[0], BaseException) else self._last
            return False  # retries are the exporter's business
        if not message.startswith("Failed to export"):
            return True
        if "code: %s" in message and len(args) == 3:
            code, reason = args[1], args[2]
            if code:
                self._last = f"the receiver answered HTTP {code}"
            elif isinstance(reason, BaseException):
                self._last = _problem(reason)
        # a request that used up the export's time before any retry leaves no other trace
        problem = self._last or ("no answer in time" if "timeout" in message else "the request failed")
        self._last = None
        if self.said:
            return False
        self.said = True
        record.name = "masterplanner.telemetry"
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.msg, record.args = f"traces could not be sent to {self.endpoint}: {problem}", ()
        return True


EXPORT_FAILURES = _ExportFailures()
"""The filter on the trace exporter's logger (`configure` adds it; `logs.configure_logging` keeps it)."""


def _exporter_timeout() -> float:
    """`EXPORT_TIMEOUT_S`, or the seconds the standard variables set (for a collector known to be slow)."""
    variables = ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT")
    given = next((os.environ[name] for name in variables if os.environ.get(name)), None)
    try:
        seconds = float(given or EXPORT_TIMEOUT_S)
    except ValueError:
        return EXPORT_TIMEOUT_S
    return seconds if 0 < seconds < 3600 else EXPORT_TIMEOUT_S


def _report_failures(endpoint: str) -> None:
    """Route the exporter's failures through `EXPORT_FAILURES`, to stderr if nothing else logs them."""
    from .redaction import redacted

    # redacted here, alone: in the line, a `?token=` value would run on into the `:` after it
    EXPORT_FAILURES.endpoint = redacted(endpoint)
    EXPORT_FAILURES.said = False
    exporter_logger = logging.getLogger(_EXPORTER_LOGGER)
    if EXPORT_FAILURES not in exporter_logger.filters:
        exporter_logger.addFilter(EXPORT_FAILURES)
    library = logging.getLogger("opentelemetry")
    if not library.handlers:  # `worker` and `serve` replace this with their format (logs.py)
        from .logs import REDACTING

        handler = logging.StreamHandler()
        handler.addFilter(REDACTING)  # the endpoint may hold a password or a `?token=`
        handler.setFormatter(logging.Formatter("%(message)s"))
        library.addHandler(handler)
        library.propagate = False


def configure(settings: Settings) -> None:
    """Turn export on in this process when the settings or the environment name an endpoint."""
    global _provider, _endpoint
    endpoint = _exporter_endpoint(settings)
    with _lock:
        if endpoint is None or (_provider is not None and endpoint == _endpoint):
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        class RunIds(RandomIdGenerator):
            """Random ids, except for a run span: those made from its run id."""

            def generate_span_id(self) -> int:
                pinned = _pinned.get()
                return pinned[1] if pinned else super().generate_span_id()

            def generate_trace_id(self) -> int:
                pinned = _pinned.get()
                return pinned[0] if pinned else super().generate_trace_id()

        if _provider is not None:
            _provider.shutdown()
        provider = TracerProvider(resource=Resource({"service.name": "masterplanner"}), id_generator=RunIds())
        exporter = OTLPSpanExporter(endpoint=endpoint, timeout=_exporter_timeout())
        _report_failures(endpoint)
        provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=500))
        _provider, _endpoint = provider, endpoint


def exporting() -> bool:
    """Whether this process sends spans (callers skip work done only for them when not)."""
    return _provider is not None


def tracer() -> trace.Tracer:
    """This process's tracer (one that records nothing when export is off)."""
    provider = _provider
    return provider.get_tracer("masterplanner") if provider is not None else trace.NoOpTracer()


def flush() -> None:
    """Send the spans not yet sent (a process ending calls this), waiting one export at most."""
    provider = _provider
    if provider is not None:
        provider.force_flush(int(_exporter_timeout() * 1000) + 500)


def run_context(run_id: str, retries: int) -> Context:
    """The context whose parent is the run's span (its `retries`-th retry's): spans in it join its trace."""
    trace_id, span_id = _ids(run_id, retries)
    parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(parent))


@contextmanager
def span(name: str, attributes: dict[str, Any], *, context: Context | None = None) -> Iterator[trace.Span]:
    """A span made current for the block; an exception out of it marks the span an error."""
    with tracer().start_as_current_span(
        name, context=context, kind=SpanKind.INTERNAL, attributes=attributes, record_exception=False
    ) as current:
        try:
            yield current
        except BaseException as error:
            current.set_status(Status(StatusCode.ERROR, type(error).__name__))
            current.set_attribute("error.type", type(error).__name__)
            raise


def record_run(run_id: str, *, retries: int, status: str, created_at: str, model: str) -> None:
    """Emit the run's span, from its creation (`created_at`, ISO 8601) to now, with the id its steps named.

    `retries`: how many times the run was retried; each end of a retried run is a span of its own.
    """
    started_ns = int(datetime.fromisoformat(created_at.replace("Z", "+00:00")).timestamp() * 1e9)
    token = _pinned.set(_ids(run_id, retries))
    try:
        run_span = tracer().start_span(
            "invoke_workflow masterplanner",
            context=Context(),
            kind=SpanKind.INTERNAL,
            start_time=started_ns,
            attributes={
                "gen_ai.operation.name": "invoke_workflow",
                "masterplanner.run.id": run_id,
                "masterplanner.run.status": status,
                "masterplanner.run.retries": retries,
                "gen_ai.request.model": model,
            },
        )
    finally:
        _pinned.reset(token)
    if status != "succeeded":
        run_span.set_status(Status(StatusCode.ERROR, status))
    run_span.end()
