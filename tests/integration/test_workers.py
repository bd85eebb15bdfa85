"""Workers sharing a Postgres database: real `masterplanner worker` processes, runs enqueued from another."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from _cluster import Cluster, plan_step

from _otlp import otlp_receiver
from _serve import serving

pytestmark = pytest.mark.postgres


def test_two_workers_share_twenty_runs_enqueued_from_a_third_process(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    steps = [
        plan_step("a"),
        plan_step("b", "a"),
        plan_step("c", "a"),
        plan_step("d", "a"),
        plan_step("e", "b", "c", "d"),
    ]
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": steps}, "repeat": True},
            *[
                {
                    "purpose": f"step:{step['id']}",
                    "output": step["id"].upper(),
                    "delay_s": 0.2,
                    "repeat": True,
                }
                for step in steps
            ],
            {"purpose": "*", "repeat": True},
        ]
    )
    workers = cluster.start_workers(2)
    run_ids = cluster.enqueue(script, [f"task number {n}" for n in range(20)])
    statuses = cluster.wait_finished(run_ids)
    assert statuses == dict.fromkeys(run_ids, "succeeded")
    executed_by: Counter[str] = Counter()
    for run_id in run_ids:
        started = cluster.events(run_id, "step_started")
        assert sorted(step for _kind, step, _data in started) == ["a", "b", "c", "d", "e"]  # each once
        executed_by.update(data["process"] for _kind, _step, data in started)
        assert cluster.store.get_run(run_id).output == "E"
    assert set(executed_by) == set(workers)  # both workers executed steps
    assert sum(executed_by.values()) == 100


def test_a_worker_killed_mid_run_leaves_every_run_to_the_other_and_no_tool_call_twice(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    ids = ["a", "b", "c"]
    script = _file_writing_chain(write_script, ids)
    cluster.start_workers(2, "--concurrency", "1")
    run_ids = cluster.enqueue(script, [f"write three files, run {n}" for n in range(4)])
    # kill the worker whose step has made its tool call and waits on its second model request
    victim_id, victim = _worker_past_a_tool_call(cluster, run_ids)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    statuses = cluster.wait_finished(run_ids)
    assert statuses == dict.fromkeys(run_ids, "succeeded")
    recovered = [
        (run_id, step, data["from"])
        for run_id in run_ids
        for _kind, step, data in cluster.events(run_id, "step_recovered")
    ]
    assert recovered and {source for _run, _step, source in recovered} == {victim_id}
    resumed = [
        (run_id, step, data["process"])
        for run_id in run_ids
        for _kind, step, data in cluster.events(run_id, "step_resumed")
    ]
    # a step the victim had started is resumed by the other worker, not started again
    assert resumed and {(run, step) for run, step, _ in resumed} <= {
        (run, step) for run, step, _ in recovered
    }
    assert victim_id not in {process for _run, _step, process in resumed}
    for run_id in run_ids:
        started = Counter(step for _kind, step, _data in cluster.events(run_id, "step_started"))
        assert started == dict.fromkeys(ids, 1), (run_id, started)
        called = Counter(step for _kind, step, _data in cluster.events(run_id, "tool_called"))
        assert called == dict.fromkeys(ids, 1), (run_id, called)  # no tool call repeated, none lost
        workspace = Path(cluster.store.get_run(run_id).workspace)
        assert {path.name: path.read_text() for path in workspace.iterdir()} == {
            f"{step_id}.txt": f"from {step_id}" for step_id in ids
        }
    assert victim_id not in {record.id for record in cluster.store.processes.listed()}


def _file_writing_chain(write_script: Callable[..., Path], ids: list[str]) -> Path:
    """A chain of steps, each writing `<id>.txt` ("from <id>") first, then answering slowly."""
    steps = [plan_step(ids[0], tools=["write_file"])]
    steps += [plan_step(step_id, before, tools=["write_file"]) for before, step_id in pairwise(ids)]
    return _file_writing_steps(write_script, steps)


def _file_writing_steps(write_script: Callable[..., Path], steps: list[dict[str, Any]]) -> Path:
    """The plan `steps`, each writing `<id>.txt` ("from <id>") first, then answering slowly."""
    ids = [step["id"] for step in steps]
    calls: list[dict[str, Any]] = [{"purpose": "planner", "output": {"steps": steps}, "repeat": True}]
    for step_id in ids:
        write = {"name": "write_file", "args": {"path": f"{step_id}.txt", "content": f"from {step_id}"}}
        calls.append({"purpose": f"step:{step_id}", "turn": 1, "tool_calls": [write], "repeat": True})
        # the second request is slow: a worker stopped then has its tool call recorded
        slow = {"turn": 2, "output": "ok", "delay_s": 1.5, "repeat": True}
        calls.append({"purpose": f"step:{step_id}", **slow})
    calls.append({"purpose": "*", "repeat": True})
    return write_script(calls)


def _worker_past_a_tool_call(cluster: Cluster, run_ids: list[str]) -> tuple[str, subprocess.Popen[str]]:
    """The id and process of a worker running a step that recorded its tool call and is not done."""
    worker_id = _wait_for_a_step_past_its_tool_call(cluster, run_ids)
    pid = {record.id: record.pid for record in cluster.store.processes.listed()}[worker_id]
    (process,) = [process for process in cluster.workers if process.pid == pid]
    return worker_id, process


def _wait_for_a_step_past_its_tool_call(cluster: Cluster, run_ids: list[str], timeout: float = 120) -> str:
    """The worker running a step that recorded its tool result and has not finished yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for run_id in run_ids:
            running: dict[str, str] = {}
            past_tool: set[str] = set()
            for kind, step, data in cluster.events(run_id, "step_started", "tool_result", "step_succeeded"):
                assert step is not None
                if kind == "step_started":
                    running[step] = data["process"]
                elif kind == "tool_result":
                    past_tool.add(step)
                else:
                    running.pop(step, None)
            for step in past_tool & set(running):
                # the call's checkpoint is written just after its tool_result event: let it land
                # (the step's next request then waits 1.5 s)
                time.sleep(0.3)
                return running[step]
        time.sleep(0.05)
    raise AssertionError("no step reached its second model request")


def test_sigterm_hands_runs_over_and_lets_the_running_step_finish(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    script = _file_writing_chain(write_script, ["a", "b"])
    cluster.start_workers(2, "--concurrency", "1")
    run_ids = cluster.enqueue(script, [f"two files, run {n}" for n in range(3)])
    stopping_id, stopping = _worker_past_a_tool_call(cluster, run_ids)
    stopping.send_signal(signal.SIGTERM)
    assert stopping.wait(timeout=60) == 0
    log = cluster.log(cluster.workers.index(stopping))
    assert "stopped:" in log, log
    statuses = cluster.wait_finished(run_ids)
    assert statuses == dict.fromkeys(run_ids, "succeeded")
    for run_id in run_ids:
        # the step it was running finished there (no recovery), and no tool call ran twice
        assert cluster.events(run_id, "step_recovered") == []
        called = Counter(step for _kind, step, _data in cluster.events(run_id, "tool_called"))
        assert called == {"a": 1, "b": 1}
    record = {record.id: record for record in cluster.store.processes.listed(include_dead=True)}[stopping_id]
    assert (record.alive, record.stopped) == (False, True)


def test_a_worker_that_finds_its_own_lease_lapsed_stops_at_once_and_its_step_runs_elsewhere(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    """Others may be replaying its steps (within a second): before, it still gave them `--grace`
    seconds, and a step that finished here meanwhile wrote its model requests' work and outcome a
    second time beside its replay."""
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [plan_step("a")]}, "repeat": True},
            {"purpose": "step:a", "output": "A", "delay_s": 12, "repeat": True},
            {"purpose": "*", "repeat": True},
        ]
    )
    suspended = cluster.worker("--grace", "60")
    (suspended_id,) = cluster.worker_ids(1)
    (run_id,) = cluster.enqueue(script, ["one slow step"])
    deadline = time.monotonic() + 60
    while not cluster.events(run_id, "step_started"):
        assert time.monotonic() < deadline, cluster.log(0)
        time.sleep(0.1)
    with cluster.store.begin("let the worker's lease lapse, as if it was suspended past it") as connection:
        connection.execute(
            sa.text("UPDATE mp_processes SET lease_until = 0 WHERE id = :id"), {"id": suspended_id}
        )
    lapsed = time.monotonic()
    assert suspended.wait(timeout=60) == 1
    assert time.monotonic() - lapsed < 6, cluster.log(0)  # the step's model request takes 12 s
    assert "was not heard from for longer than its lease" in cluster.log(0)
    cluster.worker()
    assert cluster.wait_finished([run_id]) == {run_id: "succeeded"}
    assert [data["from"] for _kind, _step, data in cluster.events(run_id, "step_recovered")] == [suspended_id]
    assert [step for _kind, step, _data in cluster.events(run_id, "step_succeeded")] == ["a"]


def test_a_run_whose_own_process_died_is_finished_by_another_worker_when_the_one_that_took_it_stops(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    """A worker that took over a run from its dead `run` process hands it over on SIGTERM.

    Before, the stopping worker gave the run's lease up (owner none): a run not queued for
    workers and held by nobody is neither queued nor abandoned, so no worker took it, and it
    stayed `running` for good while the worker's log said it was handed over.
    """
    ids = ["a", "b", "c"]
    script = _file_writing_chain(write_script, ids)
    workers = cluster.start_workers(2, "--concurrency", "1")
    command = ["run", "write three files", "--yes", "-m", f"scripted:{script}"]
    with (cluster.home / "run.log").open("w") as log:
        running = subprocess.Popen(
            [sys.executable, "-m", "masterplanner", *command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=cluster.env,
        )
    try:
        deadline = time.monotonic() + 60
        while not (listed := cluster.store.list_runs(5)):
            assert time.monotonic() < deadline, "the run was not created"
            time.sleep(0.05)
        (run,) = listed
        assert not run.for_workers
        # killed in step a, after its tool call: the step is left pending under the dead process
        dead = _wait_for_a_step_past_its_tool_call(cluster, [run.id])
        assert dead not in workers
    finally:
        running.send_signal(signal.SIGKILL)
        running.wait(timeout=30)
    deadline = time.monotonic() + 60
    while (lease := cluster.store.lease(run.id)) is None or lease.owner.split("/")[0] not in workers:
        assert time.monotonic() < deadline, f"no worker took the run over: {lease}"
        time.sleep(0.05)
    taker = lease.owner.split("/")[0]
    (other,) = set(workers) - {taker}
    pid = {record.id: record.pid for record in cluster.store.processes.listed()}[taker]
    (stopping,) = [process for process in cluster.workers if process.pid == pid]
    stopping.send_signal(signal.SIGTERM)
    assert stopping.wait(timeout=60) == 0
    assert f"handed over: {run.id}" in cluster.log(cluster.workers.index(stopping))
    assert cluster.wait_finished([run.id], timeout=60) == {run.id: "succeeded"}
    started = {step: data["process"] for _kind, step, data in cluster.events(run.id, "step_started")}
    # each step started once: a by the dead process (a worker resumed it), c by the worker left
    assert set(started) == set(ids) and (started["a"], started["c"]) == (dead, other)
    for kind in ("step_started", "tool_called"):
        assert Counter(step for _k, step, _d in cluster.events(run.id, kind)) == dict.fromkeys(ids, 1), kind
    assert [step for _kind, step, _data in cluster.events(run.id, "step_resumed")] == ["a"]
    deadline = time.monotonic() + 30  # the status is written first, then the end tells the registry
    while (lease := cluster.store.lease(run.id)) is not None:
        assert time.monotonic() < deadline, f"the worker that ended the run did not give it up: {lease}"
        time.sleep(0.05)


def _one_step(write_script: Callable[..., Path], output: str = "A") -> Path:
    """A script whose plan is one step, a, which answers `output`."""
    return write_script(
        [
            {"purpose": "planner", "output": {"steps": [plan_step("a")]}, "repeat": True},
            {"purpose": "step:a", "output": output},
            {"purpose": "*", "repeat": True},
        ]
    )


def test_run_detach_queues_the_run_and_a_worker_started_later_runs_it(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    script = _one_step(write_script)
    queued = cluster.mp("run", "one step", "-m", f"scripted:{script}", "--yes", "--detach")
    assert queued.returncode == 0, queued.stderr
    run_id = queued.stdout.strip()
    assert "no worker is running on this database: the run waits until one starts" in queued.stderr
    assert cluster.store.get_run(run_id).status == "planning"
    cluster.env["MASTERPLANNER_LOG_FORMAT"] = "json"
    worker_process = cluster.worker("--queues", "scripted,scripted")  # named twice, listened to once
    assert cluster.wait_finished([run_id]) == {run_id: "succeeded"}
    # a run of a provider no running worker takes waits, and the person is told so
    other = cluster.mp("run", "one step", "-m", "local", "--yes", "--detach")
    assert other.returncode == 0, other.stderr
    assert other.stderr.strip() == (
        "no worker running on this database takes local runs: the run waits until one does "
        "(`masterplanner worker --queues local`)"
    )
    time.sleep(1.0)  # four of the worker's claim rounds
    assert cluster.store.get_run(other.stdout.strip()).status == "planning"
    shown = cluster.mp("runs", "show", other.stdout.strip(), "--json", timeout=60)
    assert json.loads(shown.stdout)["waiting"] == other.stderr.strip()
    worker_process.send_signal(signal.SIGTERM)
    assert worker_process.wait(timeout=60) == 0
    logged = [json.loads(line) for line in cluster.log(0).splitlines()]  # every line is one JSON object
    assert [entry["event"] for entry in logged] == ["worker_started", "run_ended", "worker_stopped"]
    assert {entry["logger"] for entry in logged} == {"masterplanner.worker"}
    assert (logged[1]["run"], logged[1]["status"], logged[1]["message"]) == (
        run_id,
        "succeeded",
        f"run {run_id}: succeeded",
    )
    assert logged[0]["queues"] == ["steps-scripted"] and logged[0]["time"].endswith("Z")
    assert logged[2]["message"] == "stopped: 1 run ended here, 0 handed over"
    listed = cluster.mp("workers", "--all", "--json", timeout=60)
    assert listed.returncode == 0, listed.stderr
    (worker,) = json.loads(listed.stdout)
    assert (worker["kind"], worker["queues"], worker["concurrency"]) == ("worker", ["steps-scripted"], 4)
    started = cluster.events(run_id, "step_started")
    assert [(step, data["process"]) for _kind, step, data in started] == [("a", worker["id"])]
    drawn = cluster.mp("runs", "show", run_id, "--timeline", timeout=60)
    assert drawn.returncode == 0, drawn.stderr
    (row,) = [line for line in drawn.stdout.splitlines() if line.startswith("a ")]
    assert "█" in row and "succeeded" in row and row.endswith(worker["id"])


def test_a_worker_whose_tool_policies_setting_is_invalid_refuses_to_start_saying_which_and_where(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    script = _one_step(write_script)
    (run_id,) = cluster.enqueue(script, ["one step"])  # queued with the enqueuing process's settings
    tools = (
        "tools are ask_agent, ask_user, broadcast, code_execution, delete_file, generate_image, "
        "get_note, http_request, list_files, list_notes, read_file, recall, remember, reply, "
        "send_message, set_note, web_search, write_file, and <server>_<tool> for the MCP servers in "
        "mcp_servers"
    )
    # a misspelt tool, in the environment: the worker exits at once, naming the setting and its variable
    bad_tool = cluster.worker(env={"MASTERPLANNER_TOOL_POLICIES": '{"code_exec": "auto"}'})
    assert bad_tool.wait(timeout=120) == 2
    assert cluster.log(0) == (
        "error: setting 'tool_policies' (from MASTERPLANNER_TOOL_POLICIES): tool_policies names "
        f"'code_exec', which is not a tool; did you mean 'code_execution'? {tools}; this worker does "
        "not start until it is fixed\n"
    )
    # the same in the home's settings file: the file is named
    settings_file = cluster.home / "masterplanner.toml"
    settings_file.write_text('[tool_policies]\nwrite_flie = "ask"\n')
    in_file = cluster.worker()
    assert in_file.wait(timeout=120) == 2
    assert cluster.log(1) == (
        f"error: setting 'tool_policies' (in {settings_file}): tool_policies names 'write_flie', which "
        f"is not a tool; did you mean 'write_file'? {tools}; this worker does not start until it is fixed\n"
    )
    # a misspelt policy: refused as the settings load
    settings_file.write_text('[tool_policies]\nwrite_file = "aks"\n')
    bad_policy = cluster.worker()
    assert bad_policy.wait(timeout=120) == 2
    assert cluster.log(2) == (
        f"error: invalid settings: setting 'tool_policies.write_file' (in {settings_file}): should be "
        "'auto', 'ask' or 'deny', got 'aks'\n"
    )
    # none of them registered or claimed anything: the run waits, queued, for a worker that can run it
    assert [record.id for record in cluster.store.processes.listed(include_dead=True)] == []
    assert cluster.store.get_run(run_id).status == "planning"
    settings_file.write_text('[tool_policies]\nwrite_file = "ask"\n')
    cluster.worker()
    assert cluster.wait_finished([run_id]) == {run_id: "succeeded"}


def _postgres_cluster() -> list[str] | None:
    """`[version, name]` of the local Postgres cluster on port 5432, when this process may restart it."""
    if shutil.which("pg_lsclusters") is None or shutil.which("pg_ctlcluster") is None or os.geteuid() != 0:
        return None
    listed = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True, timeout=30)
    for line in listed.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] == "5432" and fields[3] == "online":
            return fields[:2]
    return None


def test_runs_finish_when_postgres_restarts_mid_run(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    server = _postgres_cluster()
    if server is None:
        pytest.skip("needs root and the local Postgres cluster on port 5432 (pg_ctlcluster)")
    steps = [plan_step("a"), plan_step("b", "a"), plan_step("c", "b")]
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": steps}, "repeat": True},
            *[
                {"purpose": f"step:{step_id}", "output": step_id.upper(), "delay_s": 0.5, "repeat": True}
                for step_id in "abc"
            ],
            {"purpose": "*", "repeat": True},
        ]
    )
    cluster.start_workers(2)
    run_ids = cluster.enqueue(script, [f"three steps, run {n}" for n in range(6)])
    deadline = time.monotonic() + 120
    while not any(cluster.events(run_id, "step_succeeded") for run_id in run_ids):
        assert time.monotonic() < deadline, "no step finished"
        time.sleep(0.1)
    cluster.store.close()  # its pooled connections would be dropped by the restart anyway
    restarted = subprocess.run(
        ["pg_ctlcluster", *server, "restart", "-m", "fast"], capture_output=True, text=True, timeout=120
    )
    assert restarted.returncode == 0, restarted.stderr
    statuses = cluster.wait_finished(run_ids)
    assert statuses == dict.fromkeys(run_ids, "succeeded")
    for run_id in run_ids:
        succeeded = [step for _kind, step, _data in cluster.events(run_id, "step_succeeded")]
        assert sorted(succeeded) == ["a", "b", "c"]
        assert cluster.store.get_run(run_id).output == "C"
    assert all(process.poll() is None for process in cluster.workers)  # the workers lived through it


def test_the_web_app_with_workers_queues_a_run_and_returns_at_once(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    script = _one_step(write_script, "from a worker")
    with serving(cluster.home / "serve.log", "--workers", env=cluster.env) as url:
        body = json.dumps(
            {"task": "one step", "model": f"scripted:{script}", "options": {"auto_approve": True}}
        )
        request = urllib.request.Request(
            f"{url}/api/v1/runs", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 201
            created = json.loads(response.read())
        assert created["status"] == "planning"
        time.sleep(1.0)
        assert cluster.store.get_run(created["id"]).status == "planning"  # the server executes nothing
        assert cluster.store.lease(created["id"]) is None
        waits = (
            "no worker is running on this database: the run waits until one starts (`masterplanner worker`)"
        )
        with urllib.request.urlopen(f"{url}/api/v1/runs/{created['id']}", timeout=30) as response:
            assert json.loads(response.read())["waiting"] == waits
        with urllib.request.urlopen(f"{url}/runs/{created['id']}", timeout=30) as response:
            page = response.read().decode()
        assert f'<p class="waiting" role="status">{waits}</p>' in page
        cluster.worker()
        assert cluster.wait_finished([created["id"]]) == {created["id"]: "succeeded"}
        with urllib.request.urlopen(f"{url}/api/v1/runs/{created['id']}", timeout=30) as response:
            finished = json.loads(response.read())
        assert (finished["output"], finished["waiting"]) == ("from a worker", None)


def test_a_run_whose_steps_ran_on_two_workers_is_one_trace(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    steps = [plan_step("a"), plan_step("b"), plan_step("c")]  # side by side
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": steps}, "repeat": True},
            *[
                {"purpose": f"step:{step_id}", "output": step_id, "delay_s": 0.5, "repeat": True}
                for step_id in "abc"
            ],
            {"purpose": "*", "repeat": True},
        ]
    )
    with otlp_receiver() as (url, spans):
        cluster.env["MASTERPLANNER_OTEL_ENDPOINT"] = url
        workers = set(cluster.start_workers(2, "--concurrency", "1"))
        # four runs: that no run at all has steps on both workers is then far-fetched
        run_ids = cluster.enqueue(script, [f"three at once, run {n}" for n in range(1, 5)])
        assert cluster.wait_finished(run_ids) == dict.fromkeys(run_ids, "succeeded")
        for process in cluster.workers:
            process.send_signal(signal.SIGTERM)  # a worker that stops sends what it has not sent
            assert process.wait(timeout=60) == 0
        received = list(spans)
    spread = False
    for run_id in run_ids:
        (run,) = [
            span
            for span in received
            if span.name == "invoke_workflow masterplanner"
            and span.attributes["masterplanner.run.id"] == run_id
        ]
        agents = [
            span
            for span in received
            if span.name.startswith("invoke_agent ") and span.attributes["masterplanner.run.id"] == run_id
        ]
        assert sorted(span.attributes["gen_ai.agent.id"] for span in agents) == ["a", "b", "c"]
        assert {span.trace_id for span in agents} == {run.trace_id}
        assert {span.parent_id for span in agents} == {run.span_id}
        processes = {span.attributes["masterplanner.process"] for span in agents}
        assert processes <= workers
        spread = spread or len(processes) == 2
    assert spread  # with one step at a time each, some run's steps ran on both workers
    assert len({span.trace_id for span in received if span.name == "invoke_workflow masterplanner"}) == 4


def test_a_provider_limit_holds_across_all_workers(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    steps = [plan_step("a"), plan_step("b")]  # side by side
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": steps}, "repeat": True},
            {"purpose": "step:a", "output": "A", "delay_s": 0.4, "repeat": True},
            {"purpose": "step:b", "output": "B", "delay_s": 0.4, "repeat": True},
            {"purpose": "*", "repeat": True},
        ]
    )
    # one scripted step at a time on all workers together, though each may run four
    cluster.env["MASTERPLANNER_PROVIDER_LIMITS"] = json.dumps({"scripted": {"concurrency": 1}})
    # no worker is killed here: a lease long enough that a loaded machine (CI) never makes a
    # live worker look dead, which would hand its running step to the other one
    cluster.env["MASTERPLANNER_RUN_LEASE_S"] = "15"
    cluster.start_workers(2)
    run_ids = cluster.enqueue(script, [f"two at once, run {n}" for n in range(3)])
    assert cluster.wait_finished(run_ids) == dict.fromkeys(run_ids, "succeeded")
    spans: list[tuple[datetime, datetime]] = []
    for run_id in run_ids:
        for record in cluster.store.steps(run_id):
            assert record.started_at is not None and record.finished_at is not None
            spans.append(
                (datetime.fromisoformat(record.started_at), datetime.fromisoformat(record.finished_at))
            )
    spans.sort()
    assert len(spans) == 6
    for (_start, end), (next_start, _end) in pairwise(spans):
        assert next_start >= end  # never two at once


def _most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The most of these time spans that overlap at one moment."""
    edges = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    running = most = 0
    for _moment, change in edges:  # an end sorts before a start at the same moment
        running += change
        most = max(most, running)
    return most


def test_each_worker_keeps_its_own_concurrency(cluster: Cluster, write_script: Callable[..., Path]) -> None:
    """`--concurrency` is each worker's own, though DBOS keeps one queue row for all of them."""
    steps = [plan_step(name) for name in ("a", "b", "c", "d")]  # side by side
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": steps}, "repeat": True},
            *[
                {"purpose": f"step:{s['id']}", "output": s["id"], "delay_s": 0.6, "repeat": True}
                for s in steps
            ],
            {"purpose": "*", "repeat": True},
        ]
    )
    cluster.env["MASTERPLANNER_RUN_LEASE_S"] = "15"  # nobody is killed here (see above)
    cluster.worker("--concurrency", "3")
    (wide,) = cluster.worker_ids(1)
    cluster.worker("--concurrency", "1")  # started last: once, its value held for both
    (narrow,) = set(cluster.worker_ids(2)) - {wide}
    run_ids = cluster.enqueue(script, [f"four at once, run {n}" for n in range(4)])
    assert cluster.wait_finished(run_ids) == dict.fromkeys(run_ids, "succeeded")
    spans: dict[str, list[tuple[datetime, datetime]]] = {wide: [], narrow: []}
    for run_id in run_ids:
        ran_on = {step: data["process"] for _kind, step, data in cluster.events(run_id, "step_started")}
        for record in cluster.store.steps(run_id):
            assert record.started_at is not None and record.finished_at is not None
            spans[ran_on[record.id]].append(
                (datetime.fromisoformat(record.started_at), datetime.fromisoformat(record.finished_at))
            )
    assert sum(len(each) for each in spans.values()) == 16
    assert _most_at_once(spans[narrow]) == 1
    assert 2 <= _most_at_once(spans[wide]) <= 3


def _said(cluster: Cluster, index: int, words: str, timeout: float = 60) -> str:
    """Worker `index`'s log, once it holds `words`."""
    deadline = time.monotonic() + timeout
    while words not in cluster.log(index):
        assert time.monotonic() < deadline, f"worker {index} did not say {words!r}: {cluster.log(index)}"
        time.sleep(0.2)
    return cluster.log(index)


def test_a_worker_started_with_other_provider_limits_says_it_changed_them_for_all(cluster: Cluster) -> None:
    """The queue's row holds one global limit for all workers: a worker that changes it says so."""
    cluster.env["MASTERPLANNER_PROVIDER_LIMITS"] = '{"scripted": {"concurrency": 4, "per_minute": 600}}'
    cluster.worker("--queues", "scripted")
    cluster.worker_ids(1)
    cluster.env["MASTERPLANNER_PROVIDER_LIMITS"] = '{"scripted": {"concurrency": 2}}'
    cluster.worker("--queues", "scripted")
    cluster.worker_ids(2)
    cluster.worker("--queues", "scripted")  # the same as the last: nothing changes
    cluster.worker_ids(3)
    logs = [_said(cluster, index, "steps from steps-scripted") for index in range(3)]
    changed = [line for line in logs[1].splitlines() if "provider_limits" in line]
    assert len(changed) == 1
    assert changed[0].endswith(
        "provider_limits.scripted: the workers already running held 4 at once and 600 a minute; "
        "this worker's settings say 2 at once and no limit a minute, which now hold for all of them"
    )
    assert "provider_limits" not in logs[0] + logs[2]


def _limits_said(cluster: Cluster, index: int) -> list[str]:
    """The `provider_limits` lines of worker `index` once it has started (a moment after, to be sure)."""
    _said(cluster, index, "steps from steps-scripted")
    time.sleep(0.5)  # a change is noted right after the start
    return [line for line in cluster.log(index).splitlines() if "provider_limits" in line]


def test_a_worker_restarted_after_a_kill_does_not_count_the_one_it_replaces_as_running(
    cluster: Cluster,
) -> None:
    """Before, a worker killed a moment ago still held its lease (`run_lease_s`), so the one
    restarted in its place said its limits "now hold for all" the workers already running."""
    lease = {"MASTERPLANNER_RUN_LEASE_S": "60"}  # the killed worker's lease outlasts the restart
    cluster.env["MASTERPLANNER_PROVIDER_LIMITS"] = '{"scripted": {"concurrency": 4, "per_minute": 600}}'
    killed = cluster.worker("--queues", "scripted", env=lease)
    (killed_id,) = cluster.worker_ids(1)
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    cluster.env["MASTERPLANNER_PROVIDER_LIMITS"] = '{"scripted": {"concurrency": 2}}'
    cluster.worker("--queues", "scripted", env=lease)
    assert _limits_said(cluster, 1) == []
    assert killed_id in cluster.worker_ids(2)  # its lease has not lapsed: only the kill tells it is gone


def test_a_worker_of_another_host_not_heard_from_for_half_its_lease_is_not_counted_as_running(
    cluster: Cluster,
) -> None:
    """A worker on another machine that was killed (or cut off) is not heard from: once half its
    lease has passed without a renewal, a worker started then does not count it as running."""
    elsewhere = ["unshare", "--uts", "sh", "-c", 'hostname elsewhere && exec "$@"', "sh"]
    if shutil.which("unshare") is None or subprocess.run([*elsewhere, "true"], check=False).returncode:
        pytest.skip("cannot start a process under a host name of its own (unshare --uts)")
    # renewed every 8 s; silent past 20 s; lapsed at 40 s, after the next worker's start
    lease = {"MASTERPLANNER_RUN_LEASE_S": "40"}
    cluster.env["MASTERPLANNER_PROVIDER_LIMITS"] = '{"scripted": {"concurrency": 4, "per_minute": 600}}'
    killed = cluster.worker("--queues", "scripted", env=lease, under=elsewhere)
    (killed_id,) = cluster.worker_ids(1)
    assert killed_id.startswith("elsewhere:")
    killed.send_signal(signal.SIGKILL)
    killed.wait(timeout=30)
    deadline = time.monotonic() + 30
    while (heard := _heard_from_s(cluster, killed_id)) is None or heard <= 20.5:
        assert heard is not None and time.monotonic() < deadline, f"worker 0 was heard from {heard} s ago"
        time.sleep(0.2)
    cluster.env["MASTERPLANNER_PROVIDER_LIMITS"] = '{"scripted": {"concurrency": 2}}'
    cluster.worker("--queues", "scripted", env=lease)
    assert _limits_said(cluster, 1) == []
    assert killed_id in cluster.worker_ids(2)  # its lease has not lapsed yet


def _heard_from_s(cluster: Cluster, process_id: str) -> float | None:
    """How long ago a live process renewed its lease (None once it is not alive)."""
    found = [record.age_s for record in cluster.store.processes.listed() if record.id == process_id]
    return found[0] if found else None


def test_a_run_that_failed_on_workers_is_retried_on_them_with_a_larger_budget(
    cluster: Cluster, tmp_path: Path
) -> None:
    script = tmp_path / "script.json"
    steps = [plan_step("a"), plan_step("b", "a"), plan_step("c", "b")]
    calls = [
        {"purpose": "planner", "output": {"steps": steps}},
        {"purpose": "step:a", "output": "A"},
        {"purpose": "step:b", "output": "B"},
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    cluster.start_workers(2)
    flags = ["--yes", "--rounds", "0", "--max-calls", "6", "--detach"]
    queued = cluster.mp("run", "a, b, c", "-m", f"scripted:{script}", *flags)
    assert queued.returncode == 0, queued.stderr
    run_id = queued.stdout.strip()
    assert cluster.wait_finished([run_id]) == {run_id: "failed"}
    # the planner, three prompts, a and b: c's first call is over the budget
    assert cluster.store.get_run(run_id).error == "the run used its budget of 6 model calls"

    script.write_text(json.dumps({"calls": [{"purpose": "step:c", "output": "C"}]}))
    retried = cluster.mp("runs", "retry", run_id, "--max-calls", "7", "--detach")
    assert retried.returncode == 0, retried.stderr
    assert retried.stdout.strip() == run_id
    assert cluster.wait_finished([run_id]) == {run_id: "succeeded"}
    record = cluster.store.get_run(run_id)
    assert (record.output, record.retries, record.options.max_model_calls) == ("C", 1, 7)
    started = [step for _kind, step, _data in cluster.events(run_id, "step_started")]
    assert started == ["a", "b", "c", "c"]  # c was cut short by the budget, then ran again; a, b once
    assert [data["steps"] for _kind, _step, data in cluster.events(run_id, "run_retried")] == [["c"]]


def test_steps_on_two_workers_cannot_together_pass_the_token_budget(cluster: Cluster, tmp_path: Path) -> None:
    """Each worker held only its own requests in flight to the budget: four steps at once, two on
    each worker, all passed a budget of 230,000 tokens that fits two replies of 100,000, and used
    400,000. Reservations are stored now, so each process holds the others' too (the third is sent
    cut to what the first two left, the fourth cannot be)."""
    long = " ".join(["word"] * 100_000)
    steps = [plan_step(f"p{n}") for n in range(4)]
    calls = [
        {"purpose": "planner", "output": {"steps": [*steps, plan_step("z", "p0", "p1", "p2", "p3")]}},
        *({"purpose": f"step:p{n}", "output": long, "delay_s": 1.5} for n in range(4)),
        {"purpose": "*", "repeat": True},
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"calls": calls, "max_output_tokens": 100_000}))
    workers = set(cluster.start_workers(2, "--concurrency", "2"))
    flags = ["--yes", "--rounds", "0", "--max-tokens", "230000", "--max-replans", "0", "--detach"]
    queued = cluster.mp("run", "four at once", "-m", f"scripted:{script}", *flags)
    assert queued.returncode == 0, queued.stderr
    run_id = queued.stdout.strip()
    assert cluster.wait_finished([run_id]) == {run_id: "failed"}
    error = cluster.store.get_run(run_id).error or ""
    assert error.startswith(
        "the run's budget of 230,000 tokens cannot take its next model request: even with its output "
        "cut to 1,024 tokens it needs "
    )
    started = {step: data["process"] for _kind, step, data in cluster.events(run_id, "step_started")}
    assert sorted(started) == ["p0", "p1", "p2", "p3"]
    assert set(started.values()) == workers  # the steps ran on both workers
    usage = cluster.store.usage(run_id)
    assert usage["input_tokens"] + usage["output_tokens"] <= 230_000
    answered = {
        purpose: entry for purpose, entry in usage["by_purpose"].items() if purpose.startswith("step:")
    }
    # two whole replies fit, the third was cut to what they left, the fourth could not be made
    counted = sorted(((entry["calls"], entry["output_tokens"]) for entry in answered.values()), reverse=True)
    assert (len(counted), counted[:2]) == (3, [(1, 100_000)] * 2)
    assert counted[2][0] == 1 and 20_000 < counted[2][1] < 30_000
    statuses = {step.id: step.status for step in cluster.store.steps(run_id)}
    unanswered = sorted(f"p{n}" for n in range(4) if f"step:p{n}" not in answered)
    assert [statuses[step] for step in [*unanswered, "z"]] == ["cancelled"] * 2
    with cluster.store.begin("read reservations") as connection:  # none is left held
        assert connection.scalar(sa.text("SELECT COUNT(*) FROM mp_reservations")) == 0


def test_runs_resume_finishes_a_run_whose_only_worker_died_mid_step_without_any_worker(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    """The step the dead worker had started is taken by the resuming process, not left queued.

    Before, it was handed back to its provider's queue, which only workers dequeue: with no
    worker alive `runs resume` waited for ever (10 minutes, in an exploratory session).
    """
    ids = ["a", "b"]
    script = _file_writing_chain(write_script, ids)
    worker = cluster.worker("--concurrency", "1")
    (worker_id,) = cluster.worker_ids(1)
    (run_id,) = cluster.enqueue(script, ["write two files"])
    assert _wait_for_a_step_past_its_tool_call(cluster, [run_id]) == worker_id
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    resumed = cluster.mp("runs", "resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert (report["status"], report["output"]) == ("succeeded", "ok")
    assert [kind for kind, _step, _data in cluster.events(run_id, "step_recovered")] == ["step_recovered"]
    for kind in ("step_started", "tool_called"):
        assert Counter(step for _k, step, _d in cluster.events(run_id, kind)) == dict.fromkeys(ids, 1), kind
    workspace = Path(cluster.store.get_run(run_id).workspace)
    assert {path.name: path.read_text() for path in workspace.iterdir()} == {
        f"{step_id}.txt": f"from {step_id}" for step_id in ids
    }


def test_runs_resume_takes_the_step_its_dead_worker_left_queued_when_no_worker_serves_its_queue(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    """A step still queued on its provider's queue, which no live worker serves, is taken by `runs resume`.

    One worker at `--concurrency 1` runs one of two independent steps while the other waits on
    `steps-scripted`. Killed, it leaves one step PENDING under its id and one ENQUEUED on a queue
    only workers dequeue: `runs resume` took the first over and waited for ever on the second.
    """
    steps = [
        plan_step("a", tools=["write_file"]),
        plan_step("b", tools=["write_file"]),
        plan_step("c", "a", "b", tools=["write_file"]),
    ]
    script = _file_writing_steps(write_script, steps)
    worker = cluster.worker("--concurrency", "1")
    (worker_id,) = cluster.worker_ids(1)
    (run_id,) = cluster.enqueue(script, ["write three files"])
    assert _wait_for_a_step_past_its_tool_call(cluster, [run_id]) == worker_id
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    started = [step for _kind, step, _data in cluster.events(run_id, "step_started")]
    assert len(started) == 1 and started[0] in ("a", "b")  # the other one waits on the queue
    resumed = cluster.mp("runs", "resume", run_id, "--json", timeout=90)
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads(resumed.stdout)
    assert (report["status"], report["output"]) == ("succeeded", "ok")
    recovered = [step for _kind, step, _data in cluster.events(run_id, "step_recovered")]
    assert recovered == started  # the running one was recovered; the queued one had not started
    for kind in ("step_started", "tool_called"):
        counted = Counter(step for _k, step, _d in cluster.events(run_id, kind))
        assert counted == dict.fromkeys(["a", "b", "c"], 1), kind
    workspace = Path(cluster.store.get_run(run_id).workspace)
    assert {path.name: path.read_text() for path in workspace.iterdir()} == {
        f"{step_id}.txt": f"from {step_id}" for step_id in ("a", "b", "c")
    }


def test_runs_resume_takes_its_dead_workers_step_itself_beside_other_processes_on_the_database(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    """The step `runs resume` takes over goes to a queue only the resuming process dequeues.

    It went to DBOS's internal queue, which every process launched on the database dequeues
    (another terminal's `run`, a `serve`): one of those took it as often as the resume did,
    stopped it at its tool call as not holding the run (`keep_lease`), and left it pending under
    a live process, which the resume then waited on for ever. Three such processes stand by here
    (before, three resumes in four waited), and the worker dies before the step's tool call.
    """
    ids = ["a", "b"]
    steps = [plan_step("a", tools=["write_file"]), plan_step("b", "a", tools=["write_file"])]
    calls: list[dict[str, Any]] = [{"purpose": "planner", "output": {"steps": steps}, "repeat": True}]
    for step_id in ids:
        write = {"name": "write_file", "args": {"path": f"{step_id}.txt", "content": f"from {step_id}"}}
        # the first request is slow: the worker is killed before the step's tool call
        calls.append(
            {"purpose": f"step:{step_id}", "turn": 1, "tool_calls": [write], "delay_s": 2, "repeat": True}
        )
        calls.append({"purpose": f"step:{step_id}", "turn": 2, "output": "ok", "repeat": True})
    calls.append({"purpose": "*", "repeat": True})
    script = write_script(calls)
    worker = cluster.worker("--concurrency", "1")
    (worker_id,) = cluster.worker_ids(1)
    idle_code = (
        "import time\n"
        "from masterplanner.engine import Engine\n"
        "from masterplanner.settings import Settings\n"
        "Engine(Settings.load()).launch()\n"
        "print('launched', flush=True)\n"
        "time.sleep(600)\n"
    )
    idle = [
        subprocess.Popen(
            [sys.executable, "-c", idle_code], stdout=subprocess.PIPE, text=True, env=cluster.env
        )
        for _ in range(3)
    ]
    try:
        for process in idle:
            assert process.stdout is not None and process.stdout.readline().strip() == "launched"
        idle_ids = {record.id for record in cluster.store.processes.listed() if record.kind == "process"}
        assert len(idle_ids) == 3
        (run_id,) = cluster.enqueue(script, ["write two files"])
        deadline = time.monotonic() + 60
        while not cluster.events(run_id, "step_started") and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # in its first model request
        assert cluster.events(run_id, "tool_called") == []
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
        resumed = cluster.mp("runs", "resume", run_id, "--json", timeout=90)
    finally:
        for process in idle:
            process.kill()
            process.wait(timeout=30)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "succeeded"
    taken_by = [data["process"] for _kind, _step, data in cluster.events(run_id, "step_resumed")]
    assert len(taken_by) == 1 and taken_by[0] not in {*idle_ids, worker_id}
    for kind in ("step_started", "tool_called"):
        assert Counter(step for _k, step, _d in cluster.events(run_id, kind)) == dict.fromkeys(ids, 1), kind


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's parent-death signal")
def test_a_worker_killed_mid_call_leaves_no_mcp_server_running(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    """Before, the stdio MCP server of the call (and what it started) ran on, orphaned, for ever."""
    from test_faults import FAULTS_SERVER, running

    tally = cluster.home / "tally.txt"
    servers = {
        "faults": {
            "command": sys.executable,
            "args": [FAULTS_SERVER],
            "env": {"FAULTS_TALLY": str(tally), "FAULTS_SLOW_S": "30"},
        }
    }
    cluster.env["MASTERPLANNER_MCP_SERVERS"] = json.dumps(servers)
    cluster.env["MASTERPLANNER_TOOL_POLICIES"] = json.dumps({"faults_linger": "auto"})
    linger = {"name": "faults_linger", "args": {"label": "cut"}}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [plan_step("a", tools=["faults_linger"])]}},
            {"purpose": "step:a", "tool_calls": [linger]},
            {"purpose": "*", "repeat": True},
        ]
    )
    worker = cluster.worker("--concurrency", "1")
    cluster.worker_ids(1)
    cluster.enqueue(script, ["linger"])
    pids: list[int] = []
    deadline = time.monotonic() + 120
    while not pids and time.monotonic() < deadline:
        lines = tally.read_text().splitlines() if tally.exists() else []
        pids = [int(pid) for line in lines if line.startswith("linger cut ") for pid in line.split()[2:]]
        time.sleep(0.1)
    assert pids and all(map(running, pids)), "the server's call did not start"
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    try:  # within moments; the time allowed is only so a process that never ends fails the test
        deadline = time.monotonic() + 120
        while any(map(running, pids)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(running, pids)), f"processes {pids} still run"
    finally:  # none left running after the test, whatever it found
        for pid in filter(running, pids):
            os.kill(pid, signal.SIGKILL)


def test_a_worker_logging_json_writes_only_json_lines_when_a_run_fails(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A step out of budget mid-way: the worker logs the run's end as one JSON line, nothing else.

    Before, DBOS logged each workflow that raised again, as text with a traceback.
    """
    script = tmp_path / "script.json"
    write = {"name": "write_file", "args": {"path": "a.txt", "content": "A"}}
    calls = [
        {"purpose": "planner", "output": {"steps": [plan_step("a", tools=["write_file"])]}},
        {"purpose": "step:a", "turn": 1, "tool_calls": [write]},  # the second turn is over the budget
        {"purpose": "*", "repeat": True},
    ]
    script.write_text(json.dumps({"calls": calls}))
    cluster.env["MASTERPLANNER_LOG_FORMAT"] = "json"
    with socket.socket() as probe:  # a trace receiver that is down: its failure is a JSON line too
        probe.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{probe.getsockname()[1]}"
    cluster.env["MASTERPLANNER_OTEL_ENDPOINT"] = down
    worker = cluster.worker()
    cluster.worker_ids(1)
    flags = ["--yes", "--rounds", "0", "--max-calls", "2", "--detach"]
    queued = cluster.mp("run", "a, b", "-m", f"scripted:{script}", *flags)
    assert queued.returncode == 0, queued.stderr
    run_id = queued.stdout.strip()
    assert cluster.wait_finished([run_id]) == {run_id: "failed"}
    worker.send_signal(signal.SIGTERM)
    worker.wait(timeout=60)
    lines = cluster.log(0).splitlines()
    entries = [json.loads(line) for line in lines]  # every line is JSON
    ended = [entry for entry in entries if entry.get("run") == run_id and entry.get("status") == "failed"]
    assert len(ended) == 1, lines
    error = cluster.store.get_run(run_id).error
    assert error and (ended[0]["message"], ended[0]["reason"]) == (f"run {run_id}: failed: {error}", error)
    assert not any("Traceback" in line for line in lines)
    said = [entry for entry in entries if entry["logger"] != "masterplanner.worker"]
    assert [(entry["logger"], entry["level"], entry["message"]) for entry in said] == [
        (
            "masterplanner.telemetry",
            "warning",
            f"traces could not be sent to {down}/v1/traces: connection refused",
        )
    ]
