"""The program behind `code_execution`'s `sql` language: one SQLite query over the workspace's CSV files.

It runs inside the sandbox under the system Python (`python3 -I -c <this file> <query>`), so it
uses the standard library only. Each `*.csv` file under the working directory (the workspace)
is a table named after its path without `.csv`, with anything but letters, digits and `_`
turned into `_` (`expenses.csv` → `expenses`, `data/q1 sales.csv` → `data_q1_sales`; a name
a file earlier in path order took, in any case, gets `_2`, `_3` …: `data/q1.csv` → `data_q1`,
`data_q1.csv` → `data_q1_2`); the tables the query names are loaded into an in-memory
database. A file's first row names its columns; a column whose values are all numbers (empty
cells aside) holds numbers, any other holds text. The query's rows are printed as CSV, its
column names first; numbers are printed with at most 12 significant digits, so a sum of cents
reads 246.75 and not 246.75000000000003.
The files are only read: the database lives in memory and is gone when the program ends, and
the query may only read it (no `ATTACH`, `VACUUM INTO`, pragma or change).
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import sqlite3
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

MAX_TABLE_BYTES = 20_000_000
"""A CSV file larger than this is left out (named in an error if the query needs it)."""


def table_name(path: str) -> str:
    """The table a CSV file at `path` (relative to the workspace) becomes."""
    stem = path[: -len(".csv")] if path.lower().endswith(".csv") else path
    name = re.sub(r"\W", "_", stem, flags=re.ASCII)
    return f"t_{name}" if name[:1].isdigit() else name


def number(text: str) -> int | float | None:
    """The number a CSV cell holds, or None when it is not one."""
    value = text.strip()
    if re.fullmatch(r"[+-]?\d+", value):
        return int(value)
    if re.fullmatch(r"[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?", value):
        return float(value)
    return None


def holds_numbers(cells: Iterable[str]) -> bool:
    """Whether a column holds numbers: some cell is filled, and every filled one is a number."""
    filled = [cell for cell in cells if cell.strip()]
    return bool(filled) and all(number(cell) is not None for cell in filled)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _columns(header: list[str]) -> list[str]:
    """Column names from a header row: blanks named col_N, repeats numbered."""
    names: list[str] = []
    for index, raw in enumerate(header, 1):
        name = raw.strip() or f"col_{index}"
        base, count = name, 2
        while name.lower() in (seen.lower() for seen in names):
            name, count = f"{base}_{count}", count + 1
        names.append(name)
    return names


def load(database: sqlite3.Connection, root: Path, query: str) -> dict[str, str]:
    """Load the CSV files under `root` that `query` names; every table there is, each with its file.

    Only the tables the query mentions are loaded (a workspace may hold many large files); of the
    others only the header is read, for the error message that lists them.
    """
    tables: dict[str, str] = {}
    for path in _files(root):
        if not path.is_file() or path.suffix.lower() != ".csv" or path.stat().st_size > MAX_TABLE_BYTES:
            continue
        relative = path.relative_to(root).as_posix()
        name = _unused(table_name(relative), tables)
        try:
            with _rows(path) as rows:
                header = next(rows, [])
            if not header:
                continue
            columns = _columns(header)
            tables[name] = f"{name}({', '.join(columns)}) from {relative}"
            if re.search(rf"(?<![\w\"]){re.escape(name)}(?![\w\"])|\"{re.escape(name)}\"", query, re.I):
                _create(database, name, columns, path)
        except (csv.Error, sqlite3.Error) as exc:
            raise Unreadable(f"cannot read {relative} as a CSV file: {exc}") from None
    return tables


def _files(root: Path) -> list[Path]:
    """Every entry under `root` that is not a folder, in path order; linked folders not entered.

    The walk keeps its own list of folders to read: `Path.rglob` recursed, and a workspace whose
    folders a step's program nested past Python's recursion limit failed every query. (This
    program uses the standard library only, so not `tools.workspace.walk_files`.)
    """
    found: list[Path] = []
    folders = [root]
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    (folders if entry.is_dir(follow_symlinks=False) else found).append(Path(entry.path))
        except OSError:  # gone, or not readable: passed over
            continue
    return sorted(found)


class Unreadable(Exception):
    """A CSV file the query needs cannot be read as a table (the message says which and why)."""


def _unused(name: str, tables: dict[str, str]) -> str:
    """`name`, or `name_2`, `name_3` … when a table already has it (SQLite ignores case).

    Two files can come to one name (`data/q1.csv` and `data_q1.csv`, `Sales.csv` and `sales.csv`):
    before, the second was left out without a word, or the query failed with a traceback.
    """
    taken = {table.lower() for table in tables}
    candidate, count = name, 2
    while candidate.lower() in taken:
        candidate, count = f"{name}_{count}", count + 1
    return candidate


@contextlib.contextmanager
def _rows(path: Path) -> Iterator[Iterator[list[str]]]:
    """The rows of a CSV file, read as they are taken."""
    with path.open(newline="", encoding="utf-8", errors="replace") as handle:
        yield csv.reader(handle)


def _create(database: sqlite3.Connection, name: str, columns: list[str], path: Path) -> None:
    """A table of the file's rows: a column whose cells are all numbers (blanks aside) holds numbers.

    The kinds are `holds_numbers`'s, worked out a row at a time. The file is read twice (once for
    the columns' kinds, once to insert), so a large file takes the memory of its table, not of its
    rows held as Python lists three times over (18 MB of short text cells took 640 MB that way,
    and failed with a MemoryError under a 256 MB address-space limit; now 45 MB).
    """
    width = len(columns)
    seen: list[bool | None] = [None] * width  # None: no filled cell yet; then whether all are numbers
    with _rows(path) as rows:
        next(rows, None)
        for row in rows:
            for index, cell in enumerate(row[:width]):
                if seen[index] is not False and cell.strip():
                    seen[index] = number(cell) is not None
    numeric = [flag is True for flag in seen]
    kinds = ["NUMERIC" if flag else "TEXT" for flag in numeric]
    database.execute(
        f"CREATE TABLE {_quoted(name)} ("
        + ", ".join(f"{_quoted(c)} {k}" for c, k in zip(columns, kinds, strict=True))
        + ")"
    )
    marks = ", ".join("?" for _ in columns)
    with _rows(path) as rows:
        next(rows, None)
        database.executemany(
            f"INSERT INTO {_quoted(name)} VALUES ({marks})",
            (
                [
                    (number(cell) if flag else cell) if cell.strip() else None
                    for cell, flag in zip((row + [""] * width)[:width], numeric, strict=True)
                ]
                for row in rows
            ),
        )


def _cell(value: object) -> object:
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) < 1e15 else float(f"{value:.12g}")
    return value


_READING = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
"""What a query may do: read the tables and call functions. Nothing that writes (`ATTACH` or
`VACUUM INTO` would make a file), changes a table or sets a pragma."""


def _only_reading(action: int, *_: object) -> int:
    return sqlite3.SQLITE_OK if action in _READING else sqlite3.SQLITE_DENY


def main(query: str) -> int:
    """Run `query`; its rows on stdout as CSV, or what is wrong on stderr and exit code 1."""
    database = sqlite3.connect(":memory:")
    csv.field_size_limit(MAX_TABLE_BYTES)  # a cell may be as long as a file may be (default 128 KiB)
    try:
        tables = load(database, Path.cwd(), query)
    except MemoryError:
        print("the query failed: the CSV files it reads do not fit in the sandbox's memory", file=sys.stderr)
        return 1
    except Unreadable as exc:
        print(f"the query failed: {exc}", file=sys.stderr)
        return 1
    database.set_authorizer(_only_reading)
    try:
        cursor = database.execute(query)
    except (sqlite3.Error, sqlite3.Warning) as exc:
        known = "; ".join(tables.values()) or "none (no CSV files in the workspace)"
        problem = str(exc).rstrip(".")
        if "one statement at a time" in problem:
            problem = "give one statement only"
        elif "not authorized" in problem or "authorization denied" in problem:
            problem = "only a query that reads (SELECT … or WITH … SELECT …) can run"
        print(f"the query failed: {problem}. Tables: {known}", file=sys.stderr)
        return 1
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    if cursor.description:
        writer.writerow([column[0] for column in cursor.description])
        writer.writerows([_cell(value) for value in row] for row in cursor.fetchall())
    sys.stdout.write(out.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else 2)
