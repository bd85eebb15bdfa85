"""A run planning on a worker that is killed or stopped: another worker goes on from its kept work."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from _cluster import Cluster, plan_step

from _serve import serving

pytestmark = pytest.mark.postgres

STEPS = [plan_step("a"), plan_step("b", "a"), plan_step("c", "b")]


def _calls_after_the_stop() -> list[dict[str, Any]]:
    """What the worker that takes the run over is answered: a third draft at once."""
    return [
        {"purpose": "planner", "output": {"steps": STEPS}, "repeat": True},
        {"purpose": "prompt_creator", "output": "Draft after the stop."},
        {"purpose": "prompt_creator", "output": "Revised after the stop.", "repeat": True},
        *({"purpose": f"step:{step['id']}", "output": step["id"].upper()} for step in STEPS),
        {"purpose": "*", "repeat": True},
    ]


def _planning_on_a_worker_with_two_prompts_kept(
    cluster: Cluster, write_script: Callable[..., Path]
) -> tuple[str, str, subprocess.Popen[str]]:
    """A detached 3-step run planning on one of two workers, two of its prompts kept and the
    third's draft waiting; the run's id, and the id and process of the worker planning it.

    The script is then rewritten for the worker that takes the run over (the planning worker
    read it when it took the run): its planner and first draft would answer at once.
    """
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": STEPS}},
            *({"purpose": "prompt_creator", "output": f"Draft {n}.", "delay_s": 0.1} for n in (1, 2)),
            {"purpose": "prompt_creator", "output": "Draft 3.", "delay_s": 3600.0},
            {"purpose": "prompt_creator", "output": "Revised before the stop.", "repeat": True},
            {"purpose": "*", "repeat": True},
        ]
    )
    cluster.start_workers(2, "--concurrency", "1")
    queued = cluster.mp("run", "three things", "-m", f"scripted:{script}", "--yes", "--detach")
    assert queued.returncode == 0, queued.stderr
    run_id = queued.stdout.strip()
    deadline = time.monotonic() + 120  # only so a broken run cannot hang the suite
    while True:
        by_purpose = cluster.store.usage(run_id)["by_purpose"]
        counted = [by_purpose.get(purpose, {}).get("calls") for purpose in ("prompt_creator", "critic")]
        kept = cluster.store.kept_planning(run_id) or {}
        if counted == [4, 2] and len(kept.get("prompts") or {}) == 2:
            break
        assert time.monotonic() < deadline, f"run {run_id} never kept two prompts ({by_purpose}, {kept})"
        time.sleep(0.05)
    lease = cluster.store.lease(run_id)
    assert lease is not None
    worker_id = lease.owner.rsplit("/", 1)[0]  # an execution's lease is `<worker id>/<token>`
    pid = {record.id: record.pid for record in cluster.store.processes.listed()}[worker_id]
    (process,) = [process for process in cluster.workers if process.pid == pid]
    script.write_text(json.dumps({"calls": _calls_after_the_stop()}))
    return run_id, worker_id, process


def _assert_planning_went_on_from_the_kept_work(cluster: Cluster, run_id: str, stopped_id: str) -> None:
    """The run succeeded on the other worker, each model call made once."""
    assert cluster.wait_finished([run_id]) == {run_id: "succeeded"}
    record = cluster.store.get_run(run_id)
    assert record.output == "C"
    usage = cluster.store.usage(run_id)["by_purpose"]
    assert {purpose: entry["calls"] for purpose, entry in usage.items()} == {
        "planner": 1,
        "prompt_creator": 6,  # two drafts and revisions kept; the third's draft and revision after
        "critic": 3,
        "step:a": 1,
        "step:b": 1,
        "step:c": 1,
    }
    agents = {step_id: (agent.draft, agent.prompt) for step_id, agent in record.agents.items()}
    assert sorted(agents.values()) == [
        ("Draft 1.", "Revised before the stop."),
        ("Draft 2.", "Revised before the stop."),
        ("Draft after the stop.", "Revised after the stop."),
    ]
    progress = [data for _kind, _step, data in cluster.events(run_id, "planning_progress")]
    resumed_at = next(at for at, data in enumerate(progress) if data["stage"] == "resumed")
    took_over = progress[resumed_at].pop("process")  # the worker that went on with it
    assert progress[resumed_at:] == [
        {"stage": "resumed", "prompts": 2},
        {"stage": "prompts", "draft": 3, "of": 3},
        {"stage": "review", "round": 1},
    ]
    assert len(cluster.events(run_id, "plan_ready")) == 1
    assert cluster.store.kept_planning(run_id) is None  # cleared once the plan was ready
    ran_on = {data["process"] for _kind, _step, data in cluster.events(run_id, "step_started")}
    assert ran_on and stopped_id not in ran_on
    assert took_over != stopped_id and took_over in {record.id for record in cluster.store.processes.listed()}
    with cluster.store.begin("read reservations") as connection:  # the cut request's is not left held
        assert connection.scalar(sa.text("SELECT COUNT(*) FROM mp_reservations")) == 0
    _assert_shown_resumed(cluster, run_id, took_over)


def _resumed(took_over: str) -> list[str]:
    """How planning resumed on the other worker reads, in `runs show` and on the run's page."""
    return [
        f"resuming planning in {took_over} (its plan and 2 of its prompts were made before)",
        "writing prompts (3 of 3)",
        "reviewing prompts (round 1)",
    ]


def _assert_shown_resumed(cluster: Cluster, run_id: str, took_over: str) -> None:
    """`runs show` and the run's page say planning was resumed from its plan, planned once."""
    shown = cluster.mp("runs", "show", run_id, timeout=60)
    assert shown.returncode == 0, shown.stderr
    stages = re.findall(r"^\d\d:\d\d:\d\d planning_progress (.*)$", shown.stdout, re.MULTILINE)
    assert stages.count("planning the steps") == 1 and stages[-3:] == _resumed(took_over), shown.stdout
    assert "└── c c after b" in shown.stdout  # the plan as it was made before the stop
    with serving(cluster.home / "serve.log", "--workers", env=cluster.env) as url:
        with urllib.request.urlopen(f"{url}/runs/{run_id}", timeout=30) as response:
            page = response.read().decode()
    stages = re.findall(r"<li><time[^>]*>[^<]*</time> planning_progress ([^<]*)</li>", page)
    assert stages.count("planning the steps") == 1 and stages[-3:] == _resumed(took_over), stages


def test_a_worker_killed_while_planning_leaves_the_run_to_another_that_goes_on_from_its_plan(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    run_id, victim_id, victim = _planning_on_a_worker_with_two_prompts_kept(cluster, write_script)
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    _assert_planning_went_on_from_the_kept_work(cluster, run_id, victim_id)


def test_sigterm_to_a_worker_while_planning_hands_the_run_over_with_its_plan(
    cluster: Cluster, write_script: Callable[..., Path]
) -> None:
    run_id, stopping_id, stopping = _planning_on_a_worker_with_two_prompts_kept(cluster, write_script)
    stopping.send_signal(signal.SIGTERM)
    assert stopping.wait(timeout=60) == 0
    log = cluster.log(cluster.workers.index(stopping))
    assert f"handed over: {run_id}" in log, log
    _assert_planning_went_on_from_the_kept_work(cluster, run_id, stopping_id)
