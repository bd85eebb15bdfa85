"""The sql language's program (tools/sql_runner.py) in the memory a sandbox gives it."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

from _deep_folders import deep_folders
from masterplanner.tools import sql_runner

_WIDE = 20
_ROWS = 300_000


def _query(folder: Path, query: str, address_space_mb: int) -> subprocess.CompletedProcess[str]:
    """Run the program as the sandbox does (`python -I FILE QUERY` in the workspace), its memory capped."""
    limit = address_space_mb << 20

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return subprocess.run(
        [sys.executable, "-I", sql_runner.__file__, query],
        cwd=folder,
        capture_output=True,
        text=True,
        preexec_fn=cap,
        timeout=120,
    )


def _wide_table(folder: Path) -> None:
    """18 MB of short text cells: six million of them, the most a file under the limit holds."""
    header = ",".join(f"c{n}" for n in range(_WIDE))
    row = ",".join(f"x{chr(97 + n)}" for n in range(_WIDE))
    (folder / "wide.csv").write_text(header + "\n" + (row + "\n") * _ROWS)
    assert 15_000_000 < (folder / "wide.csv").stat().st_size < sql_runner.MAX_TABLE_BYTES


def test_a_file_near_the_size_limit_loads_a_row_at_a_time(tmp_path: Path) -> None:
    # held as lists of Python strings three times over it took 640 MB, and failed under 256 MB
    _wide_table(tmp_path)
    done = _query(tmp_path, "SELECT COUNT(*), MAX(c19) FROM wide WHERE c3 = 'xd'", address_space_mb=128)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"COUNT(*),MAX(c19)\n{_ROWS},xt\n", "")


def test_files_that_do_not_fit_in_memory_are_said_so(tmp_path: Path) -> None:
    _wide_table(tmp_path)
    done = _query(tmp_path, "SELECT COUNT(*) FROM wide", address_space_mb=30)
    message = "the query failed: the CSV files it reads do not fit in the sandbox's memory\n"
    assert (done.returncode, done.stdout, done.stderr) == (1, "", message)


def test_files_that_come_to_one_table_name_are_each_a_table(tmp_path: Path) -> None:
    """Before, `data_q1.csv` was left out without a word; `Sales.csv` beside `sales.csv`, a traceback."""
    (tmp_path / "data").mkdir()
    for name, value in [("Sales.csv", 1), ("sales.csv", 100), ("data/q1.csv", 5), ("data_q1.csv", 7)]:
        (tmp_path / name).write_text(f"v\n{value}\n")
    done = _query(
        tmp_path,
        "SELECT (SELECT v FROM data_q1), (SELECT v FROM data_q1_2), "
        "(SELECT v FROM Sales), (SELECT v FROM sales_2)",
        256,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[1] == "5,7,1,100"
    failed = _query(tmp_path, "SELECT x FROM nothing", 256)
    assert failed.stderr.endswith(
        "Tables: Sales(v) from Sales.csv; data_q1(v) from data/q1.csv; data_q1_2(v) from data_q1.csv; "
        "sales_2(v) from sales.csv\n"
    )


def test_a_cell_longer_than_the_csv_module_reads_by_default_is_read(tmp_path: Path) -> None:
    (tmp_path / "wide.csv").write_text("a,b\n1," + "x" * 200_000 + "\n")
    done = _query(tmp_path, "SELECT length(b) FROM wide", 256)
    assert (done.returncode, done.stdout, done.stderr) == (0, "length(b)\n200000\n", "")


def test_files_under_folders_nested_deeper_than_python_recurses_are_tables(tmp_path: Path) -> None:
    """Before, `Path.rglob` recursed and the query failed with a `RecursionError` traceback."""
    (tmp_path / "top.csv").write_text("v\n3\n")
    with deep_folders(tmp_path, "low.csv", "v\n4\n") as depth:
        done = _query(
            tmp_path, f"SELECT (SELECT v FROM top) AS a, (SELECT v FROM {'d_' * depth}low) AS b", 256
        )
    assert (done.returncode, done.stdout, done.stderr) == (0, "a,b\n3,4\n", "")
