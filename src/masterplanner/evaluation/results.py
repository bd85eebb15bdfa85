"""A results file for `eval planning` and `eval tasks`: each finished item is appended as one JSON line.

A long evaluation (the embedded model needs tens of seconds a request, minutes a task) can then
be stopped and continued: run it again with the same file and the items already in it are not
run again. The first line records what the results were measured with (dataset or suite, model,
settings) and a fingerprint of the code that decides them (`planning_code_fingerprint`,
`package_code_fingerprint`); a run with other settings or changed code refuses the file rather
than mixing figures. A last line cut short by a crash is dropped; any other bad line is an error
naming the line. Records are keyed by their `id`, as text.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["ResultsFile", "package_code_fingerprint", "planning_code_fingerprint"]

_FORMAT = 1
_PACKAGE = Path(__file__).resolve().parents[1]
_PLANNING_CODE = (
    "plan.py",
    "planner.py",
    "agents.py",
    "evaluation/planning.py",
    "tools/selection.py",
    "tools/catalog.py",
    "models/local.py",
    "models/_llama.py",
    "models/_sampling.py",
    "models/_schema.py",
    "models/labelled.py",
    "prompts/planner_*",
    "prompts/baseline_planner.j2",
)

_NOT_IN_RUNS = ("evaluation/planning.py", "evaluation/datasets.py")


def _fingerprint(paths: Sequence[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def planning_code_fingerprint() -> str:
    """A short hash of what decides a planner's answers: its code, its prompts, the local model's code."""
    return _fingerprint([path for pattern in _PLANNING_CODE for path in sorted(_PACKAGE.glob(pattern))])


def package_code_fingerprint() -> str:
    """A short hash of every module, prompt and data file of the package but its front ends.

    What a whole run does (planning, prompts, step agents, tools, sandbox, engine) depends on
    most of the package, so `eval tasks` results are tied to all of it; `cli/` and `web/` only
    show them, and `eval planning`'s own modules play no part.
    """
    return _fingerprint(
        sorted(
            path
            for path in _PACKAGE.rglob("*")
            if path.is_file()
            and path.suffix in (".py", ".j2", ".json", ".yaml", ".toml")
            and path.relative_to(_PACKAGE).parts[0] not in ("cli", "web")
            and path.relative_to(_PACKAGE).as_posix() not in _NOT_IN_RUNS
            and "__pycache__" not in path.parts
        )
    )


class ResultsFile:
    """Per-request evaluation records, appended and flushed to disk one by one."""

    def __init__(self, path: Path, header: dict[str, Any], *, required: Sequence[str] = ("id",)) -> None:
        """Open `path` (created if missing), check its header against `header`, load its records.

        Every record must have the fields `required`.
        """
        self.path = path
        self.header = {"format": _FORMAT, **header}
        self.required = tuple(required)
        self.records: dict[str, dict[str, Any]] = {}
        if path.exists():
            self._load()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._write_line(self.header)

    def _load(self) -> None:
        raw = self.path.read_bytes()
        if not raw.endswith(b"\n"):
            # Every record is written with its newline in one write: a last line without one
            # was cut short by a crash. Drop it; its request is planned again.
            raw = raw[: raw.rfind(b"\n") + 1]
            with self.path.open("r+b") as handle:
                handle.truncate(len(raw))
        lines = raw.decode("utf-8", errors="replace").split("\n")[:-1]
        if not lines:
            self._write_line(self.header)
            return
        for number, line in enumerate(lines, start=1):
            try:
                item = json.loads(line)
                if not isinstance(item, dict):
                    raise ValueError("not a JSON object")
            except ValueError as exc:
                raise ConfigError(f"results file {self.path}: line {number}: {exc}") from None
            if number == 1:
                self._check_header(item)
            else:
                self._check_record(item, number)
                self.records[str(item["id"])] = item

    def _check_header(self, found: dict[str, Any]) -> None:
        for key, wanted in self.header.items():
            if found.get(key) != wanted:
                raise ConfigError(
                    f"results file {self.path} holds results measured with {key}={found.get(key)!r}, "
                    f"not {wanted!r}: choose another file"
                )

    def _check_record(self, item: dict[str, Any], number: int) -> None:
        for key in self.required:
            if key not in item:
                raise ConfigError(f"results file {self.path}: line {number}: field {key!r} is missing")

    def _write_line(self, item: dict[str, Any]) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(item, separators=(",", ":")) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def append(self, record: dict[str, Any]) -> None:
        """Keep one item's record (durably: written and synced before this returns)."""
        self._write_line(record)
        self.records[str(record["id"])] = record
