"""The engine through its public API, with the scripted model: lifecycle, scheduling, faults, budgets."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from _answers import execute_answering
from _cli import mp
from _faults import Killed, failing_as_the_event_is_written
from _plans import step

from masterplanner import PlanError, RequestError, RunError, RunNotFoundError, Settings
from masterplanner.engine import Engine, RunOptions, RunRecord
from masterplanner.tools.mcp import McpServer

FAST = RunOptions(auto_approve=True, prompt_rounds=0, retry_backoff_s=0.01)


@pytest.fixture
def engine(isolated: Path) -> Iterator[Engine]:
    created = Engine(Settings.load())
    yield created
    created.close()


def _planner(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"purpose": "planner", "output": {"steps": list(steps)}}


DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}


def _kinds(engine: Engine, run_id: str) -> list[tuple[str, str | None]]:
    return [(event.kind, event.step) for event in engine.store.events(run_id)]


async def test_independent_steps_overlap(engine: Engine, write_script: Callable[..., Path]) -> None:
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", tools=[]), step("c", tools=[])),
            *({"purpose": f"step:{name}", "output": f"{name} out", "delay_s": 1.0} for name in "abc"),
            {"purpose": "aggregator", "output": "all three"},
            DRAFTS,
        ]
    )
    run = engine.create_run("three at once", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    assert final.output == "all three"
    report = engine.report(run.id)
    starts = [step["started_at"] for step in report["steps"]]
    ends = [step["finished_at"] for step in report["steps"]]
    assert [step["status"] for step in report["steps"]] == ["succeeded"] * 3
    assert [step["output"] for step in report["steps"]] == ["a out", "b out", "c out"]
    # overlapping: each started before any ended (one after another, a step would start after one
    # ended); not a bound on seconds, which failed under a loaded CI run; timing is bench/engine.py's
    assert max(starts) < min(ends), (starts, ends)
    assert report["usage"]["by_purpose"]["step:a"]["calls"] == 1


async def test_chain_passes_outputs_and_the_final_step_answers(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    plan = {"purpose": "planner", "output": {"steps": [step("a", tools=[]), step("b", "a", tools=[])]}}
    script = write_script(
        [
            plan,
            {"purpose": "step:a", "output": "A-RESULT"},
            {"purpose": "step:b", "output": "B-RESULT"},
            DRAFTS,
        ]
    )
    run = engine.create_run("a then b", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    assert final.output == "B-RESULT"  # the only sink's output, no aggregator call
    assert _kinds(engine, run.id) == [
        ("run_created", None),
        *[("planning_progress", None)] * 4,
        ("plan_ready", None),
        ("approved", None),
        ("step_started", "a"),
        ("step_succeeded", "a"),
        ("step_started", "b"),
        ("step_succeeded", "b"),
        ("run_succeeded", None),
        ("team_stored", None),
    ]
    assert "aggregator" not in engine.report(run.id)["usage"]["by_purpose"]
    # which part of planning was under way, as it began (the live view's header says it)
    assert [event.data for event in engine.store.events(run.id) if event.kind == "planning_progress"] == [
        {"stage": "similar_teams"},
        {"stage": "steps"},
        {"stage": "prompts", "draft": 1, "of": 2},
        {"stage": "prompts", "draft": 2, "of": 2},
    ]


async def test_garbage_output_is_retried_then_fails_and_skips_dependents(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    garbage = {"purpose": "step:a", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True}
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=[]), step("c", tools=[])),
            garbage,
            {"purpose": "step:c", "output": "c fine"},
            DRAFTS,
        ]
    )
    run = engine.create_run("fails", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "failed"
    steps = {s["id"]: s for s in engine.report(run.id)["steps"]}
    assert steps["a"]["status"] == "failed"
    assert steps["a"]["attempts"] == 3
    assert steps["a"]["error"] == (
        "the model called no_such_tool, a tool this step does not have, 3 times in a row; "
        "the step gave up after 3 attempts"
    )
    assert steps["b"]["status"] == "skipped"
    assert steps["b"]["error"] == "dependency 'a' failed and could not be replanned"
    assert steps["c"] == steps["c"] | {"status": "succeeded", "output": "c fine"}
    assert final.error is not None and final.error.startswith(f"step a failed: {steps['a']['error']}")
    assert "; step b skipped: dependency 'a' failed and could not be replanned" in final.error
    kinds = [kind for kind, step_id in _kinds(engine, run.id) if step_id == "a"]
    # a replan was tried; the script has no replanner answer, so the step stays failed
    assert kinds == [
        "step_started",
        "step_retried",
        "step_retried",
        "step_failed",
        "replan_requested",
        "replan_failed",
    ]
    failed_replan = next(e for e in engine.store.events(run.id) if e.kind == "replan_failed")
    assert failed_replan.data["n"] == 1
    assert "no entry left for purpose 'replanner'" in failed_replan.data["error"]


async def test_a_retried_step_samples_with_a_seed(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from masterplanner.models.scripted import ScriptedModel
    from masterplanner.purpose import current_purpose

    seen: list[tuple[Any, Any]] = []
    original = ScriptedModel.request

    async def spy(self: ScriptedModel, messages: Any, settings: Any, params: Any) -> Any:
        if current_purpose() == "step:a":
            seen.append(((settings or {}).get("temperature"), (settings or {}).get("seed")))
        return await original(self, messages, settings, params)

    monkeypatch.setattr(ScriptedModel, "request", spy)
    garbage = {"purpose": "step:a", "tool_calls": [{"name": "no_such_tool", "args": {}}]}
    script = write_script(
        [
            _planner(step("a", tools=[])),
            garbage,
            garbage,
            garbage,
            {"purpose": "step:a", "output": "a fine"},
            DRAFTS,
        ]
    )
    run = engine.create_run("retry differently", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    # The first attempt (three calls: the agent's own retries) is greedy; the second samples.
    assert seen == [(None, None)] * 3 + [(0.7, 2)]


async def test_tool_calls_write_the_workspace_and_refused_paths_reach_the_agent(
    engine: Engine, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "link.txt").symlink_to(outside)
    script = write_script(
        [
            _planner(step("w", tools=["read_file", "write_file"])),
            {"purpose": "step:w", "tool_calls": [{"name": "read_file", "args": {"path": "link.txt"}}]},
            {
                "purpose": "step:w",
                "tool_calls": [{"name": "write_file", "args": {"path": "out/a.txt", "content": "hi"}}],
            },
            {"purpose": "step:w", "output": "written"},
            DRAFTS,
        ]
    )
    run = engine.create_run("write", model=f"scripted:{script}", options=FAST, workspace=workspace)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    assert (workspace / "out" / "a.txt").read_text() == "hi"
    results = [event.data for event in engine.store.events(run.id) if event.kind == "tool_result"]
    assert results[0] == {"tool": "read_file", "error": "'link.txt' is a symlink; symlinks are not followed"}
    assert results[1] == {"tool": "write_file", "result": "wrote 2 bytes to out/a.txt"}


async def test_call_budget_fails_the_run_and_keeps_finished_outputs(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=[])),
            {"purpose": "step:a", "output": "kept"},
            {"purpose": "*", "repeat": True},
        ]
    )
    options = RunOptions(auto_approve=True, prompt_rounds=0, max_model_calls=4)
    run = engine.create_run("budget", model=f"scripted:{script}", options=options)
    final = await engine.execute(run.id)
    assert final.status == "failed"
    assert final.error == "the run used its budget of 4 model calls"
    steps = {s["id"]: s for s in engine.report(run.id)["steps"]}
    assert steps["a"]["output"] == "kept"
    assert steps["b"]["status"] == "cancelled"
    assert engine.report(run.id)["usage"]["llm_calls"] == 4


async def _slow_step_running(
    engine: Engine, write_script: Callable[..., Path]
) -> tuple[RunRecord, asyncio.Future[RunRecord]]:
    """A run executing in the background whose one step is running (and would take 30 s)."""
    script = write_script(
        [_planner(step("slow", tools=[])), {"purpose": "step:slow", "output": "never", "delay_s": 30}, DRAFTS]
    )
    run = engine.create_run("slow", model=f"scripted:{script}", options=FAST)
    execution = asyncio.ensure_future(engine.execute(run.id))
    while engine.store.steps(run.id) == [] or engine.store.steps(run.id)[0].status != "running":  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    return run, execution


async def test_cancel_stops_running_steps_promptly(engine: Engine, write_script: Callable[..., Path]) -> None:
    run, execution = await _slow_step_running(engine, write_script)
    started = time.monotonic()
    other = Engine(Settings.load())  # another process's cancel
    try:
        other.request_cancel(run.id)
    finally:
        other.close()
    final = await asyncio.wait_for(execution, 5)
    assert time.monotonic() - started < 2
    assert final.status == "cancelled"
    assert engine.store.steps(run.id)[0].status == "cancelled"
    assert _kinds(engine, run.id)[-1] == ("run_cancelled", None)


@pytest.mark.parametrize("resumer", ["this process", "another process"])
async def test_an_execution_its_caller_cancels_stops_and_the_run_resumes_at_once(
    engine: Engine, write_script: Callable[..., Path], resumer: str
) -> None:
    """A caller that gives up on `execute` (a timeout, its own Ctrl-C) leaves a run any process resumes now.

    The step it was running stops with it (nothing runs it in the background) and is run again,
    once, by the execution that resumes the run; before, that execution waited for ever on the
    step's workflow, left pending under this live process.
    """
    script = write_script(
        [
            _planner(step("a", tools=[])),
            {"purpose": "step:a", "output": "A done", "delay_s": 1.5, "repeat": True},
            DRAFTS,
        ]
    )
    run = engine.create_run("a", model=f"scripted:{script}", options=FAST)
    execution = asyncio.ensure_future(engine.execute(run.id))
    while [s.status for s in engine.store.steps(run.id)] != ["running"]:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    execution.cancel()
    with pytest.raises(asyncio.CancelledError):
        await execution
    await asyncio.sleep(2)  # the stopped step would have answered by now, had anything run it
    assert [(s.id, s.status) for s in engine.store.steps(run.id)] == [("a", "running")]
    assert engine.store.lease(run.id) is None  # given up: `runs list` says stopped
    if resumer == "this process":
        await asyncio.wait_for(engine.execute(run.id), 10)
    else:  # `runs resume` while this process, where the step stopped, lives on
        resumed = await asyncio.to_thread(mp, "runs", "resume", run.id)
        assert resumed.returncode == 0, resumed.stderr
    final = engine.store.get_run(run.id)
    assert (final.status, final.output) == ("succeeded", "A done")
    assert (
        engine.report(run.id)["usage"]["by_purpose"]["step:a"]["calls"] == 1
    )  # the stopped call is not counted
    assert [kind for kind, step_id in _kinds(engine, run.id) if step_id == "a"].count("step_succeeded") == 1


async def test_a_cancel_whose_clean_up_is_slow_is_not_cut_short_by_the_next_look(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guard looks at cancel flags every 0.2 s; it stops a run once, not at every look.

    Before, on a loaded machine (clean-up slower than a look), the second cancel landed inside the
    first one's clean-up: the run was left `running` with its steps running.
    """
    from masterplanner.engine import runner

    marking = runner._mark_cancelled

    def slow_mark(*args: Any) -> None:
        time.sleep(0.7)  # on the worker thread: the guard looks three times meanwhile
        marking(*args)

    monkeypatch.setattr(runner, "_mark_cancelled", slow_mark)
    run, execution = await _slow_step_running(engine, write_script)
    engine.request_cancel(run.id)
    final = await asyncio.wait_for(execution, 10)
    assert final.status == "cancelled"
    assert engine.store.steps(run.id)[0].status == "cancelled"
    assert _kinds(engine, run.id)[-1] == ("run_cancelled", None)


def _one_step_run(engine: Engine, write_script: Callable[..., Path]) -> RunRecord:
    """A created run of one step, "a", that succeeds at once."""
    script = write_script([_planner(step("a", tools=[])), {"purpose": "step:a", "output": "a done"}, DRAFTS])
    return engine.create_run("one step", model=f"scripted:{script}", options=FAST)


async def test_a_cancel_landing_as_the_review_is_approved_keeps_the_run_cancelled(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The approval's move to `running` does not bring back a run a cancel recorded meanwhile.

    The cancel lands after the review was answered, as the approval is written: the approval,
    one transaction with its event, records nothing (before, its `approved` event was written
    first, on its own, and stayed on the cancelled run). A cancel within the approval's
    transaction waits for its end (the run's row is locked before it is read:
    `test_a_lease_taken_over_during_a_revision_waits_for_it`).
    """
    from masterplanner.engine.control import mark_cancelled
    from masterplanner.engine.store import RunStore

    run = _one_step_run(engine, write_script)
    store, canceller = engine.store, RunStore(engine.settings.database_url)
    deciding, cancelled = store.decide_review, []

    def decide(run_id: str, decision: Any, *args: Any, **kwargs: Any) -> bool:
        if decision == "approved" and not cancelled:  # another process's cancel
            cancelled.append(run_id)
            mark_cancelled(canceller, run_id)
        return deciding(run_id, decision, *args, **kwargs)

    monkeypatch.setattr(store, "decide_review", decide)
    try:
        final = await asyncio.wait_for(engine.execute(run.id), 60)
    finally:
        canceller.close()
    assert cancelled == [run.id]
    assert final.status == "cancelled"
    assert store.get_run(run.id).status == "cancelled"
    assert [step.status for step in store.steps(run.id)] in ([], ["pending"], ["cancelled"])
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert kinds[-1] == "run_cancelled" and "approved" not in kinds and "step_started" not in kinds


async def test_a_cancel_landing_as_the_run_ends_keeps_it_cancelled_and_stores_no_team(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's end does not say it succeeded, nor store its team, after a cancel was recorded."""
    from masterplanner.engine.control import mark_cancelled

    run = _one_step_run(engine, write_script)
    store = engine.store
    ending = store.end_run

    def end_run(run_id: str, status: Any, *args: Any, **values: Any) -> bool:
        if status == "succeeded":  # another process's cancel, recorded as the run ends
            mark_cancelled(store, run_id)
        return ending(run_id, status, *args, **values)

    monkeypatch.setattr(store, "end_run", end_run)
    final = await asyncio.wait_for(engine.execute(run.id), 60)
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert (final.status, store.get_run(run.id).status) == ("cancelled", "cancelled")
    assert kinds[-1] == "run_cancelled" and "run_succeeded" not in kinds and "team_stored" not in kinds


@pytest.mark.parametrize("kind", ["ask_user", "tool_approval"])
async def test_a_step_that_asks_as_a_cancel_ends_the_run_leaves_no_request_open(
    engine: Engine,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    kind: str,
) -> None:
    """A cancel that ends the run as a step is about to ask leaves no request open, and no event after it.

    The run's end closed its open requests, and then the step opened its own: it stayed open for
    good on the cancelled run (`runs pending`, the web's list, the API's requests). Now the step
    is told the run has ended (`RunEnded`), and stops recording nothing.
    """
    call = (
        {"name": "ask_user", "args": {"question": "Which city?"}}
        if kind == "ask_user"
        else {"name": "write_file", "args": {"path": "a.txt", "content": "A"}}
    )
    script = write_script(
        [
            _planner(step("a", tools=[call["name"]])),
            {"purpose": "step:a", "tool_calls": [call]},
            {"purpose": "*", "repeat": True},
        ]
    )
    # not `auto_approve`, which takes `ask` for `auto`: the plan is approved by a person
    options = replace(FAST, auto_approve=False, tool_policies={"write_file": "ask"})
    run = engine.create_run("asks", model=f"scripted:{script}", options=options, workspace=tmp_path / "ws")
    store = engine.store
    opening, ending = store.open_request, store.end_run
    ended, asked = threading.Event(), threading.Event()

    def end_run(run_id: str, status: Any, *args: Any, **values: Any) -> bool:
        try:
            return ending(run_id, status, *args, **values)
        finally:
            if status == "cancelled":
                ended.set()

    def open_request(run_id: str, opened: str, *args: Any, **values: Any) -> Any:
        if opened != kind:
            return opening(run_id, opened, *args, **values)
        try:  # another process's cancel, which this process's guard carries out before the step asks
            assert store.ask_cancel(run_id, by="cli@elsewhere:1")
            assert ended.wait(30), "the cancel did not end the run"
            return opening(run_id, opened, *args, **values)
        finally:
            asked.set()

    monkeypatch.setattr(store, "end_run", end_run)
    monkeypatch.setattr(store, "open_request", open_request)

    async def approve(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve"}

    final = await asyncio.wait_for(execute_answering(engine, run.id, review=approve), 60)
    assert await asyncio.to_thread(asked.wait, 30)  # the step's thread (stopped or not with its task) asked
    assert (final.status, store.get_run(run.id).status) == ("cancelled", "cancelled")
    assert store.requests.find(run.id) == []
    assert [request.kind for request in store.requests.find(run.id, state=None)] == ["plan_review"]
    said = [said_kind for said_kind, _ in _kinds(engine, run.id)]
    assert said[-1] == "run_cancelled" and "step_failed" not in said
    assert not (tmp_path / "ws" / "a.txt").exists()


async def test_a_step_s_pause_on_an_ended_run_stops_the_step_as_its_cancel_does(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """A step not stopped with its run's execution (on a worker) that asks after the run ended stops.

    It is told so with DBOS's own cancellation (a `BaseException`: no tool call, step attempt or
    DBOS step records it), naming why; before, it opened its request on the ended run and waited
    for it for ever.
    """
    from dbos._error import DBOSWorkflowCancelledError

    from masterplanner.engine.control import mark_cancelled
    from masterplanner.engine.tool_calls import step_pause

    run = _one_step_run(engine, write_script)
    mark_cancelled(engine.store, run.id)
    said = engine.store.events(run.id)
    ended = rf"^DBOS Error 10: run {run.id} has ended \(cancelled\): its ask_user request was not opened$"
    with pytest.raises(DBOSWorkflowCancelledError, match=ended):
        asked = ("request_opened", {"kind": "ask_user"})
        await asyncio.wait_for(
            step_pause(engine.store, run.id, "a", "ask_user", {"question": "q"}, asked), 10
        )
    assert (engine.store.requests.find(run.id, state=None), engine.store.events(run.id)) == ([], said)


async def test_a_step_that_asks_on_a_run_ended_without_cancelling_it_records_its_workflow_cancelled(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step whose run ended without its workflow being cancelled first stops for good when it asks.

    A cancel of a run whose holder's lease lapsed (`request_cancel`) ends it directly, cancelling
    no step workflow. The step's pause on the ended run raised DBOS's `DBOSWorkflowCancelledError`
    with its workflow still PENDING: DBOS then waited for an outcome nobody recorded, and recovery
    ran the step again. Now the pause records the step's workflow CANCELLED first, and the
    execution stops: the step taken for failed, it started the next step on the ended run.
    """
    from dbos import DBOS

    from masterplanner.engine import workflows
    from masterplanner.engine.control import mark_cancelled

    script = write_script(
        [
            _planner(step("a", tools=["ask_user"]), step("b", tools=[])),
            {"purpose": "step:a", "tool_calls": [{"name": "ask_user", "args": {"question": "Which city?"}}]},
            {"purpose": "*", "repeat": True},
        ]
    )
    one_at_a_time = replace(FAST, max_parallel=1)  # b waits for a's slot
    run = engine.create_run("asks", model=f"scripted:{script}", options=one_at_a_time)
    store, opening, pausing = engine.store, engine.store.open_request, workflows.step_pause
    paused, stepped = asyncio.Event(), []

    def open_request(run_id: str, opened: str, *args: Any, **values: Any) -> Any:
        if opened == "ask_user":  # the lapsed-lease cancel: the run ends, its step workflows not cancelled
            mark_cancelled(store, run_id)
        return opening(run_id, opened, *args, **values)

    async def step_pause(*args: Any, **values: Any) -> Any:
        stepped.append(DBOS.workflow_id)
        try:
            return await pausing(*args, **values)
        finally:
            paused.set()

    monkeypatch.setattr(store, "open_request", open_request)
    monkeypatch.setattr(workflows, "step_pause", step_pause)
    execution = asyncio.ensure_future(engine.execute(run.id))
    await asyncio.wait_for(paused.wait(), 60)
    status = await DBOS.get_workflow_status_async(stepped[0])
    assert status is not None and status.status == "CANCELLED"
    assert store.requests.find(run.id) == []
    final = await asyncio.wait_for(execution, 60)
    assert (final.status, store.get_run(run.id).status) == ("cancelled", "cancelled")
    said = _kinds(engine, run.id)
    assert said[-1] == ("run_cancelled", None) and ("step_started", "b") not in said
    assert [kind for kind, _ in said].count("step_failed") == 0


async def test_review_decisions(engine: Engine, write_script: Callable[..., Path]) -> None:
    script = write_script([_planner(step("a", tools=[])), {"purpose": "*", "repeat": True}])
    options = RunOptions(prompt_rounds=0)

    async def reject(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "reject", "reason": "not today"}

    run = engine.create_run("x", model=f"scripted:{script}", options=options)
    final = await execute_answering(engine, run.id, review=reject)
    assert (final.status, final.error) == ("cancelled", "rejected: not today")

    edited = {"task": "x", "steps": [step("b", tools=[]), step("c", "b", tools=[])]}

    async def edit(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve", "plan": edited}

    run = engine.create_run("x", model=f"scripted:{script}", options=options)
    final = await execute_answering(engine, run.id, review=edit)
    assert final.status == "succeeded", final.error
    assert [s.id for s in engine.store.steps(run.id)] == ["b", "c"]
    assert ("plan_edited", None) in _kinds(engine, run.id)

    async def cyclic(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve", "plan": {"task": "x", "steps": [step("a", "b"), step("b", "a")]}}

    run = engine.create_run("x", model=f"scripted:{script}", options=options)
    with pytest.raises(PlanError, match="cycle"):
        await execute_answering(engine, run.id, review=cyclic)
    assert engine.store.get_run(run.id).status == "awaiting_approval"  # nothing applied

    for task, problem in (
        ("Delete all", "task: is the run's task and cannot be edited; start a new run for another task"),
        ("   ", "plan: task: must not be empty"),
    ):

        async def retasked(_run: Any, _catalog: Any, task: str = task) -> dict[str, Any]:
            return {"action": "approve", "plan": {"task": task, "steps": [step("a", tools=[])]}}

        run = engine.create_run("x", model=f"scripted:{script}", options=options)
        with pytest.raises(PlanError) as refused:
            await execute_answering(engine, run.id, review=retasked)
        assert refused.value.problems == [problem]
        assert engine.store.get_run(run.id).status == "awaiting_approval"


async def test_a_run_held_by_a_live_process_is_not_executed_twice(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script([_planner(step("a", tools=[])), {"purpose": "*", "repeat": True}])
    run = engine.create_run("x", model=f"scripted:{script}", options=FAST)
    other = "other-host:1:abcd"
    assert engine.store.claim(run.id, other, lease_s=10)

    async def renew() -> None:  # the other process is alive: it keeps renewing its lease
        while True:
            await asyncio.sleep(0.1)
            await asyncio.to_thread(engine.store.heartbeat, run.id, other, lease_s=10)

    renewing = asyncio.ensure_future(renew())
    try:
        with pytest.raises(RunError, match=f"being executed by another process \\({other}\\)"):
            await asyncio.wait_for(engine.execute(run.id), 5)
    finally:
        renewing.cancel()
    assert engine.store.get_run(run.id).status == "planning"
    assert engine.store.lease(run.id).owner == other  # type: ignore[union-attr]


async def test_a_run_whose_process_died_is_taken_over_when_its_lease_lapses(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    script = write_script([_planner(step("a", tools=[])), {"purpose": "*", "repeat": True}])
    engine = Engine(Settings.load(run_lease_s=1.5))
    try:
        run = engine.create_run("x", model=f"scripted:{script}", options=FAST)
        assert engine.store.claim(run.id, "dead-host:1:abcd", lease_s=1.5)  # and never renewed
        waits: list[Any] = []
        started = time.monotonic()
        final = await engine.execute(run.id, on_wait=waits.append)
        assert final.status == "succeeded", final.error
        assert time.monotonic() - started >= 1.0  # it waited for the lease to lapse
        assert [lease.owner for lease in waits] == ["dead-host:1:abcd"]
        assert engine.store.lease(run.id) is None  # given up at the end
        assert engine.abandoned_runs() == []
    finally:
        engine.close()


def test_bad_inputs_are_refused_before_anything_is_stored(engine: Engine) -> None:
    with pytest.raises(PlanError, match="empty"):
        engine.create_run("   ", model="local")
    with pytest.raises(Exception, match="unknown model"):
        engine.create_run("x", model="nope:x")
    with pytest.raises(RunError, match="no run 'missing'"):
        engine.store.get_run("missing")
    assert engine.store.list_runs() == []


def test_an_id_start_is_taken_literally(engine: Engine, write_script: Callable[..., Path]) -> None:
    """`%` and `_` in an id given are characters, not patterns: they matched any run once."""
    run = engine.create_run("x", model=f"scripted:{write_script([])}")
    assert engine.store.get_run(run.id[:6]).id == run.id
    for pattern in ("%" + run.id[-6:], "_" * 8 + run.id[8:]):
        with pytest.raises(RunNotFoundError, match=f"no run {pattern!r}"):
            engine.store.get_run(pattern)
    request, _ = engine.store.requests.open(run.id, "ask_user", {"question": "q"}, key="k")
    assert engine.store.requests.get(request.id[:4]).id == request.id
    with pytest.raises(RequestError, match="no request '%"):
        engine.store.requests.get("%" + request.id[-2:])


async def test_calls_made_at_once_cannot_all_pass_the_call_budget(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """Each of the calls made at once (here the prompts' drafts) passed the check before any was
    counted: a budget of 7 calls made 10."""
    script = write_script(
        [
            _planner(
                *(step(f"p{n}", tools=[]) for n in range(4)), step("z", "p0", "p1", "p2", "p3", tools=[])
            ),
            *({"purpose": f"step:p{n}", "output": f"P{n}", "delay_s": 0.5} for n in range(4)),
            {"purpose": "*", "repeat": True},
        ]
    )
    run = engine.create_run("at once", model=f"scripted:{script}", options=replace(FAST, max_model_calls=4))
    final = await engine.execute(run.id)
    assert final.status == "failed" and final.error is not None
    assert "the run used its budget of 4 model calls" in final.error
    # at most the budget; a draft still in flight when the refusal failed the run is cancelled
    # with it, and may be before its reply was counted (3 under load, 2 in a CI run): the planner's
    # call is always counted
    assert 1 <= engine.report(run.id)["usage"]["llm_calls"] <= 4


def _four_long_replies(write_script: Callable[..., Path]) -> Path:
    """Four steps at once, each answering with 100,000 tokens (words), the most a reply may take."""
    long = " ".join(["word"] * 100_000)
    plan = _planner(*(step(f"p{n}", tools=[]) for n in range(4)), step("z", "p0", "p1", "p2", "p3", tools=[]))
    calls = [plan, DRAFTS, *({"purpose": f"step:p{n}", "output": long, "delay_s": 0.3} for n in range(4))]
    return write_script(None, raw=json.dumps({"calls": calls, "max_output_tokens": 100_000}))


def _budget_outcome(engine: Engine, run_id: str) -> tuple[list[tuple[int, int]], list[str], int]:
    """The replies counted (calls, output tokens), the unanswered steps' statuses, and all calls.

    A step whose reply was counted may still be cancelled with the run when the next request is
    refused before it finished (a race with the load); one whose reply was not counted never ends
    otherwise than cancelled."""
    usage = engine.report(run_id)["usage"]
    answered = {
        purpose: entry for purpose, entry in usage["by_purpose"].items() if purpose.startswith("step:")
    }
    unanswered = [
        s.status
        for s in engine.store.steps(run_id)
        if s.id.startswith("p") and f"step:{s.id}" not in answered
    ]
    counted = [(entry["calls"], entry["output_tokens"]) for entry in answered.values()]
    return counted, unanswered, usage["llm_calls"]


async def test_steps_at_once_cannot_together_pass_the_token_budget(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """Each request checked the tokens used before it was made, so four at once all passed a
    budget of 230,000 and used 400,000; each now reserves its worst case (its request, and the
    script's 100,000-token cap on a reply) until its real usage is counted. The third, whose
    worst case cannot fit what the first two left, is sent cut to that (it failed the run), and
    says it waits while they are in flight."""
    script = _four_long_replies(write_script)
    options = replace(FAST, max_tokens=230_000, max_replans=0)
    run = engine.create_run("at once", model=f"scripted:{script}", options=options)
    final = await engine.execute(run.id)
    assert final.status == "failed" and final.error is not None
    assert final.error.startswith(
        "the run's budget of 230,000 tokens cannot take its next model request: even with its output "
        "cut to 1,024 tokens it needs "
    )
    usage = engine.report(run.id)["usage"]
    assert usage["input_tokens"] + usage["output_tokens"] <= 230_000
    counted, unanswered, calls = _budget_outcome(engine, run.id)
    whole, cut = sorted(counted, reverse=True)[:2], sorted(counted)[0]
    assert (whole, len(counted), unanswered, calls) == ([(1, 100_000)] * 2, 3, ["cancelled"], 9)
    assert cut[0] == 1 and 20_000 < cut[1] < 30_000  # the third, cut to the max_tokens it was sent
    by_purpose = engine.report(run.id)["usage"]["by_purpose"]
    late = {f"p{n}" for n in range(4) if by_purpose.get(f"step:p{n}", {}).get("output_tokens") != 100_000}
    waits = [
        (event.step, event.data) for event in engine.store.events(run.id) if event.kind == "model_waiting"
    ]
    assert sorted(step or "" for step, _data in waits) == sorted(late)  # once each, as it started to wait
    for step_id, data in waits:
        assert (data["purpose"], data["budget"]) == (f"step:{step_id}", "max_tokens")
        assert data["in_flight"] in (1, 2)  # the first two (one may be counted by then, under load)


async def test_steps_at_once_cannot_together_pass_the_money_budget(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for money: four steps at once spent $0.40 of a $0.23 budget; the third is sent
    with the output tokens what the first two left buys."""
    from masterplanner.models import pricing

    monkeypatch.setattr(pricing, "_FREE_SYSTEMS", frozenset())  # the script priced at $1 a million tokens
    monkeypatch.setattr(
        pricing, "_priced", lambda provider, name, usage: (usage.input_tokens + usage.output_tokens) / 1e6
    )
    script = _four_long_replies(write_script)
    options = replace(FAST, max_cost_usd=0.23, max_replans=0)
    run = engine.create_run("at once", model=f"scripted:{script}", options=options)
    final = await engine.execute(run.id)
    assert final.status == "failed" and final.error is not None
    assert final.error.startswith(
        "the run's money budget of $0.23 cannot take its next model request: even with its output cut "
        "to 1,024 tokens it costs $0.00"
    )
    assert 0.2 <= engine.report(run.id)["usage"]["cost_usd"] <= 0.23
    counted, unanswered, calls = _budget_outcome(engine, run.id)
    whole, cut = sorted(counted, reverse=True)[:2], sorted(counted)[0]
    assert (whole, len(counted), unanswered, calls) == ([(1, 100_000)] * 2, 3, ["cancelled"], 9)
    assert cut[0] == 1 and 20_000 < cut[1] < 30_000  # cut to what the money left buys
    waits = [event.data["budget"] for event in engine.store.events(run.id) if event.kind == "model_waiting"]
    assert waits == ["max_cost_usd"] * 2


async def test_a_usage_write_that_fails_gives_back_the_requests_budget_reservation(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The request was answered but its usage could not be stored: its reservation stayed held
    against the run's budgets until the process's lease lapsed, though the process went on."""
    from masterplanner.engine.store import RunStore

    stored = RunStore.add_usage
    failed: list[str] = []

    def failing(self: RunStore, run_id: str, purpose: str, **usage: Any) -> None:
        if purpose == "step:a" and not failed:
            failed.append(purpose)
            raise RunError("the run's database failed: disk I/O error")
        stored(self, run_id, purpose, **usage)

    monkeypatch.setattr(RunStore, "add_usage", failing)
    script = write_script([_planner(step("a", tools=[])), DRAFTS, {"purpose": "step:a", "output": "A"}])
    run = engine.create_run(
        "x", model=f"scripted:{script}", options=replace(FAST, max_tokens=100_000, max_replans=0)
    )
    final = await engine.execute(run.id)
    assert failed == ["step:a"]
    assert (final.status, final.error) == (
        "failed",
        "step a failed: the run's database failed: disk I/O error",
    )
    with engine.store.begin("read reservations") as connection:
        assert connection.scalar(sa.text("SELECT COUNT(*) FROM mp_reservations")) == 0


async def test_an_error_that_is_not_ours_fails_the_run_instead_of_leaving_it_running(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug (here, the review raising TypeError) escaped the run's driver: the run stayed
    `running` with no event and no error, and nobody took it over (its lease was given up)."""
    from masterplanner.engine import runner

    async def broken(*_args: Any, **_kwargs: Any) -> RunRecord:
        raise TypeError("changes() takes 4 positional arguments but 5 were given")

    monkeypatch.setattr(runner, "review_run", broken)
    slow = [_planner(step("a", tools=[])), DRAFTS]
    run = engine.create_run("a bug", model=f"scripted:{write_script(slow)}", options=FAST)
    with pytest.raises(TypeError):  # the caller still sees the bug as it was raised
        await engine.execute(run.id)
    final = engine.store.get_run(run.id)
    assert (final.status, final.error) == (
        "failed",
        "an unexpected error stopped the run (a bug in masterplanner): TypeError: "
        "changes() takes 4 positional arguments but 5 were given",
    )
    assert engine.store.events(run.id)[-1].kind == "run_failed"

    async def grouped(*_args: Any, **_kwargs: Any) -> RunRecord:  # ours inside a library's task group: no bug
        raise ExceptionGroup("unhandled errors in a TaskGroup", [RunError("the review could not be stored")])

    monkeypatch.setattr(runner, "review_run", grouped)
    run = engine.create_run("a group", model=f"scripted:{write_script(slow)}", options=FAST)
    with pytest.raises(ExceptionGroup):
        await engine.execute(run.id)
    final = engine.store.get_run(run.id)
    assert (final.status, final.error) == ("failed", "the review could not be stored")


async def test_step_timeout_and_wall_time_budget(engine: Engine, write_script: Callable[..., Path]) -> None:
    slow = [_planner(step("a", tools=[])), {"purpose": "step:a", "output": "late", "delay_s": 5}, DRAFTS]
    options = RunOptions(auto_approve=True, prompt_rounds=0, step_timeout_s=0.3, max_replans=0)
    run = engine.create_run("slow step", model=f"scripted:{write_script(slow)}", options=options)
    final = await engine.execute(run.id)
    assert (final.status, final.error) == ("failed", "step a failed: timed out after 0.3 s")

    options = RunOptions(auto_approve=True, prompt_rounds=0, max_wall_s=0.3)
    run = engine.create_run("slow run", model=f"scripted:{write_script(slow)}", options=options)
    final = await engine.execute(run.id)
    assert (final.status, final.error) == ("failed", "the run used its wall-time budget of 0.3 s")
    assert engine.store.steps(run.id)[0].status == "cancelled"


def test_an_unusable_database_is_a_clear_error(isolated: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(RunError, match="cannot create"):
        Engine(Settings.load(database_url=f"sqlite:///{blocker}/runs.sqlite"))
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(RunError, match=r"garbage\.sqlite: cannot open it: file is not a database"):
        Engine(Settings.load(database_url=f"sqlite:///{garbage}"))
    assert garbage.read_bytes() == b"this is not a database" * 100


async def test_tool_approval_policies(
    engine: Engine, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    calls = [
        {
            "purpose": "step:w",
            "tool_calls": [{"name": "write_file", "args": {"path": "a.txt", "content": "A"}}],
        },
        {"purpose": "step:w", "output": "done"},
    ]
    plan = _planner(step("w", tools=["write_file"]))
    asked: list[tuple[str, str, dict[str, Any]]] = []

    async def say(answer: bool) -> Any:
        async def approve(step_id: str, tool: str, arguments: dict[str, Any]) -> bool:
            asked.append((step_id, tool, arguments))
            return answer

        return approve

    cases = [
        (
            {"write_file": "ask"},
            False,
            True,
            ["tool_approval_requested", "tool_approved", "tool_called", "tool_result"],
        ),
        ({"write_file": "ask"}, False, False, ["tool_approval_requested", "tool_denied"]),
        ({"write_file": "deny"}, False, True, ["tool_denied"]),
        ({"write_file": "ask"}, True, False, ["tool_called", "tool_result"]),  # --yes: ask becomes auto
    ]
    for number, (policies, auto, answer, expected) in enumerate(cases):
        asked.clear()
        workspace = tmp_path / f"ws-{number}"
        options = RunOptions(auto_approve=auto, prompt_rounds=0, tool_policies=policies)
        run = engine.create_run(
            "w",
            model=f"scripted:{write_script([plan, *calls, DRAFTS])}",
            options=options,
            workspace=workspace,
        )

        async def approve_plan(_run: Any, _catalog: Any) -> dict[str, Any]:
            return {"action": "approve"}

        final = await execute_answering(engine, run.id, review=approve_plan, approve_tool=await say(answer))
        assert final.status == "succeeded", final.error
        tool_events = [
            kind for kind, step_id in _kinds(engine, run.id) if step_id == "w" and kind.startswith("tool")
        ]
        assert tool_events == expected, policies
        assert (workspace / "a.txt").exists() == ("tool_result" in expected)
        if "tool_approval_requested" in expected:
            assert asked == [("w", "write_file", {"path": "a.txt", "content": "A"})]
        else:
            assert asked == []
        denied = [e.data for e in engine.store.events(run.id) if e.kind == "tool_denied"]
        if denied:
            assert denied[0]["by"] == ("policy" if policies["write_file"] == "deny" else "test")


async def test_a_tool_call_written_as_the_answer_is_sent_back_not_taken_as_the_output(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """The embedded model once ended a step "succeeded" with `{"tool": "read_file", …}` as its output."""
    written = '{"tool": "read_file", "arguments": {"path": "notes.txt"}}'
    script = write_script(
        [
            _planner(step("a", tools=["read_file"]), step("b", "a", tools=["read_file"])),
            {"purpose": "step:a", "output": written},
            {
                "purpose": "step:a",
                "expect": [
                    "your answer is a call of read_file written as text: make the call as a tool call"
                ],
                "output": "The notes say hello.",
            },
            # JSON that names no tool of the step is an answer like any other
            {"purpose": "step:b", "output": '{"tool": "hammer", "arguments": {}}'},
            DRAFTS,
        ]
    )
    run = engine.create_run("a", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert (final.status, final.output) == ("succeeded", '{"tool": "hammer", "arguments": {}}'), final.error
    assert engine.store.steps(run.id)[0].output == "The notes say hello."


async def test_the_person_is_asked_about_every_argument_and_never_about_a_call_refused_anyway(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An http_request's body was left out of what the person approved, and then sent.

    A generate_image call to a protected path was put to the person, then refused.
    """
    monkeypatch.setenv("MASTERPLANNER_HTTP_ALLOWED_DOMAINS", '["example.com"]')
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-used")  # generate_image is offered: its check refuses
    post = {"url": "https://example.com/in", "method": "POST", "body": "the whole body"}
    script = write_script(
        [
            _planner(step("s", tools=["http_request", "generate_image"])),
            {
                "purpose": "step:s",
                "tool_calls": [
                    {"name": "generate_image", "args": {"prompt": "a cat", "path": ".vscode/cat.png"}},
                    {"name": "http_request", "args": post},
                ],
            },
            {"purpose": "step:s", "output": "done"},
            DRAFTS,
        ]
    )
    engine = Engine(Settings.load())
    asked: list[tuple[str, dict[str, Any]]] = []

    async def deny(_step: str, tool: str, arguments: dict[str, Any]) -> bool:
        asked.append((tool, arguments))
        return False

    async def approve_plan(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve"}

    try:
        options = RunOptions(prompt_rounds=0, tool_policies={"http_request": "ask", "generate_image": "ask"})
        run = engine.create_run("s", model=f"scripted:{script}", options=options)
        final = await execute_answering(engine, run.id, review=approve_plan, approve_tool=deny)
        assert final.status == "succeeded", final.error
        assert asked == [
            (
                "http_request",
                {"method": "POST", "url": "https://example.com/in", "headers": {}, "body": "the whole body"},
            )
        ]
        results = [e.data for e in engine.store.events(run.id) if e.kind == "tool_result"]
        assert (
            results[0]["tool"] == "generate_image" and "'.vscode' is a file or folder" in results[0]["error"]
        )
    finally:
        engine.close()


async def test_time_waiting_for_a_person_is_not_the_step_s_time(
    engine: Engine, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """An approval given after the step timeout has passed: the step goes on; its own time still counts."""
    plan = _planner(step("w", tools=["write_file"]))
    calls = [
        {
            "purpose": "step:w",
            "tool_calls": [{"name": "write_file", "args": {"path": "a.txt", "content": "A"}}],
        },
        {"purpose": "step:w", "output": "written", "delay_s": 0.6},
    ]
    options = RunOptions(
        prompt_rounds=0, step_timeout_s=1.0, tool_policies={"write_file": "ask"}, max_replans=0
    )
    run = engine.create_run(
        "w",
        model=f"scripted:{write_script([plan, *calls, DRAFTS])}",
        options=options,
        workspace=tmp_path / "ws",
    )

    async def approve_late(_step: str, _tool: str, _arguments: dict[str, Any]) -> bool:
        await asyncio.sleep(2.5)  # a person taking longer than the step may run
        return True

    async def approve_plan(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve"}

    final = await execute_answering(engine, run.id, review=approve_plan, approve_tool=approve_late)
    assert (final.status, final.output) == ("succeeded", "written"), final.error
    assert (tmp_path / "ws" / "a.txt").read_text() == "A"

    # the step's own time counts as before: 0.6 s after the approval, and 0.6 s before it, is over 1 s
    slow = [{**calls[0], "delay_s": 0.6}, calls[1]]
    run = engine.create_run(
        "w",
        model=f"scripted:{write_script([plan, *slow, DRAFTS])}",
        options=options,
        workspace=tmp_path / "ws2",
    )
    final = await execute_answering(engine, run.id, review=approve_plan, approve_tool=approve_late)
    assert final.status == "failed"
    assert final.error == "step w failed: timed out after 1 s"


async def test_policies_edited_at_review_apply_per_run_and_per_agent(
    engine: Engine, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    both = [step("w", tools=["write_file"]), step("v", tools=["write_file"])]
    script = write_script(
        [
            _planner(*both),
            *(
                {
                    "purpose": f"step:{name}",
                    "tool_calls": [{"name": "write_file", "args": {"path": f"{name}.txt", "content": name}}],
                }
                for name in "wv"
            ),
            {"purpose": "step:w", "output": "done"},
            {"purpose": "step:v", "output": "done"},
            {"purpose": "aggregator", "output": "both done"},
            DRAFTS,
        ]
    )

    async def review(run: Any, _catalog: Any) -> dict[str, Any]:
        agents = {step_id: agent.to_json_dict() for step_id, agent in run.agents.items()}
        return {
            "action": "approve",
            "plan": run.plan.to_json_dict(),
            "agents": agents | {"v": agents["v"] | {"tool_policies": {"write_file": "deny"}}},
            "tool_policies": {"write_file": "auto"},
        }

    workspace = tmp_path / "ws"
    run = engine.create_run(
        "w", model=f"scripted:{script}", options=RunOptions(prompt_rounds=0), workspace=workspace
    )
    final = await execute_answering(engine, run.id, review=review)
    assert final.status == "succeeded", final.error
    assert (workspace / "w.txt").read_text() == "w"  # run-wide auto
    assert not (workspace / "v.txt").exists()  # its agent denies write_file
    assert engine.store.get_run(run.id).options.tool_policies == {"write_file": "auto"}
    denied = [(e.step, e.data) for e in engine.store.events(run.id) if e.kind == "tool_denied"]
    assert denied == [("v", {"tool": "write_file", "by": "policy"})]


def test_budgets_hold_for_the_run_across_processes(engine: Engine, write_script: Callable[..., Path]) -> None:
    from masterplanner import BudgetExceededError
    from masterplanner.engine.budget import RunLedger

    script = write_script([{"purpose": "*", "repeat": True}])
    options = RunOptions(max_model_calls=3, max_tokens=1_000)
    run = engine.create_run("x", model=f"scripted:{script}", options=options)
    here = RunLedger(engine.store, run.id, options)
    other = Engine(Settings.load())  # another process's view of the same run
    try:
        there = RunLedger(other.store, run.id, options)
        here.record("step:a", input_tokens=10, output_tokens=5, seconds=0.1)
        there.record("step:b", input_tokens=10, output_tokens=5, seconds=0.1)
        here.check()
        there.record("step:b", input_tokens=10, output_tokens=5, seconds=0.1)
        with pytest.raises(BudgetExceededError, match=r"^the run used its budget of 3 model calls$"):
            here.check()  # this ledger counted one call itself; the run used three
        RunLedger(other.store, run.id, RunOptions(max_model_calls=None, max_tokens=46)).check()
        with pytest.raises(BudgetExceededError, match=r"^the run used its budget of 45 tokens \(45 used\)$"):
            RunLedger(other.store, run.id, RunOptions(max_model_calls=None, max_tokens=45)).check()
    finally:
        other.close()


async def test_a_cancel_asked_just_before_the_run_ends_does_not_cut_its_end_short(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel asked as the end records `succeeded` leaves the run succeeded, its team stored.

    Before, the executor's guard saw the cancel flag while the end told the registry (0.2 s on) and
    cut the end workflow there: the run said succeeded, but its team was never stored and nothing
    finished the end (the lease was given up cleanly).
    """
    import threading

    from masterplanner import RunService
    from masterplanner.engine import workflows

    run = _one_step_run(engine, write_script)
    store = engine.store
    ending, telling = store.end_run, workflows._tell_registry
    told: list[RunRecord] = []

    def cancel() -> None:  # another process's `runs cancel`, waiting for the run to stop
        service = RunService(engine.settings)
        try:
            told.append(asyncio.run(service.cancel(run.id, wait_s=30, by="cli@elsewhere:1")))
        finally:
            service.close()

    canceller = threading.Thread(target=cancel)

    def end_run(run_id: str, status: Any, *args: Any, **values: Any) -> bool:
        if status == "succeeded":  # the cancel is asked just before the end records the outcome
            canceller.start()
            while not store.cancel_requested(run_id):
                time.sleep(0.01)
        return ending(run_id, status, *args, **values)

    def slow_tell(*args: Any, **kwargs: Any) -> None:  # the guard looks several times meanwhile
        time.sleep(1.0)
        telling(*args, **kwargs)

    monkeypatch.setattr(store, "end_run", end_run)
    monkeypatch.setattr(workflows, "_tell_registry", slow_tell)
    final = await asyncio.wait_for(engine.execute(run.id), 60)
    await asyncio.to_thread(canceller.join, 60)
    assert (final.status, final.output) == ("succeeded", "a done")
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert kinds[-3:] == ["cancel_requested", "run_succeeded", "team_stored"]
    assert "run_cancelled" not in kinds
    assert [(record.status, record.output) for record in told] == [("succeeded", "a done")]


async def test_an_end_cut_short_is_finished_by_the_next_execution(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies as its run's end tells the registry; the next execution finishes that end."""
    from masterplanner.engine import workflows

    script = write_script([_planner(step("a", tools=[])), {"purpose": "*", "repeat": True}])
    run = engine.create_run("x", model=f"scripted:{script}", options=FAST)
    told = workflows._tell_registry

    def dying(*args: Any, **kwargs: Any) -> None:  # the process dies while telling the registry
        raise Killed

    monkeypatch.setattr(workflows, "_tell_registry", dying)
    with pytest.raises(Killed):
        await engine.execute(run.id)
    assert engine.store.get_run(run.id).status == "succeeded"  # the outcome is recorded
    assert "team_stored" not in [kind for kind, _ in _kinds(engine, run.id)]

    monkeypatch.setattr(workflows, "_tell_registry", told)
    final = await engine.execute(run.id)
    assert final.status == "succeeded"
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert kinds[-2:] == ["run_succeeded", "team_stored"]  # told once, after the outcome
    assert kinds.count("run_succeeded") == 1
    again = await engine.execute(run.id)  # nothing is left to do: nothing happens twice
    assert again.status == "succeeded"
    assert [kind for kind, _ in _kinds(engine, run.id)] == kinds


async def test_an_end_whose_execution_was_given_up_is_finished_in_the_process_that_goes_on(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A library caller cancels `execute` as the run's end tells the registry, and carries on.

    The end is handed back to DBOS's queue once that registry call returns, and finished from its
    last checkpoint with nobody executing the run again; the registry is never told by two calls
    at once. Before, the end stayed pending under this live process, which renews its lease: it
    was finished only if this process executed the run again, and another process resuming the
    run (`runs resume`, a worker, a retry) followed it for ever.
    """
    from dbos import DBOS

    from masterplanner.engine import workflows

    script = write_script([_planner(step("a", tools=[])), {"purpose": "*", "repeat": True}])
    run = engine.create_run("x", model=f"scripted:{script}", options=FAST)
    tell = workflows._tell_registry
    calls: list[str] = []
    at_once: list[int] = []  # how many calls ran as each began
    running, counting = [0], threading.Lock()
    blocked, go_on = threading.Event(), threading.Event()

    def slow(resources: Any, **kwargs: Any) -> None:  # the first call outlasts its execution
        with counting:
            calls.append(resources.run_id)
            running[0] += 1
            at_once.append(running[0])
        try:
            if len(calls) == 1:
                blocked.set()
                go_on.wait(30)
            tell(resources, **kwargs)
        finally:
            with counting:
                running[0] -= 1

    monkeypatch.setattr(workflows, "_tell_registry", slow)
    execution = asyncio.ensure_future(engine.execute(run.id))
    await asyncio.to_thread(blocked.wait, 60)
    assert engine.store.get_run(run.id).status == "succeeded"  # the outcome is recorded
    execution.cancel()  # the caller gives up; this process goes on
    await asyncio.gather(execution, return_exceptions=True)
    assert engine.store.lease(run.id) is None
    go_on.set()  # the cancelled call returns; nobody executes the run again here

    async def finished() -> str:
        while True:
            status = await DBOS.get_workflow_status_async(f"{run.id}._end")
            if status is not None and status.status not in ("PENDING", "ENQUEUED"):
                return status.status
            await asyncio.sleep(0.05)

    assert await asyncio.wait_for(finished(), 30) == "SUCCESS"  # before, pending for ever
    assert calls == [run.id, run.id]  # the end's replay tells the registry again (it dedupes)
    assert at_once == [1, 1]  # one after the other, never two calls at once
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert (kinds.count("run_succeeded"), kinds.count("team_stored")) == (1, 1)
    assert kinds[-2:] == ["run_succeeded", "team_stored"]
    again = await asyncio.wait_for(engine.execute(run.id), 30)  # nothing is left to do
    assert again.status == "succeeded"
    assert [kind for kind, _ in _kinds(engine, run.id)] == kinds
    assert calls == [run.id, run.id]


async def test_steps_named_aggregate_and_end_are_the_steps_alone(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """Two sinks named as the run's answer and end workflows once were: the run composes and ends.

    Before, the answer's workflow took step `aggregate`'s id (`<run>.aggregate`) and failed with
    DBOS's conflicting-workflow error.
    """
    script = write_script(
        [
            _planner(step("aggregate", tools=[]), step("end", tools=[])),
            {"purpose": "step:aggregate", "output": "AGG"},
            {"purpose": "step:end", "output": "END"},
            {"purpose": "aggregator", "expect": ["AGG", "END"], "output": "both"},
            DRAFTS,
        ]
    )
    run = engine.create_run("two sinks", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert (final.status, final.error, final.output) == ("succeeded", None, "both")
    assert [(s.id, s.status, s.output) for s in engine.store.steps(run.id)] == [
        ("aggregate", "succeeded", "AGG"),
        ("end", "succeeded", "END"),
    ]
    assert [kind for kind, _ in _kinds(engine, run.id)][-2:] == ["run_succeeded", "team_stored"]
    again = await engine.execute(run.id)  # the ended run, executed again, finds its own end
    assert (again.status, again.output) == ("succeeded", "both")


async def test_an_end_still_running_where_the_lease_lapsed_is_followed_not_run_again(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's lease lapsed (handed over) while its end, telling the registry, still runs.

    The execution that takes the run over waits for that end to finish. Before, it resumed the
    end at once, without asking whether its executor was alive: the end ran a second time beside
    the first, and the registry was told twice.
    """
    from masterplanner.engine import runner, workflows

    script = write_script([_planner(step("a", tools=[])), {"purpose": "*", "repeat": True}])
    run = engine.create_run("x", model=f"scripted:{script}", options=FAST)
    tell = workflows._tell_registry
    calls: list[str] = []
    blocked, go_on = threading.Event(), threading.Event()

    def slow(resources: Any, **kwargs: Any) -> None:  # the first end is slow to tell the registry
        calls.append(resources.run_id)
        blocked.set()
        go_on.wait(30)
        tell(resources, **kwargs)

    followed = asyncio.Event()
    next_status = runner.next_status

    async def watched(workflow_id: str) -> Any:  # the second execution waits for the end
        if workflow_id.endswith("._end"):
            followed.set()
        return await next_status(workflow_id)

    monkeypatch.setattr(workflows, "_tell_registry", slow)
    monkeypatch.setattr(runner, "next_status", watched)
    first = asyncio.ensure_future(engine.execute(run.id))
    while not blocked.is_set():  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    assert engine.store.get_run(run.id).status == "succeeded"  # the outcome is recorded
    held = engine.store.lease(run.id)
    assert held is not None
    engine.store.hand_over(run.id, held.owner)  # its lease lapses; the end still runs

    second = asyncio.ensure_future(engine.execute(run.id))
    deadline = time.monotonic() + 30
    while not followed.is_set() and len(calls) < 2:  # before, the end started again at once
        assert time.monotonic() < deadline, "the second execution neither followed nor resumed the end"
        await asyncio.sleep(0.02)
    go_on.set()
    final = await asyncio.wait_for(second, 60)
    await asyncio.gather(first, return_exceptions=True)
    assert final.status == "succeeded"
    assert calls == [run.id]  # told once, by the end that was running
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert (kinds.count("run_succeeded"), kinds.count("team_stored")) == (1, 1)
    assert kinds[-2:] == ["run_succeeded", "team_stored"]


async def test_an_end_an_earlier_version_recorded_under_the_old_id_is_finished(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose end began under the old id (`<run>.end`) and was cut short is finished by this one.

    The run's own workflows were `<run>.<name>` (now `<run>._<name>`): the end of a run started by
    an earlier version is looked up under the id it has, not left for ever unfinished.
    """
    from masterplanner.engine import records, runtime, workflows

    script = write_script([_planner(step("a", tools=[])), {"purpose": "*", "repeat": True}])
    run = engine.create_run("x", model=f"scripted:{script}", options=FAST)

    def dying(*args: Any, **kwargs: Any) -> None:  # the earlier version dies while telling the registry
        raise Killed

    with monkeypatch.context() as patched:  # undone here (not the fixtures' patches too)
        patched.setattr(runtime, "own_workflow_id", records.workflow_id)  # the earlier version's ids
        patched.setattr(workflows, "_tell_registry", dying)
        with pytest.raises(Killed):
            await engine.execute(run.id)
        old = await asyncio.to_thread(engine.store.get_run, run.id)
        assert old.status == "succeeded"

    final = await engine.execute(run.id)
    assert final.status == "succeeded"
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert kinds[-2:] == ["run_succeeded", "team_stored"]
    assert kinds.count("run_succeeded") == 1


def _failing_once(engine: Engine, monkeypatch: pytest.MonkeyPatch, status: str, times: int = 1) -> list[str]:
    """The store's write of the run's end as `status` fails `times` times (a full disk).

    After DBOS began the end.
    """
    real = engine.store.end_run
    failed: list[str] = []

    def end_run(run_id: str, to: Any, *args: Any, **values: Any) -> bool:
        if to == status and len(failed) < times:
            failed.append(run_id)
            raise RunError("the run's database failed: disk I/O error: cannot update a run")
        return real(run_id, to, *args, **values)

    monkeypatch.setattr(engine.store, "end_run", end_run)
    return failed


async def test_a_run_whose_end_dbos_recorded_and_the_store_did_not_ends_on_resume_as_recorded(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end workflow ended (ERROR: the store could not write the outcome) and the run did not.

    Before, every resume called the end workflow again under its id, which only raised the
    recorded error again: the run stayed `running` for ever.
    """
    script = write_script([_planner(step("a", tools=[])), {"purpose": "step:a", "output": "A"}, DRAFTS])
    run = engine.create_run("x", model=f"scripted:{script}", options=FAST)
    failed = _failing_once(engine, monkeypatch, "succeeded")
    with pytest.raises(RunError, match="disk I/O error"):
        await engine.execute(run.id)
    assert failed == [run.id]
    assert engine.store.get_run(run.id).status == "running"

    final = await engine.execute(run.id)
    assert (final.status, final.output, final.error) == ("succeeded", "A", None)
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert kinds[-2:] == ["run_succeeded", "team_stored"]
    assert (kinds.count("run_succeeded"), kinds.count("team_stored")) == (1, 1)
    assert [s.status for s in engine.store.steps(run.id)] == ["succeeded"]
    again = await engine.execute(run.id)  # ended: nothing more happens
    assert (again.status, again.output) == ("succeeded", "A")
    assert [kind for kind, _ in _kinds(engine, run.id)] == kinds


async def test_a_run_that_failed_planning_and_whose_end_the_store_missed_ends_failed_without_planning_again(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The end's outcome is the one recorded: the run is not taken on again (asking the planner again)."""
    script = write_script([])  # no answer for the planner: planning fails
    run = engine.create_run("x", model=f"scripted:{script}", options=FAST)
    _failing_once(engine, monkeypatch, "failed")
    with pytest.raises(RunError) as stopped:
        await engine.execute(run.id)
    assert engine.store.get_run(run.id).status == "planning"
    calls = engine.report(run.id)["usage"]["llm_calls"]
    assert calls >= 1

    final = await engine.execute(run.id)
    assert (final.status, final.error) == ("failed", str(stopped.value))
    assert engine.report(run.id)["usage"]["llm_calls"] == calls
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert kinds.count("run_failed") == 1 and kinds[-1] == "run_failed"
    failed = [event.data for event in engine.store.events(run.id) if event.kind == "run_failed"]
    assert failed == [{"reason": str(stopped.value), "outcome_counted": False}]


@pytest.mark.parametrize("status", ["succeeded", "failed"])
async def test_an_end_the_store_cannot_record_again_on_resume_stops_the_run_to_resume_later(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    """The disk is still full when the run is resumed: its end, made again, fails again.

    Before, the resume raised the store's plain error ("…: cannot update a run") with no resume
    hint, where the first execution stopped the run to resume later (`RunStoppedError`); and an
    execution whose answer the store could not record (a succeeded end) raised it plainly too.
    """
    from masterplanner.errors import RunStoppedError

    answers = (
        [] if status == "failed" else [_planner(step("a", tools=[])), {"purpose": "step:a", "output": "A"}]
    )
    script = write_script([*answers, DRAFTS])  # failed: no answer for the planner, planning fails
    run = engine.create_run("x", model=f"scripted:{script}", options=FAST)
    failed = _failing_once(engine, monkeypatch, status, times=2)
    with pytest.raises(RunStoppedError):
        await engine.execute(run.id)
    with pytest.raises(RunStoppedError) as stopped:
        await engine.execute(run.id)  # resumed: the end made again fails again
    assert str(stopped.value) == "the run's database failed: disk I/O error: cannot update a run"
    assert failed == [run.id, run.id]
    assert engine.store.get_run(run.id).status == ("running" if status == "succeeded" else "planning")
    assert engine.store.lease(run.id) is None  # given up: `runs list` says stopped

    final = await engine.execute(run.id)  # room again: the run ends as its end was to end it
    assert final.status == status
    if status == "succeeded":
        assert final.output == "A"
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert kinds.count(f"run_{status}") == 1


@pytest.mark.parametrize("status", ["succeeded", "failed"])
async def test_a_run_s_end_is_written_whole_or_not_at_all(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, status: str
) -> None:
    """The end's event cannot be written (the disk fills between the status and the event).

    Before, the status was a transaction of its own: the run stood ended with no `run_succeeded`
    or `run_failed` among its events, for good (its end, made again, found it ended and wrote
    nothing more). Now nothing of the end is written: the run stops, and its resume ends it once.
    """
    import sqlalchemy as sa

    from masterplanner.engine import store as store_module
    from masterplanner.errors import RunStoppedError

    answers = (
        [] if status == "failed" else [_planner(step("a", tools=[])), {"purpose": "step:a", "output": "A"}]
    )
    script = write_script([*answers, DRAFTS])  # failed: no answer for the planner, planning fails
    run = engine.create_run("x", model=f"scripted:{script}", options=FAST)
    insert, refused = store_module._insert_event, []

    def full_disk(connection: Any, run_id: str, at: str, kind: Any, step: Any, payload: str) -> int:
        if kind == f"run_{status}" and not refused:
            refused.append(kind)
            raise sa.exc.OperationalError("INSERT INTO mp_events", {}, Exception("disk I/O error"))
        return insert(connection, run_id, at, kind, step, payload)

    monkeypatch.setattr(store_module, "_insert_event", full_disk)
    with pytest.raises(RunStoppedError):
        await engine.execute(run.id)
    assert refused == [f"run_{status}"]
    stopped = engine.store.get_run(run.id)
    assert stopped.status == ("running" if status == "succeeded" else "planning")
    final = await engine.execute(run.id)  # room again
    assert final.status == status
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert kinds.count(f"run_{status}") == 1


def _failing_as_the_run_moves(
    monkeypatch: pytest.MonkeyPatch, status: str, failure: BaseException
) -> list[str]:
    """`failure` is raised once as the run's status moves to `status`, within the write that moves it."""
    from masterplanner.engine import store as store_module

    moving, failed = store_module._update_run, []

    def move(connection: Any, run_id: str, *args: Any, **kwargs: Any) -> bool:
        values = args[2] if len(args) > 2 else kwargs["values"]
        if values.get("status") == status and not failed:
            failed.append(run_id)
            raise failure
        return moving(connection, run_id, *args, **kwargs)

    monkeypatch.setattr(store_module, "_update_run", move)
    return failed


@pytest.mark.parametrize("decision", ["approved", "rejected"])
async def test_a_review_s_decision_is_written_whole_or_not_at_all(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, decision: str
) -> None:
    """The process dies between the decision's event and the run's move.

    Before, each was a write of its own: the run stood awaiting approval with an `approved` (or
    `rejected`) event, and its resume took the review's answer again and recorded a second one.
    Now the decision is one transaction: nothing of it was written, and the resume records it once.
    """
    script = write_script([_planner(step("a", tools=[])), {"purpose": "step:a", "output": "A"}, DRAFTS])
    run = engine.create_run("x", model=f"scripted:{script}", options=replace(FAST, auto_approve=False))

    async def review(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve"} if decision == "approved" else {"action": "reject", "reason": "no"}

    moved_to = "running" if decision == "approved" else "cancelled"
    killed = _failing_as_the_run_moves(monkeypatch, moved_to, Killed())
    with pytest.raises(Killed):
        await execute_answering(engine, run.id, review=review)
    assert killed == [run.id]
    stopped = engine.store.get_run(run.id)
    assert stopped.status == "awaiting_approval"
    assert decision not in [kind for kind, _ in _kinds(engine, run.id)]

    final = await engine.execute(run.id)  # resumed: the review's answer is taken as it was given
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert kinds.count(decision) == 1
    if decision == "approved":
        assert (final.status, final.output) == ("succeeded", "A")
    else:
        assert (final.status, final.error) == ("cancelled", "rejected: no")
        assert kinds[-1] == "rejected" and "step_started" not in kinds


@pytest.mark.parametrize("decision", ["approved", "rejected"])
async def test_a_review_s_decision_the_store_could_not_record_is_not_half_recorded(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, decision: str
) -> None:
    """The disk fills between the decision's event and the run's move: the run fails, saying so.

    Before, the event stayed: the failed run said it was approved (or rejected) at review, and
    its retry, which reviews again a plan never approved, recorded a second `rejected`. Now
    nothing of the decision is written, and the retry applies the answer given, once.
    """
    script = write_script([_planner(step("a", tools=[])), {"purpose": "step:a", "output": "A"}, DRAFTS])
    run = engine.create_run("x", model=f"scripted:{script}", options=replace(FAST, auto_approve=False))

    async def review(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve"} if decision == "approved" else {"action": "reject", "reason": "no"}

    full_disk = sa.exc.OperationalError("UPDATE mp_runs", {}, Exception("disk I/O error"))
    moved_to = "running" if decision == "approved" else "cancelled"
    failed = _failing_as_the_run_moves(monkeypatch, moved_to, full_disk)
    ended = await execute_answering(engine, run.id, review=review)
    assert failed == [run.id]
    assert ended.status == "failed"
    assert ended.error is not None and ended.error.endswith("disk I/O error")
    assert decision not in [kind for kind, _ in _kinds(engine, run.id)]

    engine.retry(run.id)  # room again: its plan, never approved, is reviewed again
    final = await engine.execute(run.id)
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert kinds.count(decision) == 1
    if decision == "approved":
        assert (final.status, final.output) == ("succeeded", "A")
    else:
        assert (final.status, final.error) == ("cancelled", "rejected: no")


async def _stopped_as_the_event_is_written(
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    run_id: str,
    kind: str,
    failure: str,
    review: Callable[[Any, Any], Awaitable[dict[str, Any]]],
) -> RunRecord:
    """Execute the run until its `kind` event is written, where the process dies (`failure` "killed")
    or the disk is full ("full disk"): the run as it stood then (awaiting approval, or failed)."""
    if failure == "killed":
        killed = failing_as_the_event_is_written(monkeypatch, kind, Killed())
        with pytest.raises(Killed):
            await execute_answering(engine, run_id, review=review)
        assert killed == [run_id]
        stopped = engine.store.get_run(run_id)
        assert stopped.status == "awaiting_approval"
        return stopped
    full_disk = sa.exc.OperationalError("INSERT INTO mp_events", {}, Exception("disk I/O error"))
    failed = failing_as_the_event_is_written(monkeypatch, kind, full_disk)
    stopped = await execute_answering(engine, run_id, review=review)
    assert failed == [run_id]
    assert stopped.status == "failed"
    assert stopped.error is not None and stopped.error.endswith("disk I/O error")
    return stopped


@pytest.mark.parametrize("failure", ["killed", "full disk"])
async def test_an_approved_edit_is_written_whole_with_its_approval(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """The process dies (or the disk fills) between the edited plan's write and its `plan_edited`.

    Before, the edit was written first on its own, then its event: the run kept the edited plan
    with no `plan_edited`, and the answer, taken again on resume (or on retry), no longer
    differed from the plan stored, so it was no edit: the audit never said the person edited the
    plan. Now the edit, its event, the approval and the run's move are one transaction.
    """
    script = write_script([_planner(step("a", tools=[])), {"purpose": "step:b", "output": "B"}, DRAFTS])
    run = engine.create_run("x", model=f"scripted:{script}", options=replace(FAST, auto_approve=False))
    edited = {"task": "x", "steps": [step("b", tools=[])]}

    async def review(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve", "plan": edited}

    stopped = await _stopped_as_the_event_is_written(
        engine, monkeypatch, run.id, "plan_edited", failure, review
    )
    assert stopped.plan is not None and stopped.plan.ids == ["a"]  # nothing of the edit was written
    assert "plan_edited" not in [kind for kind, _ in _kinds(engine, run.id)]

    if failure == "full disk":
        engine.retry(run.id)  # room again: its plan, never approved, is reviewed again
    final = await engine.execute(run.id)  # the review's answer is taken as it was given: an edit
    assert (final.status, final.output) == ("succeeded", "B")
    kinds = [kind for kind, _ in _kinds(engine, run.id)]
    assert (kinds.count("plan_edited"), kinds.count("approved")) == (1, 1)
    assert kinds.index("plan_edited") < kinds.index("approved") < kinds.index("step_started")
    assert [s.id for s in engine.store.steps(run.id)] == ["b"]


@pytest.mark.parametrize("failure", ["killed", "full disk"])
async def test_a_plan_review_is_opened_with_its_approval_requested_or_not_at_all(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """The process dies (or the disk fills) as the plan review's `approval_requested` is written.

    Before, the review request was written first, on its own, then its event: killed there, the
    resumed run found the request under its key (not new), so it never announced it, and the
    run's events, its page's live view and its audit never said the plan was put to a person.
    Now the request and its event are one transaction: nothing of either is written, and the
    run resumed (or retried) opens the review with its event, once.
    """
    script = write_script([_planner(step("a", tools=[])), {"purpose": "step:a", "output": "A"}, DRAFTS])
    run = engine.create_run("x", model=f"scripted:{script}", options=replace(FAST, auto_approve=False))

    async def review(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve"}

    await _stopped_as_the_event_is_written(engine, monkeypatch, run.id, "approval_requested", failure, review)
    assert engine.store.requests.find(run.id, state=None) == []  # no review without its event
    assert "approval_requested" not in [kind for kind, _ in _kinds(engine, run.id)]

    if failure == "full disk":
        engine.retry(run.id)  # room again: its plan, never approved, is reviewed
    final = await execute_answering(engine, run.id, review=review)
    assert (final.status, final.output) == ("succeeded", "A")
    (asked,) = engine.store.requests.find(run.id, state=None)
    assert (asked.kind, asked.state) == ("plan_review", "answered")
    events = engine.store.events(run.id)
    assert [event.data for event in events if event.kind == "approval_requested"] == [{"request": asked.id}]
    kinds = [event.kind for event in events]
    assert kinds.index("plan_ready") < kinds.index("approval_requested") < kinds.index("approved")


async def test_two_processes_executing_one_run_at_once_run_it_once(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            _planner(step("a", tools=[])),
            {"purpose": "step:a", "output": "A", "delay_s": 3.0},
            {"purpose": "*", "repeat": True},
        ]
    )
    first, second = Engine(Settings.load(run_lease_s=2)), Engine(Settings.load(run_lease_s=2))
    try:
        run = first.create_run("x", model=f"scripted:{script}", options=FAST)
        outcomes = await asyncio.gather(first.execute(run.id), second.execute(run.id), return_exceptions=True)
        errors = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        finished = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
        assert len(errors) == 1 and len(finished) == 1, outcomes
        assert isinstance(errors[0], RunError)
        assert "being executed by another process" in str(errors[0])
        assert finished[0].status == "succeeded"
        kinds = _kinds(first, run.id)
        assert kinds.count(("step_started", "a")) == 1
        assert kinds.count(("plan_ready", None)) == 1
        assert first.report(run.id)["usage"]["by_purpose"]["step:a"]["calls"] == 1
    finally:
        first.close()
        second.close()


async def test_a_review_answer_that_does_not_fit_is_refused_naming_the_field(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    from masterplanner import RequestError, RunService

    script = write_script([_planner(step("a", tools=[])), {"purpose": "*", "repeat": True}])
    run = engine.create_run("x", model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
    execution = asyncio.ensure_future(engine.execute(run.id))
    service = RunService(engine.settings)
    try:
        while not (pending := await service.pending(run.id)):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        review = pending[0]
        with pytest.raises(RequestError) as misspelt:
            await service.answer(review.id, {"action": "approve", "agnets": {}}, by="test")
        assert str(misspelt.value) == (
            f"request {review.id}: the answer does not fit a plan review: agnets: unknown field; known: "
            "action, agents, plan, reason, tool_policies"
        )
        with pytest.raises(
            RequestError,
            match=r"tool_policies\.write_file: should be 'auto', 'ask' or 'deny', got 'sometimes'",
        ):
            await service.answer(
                review.id, {"action": "approve", "tool_policies": {"write_file": "sometimes"}}, by="test"
            )
        with pytest.raises(RequestError, match=r"agents\.a\.prompt: should be text, got a number"):
            await service.answer(review.id, {"action": "approve", "agents": {"a": {"prompt": 7}}}, by="test")
        # a misspelt tool would have left the tool it meant under its old policy, silently
        with pytest.raises(RequestError) as misnamed:
            await service.answer(
                review.id, {"action": "approve", "tool_policies": {"write-file": "ask"}}, by="t"
            )
        assert str(misnamed.value).startswith(
            f"request {review.id}: tool_policies names 'write-file', which is not a tool; "
            "did you mean 'write_file'? tools are "
        )
        with pytest.raises(RequestError) as own:
            await service.answer(
                review.id,
                {"action": "approve", "agents": {"a": {"prompt": "p", "tool_policies": {"nope": "ask"}}}},
                by="t",
            )
        assert str(own.value).startswith(
            f"request {review.id}: agents.a.tool_policies names 'nope', which is not"
        )
        with pytest.raises(RequestError) as stray:
            await service.answer(review.id, {"action": "approve", "agents": {"zz": {"prompt": "p"}}}, by="t")
        assert str(stray.value) == (
            f"request {review.id}: agents names step 'zz', which the plan does not have (its steps: a)"
        )
        # a program's answer of the wrong form is told the form, in the answer's own fields
        form = '{"action": "approve"} or {"action": "reject", "reason": …}'
        for wrong, got in (({"approved": True}, "no action"), ({"action": "yes"}, 'action "yes"')):
            with pytest.raises(RequestError) as refused:
                await service.answer(review.id, wrong, by="test")
            assert (
                str(refused.value) == f"request {review.id} is a plan review: its answer is {form}, got {got}"
            )
        assert (await service.request(review.id)).state == "open"  # nothing was taken
        await service.answer(review.id, {"action": "approve"}, by="test")
        assert (await execution).status == "succeeded"
    finally:
        service.close()


async def test_a_cancel_from_the_process_executing_the_run_stops_it_once(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    run, execution = await _slow_step_running(engine, write_script)
    requested = await asyncio.to_thread(engine.request_cancel, run.id)
    assert requested.status == "running"  # the execution holds the run: it stops it, not the cancel
    final = await asyncio.wait_for(execution, 5)
    assert final.status == "cancelled"
    assert engine.store.steps(run.id)[0].status == "cancelled"
    assert [kind for kind, _ in _kinds(engine, run.id)].count("run_cancelled") == 1


def test_a_worker_takes_by_default_the_providers_whose_keys_are_set_here(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from masterplanner.engine.worker import Worker

    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-not-used")
    worker = Worker(Settings.load())
    try:
        assert worker.providers == ["anthropic", "local", "ollama", "scripted"]
        assert worker.left_out == {"openai": "OPENAI_API_KEY"}
        # a compatible server needs only OPENAI_BASE_URL: the line it starts with names both
        assert worker.left_out_text == (
            "; not openai's (neither OPENAI_API_KEY nor OPENAI_BASE_URL is set here)"
        )
        assert worker.queues == ["steps-anthropic", "steps-local", "steps-ollama", "steps-scripted"]
    finally:
        worker.close()
    chosen = Worker(Settings.load(), providers=["scripted"])
    try:
        assert (chosen.providers, chosen.left_out) == (["scripted"], {})  # asked for: nothing left out
    finally:
        chosen.close()


def test_a_tool_call_in_a_process_running_steps_inline_needs_the_run_still_held_there(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    import sqlalchemy as sa
    from dbos._error import DBOSWorkflowConflictIDError

    from masterplanner.engine.runtime import keep_lease
    from masterplanner.engine.store import runs_table

    script = write_script([{"purpose": "*", "repeat": True}])
    run = engine.create_run("a task", model=f"scripted:{script}", options=FAST)
    engine.launch()

    def set_lease(**values: object) -> None:
        with engine.store.begin("set the lease") as connection:
            connection.execute(sa.update(runs_table).where(runs_table.c.id == run.id).values(**values))

    assert engine.store.claim(run.id, f"{engine.owner}/abc123", lease_s=30)
    keep_lease(run.id)  # held here: the call is made
    set_lease(lease_until=0.0)
    keep_lease(run.id)  # lapsed, and nobody took it (a laptop that slept): it carries on
    set_lease(owner="elsewhere:4242:0badc0de/def456", lease_until=1e12)
    with pytest.raises(DBOSWorkflowConflictIDError):  # a worker took it over: no call here
        keep_lease(run.id)
    # a worker in another container under this host name, where it too has this pid
    set_lease(owner=f"{socket.gethostname()}:{os.getpid()}:0badc0-0badc0de/def456")
    with pytest.raises(DBOSWorkflowConflictIDError):
        keep_lease(run.id)
    set_lease(owner=None)
    with pytest.raises(DBOSWorkflowConflictIDError):  # given up: nobody here runs its steps
        keep_lease(run.id)


def test_a_process_that_is_not_a_worker_renews_its_lease_after_it_lapsed(isolated: Path) -> None:
    """A database away for longer than `run_lease_s` let the lease of a `run` or `serve` lapse:
    its heartbeat stopped at the first failed renewal, and the process, still executing runs,
    was listed dead for the rest of its life (a step it ran was handed to others as a dead one's)."""
    from masterplanner.engine.processes import processes_table

    engine = Engine(Settings.load(run_lease_s=1))
    try:
        engine.launch()
        with engine.store.begin("let the lease lapse, as in a database outage") as connection:
            connection.execute(
                sa.update(processes_table).where(processes_table.c.id == engine.owner).values(lease_until=0.0)
            )
        assert not engine.store.processes.alive(engine.owner)
        time.sleep(0.7)  # renewed every fifth of its lease (0.2 s)
        assert engine.store.processes.alive(engine.owner)
    finally:
        engine.close()


def test_a_policy_for_a_tool_that_does_not_exist_is_refused_before_the_run_is_made(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    from masterplanner import ConfigError

    model = f"scripted:{write_script([{'purpose': '*', 'repeat': True}])}"
    with pytest.raises(ConfigError) as refused:
        engine.create_run("x", model=model, options=RunOptions(tool_policies={"code-execution": "deny"}))
    assert str(refused.value).startswith(
        "tool_policies names 'code-execution', which is not a tool; did you mean 'code_execution'? tools are "
    )
    assert engine.store.list_runs() == []
    # MCP tools are named after their configured server
    engine.settings.mcp_servers["notes"] = McpServer(command="x")
    engine.create_run("x", model=model, options=RunOptions(tool_policies={"notes_shout": "deny"}))


def test_a_workspace_given_as_a_link_to_a_folder_is_that_folder(
    engine: Engine, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """Before, `--workspace LINK` was refused as "not a directory"."""
    target = tmp_path / "real"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    model = f"scripted:{write_script([{'purpose': '*', 'repeat': True}])}"
    record = engine.create_run("x", model=model, workspace=link)
    assert record.workspace == str(target.resolve())


def test_a_run_for_workers_is_queued_without_the_model_key_which_only_workers_need(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    from masterplanner.errors import MissingCredentialError, ModelSpecError

    for variable in ("OPENAI_API_KEY", "OPENAI_BASE_URL"):
        monkeypatch.delenv(variable, raising=False)
    queued = engine.create_run("x", model="openai:gpt-4.1", for_workers=True)
    assert (queued.model, queued.options.team_tools) == ("openai:gpt-4.1", True)
    with pytest.raises(MissingCredentialError, match="needs the environment variable OPENAI_API_KEY"):
        engine.create_run("x", model="openai:gpt-4.1")  # executed here: the key is needed here
    with pytest.raises(ModelSpecError):
        engine.create_run("x", model="openai:", for_workers=True)  # the form is still checked


async def test_a_prompt_left_blank_at_review_is_written_again(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    # a prompt of spaces ran the step with no instructions and was stored as the agent's prompt
    script = write_script(
        [
            _planner(step("solo", tools=[])),
            {"purpose": "prompt_creator", "output": "You are the first draft."},
            {"purpose": "prompt_creator", "output": "You are written again."},
            {"purpose": "step:solo", "expect": ["You are written again."], "output": "done"},
            {"purpose": "*", "repeat": True},
        ]
    )
    options = RunOptions(prompt_rounds=0, retry_backoff_s=0.01)
    run = engine.create_run("blank prompt", model=f"scripted:{script}", options=options)

    async def blank(_: RunRecord, __: Any) -> dict[str, Any]:
        return {"action": "approve", "agents": {"solo": {"prompt": " \n\t "}}}

    final = await execute_answering(engine, run.id, review=blank)
    assert final.status == "succeeded", final.error
    assert engine.store.get_run(run.id).agents["solo"].prompt == "You are written again."


def test_a_model_s_text_holding_a_nul_is_stored_with_a_replacement_character(
    database_url: str, write_script: Callable[..., Path]
) -> None:
    """A step's output, a checker's reason in a step's error, a consulted step's answer and the
    aggregator's answer: on SQLite each was stored with its NUL; on Postgres the run failed in
    the database's words, naming its URL."""
    checked = replace(FAST, check_outputs=True, max_replans=0)
    failing = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=[])),
            {"purpose": "step:a", "output": "A\x00 found"},
            {"purpose": "checker", "output": {"meets": True, "reason": "fine"}},
            {
                "purpose": "step:b",
                "tool_calls": [{"name": "ask_agent", "args": {"to": "a", "question": "which?"}}],
            },
            {"purpose": "consult:a", "output": "forty\x00two"},
            {
                "purpose": "step:b",
                "expect": ["A\ufffd found", "step a answers: forty\ufffdtwo"],
                "output": "B",
            },
            {"purpose": "checker", "output": {"meets": False, "reason": "too\x00 short"}},
            DRAFTS,
        ]
    )
    composed = write_script(
        [
            _planner(step("x", tools=[]), step("y", tools=[])),
            {"purpose": "step:x", "output": "X\x00"},
            {"purpose": "step:y", "output": "Y"},
            {"purpose": "aggregator", "expect": ["X\ufffd"], "output": "ALL\x00"},
            DRAFTS,
        ]
    )

    async def program() -> tuple[Any, ...]:
        engine = Engine(Settings.load())
        try:
            first = engine.create_run("nul", model=f"scripted:{failing}", options=checked)
            failed = await engine.execute(first.id)
            steps = [(s.id, s.status, s.output, s.error) for s in engine.store.steps(first.id)]
            answers = [m.answer for m in engine.store.messages.of_run(first.id)]
            second = engine.create_run("nul", model=f"scripted:{composed}", options=FAST)
            done = await engine.execute(second.id)
            outputs = [s.output for s in engine.store.steps(second.id)]
            return failed.status, failed.error, steps, answers, done.status, done.output, outputs
        finally:
            engine.close()

    short = "its output does not meet the expected output (b done): too\ufffd short"
    assert asyncio.run(program()) == (
        "failed",
        f"step b failed: {short}",
        [("a", "succeeded", "A\ufffd found", None), ("b", "failed", None, short)],
        ["forty\ufffdtwo"],
        "succeeded",
        "ALL\ufffd",
        ["X\ufffd", "Y"],
    )
