"""A run stopped while planning, resumed by another engine from its kept work (`planning.PlanningWork`)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _plans import step

from masterplanner import Settings
from masterplanner.engine import Engine, RunOptions, run_catalog
from masterplanner.event_text import planning_stage

OPTIONS = RunOptions(auto_approve=True, prompt_rounds=0)


def _planner(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"purpose": "planner", "output": {"steps": list(steps)}}


async def _stopped_with_its_plan_kept(script: Path, task: str) -> str:
    """Run `task` in one engine and stop it (as Ctrl-C does) once its plan is kept; the run's id.

    The script's first draft waits an hour: the run is planning when it stops.
    """
    planning = Engine(Settings.load())
    try:
        run = planning.create_run(task, model=f"scripted:{script}", options=OPTIONS)
        execution = asyncio.ensure_future(planning.execute(run.id))
        deadline = time.monotonic() + 60  # only so a broken run cannot hang the suite
        while (planning.store.kept_planning(run.id) or {}).get("reused") is None:
            assert not execution.done() and time.monotonic() < deadline, "its planning was never kept"
            await asyncio.sleep(0.05)
        execution.cancel()
        await asyncio.gather(execution, return_exceptions=True)
        assert planning.store.get_run(run.id).status == "planning"
    finally:
        planning.close()
    return run.id


def _progress(engine: Engine, run_id: str) -> list[dict[str, Any]]:
    return [event.data for event in engine.store.events(run_id) if event.kind == "planning_progress"]


async def test_a_kept_plan_naming_a_tool_no_longer_offered_is_planned_again(
    write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the kept plan was taken as it was: approved by itself, the run failed at its start
    ("the plan cannot run here") for a tool the settings no longer offered."""
    script = write_script(
        [
            _planner(step("fetch", tools=["http_request"])),
            {"purpose": "prompt_creator", "output": "Fetch it.", "delay_s": 3600.0},
        ]
    )
    monkeypatch.setenv("MASTERPLANNER_HTTP_ALLOWED_DOMAINS", '["example.com"]')
    run_id = await _stopped_with_its_plan_kept(script, "fetch a page")
    monkeypatch.delenv("MASTERPLANNER_HTTP_ALLOWED_DOMAINS")  # http_request is no longer offered
    script.write_text(
        json.dumps(
            {
                "calls": [
                    _planner(step("write", tools=[])),
                    {"purpose": "prompt_creator", "output": "Write it."},
                    {"purpose": "step:write", "output": "written"},
                ]
            }
        )
    )
    resuming = Engine(Settings.load())
    try:
        final = await resuming.execute(run_id)
        assert (final.status, final.output, final.error) == ("succeeded", "written", None)
        assert final.plan is not None and final.plan.ids == ["write"]
        usage = resuming.report(run_id)["usage"]["by_purpose"]
        assert {purpose: entry["calls"] for purpose, entry in usage.items()} == {
            "planner": 2,
            "prompt_creator": 1,  # the new plan's (the first one's, cut short by the stop, was not made)
            "step:write": 1,
        }
        why = "step 'fetch': tool 'http_request' is not available here: " + str(
            run_catalog(resuming.settings).why_missing("http_request")
        )
        progress = _progress(resuming, run_id)
        again = progress.index({"stage": "planned_again", "why": why, "process": resuming.owner})
        assert [data["stage"] for data in progress[again:]] == [
            "planned_again",
            "similar_teams",
            "steps",
            "prompts",
        ]
        assert planning_stage(progress[again]) == (
            f"planning again in {resuming.owner}: the plan made before the stop names a tool "
            f"not offered now ({why})"
        )
        assert resuming.store.kept_planning(run_id) is None
    finally:
        resuming.close()


async def test_a_resumed_planning_names_the_process_that_took_it_over(
    write_script: Callable[..., Path],
) -> None:
    """Before, `resumed` said what was kept but not which process went on with it."""
    script = write_script(
        [
            _planner(step("a", tools=[])),
            {"purpose": "prompt_creator", "output": "Do a.", "delay_s": 3600.0},
        ]
    )
    run_id = await _stopped_with_its_plan_kept(script, "do a")
    script.write_text(
        json.dumps(
            {
                "calls": [
                    {"purpose": "prompt_creator", "output": "Do a."},
                    {"purpose": "step:a", "output": "A"},
                ]
            }
        )
    )
    resuming = Engine(Settings.load())
    try:
        final = await resuming.execute(run_id)
        assert (final.status, final.output) == ("succeeded", "A")
        progress = _progress(resuming, run_id)
        resumed = {"stage": "resumed", "prompts": 0, "process": resuming.owner}
        assert progress[progress.index(resumed) :] == [resumed, {"stage": "prompts", "draft": 1, "of": 1}]
        assert planning_stage(resumed) == f"resuming planning in {resuming.owner} (its plan was made before)"
    finally:
        resuming.close()


def _take_over(other: Any, run_id: str) -> None:
    """The other process (`other`, its store) takes the run once the stalled one's lease lapsed."""
    deadline = time.monotonic() + 30
    while not other.claim(run_id, "other", lease_s=60):
        assert time.monotonic() < deadline, "the stalled process's lease never lapsed"
        time.sleep(0.05)


def _stall(patch: pytest.MonkeyPatch, store: Any) -> None:
    """The process of `store` stalls: its guard neither renews its lease nor sees it taken over."""
    patch.setattr(store, "heartbeats", lambda owners, **_: None)
    patch.setattr(store, "watched", lambda owners: dict.fromkeys(owners, (True, False)))


@pytest.mark.parametrize("lost", ["while planning", "before its plan was recorded"])
async def test_a_process_that_lost_the_run_while_planning_records_nothing_and_stops(
    database_url: str,
    write_script: Callable[..., Path],
    lost: str,
) -> None:
    """A process stalls past its lease while planning; another takes the run over.

    Only the kept work's writes checked the lease: the stalled one, going on, recorded its plan
    over the new holder's with a second `plan_ready` (and each opened a review), or here, ran the
    run's steps itself. Now it stops quietly at its first write, and the new holder goes on.
    """
    from masterplanner.engine import planning
    from masterplanner.engine.store import RunStore

    slow = {"delay_s": 2.5}  # past the stalled process's lease of 1 s
    script = write_script(
        [
            _planner(step("a", tools=[])) | (slow if lost == "while planning" else {}),
            {"purpose": "prompt_creator", "output": "Do a.", "repeat": True},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b", "output": "B"},
        ]
    )
    other = RunStore(database_url)
    stalled = Engine(Settings.load(run_lease_s=1))
    taking_over: list[str] = []

    def take_over(run_id: str) -> None:
        _take_over(other, run_id)
        taking_over.append(run_id)

    cautions = planning.model_cautions

    def stalls(resources: Any, run: Any) -> list[str]:
        take_over(run.id)  # the whole process stalls here, its prompts kept
        return cautions(resources, run)

    try:
        run = stalled.create_run("do a", model=f"scripted:{script}", options=OPTIONS)
        with pytest.MonkeyPatch.context() as patch:
            _stall(patch, stalled.store)  # its guard neither renews its lease nor sees it taken over
            if lost == "before its plan was recorded":
                patch.setattr(planning, "model_cautions", stalls)
            execution = asyncio.ensure_future(stalled.execute(run.id))
            if lost == "while planning":
                while {"stage": "steps"} not in _progress(stalled, run.id):  # noqa: ASYNC110
                    await asyncio.sleep(0.05)  # the planner is asked: the stalled process holds the run
                await asyncio.to_thread(take_over, run.id)
            final = await asyncio.wait_for(execution, 60)
        assert taking_over == [run.id]
        assert (final.status, final.plan, final.output) == ("planning", None, None)
        kinds = [event.kind for event in stalled.store.events(run.id)]
        assert "plan_ready" not in kinds and "step_started" not in kinds
        lease = other.lease(run.id)
        assert lease is not None and lease.owner == "other"
        calls = stalled.report(run.id)["usage"]["by_purpose"]
        if lost == "while planning":  # its plan is not kept, and no prompt is asked for it
            assert other.kept_planning(run.id) is None
            assert set(calls) == {"planner"}
        else:  # what it kept while it held the lease stays, for the new holder
            kept = other.kept_planning(run.id)
            assert kept is not None and set(kept["prompts"]) == {"a"}
    finally:
        stalled.close()
    other.release(run.id, "other")
    going_on = Engine(Settings.load())
    try:
        final = await going_on.execute(run.id)
        assert (final.status, final.output) == ("succeeded", "A")
        kinds = [event.kind for event in going_on.store.events(run.id)]
        assert (kinds.count("plan_ready"), kinds.count("step_started")) == (1, 1)
    finally:
        going_on.close()
        other.close()


@pytest.mark.parametrize("decision", ["approved", "rejected", "plan_edited"])
async def test_a_process_that_lost_the_run_while_its_review_was_open_records_no_decision(
    database_url: str,
    write_script: Callable[..., Path],
    decision: str,
) -> None:
    """A process stalls past its lease while the plan review is open; another takes the run over.

    Before, the review's outcome was written by whichever process read the answer: the stalled
    one recorded `approved` (and ran the steps itself) or `rejected` (and cancelled the run) under
    the new holder's lease. Now it records nothing and stops; the holder applies the answer, once.
    An edit the answer makes (`plan_edited`) is written with the approval, by the holder alone:
    before, the stalled process wrote the edited plan over the holder's run, with its event, and
    the holder, finding the answer no longer differed from the plan, made no edit of it.
    """
    from masterplanner import RunService
    from masterplanner.engine.store import RunStore

    script = write_script(
        [
            _planner(step("a", tools=[])),
            {"purpose": "prompt_creator", "output": "Do a.", "repeat": True},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b", "output": "B"},
        ]
    )
    other = RunStore(database_url)
    stalled = Engine(Settings.load(run_lease_s=1))
    service = RunService(stalled.settings)
    answer: dict[str, Any] = {
        "approved": {"action": "approve"},
        "rejected": {"action": "reject", "reason": "no"},
        "plan_edited": {"action": "approve", "plan": {"task": "do a", "steps": [step("b", tools=[])]}},
    }[decision]

    try:
        run = stalled.create_run("do a", model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        with pytest.MonkeyPatch.context() as patch:
            _stall(patch, stalled.store)  # its guard neither renews its lease nor sees it taken over
            execution = asyncio.ensure_future(stalled.execute(run.id))
            while not (pending := await service.pending(run.id)):
                assert not execution.done(), execution
                await asyncio.sleep(0.05)
            await asyncio.to_thread(_take_over, other, run.id)
            await service.answer(pending[0].id, answer, by="test")
            final = await asyncio.wait_for(execution, 60)
        assert (final.status, final.error) == ("awaiting_approval", None)
        assert final.plan is not None and final.plan.ids == ["a"]
        kinds = [event.kind for event in stalled.store.events(run.id)]
        assert not {decision, "approved", "plan_edited", "step_started"} & set(kinds)
        lease = other.lease(run.id)
        assert lease is not None and lease.owner == "other"
    finally:
        service.close()
        stalled.close()
    other.release(run.id, "other")
    going_on = Engine(Settings.load())
    try:
        final = await going_on.execute(run.id)  # the answer given is applied by the holder, once
        kinds = [event.kind for event in going_on.store.events(run.id)]
        assert kinds.count(decision) == 1
        if decision == "approved":
            assert (final.status, final.output) == ("succeeded", "A")
            assert kinds.count("step_started") == 1
        elif decision == "plan_edited":
            assert (final.status, final.output) == ("succeeded", "B")
            assert kinds.count("approved") == 1 and kinds.count("step_started") == 1
        else:
            assert (final.status, final.error) == ("cancelled", "rejected: no")
            assert "step_started" not in kinds
    finally:
        going_on.close()
        other.close()


async def test_a_process_that_lost_the_run_opens_no_review_after_a_refused_edit(
    database_url: str, write_script: Callable[..., Path]
) -> None:
    """A process stalls past its lease while the plan review is open; another takes the run over.

    The answer is an edit that cannot be applied (stored as a version that checked less stored
    it): it is refused, and the review is asked again. Before, the stalled process opened that
    second review (with its `approval_requested`) beside the holder's: opening a review was not
    bound to the lease. Now it opens nothing and stops; the holder refuses the edit and asks
    again, once.
    """
    from _answers import execute_answering

    from masterplanner.engine.store import RunStore

    script = write_script(
        [
            _planner(step("a", tools=[])),
            {"purpose": "prompt_creator", "output": "Do a.", "repeat": True},
            {"purpose": "step:a", "output": "A"},
        ]
    )
    other = RunStore(database_url)
    stalled = Engine(Settings.load(run_lease_s=1))
    unknown = {"action": "approve", "plan": {"task": "do a", "steps": [step("a", tools=["no_such_tool"])]}}

    def reviews(run_id: str) -> list[Any]:
        return [
            request for request in other.requests.find(run_id, state=None) if request.kind == "plan_review"
        ]

    async def stopped(execution: asyncio.Future[Any], run_id: str) -> Any:
        while not execution.done():
            assert len(await asyncio.to_thread(reviews, run_id)) == 1, "a second review was opened"
            await asyncio.sleep(0.05)
        return execution.result()

    try:
        run = stalled.create_run("do a", model=f"scripted:{script}", options=RunOptions(prompt_rounds=0))
        with pytest.MonkeyPatch.context() as patch:
            _stall(patch, stalled.store)  # its guard neither renews its lease nor sees it taken over
            execution = asyncio.ensure_future(stalled.execute(run.id))
            while not (asked := await asyncio.to_thread(reviews, run.id)):
                assert not execution.done(), execution
                await asyncio.sleep(0.05)
            await asyncio.to_thread(_take_over, other, run.id)
            await asyncio.to_thread(other.requests.answer, asked[0].id, unknown, by="test")
            final = await asyncio.wait_for(stopped(execution, run.id), 60)
        assert (final.status, final.error) == ("awaiting_approval", None)
        kinds = [event.kind for event in stalled.store.events(run.id)]
        assert (kinds.count("approval_requested"), "approved" in kinds) == (1, False)
        lease = other.lease(run.id)
        assert lease is not None and lease.owner == "other"
    finally:
        stalled.close()
    other.release(run.id, "other")
    going_on = Engine(Settings.load())

    async def approve(_run: Any, _catalog: Any) -> dict[str, Any]:
        return {"action": "approve"}

    try:
        final = await execute_answering(going_on, run.id, review=approve)
        assert (final.status, final.output) == ("succeeded", "A")
        first, second = reviews(run.id)
        assert (first.id, "refused_edit" in second.payload) == (asked[0].id, True)
        said = [event.data for event in going_on.store.events(run.id) if event.kind == "approval_requested"]
        assert said == [
            {"request": first.id},
            {"request": second.id, "refused_edit": second.payload["refused_edit"]},
        ]
    finally:
        going_on.close()
        other.close()
