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

One trace per run, whichever processes executed it: the trace id and the run span's id are
made from the run id, so a step's span on any worker names the same parent, and the run span,
emitted by whichever process ends the run, has the id they named. Spans carry names, ids,
counts, costs and outcomes, never prompts, outputs or tool arguments (they may hold secrets).
"""

from __future__ import annotations

import contextvars
import hashlib
import os
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

__all__ = ["configure", "exporting", "flush", "record_run", "run_context", "span", "tracer"]

_lock = threading.Lock()
_provider: Any = None
"""The SDK's TracerProvider when export is on (the SDK is imported only then)."""
_endpoint: str | None = None
_pinned: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar("pinned_ids", default=None)
"""`(trace id, span id)` the next span started gets: the run span's, made from the run id."""


def _ids(run_id: str) -> tuple[int, int]:
    digest = hashlib.sha256(f"masterplanner run {run_id}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def _exporter_endpoint(settings: Settings) -> str | None:
    """Where spans go: the setting (a base URL, `/v1/traces` added), else the standard variables."""
    if settings.otel_endpoint:
        return settings.otel_endpoint.rstrip("/") + "/v1/traces"
    if os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return ""  # the exporter reads the standard variables itself
    return None


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
        exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
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
    """Send the spans not yet sent (a process ending calls this)."""
    provider = _provider
    if provider is not None:
        provider.force_flush(5_000)


def run_context(run_id: str) -> Context:
    """The context whose parent is the run's span: spans started in it join the run's trace."""
    trace_id, span_id = _ids(run_id)
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


def record_run(run_id: str, *, status: str, created_at: str, model: str) -> None:
    """Emit the run's span, from its creation (`created_at`, ISO 8601) to now, with the id its steps named."""
    started_ns = int(datetime.fromisoformat(created_at.replace("Z", "+00:00")).timestamp() * 1e9)
    token = _pinned.set(_ids(run_id))
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
                "gen_ai.request.model": model,
            },
        )
    finally:
        _pinned.reset(token)
    if status != "succeeded":
        run_span.set_status(Status(StatusCode.ERROR, status))
    run_span.end()
