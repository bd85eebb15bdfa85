"""Agents' long-term memory, in the registry's database: facts they chose to keep, and past runs.

- Semantic memory: a step agent's `remember(fact)` stores a fact; `recall(query)` finds facts
  and episodes by the registry's ranking (the text index, fused with cosine when an embedder is
  set).
- Episodic memory: when a run ends, a short account of it (task, outcome, result or error) is
  kept, so "what happened last time we did X" can be recalled.

Every item has a time to live (`memory_ttl_days`, renewed when it is recalled) and the store a
size cap (`memory_max_items`): storing past the cap evicts the least recently used items, and
expired items are dropped. Text that looks like a secret (API keys, tokens, passwords) is refused,
so secrets never reach the database or a later prompt through memory.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from sqlalchemy.engine import Connection

from ..database import names_nothing, reconnecting_methods
from ..errors import NUL_PROBLEM, NotFoundError, ToolError, quoted_id
from ..redaction import secret_parts
from .store import RegistryStore, _count_write, _sql, _text_index

__all__ = ["MAX_MEMORY_CHARS", "MemoryItem", "MemoryKind", "MemoryStore", "episode_text"]

MemoryKind = Literal["fact", "episode"]
MAX_MEMORY_CHARS = 2000


@dataclass(frozen=True)
class MemoryItem:
    """One remembered fact or run."""

    id: str
    kind: MemoryKind
    text: str
    source: str
    created_at: str
    last_used_at: str
    expires_at: str

    def to_json_dict(self) -> dict[str, str]:
        """Plain JSON form."""
        return dict(self.__dict__)


def _now(days: float = 0) -> str:
    """UTC now (plus `days`), to the microsecond: least-recently-used order must not tie."""
    moment = datetime.now(UTC) + timedelta(days=days)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


_COLUMNS = "id, kind, text, source, created_at, last_used_at, expires_at"


@reconnecting_methods
class MemoryStore:
    """Facts and episodes in the registry's database, with a time to live and a size cap."""

    def __init__(self, registry: RegistryStore, *, ttl_days: float = 180, max_items: int = 10_000) -> None:
        self.registry = registry
        self.ttl_days = ttl_days
        self.max_items = max_items

    def remember(self, text: str, *, kind: MemoryKind = "fact", source: str = "") -> MemoryItem:
        """Store `text`; raises `ToolError` for empty, oversized or secret-looking text.

        An episode replaces the earlier episode of the same `source` (a run retried after it
        failed is one account of how it ended, not one for each end).
        """
        text = text.strip()
        if not text:
            raise ToolError("there is nothing to remember: the text is empty")
        if len(text) > MAX_MEMORY_CHARS:
            raise ToolError(f"a memory is at most {MAX_MEMORY_CHARS} characters; this one is {len(text)}")
        if "\x00" in text:  # searches stop at it, and Postgres refuses it
            raise ToolError(f"the text to remember {NUL_PROBLEM}")
        if secret_parts(text):  # a key's shape, or the value of a secret variable here
            raise ToolError("that looks like a secret (a key, token or password); secrets are not remembered")
        now = _now()
        item = MemoryItem(f"m{secrets.token_hex(6)}", kind, text, source[:200], now, now, _now(self.ttl_days))
        with self.registry._begin("remember") as connection:
            if kind == "episode" and source:
                earlier = _sql(
                    connection,
                    "SELECT id FROM mp_memories WHERE kind = 'episode' AND source = ?",
                    (source[:200],),
                ).all()
                for row in earlier:
                    _delete(connection, row[0])
            _sql(
                connection,
                f"INSERT INTO mp_memories ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
                tuple(item.__dict__.values()),
            )
            _text_index(connection, "memory").insert(connection, item.id, text)
            self._evict(connection, now)
            _count_write(connection)
        return item

    def _evict(self, connection: Connection, now: str) -> None:
        """Drop expired memories, then the least recently used ones beyond the cap."""
        expired = [
            row[0] for row in _sql(connection, "SELECT id FROM mp_memories WHERE expires_at < ?", (now,))
        ]
        count = int(_sql(connection, "SELECT count(*) FROM mp_memories").scalar_one()) - len(expired)
        if count > self.max_items:
            expired += [
                row[0]
                for row in _sql(
                    connection,
                    "SELECT id FROM mp_memories WHERE expires_at >= ? "
                    "ORDER BY last_used_at, created_at LIMIT ?",
                    (now, count - self.max_items),
                )
            ]
        for memory_id in expired:
            _delete(connection, memory_id)

    def recall(self, query: str, limit: int = 5, kind: MemoryKind | None = None) -> list[MemoryItem]:
        """The memories most like `query`, best first; each one recalled lives `ttl_days` longer."""
        now = _now()
        wanted = self.registry._query_vector(query)  # before the transaction: no lock held meanwhile
        with self.registry._begin("recall") as connection:
            fused, _ = self.registry._rank(connection, "memory", query, wanted)
            if not fused:
                return []
            marks = ", ".join("?" for _ in fused)
            rows = _sql(
                connection,
                f"SELECT {_COLUMNS} FROM mp_memories WHERE id IN ({marks}) AND expires_at >= ?",
                (*fused, now),
            ).all()
            found = [MemoryItem(*row) for row in rows if kind is None or row[1] == kind]
            found.sort(key=lambda item: (-fused[item.id], item.id))
            found = found[:limit]
            for item in found:
                _sql(
                    connection,
                    "UPDATE mp_memories SET last_used_at = ?, expires_at = ? WHERE id = ?",
                    (now, _now(self.ttl_days), item.id),
                )
        return found

    def list(self, kind: MemoryKind | None = None) -> list[MemoryItem]:
        """Every memory that has not expired, most recently used first."""
        with self.registry._begin("list memories") as connection:
            rows = _sql(
                connection,
                f"SELECT {_COLUMNS} FROM mp_memories WHERE expires_at >= ? ORDER BY last_used_at DESC, id",
                (_now(),),
            ).all()
        return [MemoryItem(*row) for row in rows if kind is None or row[1] == kind]

    def forget(self, memory_id: str) -> None:
        """Delete one memory."""
        with self.registry._begin("forget a memory") as connection:
            if names_nothing(memory_id) or not _delete(connection, memory_id):
                raise NotFoundError(f"no memory {quoted_id(memory_id)} (see `masterplanner memory list`)")
            _count_write(connection)


def _delete(connection: Connection, memory_id: str) -> bool:
    """Delete a memory with its vectors and index entry; False when there was none."""
    if not _sql(connection, "DELETE FROM mp_memories WHERE id = ?", (memory_id,)).rowcount:
        return False
    _sql(connection, "DELETE FROM mp_vectors WHERE kind = 'memory' AND item_id = ?", (memory_id,))
    _text_index(connection, "memory").delete(connection, memory_id)
    return True


def episode_text(task: str, status: str, output: str | None, error: str | None, when: str) -> str:
    """A run's account for episodic memory: when, the task, how it ended, and what came out."""
    outcome = f"Result: {output.strip()[:600]}" if output else f"Error: {(error or 'none given')[:600]}"
    text = f"{when[:10]}: the task {task.strip()[:800]!r} {status}. {outcome}"
    return text[:MAX_MEMORY_CHARS]
