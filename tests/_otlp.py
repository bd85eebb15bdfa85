"""A real OTLP/HTTP trace receiver on 127.0.0.1, as the trace tests use it."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from _http_server import Received, Reply, http_server


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    error: bool


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def _received(body: bytes) -> list[ReceivedSpan]:
    """The spans of an OTLP/HTTP export request's body."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    return [
        ReceivedSpan(
            name=span.name,
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_id=span.parent_span_id.hex(),
            attributes={attribute.key: _value(attribute.value) for attribute in span.attributes},
            error=span.status.code == 2,
        )
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, list[ReceivedSpan]]]:
    """Yield the receiver's base URL and the list the spans it receives are added to."""
    spans: list[ReceivedSpan] = []
    lock = threading.Lock()

    def receive(request: Received) -> Reply:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        if request.path != "/v1/traces":
            return Reply(404)
        gzipped = request.headers.get("Content-Encoding") == "gzip"
        received = _received(gzip.decompress(request.body) if gzipped else request.body)
        with lock:
            spans.extend(received)
        return Reply(200, ExportTraceServiceResponse().SerializeToString(), "application/x-protobuf")

    with http_server(receive) as server:
        yield server.url, spans
