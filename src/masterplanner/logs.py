"""What long-running processes (`worker`, `serve`) log, as text or as JSON lines (`log_format`).

Everything goes through the `masterplanner` logger to stderr. With `log_format = "json"` each
record is one JSON object a line: `time` (ISO 8601 UTC), `level`, `logger`, `message`, and the
fields the caller attached (`run`, `status`, `worker`, …), for a log collector to index; a record
logged with an exception adds `error` (its traceback's last line) and `traceback` (the whole).
As text, such a record's message is followed by its traceback's lines.
Messages name runs, steps and processes, never secrets (database URLs hide their password), and
every record, ours or a library's, passes `REDACTING` on its way out (our handler is on the root
logger too, and the filter on the handlers libraries had set on their loggers when logging was
configured): what looks like a credential in its message, its fields (in lists and mappings
too) or its exception's traceback is replaced by `[secret removed]` (in the lines of source a
traceback shows, only secret values and quoted credentials: `api_key = settings.api_key` is code).
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Literal

__all__ = ["REDACTING", "JsonLines", "configure_logging", "json_lines", "log"]

LOGGER = "masterplanner"


class JsonLines(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry |= getattr(record, "fields", {})
        traceback = _traceback(record)
        if traceback:  # its last line, to read at a glance, and the whole, to find where it came from
            entry["error"] = traceback.splitlines()[-1]
            entry["traceback"] = traceback
        return json.dumps(entry, ensure_ascii=True, default=str)


def _traceback(record: logging.LogRecord) -> str:
    """The traceback of the record's exception (redacted by `REDACTING` when it passed), or ""."""
    if record.exc_text:
        return record.exc_text
    if record.exc_info:
        return logging.Formatter().formatException(record.exc_info)
    return ""


class _Text(logging.Formatter):
    """The message, then its exception's traceback if any, each line made safe by `printable`.

    `printable` shows control characters rather than obeying them. Before, only the message was
    written: the web app's "unexpected error" left no traceback in the server's log.
    """

    def __init__(self, printable: Callable[[str], str]) -> None:
        super().__init__()
        self._printable = printable

    def format(self, record: logging.LogRecord) -> str:
        """The record's message, and its traceback's lines, printable."""
        lines = [record.getMessage(), *_traceback(record).splitlines()]
        return "\n".join(map(self._printable, lines))


class _NotWorkflowOutcomes(logging.Filter):
    """Drops DBOS's report of a workflow that raised ("Exception encountered in … workflow").

    A step that ran out of budget or a cancelled run is an outcome the engine records and the
    worker logs in one line; DBOS logged each again with a traceback, which broke JSON lines.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether the record is kept."""
        return not record.getMessage().startswith("Exception encountered in")


WORKFLOW_OUTCOMES = _NotWorkflowOutcomes()
"""The filter on DBOS's logger in every process (`engine/runtime.py` adds it at launch)."""


class _Redacting(logging.Filter):
    """Takes credentials out of what a record shows (`redaction.redacted`), keeping the record.

    Its message, its fields (JSON lines) and its exception's traceback: an exception's message
    may quote a key a server echoed or a URL with its password (an error uvicorn or the web app
    logs with its traceback). On the handler of `configure_logging`, so every logger's records
    pass it, on the trace exporter's own handler, and on DBOS's logger, whose console handler
    `--debug` shows: DBOS logs the database URL it was given with SQLAlchemy's password hiding,
    which leaves a `?password=` parameter whole and shows part of an unescaped password holding `@`.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Always keeps the record, with its message, fields and traceback redacted."""
        from .redaction import redacted, redacted_traceback

        message = record.getMessage()
        shown = redacted(message)
        if shown != message:
            record.msg, record.args = shown, None
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            record.fields = _redacted_value(fields)
        if record.exc_info and not record.exc_text:  # what a formatter shows of it, made here first
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:  # its source lines are code, kept but for secret values in them
            record.exc_text = redacted_traceback(record.exc_text)
        return True


def _redacted_value(value: Any) -> Any:
    """`value` with its text redacted, in lists and mappings too (a field may hold several URLs)."""
    from .redaction import redacted

    if isinstance(value, str):
        return redacted(value)
    if isinstance(value, dict):
        return {name: _redacted_value(item) for name, item in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted_value(item) for item in value]
    return value


REDACTING = _Redacting()
"""The filter that redacts each record shown (on `configure_logging`'s handler and DBOS's logger)."""


def configure_logging(log_format: Literal["text", "json"], *, printable: Callable[[str], str] = str) -> None:
    """Send the `masterplanner` logger's records (INFO and up) to stderr in `log_format`.

    JSON lines are pure ASCII (every control character escaped); text goes through `printable`.
    DBOS's, OpenTelemetry's and uvicorn's own records (their errors, a trace exporter's failure
    in our words, `telemetry._ExportFailures`) go the same way, in the same format: DBOS adds its
    console handler only to a logger that has none, and `serve` leaves uvicorn's configuration off.
    So do other libraries' warnings and errors, through the root logger (WARNING and up); a
    handler a library set on its own logger already (fastmcp's) gets `REDACTING` too.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(REDACTING)
    handler.setFormatter(JsonLines() if log_format == "json" else _Text(printable))
    for name in (LOGGER, "dbos", "opentelemetry", "uvicorn"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False
    # every other logger's records (asyncio's "Task exception was never retrieved", httpx's,
    # SQLAlchemy's) reach the root logger: before, Python's last-resort handler printed them
    # unredacted and not as JSON lines
    root = logging.getLogger()
    for old in [kept for kept in root.handlers if REDACTING in kept.filters]:
        root.removeHandler(old)
    root.addHandler(handler)
    # a library's own handlers on loggers that do not propagate (fastmcp's) redact as well
    for logger in [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]:
        for own in logger.handlers:
            if REDACTING not in own.filters:
                own.addFilter(REDACTING)
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    logging.getLogger("dbos").addFilter(WORKFLOW_OUTCOMES)
    logging.getLogger("dbos").addFilter(REDACTING)


def json_lines() -> bool:
    """Whether this process logs JSON lines (`configure_logging` set them), so says all in them."""
    return any(isinstance(handler.formatter, JsonLines) for handler in logging.getLogger(LOGGER).handlers)


def log(name: str, message: str, **fields: Any) -> None:
    """Log `message` at INFO under `masterplanner.<name>`, with `fields` for JSON lines."""
    logging.getLogger(f"{LOGGER}.{name}").info(message, extra={"fields": fields})
