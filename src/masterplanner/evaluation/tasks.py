"""`masterplanner eval tasks`: everyday offline tasks, each run end to end and scored pass/fail.

The suite (`everyday_tasks.json`, or another file in its format) lists tasks like "write a poem
to poem.txt", "summarize article.txt to summary.txt" or "compute the total of a CSV column":

```json
{"tasks": [{"id": "write-poem", "category": "write", "task": "Write … to poem.txt.",
            "files": {"notes.txt": "seed content"},
            "checks": [{"exists": "poem.txt"}, {"mentions": {"path": "poem.txt", "any": ["sea"]}}],
            "needs_dependency": false}]}
```

Each task runs as a real run through the engine (`Engine.create_run` and `execute`, the plan
approved automatically) in a fresh workspace holding its seed `files`. All runs of one evaluation
share a home of their own (a new database and an empty registry) with `remember_runs = never`, so
no task reuses another's team or plan. A task passes when its run succeeded, its plan passes the
plan checks and its workspace passes its file checks (`checks.py`). `needs_dependency` (default:
true for the `two-part` category) asks for at least one dependency in the plan.

With a results file, each finished task is appended to it, and a run of the same suite, model and
code (`package_code_fingerprint`) takes finished tasks from it instead of running them again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..engine.records import flat_steps
from ..errors import ConfigError, MasterplannerError
from ..private import private_folder
from ..text_files import json_problem, read_text
from ..tools.workspace import Workspace
from ..usage import UsageLedger, noun_for
from .checks import Check, CheckResult, check_file, parse_check, plan_checks
from .results import ResultsFile, package_code_fingerprint

if TYPE_CHECKING:
    from ..engine import Engine, RunOptions
    from ..settings import Settings

__all__ = [
    "CATEGORIES",
    "DEFAULT_SUITE",
    "EverydayTask",
    "TasksReport",
    "evaluate_tasks",
    "load_suite",
    "suite_options",
]

DEFAULT_SUITE = Path(__file__).with_name("everyday_tasks.json")
CATEGORIES = ("write", "summarize", "translate", "csv", "files", "script", "two-part")
_RECORD_FIELDS = ("id", "category", "passed", "checks", "status", "seconds", "usage")
_OUTPUT_KEPT = 500
"""Characters of a run's answer kept in its record (for reading failures, not for scoring)."""
_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-")


@dataclass(frozen=True)
class EverydayTask:
    """One task of the suite: what to ask, the files it starts with, what its workspace must hold."""

    id: str
    category: str
    task: str
    files: dict[str, str]
    checks: tuple[Check, ...]
    needs_dependency: bool


def _task(raw: object, where: str) -> EverydayTask:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: a task is a JSON object")
    unknown = set(raw) - {"id", "category", "task", "files", "checks", "needs_dependency"}
    if unknown:
        raise ConfigError(f"{where}: unknown {noun_for(len(unknown), 'field')} {', '.join(sorted(unknown))}")
    task_id, category, text = raw.get("id"), raw.get("category"), raw.get("task")
    if not isinstance(task_id, str) or not task_id or not set(task_id) <= _ID_CHARS:
        raise ConfigError(f"{where}: id must be lowercase letters, digits and hyphens")
    where = f"{where} ({task_id})"
    if category not in CATEGORIES:
        raise ConfigError(f"{where}: category must be one of {', '.join(CATEGORIES)}")
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{where}: task must be non-empty text")
    files = raw.get("files", {})
    if not isinstance(files, dict) or not all(
        isinstance(path, str) and isinstance(content, str) for path, content in files.items()
    ):
        raise ConfigError(f"{where}: files maps paths to their text")
    checks = raw.get("checks")
    if not isinstance(checks, list) or not checks:
        raise ConfigError(f"{where}: checks must list at least one check")
    needs = raw.get("needs_dependency", category == "two-part")
    if not isinstance(needs, bool):
        raise ConfigError(f"{where}: needs_dependency must be true or false")
    parsed = tuple(parse_check(check, f"{where}: check {number}") for number, check in enumerate(checks, 1))
    return EverydayTask(task_id, str(category), text, dict(files), parsed, needs)


def load_suite(path: Path | None = None) -> list[EverydayTask]:
    """The tasks of a suite file (default: the shipped everyday suite); `ConfigError` naming what is wrong."""
    path = path or DEFAULT_SUITE
    text = read_text(path, "task suite")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"task suite {path}: not JSON: {json_problem(exc)}") from None
    raw_tasks = data.get("tasks") if isinstance(data, dict) else None
    if not isinstance(raw_tasks, list) or not raw_tasks:
        raise ConfigError(f'task suite {path}: expected {{"tasks": [...]}} with at least one task')
    tasks = [_task(raw, f"task suite {path}: task {number}") for number, raw in enumerate(raw_tasks, 1)]
    repeated = [task_id for task_id, count in Counter(task.id for task in tasks).items() if count > 1]
    if repeated:
        raise ConfigError(
            f"task suite {path}: {noun_for(len(repeated), 'id')} used twice: {', '.join(repeated)}"
        )
    return tasks


def _suite_fingerprint(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def suite_options() -> RunOptions:
    """How the suite's runs execute: `masterplanner run --yes` defaults, 20 minutes of execution each."""
    from ..engine import RunOptions

    return RunOptions(auto_approve=True, max_wall_s=1200.0)


@dataclass
class TasksReport:
    """What `eval tasks` prints: pass rates overall and per category, and each failure's checks."""

    model: str
    records: list[dict[str, Any]]
    usage: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> int:
        """How many tasks passed every check."""
        return sum(1 for record in self.records if record["passed"])

    @property
    def pass_rate(self) -> float:
        """The share of tasks that passed."""
        return round(self.passed / len(self.records), 4) if self.records else 0.0

    def by_category(self) -> dict[str, dict[str, Any]]:
        """`{category: {"tasks", "passed", "pass_rate"}}`, in the suite's category order."""
        found: dict[str, dict[str, Any]] = {}
        for category in CATEGORIES:
            rows = [record for record in self.records if record["category"] == category]
            if rows:
                passed = sum(1 for record in rows if record["passed"])
                found[category] = {
                    "tasks": len(rows),
                    "passed": passed,
                    "pass_rate": round(passed / len(rows), 4),
                }
        return found

    def failed_checks(self) -> dict[str, int]:
        """How many tasks failed each kind of check, most first."""
        counts = Counter(
            kind
            for record in self.records
            for kind in {check["kind"] for check in record["checks"] if not check["ok"]}
        )
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def failures(self) -> list[dict[str, Any]]:
        """`[{"id", "category", "failed": [{"check", "detail"}]}]` for every task that did not pass."""
        return [
            {
                "id": record["id"],
                "category": record["category"],
                "failed": [
                    {"check": check["check"], "detail": check["detail"]}
                    for check in record["checks"]
                    if not check["ok"]
                ],
            }
            for record in self.records
            if not record["passed"]
        ]

    def to_json_dict(self, *, per_task: bool = False) -> dict[str, Any]:
        """The figures as JSON; `per_task` adds every task's record (checks, plan, usage, seconds)."""
        seconds = [record["seconds"] for record in self.records]
        payload: dict[str, Any] = {
            "model": self.model,
            "tasks": len(self.records),
            "passed": self.passed,
            "pass_rate": self.pass_rate,
            "by_category": self.by_category(),
            "failed_checks": self.failed_checks(),
            "failures": self.failures(),
            "p50_seconds": round(statistics.median(seconds), 1) if seconds else 0.0,
            "usage": self.usage,
        }
        if per_task:
            payload["per_task"] = self.records
        return payload


def _output_cap(model_spec: str, settings: Settings) -> dict[str, int]:
    """The embedded model's reply and window sizes, which change its runs: part of a results header."""
    if model_spec == "local" or model_spec.startswith("local:"):
        return {
            "max_output_tokens": settings.local_max_output_tokens,
            "context_tokens": settings.local_context_tokens,
        }
    return {}


def _by_role(usage: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Usage by purpose with every `step:<id>` (and `consult:<id>`) counted as one purpose."""
    ledger = UsageLedger()
    for purpose, entry in usage.items():
        ledger.merge({purpose.split(":", 1)[0]: entry})
    return ledger.by_purpose()


def _seed(workspace: Workspace, task: EverydayTask) -> None:
    for path, content in task.files.items():
        workspace.write_file(path, content)


async def _run_task(
    engine: Engine, task: EverydayTask, model_spec: str, options: RunOptions, workspaces: Path
) -> dict[str, Any]:
    """Run one task in a fresh workspace and check it: its results-file record."""
    workspace = Workspace(tempfile.mkdtemp(prefix=f"{task.id}-", dir=workspaces)).create()
    _seed(workspace, task)
    started = time.perf_counter()
    run = engine.create_run(task.task, model=model_spec, options=options, workspace=workspace.root)
    error: str | None = None
    try:
        final = await engine.execute(run.id)
        status, error = final.status, final.error
    except MasterplannerError as exc:
        status, error = "failed", str(exc)
    seconds = round(time.perf_counter() - started, 2)
    report = engine.report(run.id)
    plan = report["plan"]
    succeeded = status == "succeeded"
    results = [CheckResult("run_succeeded", "run succeeded", succeeded, "" if succeeded else error or status)]
    results += plan_checks(task.task, plan, needs_dependency=task.needs_dependency)
    for check in task.checks:
        results.append(await check_file(check, workspace))
    return {
        "id": task.id,
        "category": task.category,
        "passed": all(result.ok for result in results),
        "checks": [result.to_json_dict() for result in results],
        "status": status,
        "error": error,
        "seconds": seconds,
        "steps": len((plan or {}).get("steps", [])),
        "plan": plan,
        "step_errors": {step["id"]: step["error"] for step in flat_steps(report["steps"]) if step["error"]},
        "output": (report["output"] or "")[:_OUTPUT_KEPT],
        "files": sorted(entry.name for entry in workspace.list_files()),
        "usage": report["usage"].get("by_purpose", {}),
    }


def _suite_settings(settings: Settings, home: Path) -> Settings:
    """Settings for the suite's runs: the model settings given, a home of their own, nothing remembered."""
    from ..settings import Settings

    return Settings.load(
        home=home,
        model=settings.model,
        local_context_tokens=settings.local_context_tokens,
        local_threads=settings.local_threads,
        local_max_output_tokens=settings.local_max_output_tokens,
        remember_runs="never",
        embedder="none",
    )


async def evaluate_tasks(
    settings: Settings,
    *,
    model_spec: str,
    suite: Path | None = None,
    category: str | None = None,
    limit: int | None = None,
    results: Path | None = None,
    options: RunOptions | None = None,
    model_for: Callable[[EverydayTask], str] | None = None,
    keep: Path | None = None,
    progress: Callable[[int, int, int, str | None], None] | None = None,
) -> TasksReport:
    """Run the suite's tasks (of `category`, the first `limit`) with `model_spec`, and check each.

    `settings` gives the model settings (the runs get a home of their own). `model_for` picks
    another model spec for a task (tests script each task). `keep` keeps the runs' home and
    workspaces in that folder instead of a temporary one. `progress(done, total, passed, task_id)`
    is called before each task (with its id) and at the end (with None).
    """
    from ..engine import Engine

    if category is not None and category not in CATEGORIES:
        raise ConfigError(f"unknown category {category!r}; known: {', '.join(CATEGORIES)}")
    suite_path = suite or DEFAULT_SUITE
    tasks = [task for task in load_suite(suite_path) if category in (None, task.category)]
    tasks = tasks[:limit] if limit else tasks
    run_options = options or suite_options()
    saved = None
    if results:
        header: dict[str, Any] = {
            "suite": _suite_fingerprint(suite_path),
            "model": model_spec,
            "options": run_options.to_json_dict(),
            "code": package_code_fingerprint(),
        }
        saved = ResultsFile(results, header | _output_cap(model_spec, settings), required=_RECORD_FIELDS)
    records: list[dict[str, Any]] = []
    ledger = UsageLedger()
    with tempfile.TemporaryDirectory(prefix="masterplanner-tasks-") as temporary:
        root = Path(keep or temporary)
        workspaces = private_folder(root / "workspaces")  # the runs' files: as a home's `workspaces`
        engine: Engine | None = None
        try:
            for done, task in enumerate(tasks):
                if progress:
                    progress(done, len(tasks), sum(1 for record in records if record["passed"]), task.id)
                record = saved.records.get(task.id) if saved else None
                if record is None:
                    engine = engine or Engine(_suite_settings(settings, root / "home"))
                    spec = model_for(task) if model_for else model_spec
                    record = await _run_task(engine, task, spec, run_options, workspaces)
                    if saved:
                        saved.append(record)
                records.append(record)
                ledger.merge(_by_role(record["usage"]))
        finally:
            if engine is not None:
                engine.close()
                # DBOS made its thread pool, now shut down, this loop's default executor: give the
                # loop a fresh one, or the loop's next `asyncio.to_thread` (a second evaluation) fails.
                asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor())
    if progress:
        progress(len(tasks), len(tasks), sum(1 for record in records if record["passed"]), None)
    return TasksReport(model=model_spec, records=records, usage=ledger.summary())
