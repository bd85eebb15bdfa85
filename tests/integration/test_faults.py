"""The fault suite: `masterplanner run` in real processes against a real HTTP model server on
127.0.0.1 that misbehaves when told, with tools that crash or take their time, a disk that
fills, and processes stopped mid-run (SIGTERM, kill -9). Each case's end state is asserted
exactly: the run's and steps' status, the message, the events, and how often each side effect
happened. (A Postgres restart mid-run is `test_workers.py::test_a_postgres_restart_mid_run…`.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from _model_server import ModelServer, Rule, model_server
from masterplanner.engine.store import RunStore

FAULTS_SERVER = str(Path(__file__).with_name("mcp_faults_server.py"))
PLANNER = "You are the Master Planner"
PROMPT_WRITER = "You write system prompts"
AGGREGATOR = "Compose the final answer to the task from the results"


def step(step_id: str, *deps: str, tools: list[str] | None = None) -> dict[str, Any]:
    return {
        "id": step_id,
        "title": step_id,
        "instruction": f"Do {step_id}.",
        "agent_role": "worker",
        "tools": tools or [],
        "depends_on": list(deps),
        "expected_output": "",
    }


def rules(
    *steps: dict[str, Any], faults: dict[str, list[str]] | None = None, always: dict[str, str] | None = None
) -> list[Rule]:
    """Rules answering the planner with `steps`, the prompt writer, the aggregator, and each step with
    `<id> done`; `faults` and `always` by rule: `planner`, `aggregator` or a step's id."""
    faults, always = faults or {}, always or {}
    keyed = {
        "planner": Rule([PLANNER], {"steps": list(steps)}),
        "prompts": Rule([PROMPT_WRITER], "You do the step you are given."),
        "aggregator": Rule([AGGREGATOR], "all done"),
        **{one["id"]: Rule([f"Do {one['id']}."], f"{one['id']} done") for one in steps},
    }
    for key, rule in keyed.items():
        rule.faults, rule.always = list(faults.get(key, [])), always.get(key)
    return list(keyed.values())


class Scene:
    """One test's home, environment and model server, and the `masterplanner` processes it starts."""

    def __init__(self, home: Path, server: ModelServer) -> None:
        self.home = home
        self.server = server
        self.tally = home / "tally.txt"
        self.env = {
            **{key: value for key, value in os.environ.items() if not key.startswith("MASTERPLANNER_")},
            "MASTERPLANNER_HOME": str(home),
            "MASTERPLANNER_EMBEDDER": "none",
            "MASTERPLANNER_REUSE_THRESHOLD": "1.01",
            "MASTERPLANNER_REMEMBER_RUNS": "never",
            "MASTERPLANNER_RUN_LEASE_S": "2",
            "MASTERPLANNER_MODEL_ATTEMPTS": "3",
            "MASTERPLANNER_MODEL_TIMEOUT_S": "3",
            "MASTERPLANNER_MCP_SERVERS": json.dumps(
                {"faults": {"command": sys.executable, "args": [FAULTS_SERVER]}}
            ),
            "MASTERPLANNER_TOOL_POLICIES": json.dumps(
                {"faults_tally": "auto", "faults_slow": "auto", "faults_crash": "auto"}
            ),
            "OPENAI_BASE_URL": server.base_url,
            "FAULTS_TALLY": str(self.tally),
            "FAULTS_SLOW_S": "30",
            "COLUMNS": "200",
        }
        self.env.pop("OPENAI_API_KEY", None)

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "masterplanner", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.env, **(env or {})},
        )

    def run(
        self, *args: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        process = self.start(*args, env=env)
        out, err = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def run_task(self, *flags: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(
            "run",
            "Do the faulty task.",
            "--model",
            "openai:faulty",
            "--yes",
            "--json",
            "--max-replans",
            "0",
            "--rounds",
            "0",
            *flags,
            timeout=timeout,
        )

    @property
    def store(self) -> RunStore:
        return RunStore(f"sqlite:///{self.home / 'masterplanner.sqlite'}")

    def only_run(self) -> str:
        runs = self.store.list_runs()
        assert len(runs) == 1
        return runs[0].id

    def events(self, run_id: str) -> list[tuple[str, str | None, dict[str, Any]]]:
        return [(event.kind, event.step, event.data) for event in self.store.events(run_id)]

    def kinds(self, run_id: str) -> Counter[tuple[str, str | None]]:
        return Counter((kind, step) for kind, step, _ in self.events(run_id))

    def tallied(self) -> list[str]:
        return self.tally.read_text().splitlines() if self.tally.exists() else []

    def wait_for(self, what: Callable[[], bool], timeout: float = 60, why: str = "") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if what():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {why or what}")


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Callable[[list[Rule]], Scene]]:
    servers: list[Any] = []

    def make(served: list[Rule]) -> Scene:
        context = model_server(served)
        server = context.__enter__()
        servers.append(context)
        return Scene(tmp_path / "home", server)

    yield make
    for context in servers:
        context.__exit__(None, None, None)


def retries_of(scene: Scene, run_id: str) -> list[tuple[str | None, dict[str, Any]]]:
    return [(step, data) for kind, step, data in scene.events(run_id) if kind == "model_retried"]


# --- the model server misbehaves --------------------------------------------------------------


def test_a_429_with_retry_after_is_waited_out_and_the_run_succeeds(
    scene: Callable[[list[Rule]], Scene],
) -> None:
    here = scene(rules(step("fetch"), step("report", "fetch"), faults={"fetch": ["429:2"]}))
    done = here.run_task()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["output"]) == ("succeeded", "report done")
    run_id = report["run_id"]
    assert retries_of(here, run_id) == [
        (
            "fetch",
            {
                "purpose": "step:fetch",
                "error": "the model provider is rate limiting requests (HTTP 429)",
                "delay_s": 2,
                "attempt": 2,
                "attempts": 3,
            },
        )
    ]
    fetch = here.server.served("Do fetch.")
    assert [request.given for request in fetch] == ["429:2", "reply"]
    assert fetch[1].at - fetch[0].at >= 1.9  # the wait the server asked for
    kinds = here.kinds(run_id)
    assert kinds[("step_started", "fetch")] == kinds[("step_succeeded", "fetch")] == 1
    assert kinds[("step_retried", "fetch")] == 0


@pytest.mark.parametrize(
    ("fault", "rule", "problem"),
    [
        ("500", "fetch", "the model server failed (HTTP 500: the server had an error)"),
        ("hang", "fetch", "the model server did not answer within 3 s"),
        ("malformed", "fetch", "the model server's reply was not valid JSON"),
        ("crash", "fetch", "could not reach the model server (Connection error.)"),
        ("500", "planner", "the model server failed (HTTP 500: the server had an error)"),
        ("429", "aggregator", "the model provider is rate limiting requests (HTTP 429)"),
    ],
)
def test_a_failure_in_passing_is_tried_again_once_and_said(
    scene: Callable[[list[Rule]], Scene], fault: str, rule: str, problem: str
) -> None:
    here = scene(rules(step("fetch"), step("other"), faults={rule: [fault]}))
    done = here.run_task()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["output"]) == ("succeeded", "all done")
    purpose = {"fetch": "step:fetch"}.get(rule, rule)
    step_id = "fetch" if rule == "fetch" else None
    assert retries_of(here, report["run_id"]) == [
        (step_id, {"purpose": purpose, "error": problem, "delay_s": 1, "attempt": 2, "attempts": 3})
    ]
    assert here.server.given({"fetch": "Do fetch.", "planner": PLANNER, "aggregator": AGGREGATOR}[rule]) == [
        fault,
        "reply",
    ]
    kinds = here.kinds(report["run_id"])
    for one in ("fetch", "other"):
        assert kinds[("step_started", one)] == kinds[("step_succeeded", one)] == 1


def test_a_provider_that_keeps_rate_limiting_fails_the_step_after_its_tries(
    scene: Callable[[list[Rule]], Scene],
) -> None:
    here = scene(rules(step("fetch"), step("report", "fetch"), always={"fetch": "429"}))
    done = here.run_task()
    assert done.returncode == 1
    report = json.loads(done.stdout)
    error = "the model provider is rate limiting requests (HTTP 429); gave up after 3 tries"
    reason = f"step fetch failed: {error}; step report skipped: dependency 'fetch' failed"
    assert (report["status"], report["error"]) == ("failed", reason)
    assert [(one["id"], one["status"], one["error"]) for one in report["steps"]] == [
        ("fetch", "failed", error),
        ("report", "skipped", "dependency 'fetch' failed"),
    ]
    assert here.server.given("Do fetch.") == ["429", "429", "429"]  # no step-level tries on top
    assert [(data["delay_s"], data["attempt"]) for _, data in retries_of(here, report["run_id"])] == [
        (1, 2),
        (2, 3),
    ]
    assert f"\nstep fetch failed: {error}" in done.stderr


def test_a_plan_in_the_wrong_form_fails_the_run_at_planning_and_says_why(
    scene: Callable[[list[Rule]], Scene],
) -> None:
    here = scene(rules(step("fetch"), always={"planner": "wrong_schema"}))
    done = here.run_task()
    assert done.returncode == 1
    report = json.loads(done.stdout)
    error = "no valid plan after 2 repairs: plan: steps: should be a list, got null"
    assert (report["status"], report["error"], report["steps"]) == ("failed", error, [])
    assert here.server.given(PLANNER) == ["wrong_schema"] * 3  # the plan, then two repairs
    assert here.server.given("Do fetch.") == []
    assert [kind for kind, _, _ in here.events(report["run_id"])] == ["run_created", "run_failed"]
    assert f"\n{error}" in done.stderr
