"""Benchmark datasets in the GNN4TaskPlan format (UltraTool, TMDB), read from disk at run time.

Location: `MASTERPLANNER_BENCHMARKS`, else `../shared/benchmarks` beside the working directory
or beside the source checkout.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..text_files import json_problem, read_text
from ..tools.catalog import Catalog, ToolSpec

__all__ = ["DATASETS", "Request", "benchmarks_folder", "load_dataset"]

DATASETS = ("ultratool", "tmdb")


@dataclass(frozen=True)
class Request:
    """One user request with its gold tool graph."""

    id: int
    text: str
    nodes: tuple[str, ...]
    links: tuple[tuple[str, str], ...]
    steps: tuple[str, ...] = ()


def benchmarks_folder() -> Path:
    """Where the benchmark data lives (see the module docstring)."""
    configured = os.environ.get("MASTERPLANNER_BENCHMARKS")
    if configured:
        folder = Path(configured).expanduser()
        if not folder.is_dir():
            raise ConfigError(f"MASTERPLANNER_BENCHMARKS={configured}: no such folder")
        return folder
    checkout = Path(__file__).resolve().parents[3]  # the source checkout (editable installs)
    for candidate in (Path.cwd().parent / "shared" / "benchmarks", checkout.parent / "shared" / "benchmarks"):
        if candidate.is_dir():
            return candidate
    raise ConfigError(
        "benchmark data not found: set MASTERPLANNER_BENCHMARKS to the folder holding ultratool/ and tmdb/"
    )


def _read_json(path: Path) -> Any:
    text = read_text(path, "benchmark file")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"benchmark file {path}: not JSON: {json_problem(exc)}") from None


def _request(row: dict[str, Any]) -> Request:
    nodes = tuple(node["task"] for node in row.get("task_nodes", []))
    links = tuple((link["source"], link["target"]) for link in row.get("task_links", []))
    steps = tuple(str(step) for step in row.get("task_steps", []))
    return Request(int(row["id"]), str(row["user_request"]), nodes, links, steps)


def load_dataset(name: str, folder: Path | None = None) -> tuple[Catalog, list[Request], list[Request]]:
    """The dataset's tool catalog, its test requests, and its other (training) requests."""
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    root = (folder or benchmarks_folder()) / name
    tools = _read_json(root / "tool_desc.json")["nodes"]
    catalog = Catalog(ToolSpec(str(tool["id"]), str(tool.get("desc", ""))) for tool in tools)
    split = _read_json(root / "split_ids.json")["test_ids"]
    test_ids = {int(item) for ids in split.values() for item in ids}
    rows: list[Request] = []
    data = root / "data.json"
    try:
        with data.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if line.strip():
                    try:
                        rows.append(_request(json.loads(line)))
                    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                        raise ConfigError(f"{data}: line {number}: {exc}") from None
    except FileNotFoundError:
        raise ConfigError(f"benchmark file missing: {data}") from None
    test = sorted((row for row in rows if row.id in test_ids), key=lambda row: row.id)
    train = [row for row in rows if row.id not in test_ids]
    return catalog, test, train
