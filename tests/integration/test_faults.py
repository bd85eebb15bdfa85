"""The fault suite: `masterplanner run` in real processes against a real HTTP model server on
127.0.0.1 that misbehaves when told, with tools that crash or take their time, a disk that
fills, and processes stopped mid-run (SIGTERM, kill -9). Each case's end state is asserted
exactly: the run's and steps' status, the message, the events, and how often each side effect
happened. (A Postgres restart mid-run is `test_workers.py::test_a_postgres_restart_mid_run…`.)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from _cluster import plan_step as step

from _model_server import ModelServer, Rule, model_server
from masterplanner.engine.store import RunStore

FAULTS_SERVER = str(Path(__file__).with_name("mcp_faults_server.py"))
PLANNER = "You are the Master Planner"
PROMPT_WRITER = "You write system prompts"
AGGREGATOR = "Compose the final answer to the task from the results"
RUN_ARGS = (
    "run",
    "Do the faulty task.",
    "--model",
    "openai:faulty",
    "--json",
    "--max-replans",
    "0",
    "--rounds",
    "0",
)
"""`masterplanner run` on the test server's model, without the review (--yes) unless added."""


def rules(
    *steps: dict[str, Any],
    faults: dict[str, list[str]] | None = None,
    always: dict[str, str] | None = None,
    calls: dict[str, list[dict[str, Any]]] | None = None,
) -> list[Rule]:
    """Rules answering the planner with `steps`, the prompt writer, the aggregator, and each step with
    `<id> done`; `faults` and `always` by rule: `planner`, `aggregator` or a step's id. `calls`: the
    tool calls a step's agent makes, one a turn, before it answers."""
    faults, always = faults or {}, always or {}
    turns = [
        Rule([f"Do {step_id}."], {"tool_calls": [call]}, turn=turn)
        for step_id, made in (calls or {}).items()
        for turn, call in enumerate(made, 1)
    ]
    keyed = {
        "planner": Rule([PLANNER], {"steps": list(steps)}),
        "prompts": Rule([PROMPT_WRITER], "You do the step you are given."),
        "aggregator": Rule([AGGREGATOR], "all done"),
        **{one["id"]: Rule([f"Do {one['id']}."], f"{one['id']} done") for one in steps},
    }
    for key, rule in keyed.items():
        rule.faults, rule.always = list(faults.get(key, [])), always.get(key)
    rules = list(keyed.values())
    return [*rules[:3], *turns, *rules[3:]]  # the prompt writer is shown a step's instruction too


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
                {
                    "faults": {
                        "command": sys.executable,
                        "args": [FAULTS_SERVER],
                        "env": {"FAULTS_TALLY": str(self.tally), "FAULTS_SLOW_S": "30"},
                    }
                }
            ),
            "MASTERPLANNER_TOOL_POLICIES": json.dumps(
                {
                    "faults_tally": "auto",
                    "faults_slow": "auto",
                    "faults_slow_idempotent": "auto",
                    "faults_crash": "auto",
                    "faults_linger": "auto",
                    "code_execution": "auto",
                }
            ),
            "OPENAI_BASE_URL": server.base_url,
            "COLUMNS": "200",
        }
        self.env.pop("OPENAI_API_KEY", None)
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-m", "masterplanner", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**self.env, **(env or {})},
        )
        self.processes.append(process)
        return process

    def run(
        self, *args: str, timeout: float = 120, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        process = self.start(*args, env=env)
        try:
            out, err = process.communicate(timeout=timeout)
        finally:
            if process.poll() is None:  # timed out: not left running after the test
                process.kill()
                process.communicate()
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def run_task(self, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return self.run(*RUN_ARGS, "--yes", timeout=timeout)

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

    def pending(self, kind: str) -> dict[str, Any]:
        """The one open request of `kind`, once `runs pending` lists it."""
        found: list[dict[str, Any]] = []

        def listed() -> bool:
            shown = self.run("runs", "pending", "--json")
            assert shown.returncode == 0, shown.stderr
            found[:] = [request for request in json.loads(shown.stdout) if request["kind"] == kind]
            return bool(found)

        self.wait_for(listed, why=f"an open {kind} request")
        assert len(found) == 1
        return found[0]

    def resume(self, run_id: str, env: dict[str, str] | None = None) -> dict[str, Any]:
        """`runs resume RUN --json` to the run's end (a stopped process's hold lapses first): its report."""
        done = self.run("runs", "resume", run_id, "--json", env=env)
        assert done.returncode == 0, done.stderr
        return dict(json.loads(done.stdout))

    def wait_for(self, what: Callable[[], bool], timeout: float = 180, why: str = "") -> None:
        """Wait until `what()` holds; the time allowed is only so a test that never gets there fails."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if what():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {why or what}")


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Callable[[list[Rule]], Scene]]:
    servers: list[Any] = []
    scenes: list[Scene] = []

    def make(served: list[Rule]) -> Scene:
        context = model_server(served)
        server = context.__enter__()
        servers.append(context)
        scenes.append(Scene(tmp_path / "home", server))
        return scenes[-1]

    yield make
    for here in scenes:
        for process in here.processes:
            if process.poll() is None:  # a test that failed midway leaves nothing running
                process.kill()
                process.communicate()
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
        (
            "crash",
            "fetch",
            "could not reach the model server at {address} (it closed the connection without answering)",
        ),
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
    problem = problem.format(address=urlsplit(here.server.base_url).netloc)
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
    # the request made and failed is a call of the step (its three tries one request), no tokens
    fetched = report["usage"]["by_purpose"]["step:fetch"]
    assert {key: value for key, value in fetched.items() if key != "seconds"} == {
        "calls": 1,
        "input_tokens": 0,
        "output_tokens": 0,
        "cost_usd": 0.0,
        "unpriced_calls": 0,
        "failed_calls": 1,
    }
    assert report["usage"]["failed_calls"] == 1
    assert f"{report['usage']['llm_calls']} model calls (1 failed)" in done.stderr


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
    assert [(kind, data.get("stage")) for kind, _, data in here.events(report["run_id"])] == [
        ("run_created", None),
        ("planning_progress", "similar_teams"),
        ("planning_progress", "steps"),  # where it failed
        ("run_failed", None),
    ]
    assert f"\n{error}" in done.stderr


SHAPELESS_KEY = "zq7Hkd92LmPq0xWv3nRt"
"""A key of no known shape: only its being the value of OPENAI_API_KEY marks it a secret."""


@pytest.mark.parametrize("rule", ["fetch", "planner"])
def test_a_model_server_error_echoing_the_key_is_stored_and_printed_without_it(
    scene: Callable[[list[Rule]], Scene], rule: str
) -> None:
    here = scene(rules(step("fetch"), always={rule: "401"}))
    done = here.run(*RUN_ARGS, "--yes", env={"OPENAI_API_KEY": SHAPELESS_KEY})
    assert done.returncode == 1
    assert here.server.given({"fetch": "Do fetch.", "planner": PLANNER}[rule])[0] == "401"
    report = json.loads(done.stdout)
    assert report["status"] == "failed"
    assert "Incorrect API key provided: [secret removed]" in report["error"]
    stored = json.dumps([here.store.get_run(report["run_id"]).error, here.events(report["run_id"])])
    assert "[secret removed]" in stored
    for text in (done.stdout, done.stderr, stored):
        assert SHAPELESS_KEY not in text


# --- tools fail ----------------------------------------------------------------------------------


def test_a_tool_whose_server_crashes_mid_call_is_an_error_the_agent_sees(
    scene: Callable[[list[Rule]], Scene],
) -> None:
    crash = {"name": "faults_crash", "args": {"label": "c1"}}
    tally = {"name": "faults_tally", "args": {"label": "t1"}}
    here = scene(
        rules(
            step("fetch", tools=["faults_crash"]),
            step("count", "fetch", tools=["faults_tally"]),
            calls={"fetch": [crash], "count": [tally]},
        )
    )
    done = here.run_task()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["output"]) == ("succeeded", "count done")
    results = [(step, data) for kind, step, data in here.events(report["run_id"]) if kind == "tool_result"]
    assert results == [
        (
            "fetch",
            {
                "tool": "faults_crash",
                "error": "the MCP server stopped or failed before it replied (Connection closed) "
                f"(its messages are in {here.home / 'logs' / 'mcp-faults.log'})",
            },
        ),
        ("count", {"tool": "faults_tally", "result": "counted t1"}),
    ]
    assert here.tallied() == ["crash c1", "t1"]  # each call once; the server started again for count


@pytest.mark.security
def test_a_program_past_its_time_in_the_sandbox_is_killed_and_the_agent_told(
    scene: Callable[[list[Rule]], Scene],
) -> None:
    forever = {
        "name": "code_execution",
        "args": {"code": "open('started.txt', 'w').write('x')\nwhile True:\n    pass\n", "timeout_s": 1},
    }
    here = scene(rules(step("compute", tools=["code_execution"]), calls={"compute": [forever]}))
    done = here.run_task()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["output"]) == ("succeeded", "compute done")
    results = [(step, data) for kind, step, data in here.events(report["run_id"]) if kind == "tool_result"]
    killed = "killed: the program ran longer than 1 s"
    assert results == [
        (
            "compute",
            {"tool": "code_execution", "result": f"exit code -9 ({killed})\n--- stderr ---\n{killed}"},
        )
    ]
    assert (Path(report["workspace"]) / "started.txt").read_text() == "x"  # what it did before stays
    assert here.server.given("Do compute.") == ["reply", "reply"]  # the agent was told, and answered


def test_a_full_disk_is_a_tool_error_and_nothing_stored_is_lost(
    scene: Callable[[list[Rule]], Scene], tmp_path: Path
) -> None:
    big = {"name": "write_file", "args": {"path": "big.txt", "content": "x" * 200_000}}
    small = {"name": "write_file", "args": {"path": "small.txt", "content": "fits"}}
    here = scene(rules(step("write", tools=["write_file"]), calls={"write": [small, big]}))
    disk, listing = tmp_path / "disk", tmp_path / "listing.txt"
    disk.mkdir()
    # a 64 KiB file system for the workspace, mounted in a mount namespace of the run's own; what
    # the workspace holds is listed from inside it once the run has ended
    script = (
        f'mount -t tmpfs -o size=64k tmpfs {disk} && "$@"; ended=$?; ls -A {disk}/ws > {listing}; exit $ended'
    )
    flags = ["--yes", "--json", "--rounds", "0", "--max-replans", "0", "--workspace", str(disk / "ws")]
    done = subprocess.run(
        [
            "unshare",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            script,
            "sh",
            sys.executable,
            "-m",
            "masterplanner",
            "run",
            "Do the faulty task.",
            "--model",
            "openai:faulty",
            *flags,
        ],
        capture_output=True,
        text=True,
        env=here.env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["status"], report["output"]) == ("succeeded", "write done")
    results = [(step, data) for kind, step, data in here.events(report["run_id"]) if kind == "tool_result"]
    assert results == [
        ("write", {"tool": "write_file", "result": "wrote 4 bytes to small.txt"}),
        ("write", {"tool": "write_file", "error": "cannot write 'big.txt': the disk is full"}),
    ]
    assert listing.read_text().split() == ["small.txt"]  # no half-written file left behind
    shown = here.run("runs", "show", report["run_id"], "--json")  # the run's record reads back whole
    assert json.loads(shown.stdout)["status"] == "succeeded"


def _run_on_a_small_home(
    tmp_path: Path, script: Path, size: str, task: str, *flags: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """`run TASK` with its home on a `size` file system, and the folder the home is copied to after.

    The file system is a tmpfs in a mount namespace of the run's own; the home is copied out once
    the run has ended (no process has the database open then) and read back from there.
    """
    disk, copy = tmp_path / "disk", tmp_path / "home-after"
    disk.mkdir()
    home = disk / "home"
    script_text = (
        f'mount -t tmpfs -o size={size} tmpfs {disk} && "$@"; ended=$?; cp -r {home} {copy}; exit $ended'
    )
    namespace = ["unshare", "--map-root-user", "--mount", "sh", "-c", script_text, "sh", sys.executable]
    options = [*flags, "--yes", "--rounds", "0", "--max-replans", "0", "--workspace", str(tmp_path / "ws")]
    done = subprocess.run(
        [*namespace, "-m", "masterplanner", "run", task, "--model", f"scripted:{script}", *options],
        capture_output=True,
        text=True,
        env={**os.environ, "MASTERPLANNER_HOME": str(home), "COLUMNS": "200"},
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    return done, copy


FULL = "the run's database failed: database or disk is full"
FILLS = [
    # DBOS cannot checkpoint step b's reply: the step fails, the run fails with it
    pytest.param("step:b", f"step b failed: {FULL}", [("a", "succeeded"), ("b", "failed")], id="step"),
    # the steps are done, DBOS cannot record the aggregate answer: the run ends failed, not running
    pytest.param("aggregator", FULL, [("a", "succeeded"), ("b", "succeeded")], id="aggregate"),
]


@pytest.mark.parametrize(("filler", "error", "steps"), FILLS)
def test_a_full_disk_under_the_database_ends_the_run_in_our_words_and_keeps_the_record(
    filler: str, error: str, steps: list[tuple[str, str]], write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """The home (SQLite) fills up mid-run with a 3 MB reply."""
    independent = filler == "aggregator"  # two sinks: their outputs are composed by the aggregator
    plan = [step("a"), step("b") if independent else step("b", "a")]
    replies = {"step:a": "a done", "step:b": "b done", filler: "B" * 3_000_000}
    script = write_script(
        [{"purpose": "planner", "output": {"steps": plan}}]
        + [{"purpose": purpose, "output": output} for purpose, output in replies.items()]
        + [{"purpose": "*", "repeat": True}]
    )
    done, copy = _run_on_a_small_home(tmp_path, script, "2m", "Do a and b.", "--json")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["error"] == error
    assert "INSERT" not in done.stderr and "sqlalche.me" not in done.stderr and "Traceback" not in done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    shown = subprocess.run(
        [sys.executable, "-m", "masterplanner", "runs", "show", run_id, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "MASTERPLANNER_HOME": str(copy)},
        timeout=60,
    )
    record = json.loads(shown.stdout)
    assert (record["status"], record["error"]) == ("failed", error)
    assert [(s["id"], s["status"]) for s in record["steps"]] == steps
    assert record["steps"][0]["output"] == "a done"


def test_a_home_too_small_to_end_the_run_stops_it_in_our_words_to_resume(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """A 1 MiB home fills while a step's work is checkpointed: the writes that would end the run
    failed, and so did giving the run up. Before, that last failure replaced the first one
    ("cannot release a lease"), without the resume hint, and the run was left `running`."""
    plan = [step("a", tools=["write_file"]), step("b", "a", tools=["write_file"]), step("c", "b")]
    calls: list[dict[str, Any]] = [{"purpose": "planner", "output": {"steps": plan}}]
    for one in ("a", "b"):
        write = {"name": "write_file", "args": {"path": f"{one}.txt", "content": one}}
        calls += [
            {"purpose": f"step:{one}", "tool_calls": [write], "delay_s": 0.5},
            {"purpose": f"step:{one}", "output": f"{one} done", "delay_s": 0.5},
        ]
    calls += [{"purpose": "step:c", "output": "c done"}, {"purpose": "*", "repeat": True}]
    script = write_script(calls)
    done, copy = _run_on_a_small_home(tmp_path, script, "1m", "Do a, b, c.")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "lease" not in done.stderr, done.stderr
    said = re.search(
        r"run (\S+) stopped; to go on from where it stopped: masterplanner runs resume \1\n"
        rf"error: {re.escape(FULL)}\n$",
        done.stderr,
    )
    assert said, done.stderr
    run_id = said.group(1)
    env = {**os.environ, "MASTERPLANNER_HOME": str(copy), "COLUMNS": "200"}

    def listed() -> dict[str, Any]:
        shown = subprocess.run(
            [sys.executable, "-m", "masterplanner", "runs", "list", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
        )
        [record] = json.loads(shown.stdout)
        return dict(record)

    # left running, and shown stopped (to resume) once its lease is given up, or, when the disk was
    # too full for that too, once the lease lapses (run_lease_s): which of the two depends on the
    # byte the disk filled at
    deadline = time.monotonic() + 30
    while (record := listed())["idle"] is None and time.monotonic() < deadline:
        time.sleep(1)
    assert (record["run_id"], record["status"], record["idle"]) == (run_id, "running", "stopped")


# --- the run's process is stopped ---------------------------------------------------------------

STOPS = [pytest.param(signal.SIGTERM, id="sigterm"), pytest.param(signal.SIGKILL, id="kill-9")]


def stopped(process: subprocess.Popen[str], signum: int) -> str:
    """Send `signum`; check the process ends as it should (SIGTERM: cleanly, exit 143); its stderr."""
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    if signum == signal.SIGTERM:
        assert process.returncode == 143, err
        # the person is told how to go on, then that the command was stopped
        assert re.search(
            r"run (\S+) stopped; to go on from where it stopped: masterplanner runs resume \1\n"
            r"terminated \(SIGTERM\)\n$",
            err,
        ), err
    else:
        assert process.returncode == -signal.SIGKILL
    return err


@pytest.mark.parametrize("signum", STOPS)
def test_stopped_while_the_plan_waits_for_review_the_review_stays_open_for_any_process(
    scene: Callable[[list[Rule]], Scene], signum: int
) -> None:
    here = scene(rules(step("fetch"), step("report", "fetch")))
    running = here.start(*RUN_ARGS)  # no --yes: the plan waits for a review
    review = here.pending("plan_review")
    stopped(running, signum)
    run_id = review["run_id"]
    assert here.store.get_run(run_id).status == "awaiting_approval"
    assert here.pending("plan_review")["id"] == review["id"]  # the same request, still open
    if signum == signal.SIGTERM:  # its lease given up: listed as stopped (kill -9's lapses later)
        [listed] = json.loads(here.run("runs", "list", "--json").stdout)
        assert (listed["status"], listed["idle"]) == ("awaiting_approval", "stopped")
    answered = here.run("runs", "answer", review["id"], "--approve")
    assert answered.returncode == 0, answered.stderr
    report = here.resume(run_id)
    assert (report["status"], report["output"]) == ("succeeded", "report done")
    kinds = here.kinds(run_id)
    assert kinds[("approval_requested", None)] == kinds[("approved", None)] == 1
    for one in ("fetch", "report"):
        assert kinds[("step_started", one)] == kinds[("step_succeeded", one)] == 1
    assert here.server.given(PLANNER) == ["reply"]  # planned once


@pytest.mark.parametrize("signum", STOPS)
def test_stopped_during_a_tool_call_the_call_cut_off_is_not_made_again_and_the_agent_is_told(
    scene: Callable[[list[Rule]], Scene], signum: int
) -> None:
    first = {"name": "faults_tally", "args": {"label": "first"}}
    second = {"name": "faults_slow", "args": {"label": "second"}}
    here = scene(rules(step("work", tools=["faults_tally", "faults_slow"]), calls={"work": [first, second]}))
    running = here.start(*RUN_ARGS, "--yes")
    here.wait_for(lambda: "start second" in here.tallied(), why="the slow call to start")
    stopped(running, signum)
    run_id = here.only_run()
    report = here.resume(run_id)
    assert (report["status"], report["output"]) == ("succeeded", "work done")
    # the finished call is not made again, nor the one cut short: the server declares neither
    # idempotent, so whether its effect happened is the agent's to check
    assert here.tallied() == ["first", "start second"]
    tools = [(kind, data["tool"]) for kind, _, data in here.events(run_id) if kind.startswith("tool_")]
    assert tools == [
        ("tool_called", "faults_tally"),
        ("tool_result", "faults_tally"),
        ("tool_called", "faults_slow"),
        ("tool_result", "faults_slow"),
    ]
    told = (
        "faults_slow: an earlier try of this call was cut off when its process stopped; it may have "
        "taken effect, so it was not made again. Check its effect before calling it again."
    )
    assert [data.get("error") for kind, _, data in here.events(run_id) if kind == "tool_result"] == [
        None,
        told,
    ]
    assert told in here.server.texts("Do work.")[-1]  # the agent's last request carried it
    assert here.kinds(run_id)[("step_succeeded", "work")] == 1


@pytest.mark.parametrize("signum", STOPS)
def test_stopped_during_a_call_a_tool_declares_idempotent_only_that_call_runs_again(
    scene: Callable[[list[Rule]], Scene], signum: int
) -> None:
    first = {"name": "faults_tally", "args": {"label": "first"}}
    second = {"name": "faults_slow_idempotent", "args": {"label": "second"}}
    here = scene(
        rules(step("work", tools=["faults_tally", "faults_slow_idempotent"]), calls={"work": [first, second]})
    )
    running = here.start(*RUN_ARGS, "--yes")
    here.wait_for(lambda: "start second" in here.tallied(), why="the slow call to start")
    stopped(running, signum)
    run_id = here.only_run()
    quick = json.loads(here.env["MASTERPLANNER_MCP_SERVERS"])
    quick["faults"]["env"]["FAULTS_SLOW_S"] = "0.1"
    report = here.resume(run_id, env={"MASTERPLANNER_MCP_SERVERS": json.dumps(quick)})
    assert (report["status"], report["output"]) == ("succeeded", "work done")
    # the finished call is not made again; the one cut short is (its server was stopped with the run)
    assert here.tallied() == ["first", "start second", "start second", "end second"]
    calls = [data["tool"] for kind, _, data in here.events(run_id) if kind == "tool_called"]
    assert calls == ["faults_tally", "faults_slow_idempotent", "faults_slow_idempotent"]
    results = [data["tool"] for kind, _, data in here.events(run_id) if kind == "tool_result"]
    assert results == ["faults_tally", "faults_slow_idempotent"]
    assert here.kinds(run_id)[("step_succeeded", "work")] == 1


def running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def lingering(here: Scene, label: str) -> list[int]:
    """The pids of the MCP server calling `faults_linger` with `label` and of the program it started."""
    for line in here.tallied():
        if line.startswith(f"linger {label} "):
            return [int(pid) for pid in line.split()[2:]]
    return []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_killed_during_a_call_its_mcp_server_and_what_the_server_started_end_too(
    scene: Callable[[list[Rule]], Scene],
) -> None:
    """Before, a server busy in a call (one not checking for its client, as `slow` does) ran on,
    orphaned, for ever after its run's process was killed with SIGKILL, and so did its children."""
    call = {"name": "faults_linger", "args": {"label": "cut"}}
    here = scene(rules(step("work", tools=["faults_linger"]), calls={"work": [call]}))
    temporary = Path(tempfile.mkdtemp(prefix="mp-faults-tmp-"))
    env = {"MASTERPLANNER_MODEL_TIMEOUT_S": "120", "TMPDIR": str(temporary)}
    running_run = here.start(*RUN_ARGS, "--yes", env=env)
    here.wait_for(lambda: bool(lingering(here, "cut")), why="the server's call to start")
    pids = lingering(here, "cut")
    assert all(running(pid) for pid in pids)
    assert [path.name.startswith("masterplanner-mcp-") for path in temporary.iterdir()] == [True]
    stopped(running_run, signal.SIGKILL)
    try:  # within moments; the time allowed is only so a process that never ends fails the test
        here.wait_for(lambda: not any(map(running, pids)), timeout=120, why=f"processes {pids} to end")
        # the starter's file for a failed exec's reason goes with the server (the starter cannot)
        here.wait_for(lambda: not any(temporary.iterdir()), timeout=120, why="the report file to go")
    finally:  # none left running after the test, whatever it found
        for pid in filter(running, pids):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temporary, ignore_errors=True)


def test_a_call_that_ends_ends_its_mcp_server(scene: Callable[[list[Rule]], Scene]) -> None:
    call = {"name": "faults_linger", "args": {"label": "done"}}
    here = scene(rules(step("work", tools=["faults_linger"]), calls={"work": [call]}))
    quick = json.loads(here.env["MASTERPLANNER_MCP_SERVERS"])
    quick["faults"]["env"]["FAULTS_SLOW_S"] = "0.2"
    here.env["MASTERPLANNER_MCP_SERVERS"] = json.dumps(quick)
    done = here.run_task()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["output"] == "work done"
    pids = lingering(here, "done")
    assert len(pids) == 2
    here.wait_for(lambda: not any(map(running, pids)), timeout=120, why=f"processes {pids} to end")


@pytest.mark.parametrize("signum", STOPS)
def test_stopped_while_the_answer_is_being_composed_the_steps_are_not_run_again(
    scene: Callable[[list[Rule]], Scene], signum: int
) -> None:
    here = scene(rules(step("fetch"), step("other"), faults={"aggregator": ["hang"]}))
    running = here.start(*RUN_ARGS, "--yes", env={"MASTERPLANNER_MODEL_TIMEOUT_S": "120"})
    here.wait_for(lambda: here.server.given(AGGREGATOR) == ["hang"], why="the aggregator's request")
    stopped(running, signum)
    report = here.resume(here.only_run())
    assert (report["status"], report["output"]) == ("succeeded", "all done")
    assert here.server.given(AGGREGATOR) == ["hang", "reply"]
    kinds = here.kinds(report["run_id"])
    for one in ("fetch", "other"):
        assert here.server.given(f"Do {one}.") == ["reply"]
        assert kinds[("step_started", one)] == kinds[("step_succeeded", one)] == 1
