"""A step aid for small models: a step that computes something from a CSV file gets it from one SQL query.

Measured with the embedded 135M model (SmolLM2) on "Use code to add up the amount column of
expenses.csv …", "Count with code how many people in people.csv live in Paris …" and their
like: asked for a Python program, it opened the CSV for writing, summed the wrong column or
invented the data; asked for a SQLite query with the table's `CREATE TABLE` and first row in
front of it, it wrote `SELECT AVG(cost)` for "the total cost" and added filters the request
never made (`WHERE category = 'food'`). It picks a column well, an aggregate and a filter badly.
So the engine lists the queries that can answer the request — the aggregate the request's words
name ("total" → SUM, "average" → AVG, "how many" → COUNT, "highest" → the row with the largest
value), over the table's numeric columns, filtered only by a value the request names that the
table holds ("Paris") — and the model picks one under a grammar. On twelve such requests (the
four of the everyday suite and eight others) that took it from 3 right to 8 right. The query
runs as `code_execution` in `sql` (the sandbox, the step's normal tool path); its result is the
step's answer, or the input the step's text file is drafted from.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ToolError
from ..tools.sql_runner import holds_numbers, number, table_name
from ..tools.workspace import Workspace

__all__ = ["MAX_QUERIES", "DraftedQuery", "Table", "drafted_query", "query_choices", "read_table"]

MAX_QUERIES = 240
"""At most this many queries are offered; past it the filtered ones are left out."""

_KINDS = (
    ("SUM", re.compile(r"\b(?:total|sum|add(?:s|ing)?\s+up)\b", re.IGNORECASE)),
    ("AVG", re.compile(r"\b(?:average|mean)\b", re.IGNORECASE)),
    ("COUNT", re.compile(r"\b(?:count|how\s+many|number\s+of)\b", re.IGNORECASE)),
    (
        "DESC",
        re.compile(
            r"\b(?:highest|largest|biggest|most|maximum|max|oldest|longest|greatest|priciest|most\s+expensive)\b",
            re.IGNORECASE,
        ),
    ),
    (
        "ASC",
        re.compile(
            r"\b(?:lowest|smallest|least|minimum|min|youngest|shortest|cheapest|least\s+expensive)\b",
            re.IGNORECASE,
        ),
    ),
)
"""What a request asks for, by its words: an aggregate, or the row with the largest or smallest value."""

_CODE_WORDS = re.compile(
    r"\s*\b(?:use\s+code\s+to|with\s+code|using\s+code|with\s+python|in\s+python)\b", re.IGNORECASE
)
_VALUE = re.compile(r"(?<![\w.])(?:[A-Z][\w'-]*|[+-]?\d+(?:\.\d+)?)(?![\w.])")


@dataclass(frozen=True)
class Table:
    """A CSV file as the SQL runner loads it: its table name, columns, which are numeric, its cells."""

    path: str
    name: str
    columns: tuple[str, ...]
    numeric: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def shown(self) -> str:
        """`CREATE TABLE` and the first row, as the model is shown the table."""
        kinds = ", ".join(f"{_ident(c)} {'NUMERIC' if c in self.numeric else 'TEXT'}" for c in self.columns)
        lines = [f"CREATE TABLE {_ident(self.name)} ({kinds});"]
        if self.rows:
            cells = ", ".join(
                cell if column in self.numeric and cell.strip() else _literal(cell)
                for column, cell in zip(self.columns, self.rows[0], strict=False)
            )
            lines.append(f"INSERT INTO {_ident(self.name)} VALUES ({cells});")
        return "\n".join(lines)


@dataclass(frozen=True)
class DraftedQuery:
    """The query aid of one step: the model picks one of `queries` for `request` over `table`."""

    path: str
    """The CSV file the step names."""
    request: str
    """The step's instruction without "with code" and the like."""
    table: str
    """The table as the model is shown it (`Table.shown`)."""
    queries: tuple[str, ...]
    """The queries it may pick (one: no model call is needed)."""
    tool: ClassVar[str] = "code_execution"


def _ident(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_]\w*", name) else '"' + name.replace('"', '""') + '"'


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def read_table(workspace: Workspace, path: str, *, max_rows: int = 5000) -> Table | None:
    """The table `path` becomes in the SQL runner, or None when it cannot be read or has no rows."""
    try:
        text = workspace.read_file(path)
    except ToolError:
        return None
    rows = list(csv.reader(io.StringIO(text)))
    if len(rows) < 2 or not rows[0]:
        return None
    columns = tuple(cell.strip() for cell in rows[0])
    if len(set(map(str.lower, columns))) != len(columns) or not all(columns):
        return None  # the runner renames such columns; not worth guessing here
    body = tuple(tuple(row + [""] * (len(columns) - len(row))) for row in rows[1 : max_rows + 1])
    numeric = tuple(column for i, column in enumerate(columns) if holds_numbers(row[i] for row in body))
    return Table(path, table_name(path), columns, numeric, body)


def _kinds(request: str) -> list[str]:
    return [kind for kind, words in _KINDS if words.search(request)]


def _filters(table: Table, request: str) -> list[str]:
    """Conditions on a value the request names: a word the table holds, or a number."""
    found: list[str] = []
    named = _VALUE.findall(re.sub(r"[\w./-]+\.\w+", " ", request))  # file names are not values
    for value in dict.fromkeys(named[1:] if named and request.startswith(named[0]) else named):
        if number(value) is not None:
            found += [f"{_ident(c)} {op} {value}" for c in table.numeric for op in (">", "<", "=")]
            continue
        for index, column in enumerate(table.columns):
            if column in table.numeric:
                continue
            cells = sorted({row[index].strip() for row in table.rows})
            match = next((cell for cell in cells if cell.lower() == value.lower()), None)
            if match is not None:
                found.append(f"{_ident(column)} = {_literal(match)}")
    return found


def query_choices(table: Table, request: str) -> tuple[str, ...]:
    """The queries that can answer `request` over `table` (none when its words name no computation).

    Every kind the request's words name is offered ("the total number of …" offers SUM and COUNT).
    """
    kinds = _kinds(request)
    name = _ident(table.name)
    numeric = [_ident(c) for c in table.numeric]
    heads: list[tuple[str, str]] = []  # (SELECT …, what follows the filter)
    for kind in kinds:
        if kind in ("SUM", "AVG"):
            heads += [(f"SELECT {kind}({c}) FROM {name}", "") for c in numeric]
        elif kind == "COUNT":
            heads.append((f"SELECT COUNT(*) FROM {name}", ""))
        else:
            heads += [
                (f"SELECT {_ident(shown)} FROM {name}", f" ORDER BY {c} {kind} LIMIT 1")
                for shown in table.columns
                for c in numeric
            ]
    plain = [f"{head}{tail};" for head, tail in heads]
    filters = _filters(table, request) if heads else []
    filtered = [f"{head} WHERE {where}{tail};" for head, tail in heads for where in filters]
    queries = plain + filtered if len(plain) + len(filtered) <= MAX_QUERIES else plain[:MAX_QUERIES]
    return tuple(dict.fromkeys(queries))


def drafted_query(
    instruction: str, tools: Sequence[str], existing: Sequence[str], workspace: Workspace
) -> DraftedQuery | None:
    """The query aid for a step that computes from one existing CSV file it names, else None."""
    if "code_execution" not in tools:
        return None
    tables = [name for name in existing if name.lower().endswith(".csv") and name in instruction]
    if len(tables) != 1:
        return None
    table = read_table(workspace, tables[0])
    if table is None:
        return None
    request = _CODE_WORDS.sub("", instruction).strip()
    request = request[:1].upper() + request[1:]
    queries = query_choices(table, request)
    if not queries:
        return None
    return DraftedQuery(table.path, request, table.shown(), queries)
