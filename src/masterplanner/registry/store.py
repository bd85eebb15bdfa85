"""The registry store: agents (every version kept), cohorts, and their search indexes, in the run database.

Tables `mp_agents`, `mp_agent_versions`, `mp_cohorts`, a text index over agents and one over
cohort tasks, and `mp_vectors` (one float32 vector per item and embedder, marked with the
`VECTORS_VERSION` it was made by), created by named
migrations recorded in `mp_migrations` (shared with the run store). The same code runs on SQLite
(text indexes: FTS5 with porter stemming, BM25) and on Postgres (tsvector columns with English
stemming and GIN indexes, `ts_rank`; vectors as `bytea`), for workers sharing one database.
Every write is one transaction; stats change by SQL arithmetic, so concurrent writers from
several processes never lose an update.

Ranking: with no embedder, the text index alone; with one, its list and the cosine list are
fused by reciprocal rank fusion. Either way a prior from the agent's success rate and rating is
applied. Vectors are compared in memory (numpy, exhaustive) from a cache reloaded when the
registry's write counter moves; items stored while no (or another) embedder was configured, or
embedded by an older version or into vectors of another size, are embedded on the next search,
and `reembed` makes every vector again. The embedder named by a setting is checked when the
store opens and loaded when a search first needs it: reading and writing agents, teams and memories import no
NumPy and no model code. sqlite-vec is not used: Python builds without loadable SQLite
extensions (pyenv's default, this project's CI among them) cannot load it, and its vec0 search
is exhaustive too.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy import inspect
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from ..database import (
    Migration,
    create_engine,
    migrate,
    names_nothing,
    reconnecting_methods,
    transaction,
    utc_now,
)
from ..errors import (
    ConfigError,
    NotFoundError,
    RunError,
    problem_in_our_words,
    quoted_id,
    validation_problems,
)
from ..text_files import read_text
from .specs import AgentSpec, AgentStats, Cohort, with_prompt_author

if TYPE_CHECKING:
    import numpy as np

    from ..settings import Settings
    from .embedders import TextEmbedder

__all__ = [
    "REGISTRY_MIGRATIONS",
    "VECTORS_VERSION",
    "AppliedRating",
    "ImportedAgents",
    "Reembedded",
    "RegistryStore",
    "fuse",
    "lexical_similarity",
    "open_registry",
    "query_terms",
]


@dataclass
class ImportedAgents:
    """What `RegistryStore.import_agents` did, by agent id."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    """Each given a new version (the imported one differed from the current one)."""
    unchanged: list[str] = field(default_factory=list)


@dataclass
class Reembedded:
    """What `RegistryStore.reembed` did."""

    embedder: str
    made: dict[str, int]
    """Kind (agent, cohort, memory) -> how many of its items got a new vector."""
    changed: int = 0
    """Items edited or removed while they were embedded: left for the next search to embed."""


@dataclass(frozen=True)
class AppliedRating:
    """What `RegistryStore.apply_rating` changed besides the agents' ratings."""

    cohort_rated: bool
    """Whether the run had a stored team to rate."""
    lessons: dict[str, list[str]]
    """Agent id -> the lessons added (a lesson the agent had already is not)."""


def _content(spec: AgentSpec) -> dict[str, Any]:
    """What an agent's version holds (not its version number or track record)."""
    return spec.model_dump(exclude={"version", "stats"})


MAX_LESSONS = 50
"""The most lessons an agent keeps (`AgentSpec.lessons`); a rating past it lets the oldest go."""


def _lesson_key(lesson: str) -> str:
    """What two lessons are compared by: their words, in lower case, without closing punctuation."""
    return " ".join(lesson.casefold().split()).rstrip(".,;:!?… ")


def _with_lessons_kept(imported: AgentSpec, current: AgentSpec, had: Collection[str]) -> AgentSpec:
    """`imported` holding every lesson of `current` (the stored agent), after the file's new ones.

    Before, an import took the file's lessons in place of the stored ones: an older export
    imported again dropped every lesson the agent had learned since. A lesson of the file is new
    when no stored version of the agent had it (`had`: every version's lessons): one removed
    since (by an edit, or let go past `MAX_LESSONS` as it learned) stays removed; before, an older
    export brought it back. The new ones come first (as older ones); past `MAX_LESSONS`, they
    give way, oldest first. Lessons are compared as `_lesson_key` gives them: before, one that
    differed only in spacing, case or a closing `.` was imported as a second lesson. A new one is
    kept as the file has it, once.
    """
    known = {_lesson_key(lesson) for lesson in [*had, *current.lessons]}
    extra: list[str] = []
    for lesson in imported.lessons:
        if (key := _lesson_key(lesson)) not in known:
            known.add(key)
            extra.append(lesson)
    lessons = [*extra[max(0, len(extra) + len(current.lessons) - MAX_LESSONS) :], *current.lessons]
    return imported if lessons == imported.lessons else imported.model_copy(update={"lessons": lessons})


def _create_registry_tables(connection: Connection) -> None:
    _sql(
        connection,
        "CREATE TABLE IF NOT EXISTS mp_agents (id TEXT PRIMARY KEY, spec TEXT NOT NULL, "
        "version INTEGER NOT NULL, uses INTEGER NOT NULL DEFAULT 0, successes INTEGER NOT NULL DEFAULT 0, "
        "failures INTEGER NOT NULL DEFAULT 0, ratings INTEGER NOT NULL DEFAULT 0, "
        "rating_sum REAL NOT NULL DEFAULT 0, created_at TEXT NOT NULL, updated_at TEXT NOT NULL)",
    )
    _sql(
        connection,
        "CREATE TABLE IF NOT EXISTS mp_agent_versions (agent_id TEXT NOT NULL, version INTEGER NOT NULL, "
        "spec TEXT NOT NULL, created_at TEXT NOT NULL, PRIMARY KEY (agent_id, version))",
    )
    _sql(
        connection,
        "CREATE TABLE IF NOT EXISTS mp_cohorts "
        "(id TEXT PRIMARY KEY, cohort TEXT NOT NULL, created_at TEXT NOT NULL)",
    )
    _text_index(connection, "agent").create(connection)


def _index_cohorts_and_vectors(connection: Connection) -> None:
    cohorts = _text_index(connection, "cohort")
    cohorts.create(connection)
    for cohort_id, text in _sql(connection, "SELECT id, cohort FROM mp_cohorts").all():
        cohorts.insert(connection, cohort_id, json.loads(text)["task"])
    blob = "BYTEA" if _is_postgres(connection) else "BLOB"
    _sql(
        connection,
        "CREATE TABLE IF NOT EXISTS mp_vectors (embedder TEXT NOT NULL, kind TEXT NOT NULL, "
        f"item_id TEXT NOT NULL, vector {blob} NOT NULL, PRIMARY KEY (embedder, kind, item_id))",
    )
    _sql(
        connection,
        "CREATE TABLE IF NOT EXISTS mp_registry_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    )
    _sql(
        connection,
        "INSERT INTO mp_registry_meta (key, value) VALUES ('writes', 0) ON CONFLICT (key) DO NOTHING",
    )


def _create_memories(connection: Connection) -> None:
    connection.exec_driver_sql(
        "CREATE TABLE IF NOT EXISTS mp_memories (id TEXT PRIMARY KEY, kind TEXT NOT NULL, "
        "text TEXT NOT NULL, source TEXT NOT NULL, created_at TEXT NOT NULL, last_used_at TEXT NOT NULL, "
        "expires_at TEXT NOT NULL)"
    )
    connection.exec_driver_sql("CREATE INDEX IF NOT EXISTS mp_memories_used ON mp_memories (last_used_at)")
    connection.exec_driver_sql("CREATE INDEX IF NOT EXISTS mp_vectors_item ON mp_vectors (kind, item_id)")
    _text_index(connection, "memory").create(connection)


def _version_vectors(connection: Connection) -> None:
    """Record what each vector was made by (`VECTORS_VERSION`); those stored before are version 0.

    Version 0 vectors include the wrong ones of 38838a5's per-token server (every text after the
    first of a batch got the first one's vectors, shifted): searches make them again.
    """
    _sql(connection, "ALTER TABLE mp_vectors ADD COLUMN version INTEGER NOT NULL DEFAULT 0")


def _create_run_ratings(connection: Connection) -> None:
    _sql(
        connection,
        "CREATE TABLE IF NOT EXISTS mp_run_ratings (run_id TEXT PRIMARY KEY, rating INTEGER NOT NULL, "
        "rated_by TEXT NOT NULL, rated_at TEXT NOT NULL)",
    )


def _create_outcomes_counted(connection: Connection) -> None:
    """Migration `registry_0007_outcomes_counted`: which runs' outcomes were counted (`record_team`)."""
    _sql(
        connection,
        "CREATE TABLE IF NOT EXISTS mp_outcomes_counted "
        "(counting TEXT PRIMARY KEY, counted_at TEXT NOT NULL)",
    )


def _edited_at_review(connection: Connection, origin: Mapping[str, str]) -> bool:
    """Whether the run an agent was stored from had its step's prompt edited at review."""
    if not origin.get("run_id"):
        return False
    row = _sql(connection, "SELECT agents FROM mp_runs WHERE id = ?", (origin["run_id"],)).first()
    try:
        agents = json.loads(row[0]) if row is not None and row[0] else {}
        return bool(agents.get(origin.get("step_id", ""), {}).get("edited"))
    except (ValueError, AttributeError):  # not a run's agents map: nothing to tell from it
        return False


def _mark_person_prompts(connection: Connection) -> None:
    """Mark the stored agents whose prompt a person wrote (`AgentSpec.prompt_by_person`).

    Agents stored before the mark: one made from a step whose prompt was edited at review (its
    run says so), and each version from the first whose prompt differs from the version before
    it (an edit, or an import of one). Unmarked, a run reusing them would skip their prompt.
    """
    runs = inspect(connection).has_table("mp_runs")  # (a registry opened before any run store)
    rows = _sql(
        connection, "SELECT agent_id, version, spec FROM mp_agent_versions ORDER BY agent_id, version"
    )
    marked: dict[str, bool] = {}
    prompts: dict[str, str] = {}
    for agent_id, version, text in rows.all():
        spec = json.loads(text)
        prompt = str(spec.get("system_prompt", ""))
        if agent_id not in marked:
            marked[agent_id] = runs and _edited_at_review(connection, spec.get("origin") or {})
        elif prompt.strip() != prompts[agent_id].strip():
            marked[agent_id] = True
        prompts[agent_id] = prompt
        if marked[agent_id] and not spec.get("prompt_by_person"):
            _sql(
                connection,
                "UPDATE mp_agent_versions SET spec = ? WHERE agent_id = ? AND version = ?",
                (json.dumps(spec | {"prompt_by_person": True}), agent_id, version),
            )
    for agent_id, text in _sql(connection, "SELECT id, spec FROM mp_agents").all():
        spec = json.loads(text)
        if marked.get(agent_id) and not spec.get("prompt_by_person"):
            _sql(
                connection,
                "UPDATE mp_agents SET spec = ? WHERE id = ?",
                (json.dumps(spec | {"prompt_by_person": True}), agent_id),
            )


REGISTRY_MIGRATIONS: list[Migration] = [
    ("registry_0001_agents_versions_cohorts_fts", _create_registry_tables),
    ("registry_0002_cohort_index_vectors", _index_cohorts_and_vectors),
    ("registry_0003_memories", _create_memories),
    ("registry_0004_run_ratings", _create_run_ratings),
    ("registry_0005_prompt_by_person", _mark_person_prompts),
    ("registry_0006_vector_versions", _version_vectors),
    ("registry_0007_outcomes_counted", _create_outcomes_counted),
]

VECTORS_VERSION = 1
"""How the vectors stored now are made; one stored with another version is made again when used.

Raise it with any change to what is embedded for an item (`_embedding_text_of`) or to how an
embedder turns a text into a vector (a fix like one text per request for a per-token server, or
taking a server's vectors by their `index`): every registry's vectors, of every embedder, are
then made again, lazily by the next search of each kind, or at once by `reembed`.
Version 1: the texts in one request each for per-token servers (38838a5), vectors by `index`.
"""
_REEMBED_BATCH = 32
"""How many texts `reembed` embeds before it stores them (and reports progress)."""

RRF_K = 60
"""Reciprocal rank fusion's constant: an item at rank r in a list adds 1 / (RRF_K + r)."""
_CANDIDATES = 50
"""How many items each ranking (BM25, cosine) contributes before fusion."""
_KINDS = ("agent", "cohort")


def query_terms(text: str) -> list[str]:
    """The words of a search as the text indexes split them (runs of letters, with their marks, and digits).

    Lower case, without stop words and repeats.
    """
    from ..tools.selection import STOP_WORDS, index_terms

    found = (term for term in index_terms(text.lower()) if len(term) > 1 and term not in STOP_WORDS)
    return list(dict.fromkeys(found))


COMMON_TERM_DOCS = 3000
COMMON_QUERY_TEXTS = 1000
"""With only common terms, how many of the newest texts holding them all (else any) are ranked."""
"""A query term found in this many indexed texts or more is left out when rarer terms are there."""
POSTINGS_BUDGET = 4000
"""The most indexed texts the ranking query may walk: rarer terms are kept first until this is reached."""
_MAX_CACHED_TERMS = 50_000
"""Term counts kept per kind of item before the cache starts again."""


def _match(terms: list[str], operator: str, quote: str) -> str:
    return operator.join(f"{quote}{term}{quote}" for term in terms)


@dataclass(frozen=True)
class _TermChoice:
    """The terms a ranking query uses; `common` when every query term is in thousands of texts."""

    terms: list[str]
    common: bool = False


def _selective_terms(terms: list[str], count: Callable[[str], int]) -> _TermChoice:
    """The query terms worth a ranking query: the rarest first, while their texts add up to `POSTINGS_BUDGET`.

    An OR query costs a walk over every text that holds any of its terms, and the texts a common
    term adds weigh little (BM25's idf is low for it), so terms are taken rarest first until the
    texts they cover would pass `POSTINGS_BUDGET`; the rarest is always taken. `count` reads each
    term's texts only up to `COMMON_TERM_DOCS`. Terms no text holds are left out. When every term
    that occurs is that common, they all are kept and the choice is marked `common`: the index
    then ranks only a sample of the texts holding all of them (see `_search`).
    """
    counts = {term: count(term) for term in terms}
    rare = sorted((term for term in terms if 0 < counts[term] < COMMON_TERM_DOCS), key=lambda t: counts[t])
    chosen: list[str] = []
    walked = 0
    for term in rare:
        if chosen and walked + counts[term] > POSTINGS_BUDGET:
            break
        chosen.append(term)
        walked += counts[term]
    if chosen:
        return _TermChoice(chosen)
    found = [term for term in terms if counts[term]]
    return _TermChoice(found, common=True) if found else _TermChoice(terms)


def fuse(rankings: list[list[str]]) -> dict[str, float]:
    """Reciprocal rank fusion of ranked id lists: id -> sum of 1 / (RRF_K + rank), rank from 1."""
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, item in enumerate(ranking, start=1):
            fused[item] = fused.get(item, 0.0) + 1.0 / (RRF_K + rank)
    return fused


def lexical_similarity(first: str, second: str) -> float:
    """The Ochiai coefficient of two texts' word stems, in [0, 1]."""
    from ..tools.selection import words

    a, b = set(words(first)), set(words(second))
    return len(a & b) / math.sqrt(len(a) * len(b)) if a and b else 0.0


def _is_postgres(connection: Connection) -> bool:
    return connection.dialect.name == "postgresql"


def _sql(connection: Connection, statement: str, parameters: Any = ()) -> Any:
    """Run `statement` with `?` placeholders on either database (psycopg wants `%s`)."""
    if _is_postgres(connection):
        statement = statement.replace("?", "%s")
    return connection.exec_driver_sql(statement, parameters)


class _Fts5Index:
    """SQLite: an FTS5 table (porter stemming) ranked by BM25."""

    quote, all_of, any_of = '"', " AND ", " OR "

    def __init__(self, table: str, key: str) -> None:
        self.table = table
        self.key = key

    def create(self, connection: Connection) -> None:
        _sql(
            connection,
            f"CREATE VIRTUAL TABLE IF NOT EXISTS {self.table} USING fts5({self.key} UNINDEXED, body, "
            "tokenize='porter unicode61')",
        )

    def insert(self, connection: Connection, item_id: str, body: str) -> None:
        _sql(connection, f"INSERT INTO {self.table} ({self.key}, body) VALUES (?, ?)", (item_id, body))

    def delete(self, connection: Connection, item_id: str) -> None:
        _sql(connection, f"DELETE FROM {self.table} WHERE {self.key} = ?", (item_id,))

    def count(self, connection: Connection, term: str) -> int:
        """How many texts hold `term`, counted up to `COMMON_TERM_DOCS`."""
        return int(
            _sql(
                connection,
                f"SELECT count(*) FROM (SELECT rowid FROM {self.table} WHERE {self.table} MATCH ? LIMIT ?)",
                (f'"{term}"', COMMON_TERM_DOCS),
            ).scalar_one()
        )

    def ranked(self, connection: Connection, match: str, limit: int) -> list[str]:
        """The best `limit` texts matching `match` by BM25; equal ones newest first."""
        rows = _sql(
            connection,
            f"SELECT {self.key} FROM {self.table} WHERE {self.table} MATCH ? "
            "ORDER BY rank, rowid DESC LIMIT ?",
            (match, limit),
        )
        return [row[0] for row in rows]

    def ranked_sample(self, connection: Connection, match: str, limit: int) -> list[str]:
        """The best `limit` by BM25 of the newest `COMMON_QUERY_TEXTS` texts matching `match`.

        Equal ones newest first.
        """
        rows = _sql(
            connection,
            f"SELECT key FROM (SELECT {self.key} AS key, rank, rowid AS row FROM {self.table} "
            f"WHERE {self.table} MATCH ? ORDER BY rowid DESC LIMIT ?) ORDER BY rank, row DESC LIMIT ?",
            (match, COMMON_QUERY_TEXTS, limit),
        )
        return [row[0] for row in rows]


class _TsvectorIndex:
    """Postgres: a tsvector column (English stemming) with a GIN index, ranked by `ts_rank`."""

    quote, all_of, any_of = "'", " & ", " | "

    def __init__(self, table: str) -> None:
        self.table = table

    def create(self, connection: Connection) -> None:
        _sql(
            connection,
            f"CREATE TABLE IF NOT EXISTS {self.table} (item_id TEXT PRIMARY KEY, body tsvector NOT NULL)",
        )
        _sql(connection, f"CREATE INDEX IF NOT EXISTS {self.table}_body ON {self.table} USING GIN (body)")

    def insert(self, connection: Connection, item_id: str, body: str) -> None:
        _sql(
            connection,
            f"INSERT INTO {self.table} (item_id, body) VALUES (?, to_tsvector('english', ?)) "
            "ON CONFLICT (item_id) DO UPDATE SET body = excluded.body",
            (item_id, body),
        )

    def delete(self, connection: Connection, item_id: str) -> None:
        _sql(connection, f"DELETE FROM {self.table} WHERE item_id = ?", (item_id,))

    def count(self, connection: Connection, term: str) -> int:
        """How many texts hold `term`, counted up to `COMMON_TERM_DOCS`."""
        return int(
            _sql(
                connection,
                f"SELECT count(*) FROM (SELECT 1 FROM {self.table} "
                "WHERE body @@ to_tsquery('english', ?) LIMIT ?) AS hits",
                (f"'{term}'", COMMON_TERM_DOCS),
            ).scalar_one()
        )

    def ranked(self, connection: Connection, match: str, limit: int) -> list[str]:
        """The best `limit` texts matching `match` by `ts_rank`; equal ones by id, the last first."""
        rows = _sql(
            connection,
            f"SELECT item_id FROM {self.table}, to_tsquery('english', ?) AS query WHERE body @@ query "
            "ORDER BY ts_rank(body, query) DESC, item_id DESC LIMIT ?",
            (match, limit),
        )
        return [row[0] for row in rows]

    def ranked_sample(self, connection: Connection, match: str, limit: int) -> list[str]:
        """The best `limit` by `ts_rank` of `COMMON_QUERY_TEXTS` texts matching `match` (in index order)."""
        rows = _sql(
            connection,
            "SELECT item_id FROM (SELECT item_id, ts_rank(body, query) AS score "
            f"FROM {self.table}, to_tsquery('english', ?) AS query WHERE body @@ query LIMIT ?) AS found "
            "ORDER BY score DESC, item_id DESC LIMIT ?",
            (match, COMMON_QUERY_TEXTS, limit),
        )
        return [row[0] for row in rows]


_TextIndex = _Fts5Index | _TsvectorIndex


def _search(index: _TextIndex, connection: Connection, choice: _TermChoice, limit: int) -> list[str]:
    """Ids of the texts holding any of the chosen terms, best first.

    With only common terms, a sample of the texts that hold all of them (else any) is ranked,
    rather than every one of tens of thousands.
    """
    if not choice.common:
        return index.ranked(connection, _match(choice.terms, index.any_of, index.quote), limit)
    for operator in (index.all_of, index.any_of):
        found = index.ranked_sample(connection, _match(choice.terms, operator, index.quote), limit)
        if found:
            return found
    return []


_INDEX_TABLES = {"agent": "mp_agents", "cohort": "mp_cohorts", "memory": "mp_memories"}
_ITEM_TEXTS = {
    "agent": ("mp_agents", "spec"),
    "cohort": ("mp_cohorts", "cohort"),
    "memory": ("mp_memories", "text"),
}
"""Each kind of item with a vector: its table and the column its embedded text is made from."""


def _text_index(connection: Connection, kind: str) -> _TextIndex:
    table = _INDEX_TABLES[kind]
    if _is_postgres(connection):
        return _TsvectorIndex(f"{table}_text")
    return _Fts5Index(f"{table}_fts", f"{kind}_id")  # names from registry_0001: kept


class _Vectors:
    """One kind's vectors for one embedder, in memory: ids (in their order) and a unit-row matrix."""

    def __init__(self, ids: list[str], matrix: np.ndarray) -> None:
        self.ids = ids
        self.matrix = matrix
        self.position = {item: n for n, item in enumerate(ids)}

    def nearest(self, query: np.ndarray, count: int) -> list[tuple[str, float]]:
        if not self.ids:
            return []
        scores = self.matrix @ query
        # one ordering of all of them, equal scores the last id (the newest run's) first: a
        # partition first (argpartition) kept whichever equal ones it met first at its cut, the
        # oldest, so past 50 copies of a task the newest never came back
        import numpy as np

        top = np.lexsort((-np.arange(len(self.ids)), -scores))[:count]
        return [(self.ids[n], float(scores[n])) for n in top]


@reconnecting_methods
class RegistryStore:
    """Agents and cohorts; safe to share between tasks and threads of one process."""

    def __init__(self, url: str, embedder: TextEmbedder | str | None = None) -> None:
        """The registry at `url`, with `embedder`: one made already, or the setting that names one.

        A setting is checked now (`check_embedder`: a bad one is refused before the database is
        touched) and its embedder made when a search first needs it (`embedder`).
        """
        if isinstance(embedder, str):
            from .embedders import check_embedder

            check_embedder(embedder)
            self._embedder_spec: str | None = embedder
            self._embedder: TextEmbedder | None = None
        else:
            self._embedder_spec, self._embedder = None, embedder
        self.url = url
        self.engine = create_engine(url)
        self._vectors: dict[str, tuple[int, _Vectors]] = {}
        self._queries: dict[str, tuple[int | None, np.ndarray]] = {}
        """Search texts' vectors (the last 64), each with the registry's vector generation it was
        used at (`_counters`; None: embedded, not used yet)."""
        self._counts: dict[str, tuple[int, dict[str, int]]] = {}
        migrate(self.engine, self.url, REGISTRY_MIGRATIONS)

    @property
    def embedder(self) -> TextEmbedder | None:
        """The embedder searches rank and compare with; None ranks by the text index alone.

        Made (its code imported: NumPy, pydantic-ai, the model's) on first use, from the setting
        the store was opened with.
        """
        if self._embedder_spec is not None:
            from .embedders import resolve_embedder

            self._embedder = resolve_embedder(self._embedder_spec)
            self._embedder_spec = None
        return self._embedder

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
        row = _sql(connection, "SELECT version FROM mp_agents WHERE id = ?", (spec.id,)).first()
        version = (row[0] + 1) if row else spec.version
        stored = spec.model_copy(update={"version": version})
        text = stored.model_dump_json()
        if row:
            _sql(
                connection,
                "UPDATE mp_agents SET spec = ?, version = ?, updated_at = ? WHERE id = ?",
                (text, version, now, spec.id),
            )
        else:
            stats = spec.stats
            _sql(
                connection,
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
        _sql(
            connection,
            "INSERT INTO mp_agent_versions (agent_id, version, spec, created_at) VALUES (?, ?, ?, ?)",
            (spec.id, version, text, now),
        )
        index = _text_index(connection, "agent")
        if row:  # (deleting by id scans an FTS5 table: only when there is something to replace)
            index.delete(connection, spec.id)
        index.insert(connection, spec.id, stored.search_text())
        _forget_vectors(connection, "agent", spec.id)
        return stored

    def put_agents(self, specs: list[AgentSpec]) -> int:
        """Store many agents in one transaction (all or none); returns how many."""
        with self._begin("store agents") as connection:
            for spec in specs:
                self.put_agent(spec, connection)
        return len(specs)

    @staticmethod
    def _embedding_text(spec: AgentSpec) -> str:
        return ". ".join(
            part for part in (spec.name, spec.role, spec.description, " ".join(spec.keywords)) if part
        )

    def get_agent(
        self, agent_id: str, version: int | None = None, *, connection: Connection | None = None
    ) -> AgentSpec:
        """The agent (its current version, or `version`), with its current stats."""
        if names_nothing(agent_id):
            raise NotFoundError(
                f"no agent {quoted_id(agent_id)} in the registry (see `masterplanner agents list`)"
            )
        if connection is None:
            with self._begin("read an agent") as own:
                return self.get_agent(agent_id, version, connection=own)
        row = _sql(
            connection,
            "SELECT spec, uses, successes, failures, ratings, rating_sum FROM mp_agents WHERE id = ?",
            (agent_id,),
        ).first()
        if row is None:
            raise NotFoundError(
                f"no agent {quoted_id(agent_id)} in the registry (see `masterplanner agents list`)"
            )
        text = row[0]
        if version is not None:
            found = _sql(
                connection,
                "SELECT spec FROM mp_agent_versions WHERE agent_id = ? AND version = ?",
                (agent_id, version),
            ).first()
            if found is None:
                raise NotFoundError(f"agent {quoted_id(agent_id)} has no version {version}")
            text = found[0]
        return _with_stats(text, row[1:])

    @staticmethod
    def _lessons_ever(connection: Connection, agent_id: str) -> set[str]:
        """Every lesson any stored version of the agent has had (`import_agents`)."""
        rows = _sql(connection, "SELECT spec FROM mp_agent_versions WHERE agent_id = ?", (agent_id,)).all()
        return {str(lesson) for row in rows for lesson in json.loads(row[0]).get("lessons") or []}

    def versions(self, agent_id: str) -> list[int]:
        """The agent's version numbers, oldest first."""
        with self._begin("read versions") as connection:
            rows = _sql(
                connection,
                "SELECT version FROM mp_agent_versions WHERE agent_id = ? ORDER BY version",
                (agent_id,),
            ).all()
        return [row[0] for row in rows]

    def list_agents(self) -> list[AgentSpec]:
        """Every agent, most recently updated first."""
        with self._begin("list agents") as connection:
            rows = _sql(
                connection,
                "SELECT spec, uses, successes, failures, ratings, rating_sum FROM mp_agents "
                "ORDER BY updated_at DESC, id",
            ).all()
        return [_with_stats(row[0], row[1:]) for row in rows]

    def delete_agent(self, agent_id: str) -> None:
        """Remove an agent and all its versions."""
        with self._begin("delete an agent") as connection:
            deleted = _sql(connection, "DELETE FROM mp_agents WHERE id = ?", (agent_id,)).rowcount
            if not deleted:
                raise NotFoundError(f"no agent {quoted_id(agent_id)} in the registry")
            _sql(connection, "DELETE FROM mp_agent_versions WHERE agent_id = ?", (agent_id,))
            _text_index(connection, "agent").delete(connection, agent_id)
            _forget_vectors(connection, "agent", agent_id)

    def record_outcome(self, agent_id: str, *, succeeded: bool, rating: float | None = None) -> None:
        """Count one use of an agent (atomic: concurrent writers never lose an update)."""
        with self._begin("update an agent's stats") as connection:
            _count_use(connection, agent_id, succeeded=succeeded, rating=rating)

    def correct_outcome(self, agent_id: str) -> None:
        """Count an agent's last counted failure as a success instead: its run, retried, succeeded."""
        with self._begin("update an agent's stats") as connection:
            _correct_use(connection, agent_id)

    def _add_lesson(self, connection: Connection, agent_id: str, lesson: str) -> str | None:
        """Append a lesson to an agent as its next version (the 50 newest kept); the lesson added, if any.

        A lesson the agent has already is not added (None), compared as an import compares them
        (`_lesson_key`): before, one differing only in case or a closing `.` was a second lesson.
        """
        agent = self.get_agent(agent_id, connection=connection)
        lesson = lesson.strip()
        if _lesson_key(lesson) in {_lesson_key(known) for known in agent.lessons}:
            return None
        lessons = [*agent.lessons, lesson][-MAX_LESSONS:]
        self.put_agent(agent.model_copy(update={"lessons": lessons}), connection)
        return lesson

    def check_unrated(self, run_id: str) -> None:
        """`RunError` saying who rated the run and when, if it was rated."""
        with self._begin("read a run's rating") as connection:
            row = _sql(
                connection,
                "SELECT rating, rated_by, rated_at FROM mp_run_ratings WHERE run_id = ?",
                (run_id,),
            ).first()
        if row is not None:
            raise RunError(
                f"run {run_id} was rated {row[0]} already (by {row[1]} at {row[2]}): a run is rated once"
            )

    def apply_rating(
        self,
        run_id: str,
        rating: int,
        *,
        by: str,
        agent_ids: Collection[str],
        lessons: Mapping[str, list[str]],
    ) -> AppliedRating:
        """Rate the run once: its agents, its team, and the lessons, in one transaction (all or none).

        `RunError` when the run was rated already (by anyone, at any time); nothing changes then.
        Returns whether the run had a stored team to rate, and the lessons added.
        """
        try:
            with self._begin("rate a run") as connection:
                # the claim first: of two raters at once, the second's insert waits for the first's
                # commit and then conflicts, so its ratings and lessons are never applied
                _sql(
                    connection,
                    "INSERT INTO mp_run_ratings (run_id, rating, rated_by, rated_at) VALUES (?, ?, ?, ?)",
                    (run_id, rating, by, utc_now()),
                )
                rated = sorted(set(agent_ids))  # each agent once, whatever steps it served
                if rated:
                    marks = ", ".join("?" for _ in rated)
                    _sql(
                        connection,
                        "UPDATE mp_agents SET ratings = ratings + 1, rating_sum = rating_sum + ? "
                        f"WHERE id IN ({marks})",
                        (rating, *rated),
                    )
                added: dict[str, list[str]] = {}
                for agent_id, texts in lessons.items():
                    for text in texts:
                        if (lesson := self._add_lesson(connection, agent_id, text)) is not None:
                            added.setdefault(agent_id, []).append(lesson)
                return AppliedRating(self._rate_cohort(connection, run_id, rating), added)
        except IntegrityError:
            self.check_unrated(run_id)  # the other rating's words
            raise

    def search_agents(self, query: str, limit: int = 5) -> list[tuple[AgentSpec, float]]:
        """Agents matching `query`, best first, with their scores.

        BM25 (fused with cosine order when an embedder is set), times a prior from their success
        rate and rating.
        """
        wanted = self._query_vector(query)  # embedded before the transaction: no lock held meanwhile
        with self._begin("search agents") as connection:
            fused, _ = self._rank(connection, "agent", query, wanted)
            if not fused:
                return []
            marks = ", ".join("?" for _ in fused)
            rows = _sql(
                connection,
                "SELECT id, spec, uses, successes, failures, ratings, rating_sum FROM mp_agents "
                f"WHERE id IN ({marks})",
                tuple(fused),
            ).all()
        # Score from the stats columns; only the agents returned are parsed.
        scored = sorted(
            ((fused[row[0]] * _prior(_stats(row[2:7])), row[0], row) for row in rows),
            key=lambda item: (-item[0], item[1]),
        )
        return [(_with_stats(row[1], row[2:7]), score) for score, _, row in scored[:limit]]

    def similar_agents(self, text: str, limit: int = 3) -> list[tuple[AgentSpec, float]]:
        """Agents like `text` (a step's role, title and instruction), best first, with a similarity in [0, 1].

        Order as `search_agents`; similarity is the embedder's calibrated cosine of the embeddings
        with an embedder (see `TextEmbedder.similarity`), else the Ochiai coefficient of the word
        stems of `text` and the agent's name, role and description: what a step's text holds. (Its
        keywords, the words of the task it was made for, find it but are left out of the
        comparison: with them an agent scored 0.74 against the very step it was made for, under
        `agent_reuse_threshold`, and was never reused.)
        """
        found = self.search_agents(text, limit)
        if self.embedder is None:
            return [
                (spec, lexical_similarity(text, f"{spec.role}. {spec.name}. {spec.description}"))
                for spec, _ in found
            ]
        wanted = self._query_vector(text)
        if wanted is None:
            return []
        with self._begin("compare agents") as connection:
            vectors, wanted = self._current_vectors(connection, "agent", text, wanted)
        similarity = self.embedder.similarity
        return [
            (spec, similarity(float(vectors.matrix[vectors.position[spec.id]] @ wanted)))
            for spec, _ in found
            if spec.id in vectors.position
        ]

    # ---- ranking and vectors

    def _rank(
        self, connection: Connection, kind: str, text: str, wanted: np.ndarray | None
    ) -> tuple[dict[str, float], Callable[[str], float] | None]:
        """Items of `kind` like `text`: id -> fused score, and (with an embedder) id -> cosine.

        The text index's top candidates, fused by reciprocal rank fusion with the cosine top
        candidates when an embedder is set; `wanted` is `text`'s embedding (`_query_vector`),
        computed by the caller before its transaction began (and made again here if stale).
        """
        rankings: list[list[str]] = []
        terms = query_terms(text)
        if terms:
            index = _text_index(connection, kind)
            counts = self._term_counts(connection, kind)

            def count(term: str) -> int:
                if term not in counts:
                    counts[term] = index.count(connection, term)
                return counts[term]

            rankings.append(_search(index, connection, _selective_terms(terms, count), _CANDIDATES))
        if wanted is None:
            return fuse(rankings), None
        vectors, query = self._current_vectors(connection, kind, text, wanted)
        rankings.append([item for item, _ in vectors.nearest(query, _CANDIDATES)])

        def cosine(item: str) -> float:
            return float(vectors.matrix[vectors.position[item]] @ query) if item in vectors.position else 0.0

        return fuse(rankings), cosine

    def _term_counts(self, connection: Connection, kind: str) -> dict[str, int]:
        """This process's cache of term counts for `kind`, emptied whenever the registry changed."""
        writes = _writes(connection)
        cached = self._counts.get(kind)
        if cached is None or cached[0] != writes or len(cached[1]) > _MAX_CACHED_TERMS:
            cached = (writes, {})
            self._counts[kind] = cached
        return cached[1]

    def _query_vector(self, text: str) -> np.ndarray | None:
        """The embedding of a search text, None without an embedder or text (the last 64 are kept).

        One kept is used as it is here; `_current_vectors` makes it again when the registry's
        vectors were made again since it was used (`_counters`).
        """
        if self.embedder is None or not text.strip():
            return None
        cached = self._queries.get(text)
        return cached[1] if cached is not None else self._embed_query(text, None)

    def _embed_query(self, text: str, generation: int | None) -> np.ndarray:
        """`text` embedded now and kept, marked with `generation` (None: not used yet)."""
        assert self.embedder is not None
        vector: np.ndarray = self.embedder.embed_sync([text], "query")[0]
        if text not in self._queries and len(self._queries) >= 64:
            self._queries.pop(next(iter(self._queries)), None)
        self._queries[text] = (generation, vector)
        return vector

    def _current_vectors(
        self, connection: Connection, kind: str, text: str, wanted: np.ndarray
    ) -> tuple[_Vectors, np.ndarray]:
        """This kind's vectors for the configured embedder (embedding items with none), and `wanted`.

        `wanted` is `text`'s vector from `_query_vector`, embedded again if it is stale: kept from
        before the registry's vectors were made again (`reembed`, or a model of another size seen
        by any process: the generation of `_counters` moved), or of another size than this kind's
        stored vectors (made by the model served under the embedder's name before). (A kept one
        of the old size had every item embedded again at the new size, then none read back at the
        old one: the search found
        nothing, and so did every one like it.) An item has none when it has no vector of this
        embedder, of `VECTORS_VERSION` and of the query's size: one stored by an older version
        (or before versions were kept), or by another model served under the embedder's name
        since, is made again and replaced.
        """
        assert self.embedder is not None
        writes, generation = _counters(connection)
        cached = self._queries.get(text)
        fresh = cached is None or cached[0] is None
        if cached is not None and cached[0] is not None and cached[0] != generation:
            wanted, fresh = self._embed_query(text, generation), True
        name = self.embedder.spec
        stored = _sql(
            connection,
            "SELECT length(vector) FROM mp_vectors WHERE embedder = ? AND kind = ? AND version = ? LIMIT 1",
            (name, kind, VECTORS_VERSION),
        ).first()
        if stored is not None and stored[0] != wanted.shape[-1] * 4 and not fresh:
            wanted = self._embed_query(text, generation)
        size = wanted.shape[-1] * 4  # bytes of float32
        resized = stored is not None and stored[0] != size  # another model: every vector is made again
        self._queries[text] = (generation + resized, wanted)
        vectors = self._vectors.get(kind)
        if (
            not resized
            and vectors is not None
            and vectors[0] == writes
            and vectors[1].matrix.shape[1] * 4 == size
        ):
            return vectors[1], wanted
        table, column = _ITEM_TEXTS[kind]
        rows = _sql(
            connection,
            f"SELECT t.id, t.{column} FROM {table} t WHERE NOT EXISTS (SELECT 1 FROM mp_vectors v "
            "WHERE v.embedder = ? AND v.kind = ? AND v.item_id = t.id AND v.version = ? "
            "AND length(v.vector) = ?) ORDER BY t.id",
            (name, kind, VECTORS_VERSION, size),
        ).all()
        missing = [(item_id, _embedding_text_of(kind, text)) for item_id, text in rows]
        # every batch is embedded before the first write, so the write lock is held for the
        # inserts alone, not while other searches' embeddings queue for the model; they are
        # stored in id order, as `reembed` stores them, and then the counters as it moves them:
        # on Postgres two stores of the same vectors lock their rows in one order (no deadlock)
        batches = [missing[start : start + 256] for start in range(0, len(missing), 256)]
        matrices = [self.embedder.embed_sync([text for _, text in batch], "document") for batch in batches]
        for batch, matrix in zip(batches, matrices, strict=True):
            _store_vectors(
                connection,
                name,
                kind,
                [(item_id, row) for (item_id, _), row in zip(batch, matrix, strict=True)],
            )
        if resized:
            # every process's kept query vectors of the old model are made again, and its vectors reload
            _count_write(connection)
            _next_vector_generation(connection)
            writes += 1
        rows = _sql(
            connection,
            "SELECT item_id, vector FROM mp_vectors WHERE embedder = ? AND kind = ? AND version = ? "
            "AND length(vector) = ? ORDER BY item_id",
            (name, kind, VECTORS_VERSION, size),
        ).all()
        import numpy as np

        ids = [row[0] for row in rows]
        matrix = (
            np.frombuffer(b"".join(row[1] for row in rows), dtype=np.float32).reshape(len(rows), -1)
            if rows
            else np.zeros((0, size // 4), dtype=np.float32)
        )
        made = _Vectors(ids, matrix)
        self._vectors[kind] = (writes, made)  # embedding the missing ones did not count as a write
        return made, wanted

    def reembed(self, progress: Callable[[int, int], None] | None = None) -> Reembedded:
        """Make every agent's, cohort's and memory's vector again with the configured embedder.

        For vectors a search would keep: ones made by a server that answered wrongly, or by
        another model served under the same name. Texts are embedded `_REEMBED_BATCH` at a time,
        outside any transaction; each batch is stored in its own, replacing the items' vectors of
        this embedder, so what is done stays done if a later batch fails. An item whose embedded
        text was edited, or that was removed, meanwhile is left out (its edit dropped its vectors:
        the next search embeds it); one changed otherwise (a team rated) is stored.
        `progress(done, total)` is called before the first batch and after each. `ConfigError`
        with no embedder set.
        """
        embedder = self.embedder
        if embedder is None:
            raise ConfigError(
                "the embedder is 'none': the registry ranks by words alone and keeps no vectors to "
                "make again; set embedder (e.g. smollm2) to rank by meaning"
            )
        with self._begin("read the registry's texts") as connection:
            items = {
                kind: _sql(connection, f"SELECT id, {column} FROM {table} ORDER BY id").all()
                for kind, (table, column) in _ITEM_TEXTS.items()
            }
        done, total = 0, sum(len(rows) for rows in items.values())
        result = Reembedded(embedder.spec, dict.fromkeys(items, 0))
        if progress is not None:
            progress(done, total)
        for kind, rows in items.items():
            table, column = _ITEM_TEXTS[kind]
            for start in range(0, len(rows), _REEMBED_BATCH):
                batch = rows[start : start + _REEMBED_BATCH]
                matrix = embedder.embed_sync(
                    [_embedding_text_of(kind, text) for _, text in batch], "document"
                )
                marks = ", ".join("?" for _ in batch)
                with self._begin("store vectors") as connection:
                    now: dict[str, str] = dict(
                        _sql(
                            connection,
                            f"SELECT id, {column} FROM {table} WHERE id IN ({marks})",
                            tuple(item_id for item_id, _ in batch),
                        ).all()
                    )
                    # what is embedded for it unchanged: a team rated meanwhile (its rating is in its
                    # stored column, and keeps its vectors) was left with the wrong one
                    unchanged = [
                        (item_id, row)
                        for (item_id, text), row in zip(batch, matrix, strict=True)
                        if item_id in now
                        and _embedding_text_of(kind, now[item_id]) == _embedding_text_of(kind, text)
                    ]
                    _store_vectors(connection, embedder.spec, kind, unchanged)
                    _count_write(connection)  # every process's cached vectors reload
                    _next_vector_generation(connection)  # and its kept query vectors are made again
                result.made[kind] += len(unchanged)
                result.changed += len(batch) - len(unchanged)
                done += len(batch)
                if progress is not None:
                    progress(done, total)
        return result

    # ---- export and import

    def export_agents(self, path: Path) -> int:
        """Write every agent (current version, stats, lessons) as JSON lines; returns how many."""
        agents = self.list_agents()
        try:
            path.write_text("".join(agent.model_dump_json() + "\n" for agent in agents), encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc.strerror or exc}") from None
        return len(agents)

    def read_agents(self, path: Path) -> list[tuple[int, AgentSpec]]:
        """The agents of a JSON-lines file (`export_agents`'s), each with its line number.

        `ConfigError` naming the line and field of the first invalid line, or an agent given twice.
        """
        text = read_text(path, after="; nothing was imported")
        specs: list[tuple[int, AgentSpec]] = []
        lines: dict[str, int] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                spec = AgentSpec.model_validate_json(line)
            except ValidationError as exc:
                raise ConfigError(f"{path}: {_line_problem(number, exc)}; nothing was imported") from None
            if spec.id in lines:
                raise ConfigError(
                    f"{path}: line {number}: agent {spec.id!r} is on line {lines[spec.id]} too; "
                    "nothing was imported"
                )
            lines[spec.id] = number
            specs.append((number, spec))
        return specs

    def import_agents(self, specs: list[AgentSpec]) -> ImportedAgents:
        """Store agents read by `read_agents`, all in one transaction.

        An agent not here is added as it was exported (its version and track record). One that
        is here gets the imported one as its next version when they differ, its history and its
        track record here kept; one equal to its current version is left as it is. No lesson it
        has is dropped, and of the file's it gains only those none of its versions had: one
        removed since is not brought back (`_with_lessons_kept`). Its prompt stays a person's if
        it was, and becomes one if the file changes it (`with_prompt_author`).
        """
        imported = ImportedAgents()
        with self._begin("import agents") as connection:
            for spec in specs:
                try:
                    current = self.get_agent(spec.id, connection=connection)
                except NotFoundError:
                    self.put_agent(spec, connection)
                    imported.added.append(spec.id)
                    continue
                had = self._lessons_ever(connection, spec.id)
                spec = with_prompt_author(_with_lessons_kept(spec, current, had), current)
                if _content(current) == _content(spec):
                    imported.unchanged.append(spec.id)
                else:
                    self.put_agent(spec, connection)
                    imported.updated.append(spec.id)
        return imported

    # ---- cohorts

    def put_cohort(self, cohort: Cohort) -> None:
        """Store a cohort (replacing one with the same id)."""
        with self._begin("store a cohort") as connection:
            existed = _sql(connection, "SELECT 1 FROM mp_cohorts WHERE id = ?", (cohort.id,)).first()
            _sql(
                connection,
                "INSERT INTO mp_cohorts (id, cohort, created_at) VALUES (?, ?, ?) "
                "ON CONFLICT (id) DO UPDATE SET cohort = excluded.cohort, created_at = excluded.created_at",
                (cohort.id, cohort.model_dump_json(), utc_now()),
            )
            index = _text_index(connection, "cohort")
            if existed:
                index.delete(connection, cohort.id)
            index.insert(connection, cohort.id, cohort.task)
            _forget_vectors(connection, "cohort", cohort.id)

    def record_team(
        self,
        *,
        succeeded: bool,
        new_agents: Sequence[AgentSpec],
        counted: Sequence[str],
        corrected: Sequence[str],
        cohort: Cohort | None,
        counting: str | None = None,
    ) -> bool:
        """A run's effect on the registry in one transaction (all or none); False if its team was there.

        `new_agents` are stored (with their stats as given), `counted` agents get one use with
        the run's outcome each (`record_outcome`), `corrected` ones their counted failure turned
        into a success (`correct_outcome`), and `cohort`, the run's team, is stored. A storing
        that fails half way (a full disk) stores nothing, so it can be made again.

        The cohort is claimed first: when the registry has it already (the run's team was
        stored before: an answer sent again, a step made again) nothing changes, and False; of
        two at once, the second's insert waits for the first's commit and then finds it. A new
        agent the registry has already (stored with this run's team, which was removed since)
        stays as it is: no version that changes nothing, and its use is not counted again.

        `counting` names this count of the run's outcome (the run and its retry): counted once
        under that name, whatever asks again. Before, a process that died after the count and
        before its run recorded it (`registry_told`) counted the outcome again on resume, for a
        run with no cohort to claim (a failure, or a success whose team waits for a yes).
        """
        with self._begin("store a run's team") as connection:
            if cohort is not None:
                claimed = _sql(
                    connection,
                    "INSERT INTO mp_cohorts (id, cohort, created_at) VALUES (?, ?, ?) "
                    "ON CONFLICT (id) DO NOTHING",
                    (cohort.id, cohort.model_dump_json(), utc_now()),
                ).rowcount
                if claimed != 1:
                    return False
                _text_index(connection, "cohort").insert(connection, cohort.id, cohort.task)
                _forget_vectors(connection, "cohort", cohort.id)
            for spec in new_agents:
                if _sql(connection, "SELECT 1 FROM mp_agents WHERE id = ?", (spec.id,)).first() is None:
                    self.put_agent(spec, connection)
            if counting is not None and (counted or corrected):
                first = _sql(
                    connection,
                    "INSERT INTO mp_outcomes_counted (counting, counted_at) VALUES (?, ?) "
                    "ON CONFLICT (counting) DO NOTHING",
                    (counting, utc_now()),
                ).rowcount
                if first != 1:  # counted before: the run's end made again
                    counted, corrected = (), ()
            for agent_id in counted:
                _count_use(connection, agent_id, succeeded=succeeded)
            for agent_id in corrected:
                _correct_use(connection, agent_id)
        return True

    def get_cohort(self, cohort_id: str) -> Cohort:
        """The cohort with this id."""
        if names_nothing(cohort_id):
            raise NotFoundError(
                f"no cohort {quoted_id(cohort_id)} in the registry (see `masterplanner cohorts list`)"
            )
        with self._begin("read a cohort") as connection:
            row = _sql(connection, "SELECT cohort FROM mp_cohorts WHERE id = ?", (cohort_id,)).first()
        if row is None:
            raise NotFoundError(
                f"no cohort {quoted_id(cohort_id)} in the registry (see `masterplanner cohorts list`)"
            )
        return Cohort.model_validate_json(row[0])

    def list_cohorts(self) -> list[Cohort]:
        """Every cohort, newest first."""
        with self._begin("list cohorts") as connection:
            rows = _sql(connection, "SELECT cohort FROM mp_cohorts ORDER BY created_at DESC, id").all()
        return [Cohort.model_validate_json(row[0]) for row in rows]

    def similar_cohorts(self, task: str, limit: int = 3) -> list[tuple[Cohort, float]]:
        """Cohorts whose task is like `task`, best first, each with a similarity in [0, 1].

        Order: BM25 over the cohorts' tasks, fused with cosine order when an embedder is set.
        Similarity (what `reuse_threshold` is compared with): the embedder's calibrated cosine of
        the two tasks' embeddings with an embedder (see `TextEmbedder.similarity`), else the
        Ochiai coefficient of their word stems. Cohorts that rank equal (one task stored again and
        again: each run that reuses a team stores it anew) come newest first, so a team stored after
        older ones stopped working is found before them, however many they are.
        """
        wanted = self._query_vector(task)  # embedded before the transaction: no lock held meanwhile
        with self._begin("search cohorts") as connection:
            fused, cosine = self._rank(connection, "cohort", task, wanted)
            if not fused:
                return []
            # ids begin with their run's start time: the last id is the newest team
            best = sorted(sorted(fused, reverse=True), key=lambda item: -fused[item])[:limit]
            marks = ", ".join("?" for _ in best)
            rows: dict[str, str] = dict(
                _sql(
                    connection, f"SELECT id, cohort FROM mp_cohorts WHERE id IN ({marks})", tuple(best)
                ).all()
            )
        found = []
        for item in best:
            cohort = Cohort.model_validate_json(rows[item])
            if cosine is not None and self.embedder is not None:
                similarity = self.embedder.similarity(cosine(item))
            else:
                similarity = max(0.0, min(1.0, lexical_similarity(task, cohort.task)))
            found.append((cohort, similarity))
        return found

    @staticmethod
    def _rate_cohort(connection: Connection, cohort_id: str, rating: float) -> bool:
        """Set a cohort's rating; False when there is no such cohort (a failed run has none)."""
        row = _sql(connection, "SELECT cohort FROM mp_cohorts WHERE id = ?", (cohort_id,)).first()
        if row is None:
            return False
        cohort = Cohort.model_validate_json(row[0]).model_copy(update={"rating": rating})
        _sql(
            connection, "UPDATE mp_cohorts SET cohort = ? WHERE id = ?", (cohort.model_dump_json(), cohort_id)
        )
        return True

    def known_agents(self, agent_ids: list[str]) -> set[str]:
        """Which of `agent_ids` are in the registry (one query)."""
        if not agent_ids:
            return set()
        marks = ", ".join("?" for _ in agent_ids)
        with self._begin("read agents") as connection:
            rows = _sql(connection, f"SELECT id FROM mp_agents WHERE id IN ({marks})", tuple(agent_ids))
            return {row[0] for row in rows}

    def delete_cohort(self, cohort_id: str) -> None:
        """Remove a cohort (its agents stay)."""
        with self._begin("delete a cohort") as connection:
            if not _sql(connection, "DELETE FROM mp_cohorts WHERE id = ?", (cohort_id,)).rowcount:
                raise NotFoundError(f"no cohort {quoted_id(cohort_id)} in the registry")
            _text_index(connection, "cohort").delete(connection, cohort_id)
            _forget_vectors(connection, "cohort", cohort_id)


def open_registry(settings: Settings) -> RegistryStore:
    """The registry in the settings' database, with the configured embedder (checked now, made when used)."""
    return RegistryStore(settings.database_url, settings.embedder)


def _count_use(
    connection: Connection, agent_id: str, *, succeeded: bool, rating: float | None = None
) -> None:
    """Count one use of an agent, in the caller's transaction (atomic: concurrent writers lose no update)."""
    _sql(
        connection,
        "UPDATE mp_agents SET uses = uses + 1, successes = successes + ?, failures = failures + ?, "
        "ratings = ratings + ?, rating_sum = rating_sum + ? WHERE id = ?",
        (int(succeeded), int(not succeeded), int(rating is not None), rating or 0.0, agent_id),
    )


def _correct_use(connection: Connection, agent_id: str) -> None:
    """Count an agent's last counted failure as a success, in the caller's transaction."""
    _sql(
        connection,
        "UPDATE mp_agents SET successes = successes + 1, failures = failures - 1 "
        "WHERE id = ? AND failures > 0",
        (agent_id,),
    )


def _forget_vectors(connection: Connection, kind: str, item_id: str) -> None:
    """Drop an item's vectors (its text changed or it is gone) and count a write; caller's transaction."""
    _sql(connection, "DELETE FROM mp_vectors WHERE kind = ? AND item_id = ?", (kind, item_id))
    _count_write(connection)


def _store_vectors(
    connection: Connection, embedder: str, kind: str, vectors: list[tuple[str, np.ndarray]]
) -> None:
    """Store items' vectors of `embedder`, as of `VECTORS_VERSION`, in place of any they had."""
    if not vectors:
        return
    _sql(
        connection,
        "INSERT INTO mp_vectors (embedder, kind, item_id, vector, version) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (embedder, kind, item_id) DO UPDATE SET vector = excluded.vector, "
        "version = excluded.version",
        [(embedder, kind, item_id, row.tobytes(), VECTORS_VERSION) for item_id, row in vectors],
    )


def _writes(connection: Connection) -> int:
    """The registry's write counter (it moves with every change to a text index or vectors)."""
    return int(_sql(connection, "SELECT value FROM mp_registry_meta WHERE key = 'writes'").scalar_one())


def _counters(connection: Connection) -> tuple[int, int]:
    """The registry's write counter (`_writes`) and its vector generation (`_counters`)."""
    values = dict(
        _sql(connection, "SELECT key, value FROM mp_registry_meta WHERE key IN ('writes', 'vectors')").all()
    )
    return int(values["writes"]), int(values.get("vectors", 0))


def _next_vector_generation(connection: Connection) -> None:
    """Move the registry's vector generation: its vectors were made again (`reembed`, another model).

    Every process then embeds again a search text's vector it kept from before (0 until first moved).
    """
    _sql(
        connection,
        "INSERT INTO mp_registry_meta (key, value) VALUES ('vectors', 1) "
        "ON CONFLICT (key) DO UPDATE SET value = mp_registry_meta.value + 1",
    )


def _count_write(connection: Connection) -> None:
    """Move the registry's write counter (in-memory vector caches reload when it moves)."""
    _sql(connection, "UPDATE mp_registry_meta SET value = value + 1 WHERE key = 'writes'")


def _embedding_text_of(kind: str, stored: str) -> str:
    """What is embedded for an item, from its stored column."""
    if kind == "agent":
        return RegistryStore._embedding_text(_with_stats(stored, (0, 0, 0, 0, 0.0)))
    if kind == "cohort":
        return str(json.loads(stored)["task"])
    return stored


def _stats(counts: Any) -> AgentStats:
    uses, successes, failures, ratings, rating_sum = counts
    return AgentStats(
        uses=uses, successes=successes, failures=failures, ratings=ratings, rating_sum=rating_sum
    )


def _with_stats(text: str, counts: Any) -> AgentSpec:
    return AgentSpec.model_validate(json.loads(text)).model_copy(update={"stats": _stats(counts)})


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


def _line_problem(number: int, exc: ValidationError) -> str:
    """The first problem of line `number` of an agents file: `line 2: role: must not be empty`.

    A line that is no agent at all (not JSON, not an object) is named once, as the line it is:
    it read "line 2: line: invalid JSON: expected ident at line 1 column 2".
    """
    item = exc.errors()[0]
    if item["loc"]:
        return f"line {number}: {validation_problems([item], whole='line', model=AgentSpec)[0]}"
    # each agent is one line of the file, so the JSON reader's line is always 1
    problem = problem_in_our_words(item).replace("(line 1, column ", "(at column ")
    return f"line {number} {problem}"
