"""Worker processes over one Postgres database, as the worker tests start them, and the plans
their scripts give: `Cluster` (the `cluster` fixture, in conftest.py) and `plan_step`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from masterplanner.engine.store import RunStore

LEASE_S = 3.0


def plan_step(step_id: str, *deps: str, tools: list[str] | None = None) -> dict[str, Any]:
    return {
        "id": step_id,
        "title": step_id,
        "instruction": f"Do {step_id}.",
        "agent_role": "worker",
        "tools": tools or [],
        "depends_on": list(deps),
        "expected_output": "",
    }


class Cluster:
    """Worker processes and enqueuing processes over one Postgres database, with their logs in files."""

    def __init__(self, database: str, home: Path) -> None:
        self.database = database
        self.home = home
        self.env = {
            **os.environ,
            "MASTERPLANNER_HOME": str(home),
            "MASTERPLANNER_DATABASE_URL": database,
            "MASTERPLANNER_RUN_LEASE_S": str(LEASE_S),
            "MASTERPLANNER_REUSE_THRESHOLD": "1.01",
            "MASTERPLANNER_EMBEDDER": "none",
            "MASTERPLANNER_REMEMBER_RUNS": "never",
            "COLUMNS": "200",
            # no hosted provider's key: a worker takes local, ollama and scripted runs by default
            "OPENAI_API_KEY": "",
            "OPENAI_BASE_URL": "",
            "ANTHROPIC_API_KEY": "",
        }
        self.workers: list[subprocess.Popen[str]] = []
        home.mkdir(parents=True, exist_ok=True)
        self.store = RunStore(database)

    def worker(
        self, *flags: str, env: dict[str, str] | None = None, under: list[str] | None = None
    ) -> subprocess.Popen[str]:
        """A worker process with the cluster's environment (and `env` on top), started by `under`'s
        command if given (which ends by executing the rest of its command line)."""
        log = (self.home / f"worker{len(self.workers)}.log").open("w")
        process = subprocess.Popen(
            [*(under or []), sys.executable, "-m", "masterplanner", "worker", *flags],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env={**self.env, **(env or {})},
        )
        self.workers.append(process)
        return process

    def start_workers(self, count: int, *flags: str) -> list[str]:
        """Start `count` workers with `flags`; the ids of the live workers once that many are registered."""
        for _ in range(count):
            self.worker(*flags)
        return self.worker_ids(count)

    def mp(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`masterplanner ARGS` run to its end with the cluster's environment, its output captured."""
        return subprocess.run(
            [sys.executable, "-m", "masterplanner", *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def log(self, index: int) -> str:
        return (self.home / f"worker{index}.log").read_text()

    def worker_ids(self, count: int, timeout: float = 60) -> list[str]:
        """The ids of the live workers, once `count` of them are registered."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            live = [record.id for record in self.store.processes.listed() if record.kind == "worker"]
            if len(live) >= count:
                return live
            time.sleep(0.2)
        raise AssertionError(f"{count} workers did not start within {timeout:g} s")

    def enqueue(self, script: Path, tasks: list[str]) -> list[str]:
        """Queue runs for the workers from a process of its own (the library's RunService); their ids."""
        code = (
            "import asyncio, json, sys\n"
            "from masterplanner import RunOptions, RunService, Settings\n"
            "async def main():\n"
            "    service = RunService(Settings.load())\n"
            "    ids = []\n"
            "    for task in json.loads(sys.argv[2]):\n"
            "        run = await service.create(task, model='scripted:' + sys.argv[1],\n"
            "                                   options=RunOptions(auto_approve=True), for_workers=True)\n"
            "        ids.append(run.id)\n"
            "    service.close()\n"
            "    print(json.dumps(ids))\n"
            "asyncio.run(main())\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code, str(script), json.dumps(tasks)],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return list(json.loads(done.stdout))

    def wait_finished(self, run_ids: list[str], timeout: float = 180) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            statuses = {run_id: self.store.get_run(run_id).status for run_id in run_ids}
            if all(status in ("succeeded", "failed", "cancelled") for status in statuses.values()):
                return statuses
            time.sleep(0.25)
        raise AssertionError(f"runs not finished within {timeout:g} s: {statuses}")

    def events(self, run_id: str, *kinds: str) -> list[tuple[str, str | None, dict[str, Any]]]:
        return [
            (event.kind, event.step, event.data) for event in self.store.events(run_id) if event.kind in kinds
        ]

    def close(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)
        self.store.close()
