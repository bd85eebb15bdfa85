"""The registry store: agents (every version kept), cohorts, and a lexical index, in the run database.

SQLite: the tables `mp_agents`, `mp_agent_versions`, `mp_cohorts` and an FTS5 index ranked by
BM25, created by named migrations recorded in `mp_migrations` (shared with the run store).
Every write is one transaction; stats change by SQL arithmetic, so concurrent writers from
several processes never lose an update. The Postgres implementation is not built yet.
"""

from __future__ import annotations

import json
import math
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy.engine import Connection

from ..database import Migration, apply_migrations, create_engine, engine_url, transaction, utc_now
from ..errors import ConfigError, RunError
from .specs import AgentSpec, AgentStats, Cohort

__all__ = ["REGISTRY_MIGRATIONS", "RegistryStore"]


def _create_registry_tables(connection: Connection) -> None:
    connection.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS mp_agents (id TEXT PRIMARY KEY, spec TEXT NOT NULL, "
        "version INTEGER NOT NULL, uses INTEGER NOT NULL DEFAULT 0, successes INTEGER NOT NULL DEFAULT 0, "
        "failures INTEGER NOT NULL DEFAULT 0, ratings INTEGER NOT NULL DEFAULT 0, "
        "rating_sum REAL NOT NULL DEFAULT 0, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)"
    )
    connection.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS mp_agent_versions (agent_id TEXT NOT NULL, version INTEGER NOT NULL, "
        "spec TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (agent_id, version))"
    )
    connection.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS mp_cohorts "
        "(id TEXT PRIMARY KEY, cohort TEXT NOT NULL, created_at TEXT NOT NULL)"
    )
    connection.exec_driver_sql(
        "CREATE VIRTUAL TABLE IF NOT EXISTS mp_agents_fts USING fts5(agent_id UNINDEXED, body, "
        "tokenize='porter unicode61')"
    )


REGISTRY_MIGRATIONS: list[Migration] = [
    ("registry_0001_agents_versions_cohorts_fts", _create_registry_tables),
]


class RegistryStore:
    """Agents and cohorts; safe to share between tasks and threads of one process."""

    def __init__(self, url: str) -> None:
        self.url = url
        if not engine_url(url).startswith("sqlite"):
            raise ConfigError(
                f"the agent registry needs SQLite for now; {url!r} is not (Postgres comes later)"
            )
        self.engine = create_engine(url)
        with self._begin("create its tables") as connection:
            apply_migrations(connection, REGISTRY_MIGRATIONS)

    def _begin(self, action: str) -> AbstractContextManager[Connection]:
        return transaction(self.engine, self.url, action)

    def close(self) -> None:
        """Release the database connections."""
        self.engine.dispose()

    # ---- agents

    def put_agent(self, spec: AgentSpec, connection: Connection | None = None) -> AgentSpec:
        """Store `spec`: a new agent, or a new version of an existing one (older versions stay readable)."""
        if connection is None:
            with self._begin("store an agent") as own:
                return self.put_agent(spec, own)
        now = utc_now()
        row = connection.exec_driver_sql("SELECT version FROM mp_agents WHERE id = ?", (spec.id,)).first()
        version = (row[0] + 1) if row else spec.version
        stored = spec.model_copy(update={"version": version})
        text = stored.model_dump_json()
        if row:
            connection.exec_driver_sql(
                "UPDATE mp_agents SET spec = ?, version = ?, updated_at = ? WHERE id = ?",
                (text, version, now, spec.id),
            )
            connection.exec_driver_sql("DELETE FROM mp_agents_fts WHERE agent_id = ?", (spec.id,))
        else:
            stats = spec.stats
            connection.exec_driver_sql(
                "INSERT INTO mp_agents (id, spec, version, uses, successes, failures, ratings, rating_sum, "
                "created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    spec.id,
                    text,
                    version,
                    stats.uses,
                    stats.successes,
                    stats.failures,
                    stats.ratings,
                    stats.rating_sum,
                    now,
                    now,
                ),
            )
        connection.exec_driver_sql(
            "INSERT INTO mp_agent_versions (agent_id, version, spec, created_at) VALUES (?, ?, ?, ?)",
            (spec.id, version, text, now),
        )
        connection.exec_driver_sql(
            "INSERT INTO mp_agents_fts (agent_id, body) VALUES (?, ?)", (spec.id, stored.search_text())
        )
        return stored

    def put_agents(self, specs: list[AgentSpec]) -> int:
        """Store many agents in one transaction (all or none); returns how many."""
        with self._begin("store agents") as connection:
            for spec in specs:
                self.put_agent(spec, connection)
        return len(specs)

    def get_agent(self, agent_id: str, version: int | None = None) -> AgentSpec:
        """The agent (its current version, or `version`), with its current stats."""
        with self._begin("read an agent") as connection:
            row = connection.exec_driver_sql(
                "SELECT spec, uses, successes, failures, ratings, rating_sum FROM mp_agents WHERE id = ?",
                (agent_id,),
            ).first()
            if row is None:
                raise RunError(f"no agent {agent_id!r} in the registry (see `masterplanner agents list`)")
            text = row[0]
            if version is not None:
                found = connection.exec_driver_sql(
                    "SELECT spec FROM mp_agent_versions WHERE agent_id = ? AND version = ?",
                    (agent_id, version),
                ).first()
                if found is None:
                    raise RunError(f"agent {agent_id!r} has no version {version}")
                text = found[0]
        return _with_stats(text, row[1:])

    def versions(self, agent_id: str) -> list[int]:
        """The agent's version numbers, oldest first."""
        with self._begin("read versions") as connection:
            rows = connection.exec_driver_sql(
                "SELECT version FROM mp_agent_versions WHERE agent_id = ? ORDER BY version", (agent_id,)
            ).all()
        return [row[0] for row in rows]

    def list_agents(self) -> list[AgentSpec]:
        """Every agent, most recently updated first."""
        with self._begin("list agents") as connection:
            rows = connection.exec_driver_sql(
                "SELECT spec, uses, successes, failures, ratings, rating_sum FROM mp_agents "
                "ORDER BY updated_at DESC, id"
            ).all()
        return [_with_stats(row[0], row[1:]) for row in rows]

    def delete_agent(self, agent_id: str) -> None:
        """Remove an agent and all its versions."""
        with self._begin("delete an agent") as connection:
            deleted = connection.exec_driver_sql("DELETE FROM mp_agents WHERE id = ?", (agent_id,)).rowcount
            if not deleted:
                raise RunError(f"no agent {agent_id!r} in the registry")
            connection.exec_driver_sql("DELETE FROM mp_agent_versions WHERE agent_id = ?", (agent_id,))
            connection.exec_driver_sql("DELETE FROM mp_agents_fts WHERE agent_id = ?", (agent_id,))

    def record_outcome(self, agent_id: str, *, succeeded: bool, rating: float | None = None) -> None:
        """Count one use of an agent (atomic: concurrent writers never lose an update)."""
        with self._begin("update an agent's stats") as connection:
            connection.exec_driver_sql(
                "UPDATE mp_agents SET uses = uses + 1, successes = successes + ?, failures = failures + ?, "
                "ratings = ratings + ?, rating_sum = rating_sum + ? WHERE id = ?",
                (int(succeeded), int(not succeeded), int(rating is not None), rating or 0.0, agent_id),
            )

    def rate(self, agent_id: str, rating: float) -> None:
        """Add one rating (1 to 5) to an agent's stats (atomic)."""
        with self._begin("rate an agent") as connection:
            connection.exec_driver_sql(
                "UPDATE mp_agents SET ratings = ratings + 1, rating_sum = rating_sum + ? WHERE id = ?",
                (rating, agent_id),
            )

    def add_lesson(self, agent_id: str, lesson: str) -> AgentSpec:
        """Append a lesson to an agent (a new version; at most the 50 newest lessons are kept)."""
        agent = self.get_agent(agent_id)
        lessons = [*agent.lessons, lesson.strip()][-50:]
        return self.put_agent(agent.model_copy(update={"lessons": lessons}))

    def search_agents(self, query: str, limit: int = 5) -> list[tuple[AgentSpec, float]]:
        """Agents matching `query` by BM25, nudged by their success rate and rating; best first."""
        terms = [term for term in "".join(c if c.isalnum() else " " for c in query).split() if len(term) > 1]
        if not terms:
            return []
        match = " OR ".join(f'"{term}"' for term in terms)
        with self._begin("search agents") as connection:
            rows = connection.exec_driver_sql(
                "SELECT a.spec, a.uses, a.successes, a.failures, a.ratings, a.rating_sum, "
                "bm25(mp_agents_fts) "
                "FROM mp_agents_fts JOIN mp_agents a ON a.id = mp_agents_fts.agent_id "
                "WHERE mp_agents_fts MATCH ? ORDER BY bm25(mp_agents_fts) LIMIT ?",
                (match, max(limit * 4, 20)),
            ).all()
        scored = []
        for row in rows:
            spec = _with_stats(row[0], row[1:6])
            scored.append((spec, -float(row[6]) * _prior(spec.stats)))
        scored.sort(key=lambda item: -item[1])
        return scored[:limit]

    # ---- export and import

    def export_agents(self, path: Path) -> int:
        """Write every agent (current version, stats, lessons) as JSON lines; returns how many."""
        agents = self.list_agents()
        path.write_text("".join(agent.model_dump_json() + "\n" for agent in agents), encoding="utf-8")
        return len(agents)

    def import_agents(self, path: Path) -> int:
        """Read agents from JSON lines, all or nothing; errors name the line and field."""
        specs = []
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                specs.append(AgentSpec.model_validate_json(line))
            except ValidationError as exc:
                error = exc.errors()[0]
                field = ".".join(str(part) for part in error["loc"]) or "line"
                raise ConfigError(
                    f"{path}: line {number}: {field}: {error['msg']}; nothing was imported"
                ) from None
        with self._begin("import agents") as connection:
            for spec in specs:
                connection.exec_driver_sql("DELETE FROM mp_agents WHERE id = ?", (spec.id,))
                connection.exec_driver_sql("DELETE FROM mp_agent_versions WHERE agent_id = ?", (spec.id,))
                connection.exec_driver_sql("DELETE FROM mp_agents_fts WHERE agent_id = ?", (spec.id,))
                self.put_agent(spec, connection)
        return len(specs)

    # ---- cohorts

    def put_cohort(self, cohort: Cohort) -> None:
        """Store a cohort (replacing one with the same id)."""
        with self._begin("store a cohort") as connection:
            connection.exec_driver_sql(
                "INSERT OR REPLACE INTO mp_cohorts (id, cohort, created_at) VALUES (?, ?, ?)",
                (cohort.id, cohort.model_dump_json(), utc_now()),
            )

    def get_cohort(self, cohort_id: str) -> Cohort:
        """The cohort with this id."""
        with self._begin("read a cohort") as connection:
            row = connection.exec_driver_sql(
                "SELECT cohort FROM mp_cohorts WHERE id = ?", (cohort_id,)
            ).first()
        if row is None:
            raise RunError(f"no cohort {cohort_id!r} in the registry (see `masterplanner cohorts list`)")
        return Cohort.model_validate_json(row[0])

    def list_cohorts(self) -> list[Cohort]:
        """Every cohort, newest first."""
        with self._begin("list cohorts") as connection:
            rows = connection.exec_driver_sql(
                "SELECT cohort FROM mp_cohorts ORDER BY created_at DESC, id"
            ).all()
        return [Cohort.model_validate_json(row[0]) for row in rows]

    def similar_cohorts(self, task: str, limit: int = 3) -> list[tuple[Cohort, float]]:
        """Cohorts whose task is like `task`, most similar first, with a similarity in [0, 1].

        Lexical for now: the Ochiai coefficient of the two tasks' word stems (the embedder-based
        hybrid ranking comes later).
        """
        from ..tools.selection import words

        wanted = set(words(task))
        if not wanted:
            return []
        scored = []
        for cohort in self.list_cohorts():
            have = set(words(cohort.task))
            if have:
                scored.append((cohort, len(wanted & have) / math.sqrt(len(wanted) * len(have))))
        scored.sort(key=lambda item: -item[1])
        return scored[:limit]

    def rate_cohort(self, cohort_id: str, rating: float) -> bool:
        """Set a cohort's rating; False when there is no such cohort (a failed run has none)."""
        with self._begin("rate a cohort") as connection:
            row = connection.exec_driver_sql(
                "SELECT cohort FROM mp_cohorts WHERE id = ?", (cohort_id,)
            ).first()
            if row is None:
                return False
            cohort = Cohort.model_validate_json(row[0]).model_copy(update={"rating": rating})
            connection.exec_driver_sql(
                "UPDATE mp_cohorts SET cohort = ? WHERE id = ?", (cohort.model_dump_json(), cohort_id)
            )
        return True

    def known_agents(self, agent_ids: list[str]) -> set[str]:
        """Which of `agent_ids` are in the registry (one query)."""
        if not agent_ids:
            return set()
        marks = ", ".join("?" for _ in agent_ids)
        with self._begin("read agents") as connection:
            rows = connection.exec_driver_sql(
                f"SELECT id FROM mp_agents WHERE id IN ({marks})", tuple(agent_ids)
            )
            return {row[0] for row in rows}

    def delete_cohort(self, cohort_id: str) -> None:
        """Remove a cohort (its agents stay)."""
        with self._begin("delete a cohort") as connection:
            if not connection.exec_driver_sql("DELETE FROM mp_cohorts WHERE id = ?", (cohort_id,)).rowcount:
                raise RunError(f"no cohort {cohort_id!r} in the registry")


def _with_stats(text: str, counts: Any) -> AgentSpec:
    uses, successes, failures, ratings, rating_sum = counts
    spec = AgentSpec.model_validate(json.loads(text))
    stats = AgentStats(
        uses=uses, successes=successes, failures=failures, ratings=ratings, rating_sum=rating_sum
    )
    return spec.model_copy(update={"stats": stats})


def _prior(stats: AgentStats) -> float:
    """A multiplier from track record: up to 1.5 for agents that succeed and are rated well."""
    rate = stats.success_rate
    rating = stats.mean_rating
    boost = 1.0
    if rate is not None:
        boost += 0.3 * (rate - 0.5) * min(1.0, math.log1p(stats.uses) / 2)
    if rating is not None:
        boost += 0.1 * (rating - 3) / 2
    return max(0.5, boost)
