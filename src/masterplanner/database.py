"""Helpers shared by the stores that live in the one database (runs, registry): URLs and timestamps."""

from __future__ import annotations

from datetime import UTC, datetime

__all__ = ["engine_url", "utc_now"]


def utc_now() -> str:
    """The current time as ISO 8601 UTC with milliseconds, e.g. `2026-11-22T03:04:05.678Z`."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def engine_url(url: str) -> str:
    """The SQLAlchemy URL for a settings database URL (Postgres goes through psycopg 3)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url
