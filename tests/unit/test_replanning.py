"""A plan that changes while it runs: failed steps replanned, outputs checked, steps expanded."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from _answers import execute_answering
from _cli import LEASE_S, answer, mp, pending, run_events, shown, start
from _faults import Killed, failing_as_the_event_is_written
from _plans import step

from masterplanner import DatabaseUnavailableError, RunError, Settings
from masterplanner.engine import Engine, RunOptions, RunRecord
from masterplanner.service import RunService

FAST = RunOptions(auto_approve=True, prompt_rounds=0, retry_backoff_s=0.01, step_attempts=2)
DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}
GARBAGE = {"tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True}


@pytest.fixture
def engine(isolated: Path) -> Iterator[Engine]:
    created = Engine(Settings.load())
    yield created
    created.close()


def _planner(*steps: dict[str, Any], purpose: str = "planner") -> dict[str, Any]:
    return {"purpose": purpose, "output": {"steps": list(steps)}}


def _events(engine: Engine, run_id: str, *kinds: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    events = engine.store.events(run_id)
    return [(event.kind, event.step, event.data) for event in events if event.kind in kinds]


def _started(engine: Engine, run_id: str) -> list[str | None]:
    return [step for kind, step, _ in _events(engine, run_id, "step_started")]


async def _opened(service: RunService, run_id: str, kind: str, *, besides: str = "") -> Any:
    """The run's open request of `kind` (not `besides`), once there is one."""
    while True:
        found = [r for r in await service.pending(run_id) if r.kind == kind and r.id != besides]
        if found:
            return found[0]
        await asyncio.sleep(0.05)


async def _replan_after_approving_the_plan(service: RunService, run_id: str) -> Any:
    """Approve the run's plan review as it opens; the replan request, once a failed step brings it."""
    await service.answer((await _opened(service, run_id, "plan_review")).id, {"action": "approve"}, by="test")
    return await _opened(service, run_id, "replan")


@asynccontextmanager
async def _executing_with_review(
    engine: Engine, script: Path, task: str = "replan it", *, workspace: Path | None = None
) -> AsyncIterator[tuple[RunRecord, RunService, asyncio.Future[RunRecord]]]:
    """A run of `script` with a review (FAST, not approved ahead) executing while the block runs:
    the run, a service to answer its requests, and its execution (cancelled if the block leaves
    it unfinished)."""
    options = replace(FAST, auto_approve=False)
    run = engine.create_run(task, model=f"scripted:{script}", options=options, workspace=workspace)
    service = RunService(engine.settings)
    execution = asyncio.ensure_future(engine.execute(run.id))
    try:
        yield run, service, execution
    finally:
        if not execution.done():
            execution.cancel()
        service.close()


def replan_script(write_script: Callable[..., Path], *, new_ids: tuple[str, str] = ("c1", "c2")) -> Path:
    """a and b succeed; c (after both) fails every attempt; the replanner puts c1 → c2 in its place."""
    first, second = new_ids
    return write_script(
        [
            _planner(step("a", tools=[]), step("b", tools=[]), step("c", "a", "b", tools=[])),
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b", "output": "B"},
            {"purpose": "step:c"} | GARBAGE,
            # the same proposal however often it is asked to repair it
            _planner(step(first, "a", "b", tools=[]), step(second, first, tools=[]), purpose="replanner")
            | {"repeat": True},
            {"purpose": f"step:{first}", "expect": ["A", "B"], "output": "C1"},
            {"purpose": f"step:{second}", "expect": ["C1"], "output": "C2"},
            DRAFTS,
        ]
    )


async def test_a_failed_step_is_replanned_and_finished_steps_never_run_again(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    run = engine.create_run("replan it", model=f"scripted:{replan_script(write_script)}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    assert final.output == "C2"
    assert sorted(_started(engine, run.id)) == ["a", "b", "c", "c1", "c2"]  # a and b once
    report = engine.report(run.id)
    assert [(s["id"], s["status"]) for s in report["steps"]] == [
        ("a", "succeeded"),
        ("b", "succeeded"),
        ("c", "replaced"),
        ("c1", "succeeded"),
        ("c2", "succeeded"),
    ]
    assert report["steps"][2]["error"].startswith("the model called no_such_tool")
    assert [s["id"] for s in report["plan"]["steps"]] == ["a", "b", "c1", "c2"]
    revisions = _events(engine, run.id, "replan_requested", "replanned")
    assert [(kind, where) for kind, where, _ in revisions] == [("replan_requested", "c"), ("replanned", "c")]
    assert revisions[1][2] == {"retired": ["c"], "steps": ["c1", "c2"], "by": "auto", "n": 1}
    assert report["usage"]["by_purpose"]["replanner"]["calls"] == 1
    assert set(engine.store.get_run(run.id).agents) == {"a", "b", "c1", "c2"}


async def test_a_step_named_as_a_replan_once_was_is_the_step_s_alone(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """Step `replan-1` ran; the first replan is the run's own workflow, not the step's outcome.

    Before, the replan's workflow took step `replan-1`'s id and the run failed with DBOS's
    conflicting-workflow error.
    """
    script = write_script(
        [
            _planner(step("replan-1", tools=[]), step("c", "replan-1", tools=[])),
            {"purpose": "step:replan-1", "output": "R"},
            {"purpose": "step:c"} | GARBAGE,
            _planner(step("c1", "replan-1", tools=[]), purpose="replanner") | {"repeat": True},
            {"purpose": "step:c1", "expect": ["R"], "output": "C1"},
            DRAFTS,
        ]
    )
    run = engine.create_run("replan it", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert (final.status, final.error, final.output) == ("succeeded", None, "C1")
    assert [(s["id"], s["status"]) for s in engine.report(run.id)["steps"]] == [
        ("replan-1", "succeeded"),
        ("c", "replaced"),
        ("c1", "succeeded"),
    ]
    (replanned,) = _events(engine, run.id, "replanned")
    assert replanned == ("replanned", "c", {"retired": ["c"], "steps": ["c1"], "by": "auto", "n": 1})


async def test_a_step_named_as_an_expansion_once_was_is_the_step_s_alone(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """Step `expand-b` ran before `b` was expanded: `b`'s sub-plan is not `expand-b`'s outcome."""
    script = write_script(
        [
            _planner(step("expand-b", tools=[]), step("b", "expand-b", tools=[]) | {"expand": True}),
            {"purpose": "step:expand-b", "output": "E"},
            {"purpose": "planner", "expect": ["- expand-b: E"], "output": {"steps": [step("x", tools=[])]}},
            {"purpose": "step:b--x", "expect": ["E"], "output": "X"},
            DRAFTS,
        ]
    )
    run = engine.create_run("expand b", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert (final.status, final.error, final.output) == ("succeeded", None, "X")
    report = engine.report(run.id)
    assert [(s["id"], s["status"]) for s in report["steps"]] == [("expand-b", "succeeded"), ("b", "expanded")]
    assert [(s["id"], s["status"]) for s in report["steps"][1]["sub_steps"]] == [("b--x", "succeeded")]


async def test_a_replan_naming_a_step_after_the_one_it_replaces_gets_a_fresh_id(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    # The embedded model's replanner named the new step after the failed one at every repair and
    # the run failed ("that id was used earlier in this run; choose a new id"): the new step is
    # renamed c-2, and the other new step's dependency on "c" is on it.
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", tools=[]), step("c", "a", "b", tools=[])),
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b", "output": "B"},
            {"purpose": "step:c"} | GARBAGE,
            _planner(step("c", "a", "b", tools=[]), step("c2", "c", tools=[]), purpose="replanner"),
            {"purpose": "step:c-2", "expect": ["A", "B"], "output": "C1"},
            {"purpose": "step:c2", "expect": ["C1"], "output": "C2"},
            DRAFTS,
        ]
    )
    run = engine.create_run("same id", model=f"scripted:{script}", options=replace(FAST, max_replans=1))
    final = await engine.execute(run.id)
    assert (final.status, final.error, final.output) == ("succeeded", None, "C2")
    report = engine.report(run.id)
    assert [(s["id"], s["status"]) for s in report["steps"]] == [
        ("a", "succeeded"),
        ("b", "succeeded"),
        ("c", "replaced"),
        ("c-2", "succeeded"),
        ("c2", "succeeded"),
    ]
    assert [(s["id"], s["depends_on"]) for s in report["plan"]["steps"]][2:] == [
        ("c-2", ["a", "b"]),
        ("c2", ["c-2"]),
    ]
    assert report["usage"]["by_purpose"]["replanner"]["calls"] == 1
    (replanned,) = _events(engine, run.id, "replanned")
    assert replanned[2]["steps"] == ["c-2", "c2"]


def _send(purpose: str, to: str, content: str) -> dict[str, Any]:
    return {
        "purpose": purpose,
        "tool_calls": [{"name": "send_message", "args": {"to": to, "content": content}}],
    }


async def test_messages_to_replaced_steps_are_handed_on_to_the_steps_in_their_place(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    # a messages b (which is shown it, then fails) and c (which never starts); the replan puts
    # b1 → c1 in the place of both: each gets both messages, marked with where they were sent and
    # which steps have them (before, each was told "whose place your step took", as if alone)
    shown_to_b = "message #1 from step a: Use metric units."
    handed = [
        "message #{} from step a (sent to step b, whose place steps b1, c1 took; yours is one of "
        "them): Use metric units.",
        "message #{} from step a (sent to step c, whose place steps b1, c1 took; yours is one of "
        "them): Round to 2 places.",
    ]
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=[]), step("c", "b", tools=[])),
            _send("step:a", "b", "Use metric units."),
            _send("step:a", "c", "Round to 2 places."),
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b", "expect": [shown_to_b]} | GARBAGE,
            _planner(step("b1", "a", tools=[]), step("c1", "b1", tools=[]), purpose="replanner")
            | {"repeat": True},
            _send("step:b1", "c", "Are you there?") | {"expect": [handed[0].format(3), handed[1].format(5)]},
            {
                "purpose": "step:b1",
                "expect": [
                    "not sent: step c was replaced when the plan changed; the other steps still to "
                    "finish are: c1"
                ],
                "output": "B1",
            },
            {"purpose": "step:c1", "expect": [handed[0].format(4), handed[1].format(6)], "output": "C1"},
            DRAFTS,
        ]
    )
    run = engine.create_run("hand on", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    rows = [
        (m.id, m.recipient, m.state, m.handed_from, m.answer) for m in engine.store.messages.of_run(run.id)
    ]
    assert rows == [
        (1, "b", "delivered", None, None),
        (2, "c", "closed", None, "handed on to steps b1, c1, which took its recipient's place"),
        (3, "b1", "delivered", "b", None),
        (4, "c1", "delivered", "b", None),
        (5, "b1", "delivered", "c", None),
        (6, "c1", "delivered", "c", None),
    ]


async def test_replans_stop_at_the_run_s_bound(engine: Engine, write_script: Callable[..., Path]) -> None:
    script = replan_script(write_script)
    run = engine.create_run("no replans", model=f"scripted:{script}", options=replace(FAST, max_replans=0))
    final = await engine.execute(run.id)
    assert final.status == "failed"
    assert final.error is not None and final.error.startswith("step c failed: the model called no_such_tool")
    assert _events(engine, run.id, "replan_requested", "replanned", "replan_failed") == []


async def test_a_rejected_replan_is_named_in_the_run_s_error(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    async with _executing_with_review(engine, replan_script(write_script)) as (run, service, execution):
        replan = await _replan_after_approving_the_plan(service, run.id)
        await service.answer(replan.id, {"action": "reject", "reason": "not like that"}, by="test")
        final = await asyncio.wait_for(execution, 60)
    assert final.status == "failed"
    assert final.error is not None and final.error.startswith("step c failed: the model called no_such_tool")
    assert final.error.endswith(" (its replan was rejected by test: not like that)")


@pytest.mark.parametrize("front_end", ["runs answer --deny", "the others"])
async def test_a_rejection_with_no_reason_says_so_in_the_same_words_from_every_front_end(
    engine: Engine, write_script: Callable[..., Path], front_end: str
) -> None:
    """A plan's rejection and a replan's, with no reason given.

    It was "rejected" from `runs answer --deny` and "rejected at review" from the others (the
    terminal, the web page, the API): the run's error said "rejected: rejected".
    """

    async def reject(service: RunService, request_id: str) -> None:
        if front_end == "runs answer --deny":
            await service.answer_plainly(request_id, approve=False, by="test")
        else:
            await service.answer(request_id, {"action": "reject"}, by="test")

    options = replace(FAST, auto_approve=False)
    scripts = [f"scripted:{replan_script(write_script)}" for _ in range(2)]
    replanned = engine.create_run("replan it", model=scripts[0], options=options)
    reviewed = engine.create_run("reject it", model=scripts[1], options=options)
    service = RunService(engine.settings)
    try:
        execution = asyncio.ensure_future(engine.execute(replanned.id))
        await reject(service, (await _replan_after_approving_the_plan(service, replanned.id)).id)
        failed = await asyncio.wait_for(execution, 60)
        execution = asyncio.ensure_future(engine.execute(reviewed.id))
        await reject(service, (await _opened(service, reviewed.id, "plan_review")).id)
        rejected = await asyncio.wait_for(execution, 60)
    finally:
        service.close()
    assert failed.status == "failed"
    assert failed.error is not None
    assert failed.error.endswith(" (its replan was rejected by test: no reason given)")
    assert [data for *_, data in _events(engine, failed.id, "replan_failed")] == [
        {"n": 1, "rejected": "no reason given", "by": "test"}
    ]
    assert (rejected.status, rejected.error) == ("cancelled", "rejected: no reason given")
    assert [data for *_, data in _events(engine, rejected.id, "rejected")] == [
        {"reason": "no reason given", "by": "test"}
    ]


@pytest.mark.parametrize(
    ("replanner", "why"),
    [
        ([], "it could not be replanned: "),  # its model call fails: no entry left for it
        (  # its plan is refused: it names a step there is none of, however often it is repaired
            [_planner(step("b2", "nowhere", tools=[]), purpose="replanner") | {"repeat": True}],
            "replanning it found no valid plan",
        ),
    ],
    ids=["model call failed", "plan refused"],
)
async def test_the_dependents_of_a_step_whose_replan_failed_are_skipped_for_it_not_cancelled(
    engine: Engine, write_script: Callable[..., Path], replanner: list[dict[str, Any]], why: str
) -> None:
    script = write_script(
        [
            _planner(
                step("a", tools=[]),
                step("b", "a", tools=[]),
                step("c", "b", tools=[]),
                step("d", "c", tools=[]),
            ),
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b"} | GARBAGE,
            *replanner,
            DRAFTS,
        ]
    )
    run = engine.create_run("replan it", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "failed"
    assert final.error is not None and why in final.error
    # as `runs show`, the live view and the run page show them: not run because b failed and
    # could not be replanned (they said only that b failed), not cancelled as if a person had
    # stopped them
    report = engine.report(run.id)
    assert [(s["id"], s["status"], s["error"]) for s in report["steps"][1:]] == [
        ("b", "failed", report["steps"][1]["error"]),
        ("c", "skipped", "dependency 'b' failed and could not be replanned"),
        ("d", "skipped", "dependency 'c' skipped"),
    ]
    assert report["steps"][1]["error"].startswith("the model called no_such_tool")
    assert _started(engine, run.id) == ["a", "b"]


@pytest.mark.parametrize(
    ("replanner", "why"),
    [
        ([], " (it could not be replanned: "),  # no answer for the replanner: its model call fails
        (  # no valid plan: the run's error names the planner's problems, as the first execution's did
            [_planner(step("b2", "nowhere", tools=[]), purpose="replanner") | {"repeat": True}],
            " (it could not be replanned: step 'b2': depends on unknown step 'nowhere')",
        ),
    ],
    ids=["model call failed", "plan refused"],
)
async def test_a_resumed_run_skips_the_dependents_of_a_step_whose_replan_failed_for_it(
    engine: Engine,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    replanner: list[dict[str, Any]],
    why: str,
) -> None:
    """The execution stopped after b's replan failed (its model call, or no valid plan) and before
    its dependents were skipped. Resumed, the failed replan was taken for a rejected one: c was
    skipped saying only "dependency 'b' failed", not that b could not be replanned; and a refused
    plan's problems were left out of the run's error."""
    import threading

    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=[]), step("c", "b", tools=[])),
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b"} | GARBAGE,
            *replanner,
            DRAFTS,
        ]
    )
    run = engine.create_run("replan it", model=f"scripted:{script}", options=FAST)
    recorded = engine.store.update_step
    skipping, stopped = threading.Event(), threading.Event()

    def held(run_id: str, step_id: str, **values: Any) -> None:
        if values.get("status") == "skipped" and not stopped.is_set():
            skipping.set()
            stopped.wait(30)  # the execution is stopped meanwhile: the skip is never written
            return
        recorded(run_id, step_id, **values)

    monkeypatch.setattr(engine.store, "update_step", held)
    execution = asyncio.ensure_future(engine.execute(run.id))
    while not skipping.is_set():
        assert not execution.done(), execution
        await asyncio.sleep(0.05)
    execution.cancel()
    await asyncio.gather(execution, return_exceptions=True)
    stopped.set()
    monkeypatch.setattr(engine.store, "update_step", recorded)
    assert [(s.id, s.status) for s in engine.store.steps(run.id)] == [
        ("a", "succeeded"),
        ("b", "failed"),
        ("c", "pending"),
    ]

    final = await engine.execute(run.id)
    assert final.status == "failed"
    assert final.error is not None and why in final.error, final.error
    report = engine.report(run.id)
    assert [(s["id"], s["status"], s["error"]) for s in report["steps"][2:]] == [
        ("c", "skipped", "dependency 'b' failed and could not be replanned")
    ]
    assert len(_events(engine, run.id, "replan_failed")) == 1  # not asked again


def _chain_script(write_script: Callable[..., Path], *replanner: dict[str, Any]) -> Path:
    """a → b → c → d; b fails every attempt, then the replanner is asked (b2 → c2 in its place)."""
    return write_script(
        [
            _planner(
                step("a", tools=[]),
                step("b", "a", tools=[]),
                step("c", "b", tools=[]),
                step("d", "c", tools=[]),
            ),
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b"} | GARBAGE,
            *(
                replanner
                or [_planner(step("b2", "a", tools=[]), step("c2", "b2", tools=[]), purpose="replanner")]
            ),
            {"purpose": "step:b2", "output": "B2"},
            {"purpose": "step:c2", "output": "C2"},
            DRAFTS,
        ]
    )


async def test_the_dependents_of_a_step_whose_replan_was_rejected_say_so_in_their_skip(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """Their skip said only "dependency 'b' failed", while the run's error said the replan was rejected."""
    options = replace(FAST, auto_approve=False)
    run = engine.create_run("replan it", model=f"scripted:{_chain_script(write_script)}", options=options)
    service = RunService(engine.settings)
    try:
        execution = asyncio.ensure_future(engine.execute(run.id))
        replan = await _replan_after_approving_the_plan(service, run.id)
        await service.answer(replan.id, {"action": "reject", "reason": "not like that"}, by="test")
        final = await asyncio.wait_for(execution, 60)
    finally:
        service.close()
    assert final.status == "failed"
    assert final.error is not None
    assert final.error.endswith(
        " (its replan was rejected by test: not like that); step c skipped: dependency 'b' failed and its "
        "replan was rejected; step d skipped: dependency 'c' skipped"
    )
    steps = [(s["id"], s["status"], s["error"]) for s in engine.report(run.id)["steps"][2:]]
    assert steps == [
        ("c", "skipped", "dependency 'b' failed and its replan was rejected"),
        ("d", "skipped", "dependency 'c' skipped"),
    ]
    assert _started(engine, run.id) == ["a", "b"]
    # a process taking the run over after the rejection (its dependents not yet skipped) says the
    # same, whatever replans are left: it said nothing of the replan
    from types import SimpleNamespace

    from masterplanner.engine.revisions import PlanRevisions
    from masterplanner.engine.scheduler import StepOutcome

    plan = engine.store.get_run(run.id).plan
    assert plan is not None
    resources = SimpleNamespace(store=engine.store, run_id=run.id)
    revisions = PlanRevisions(resources, owner="taking-over")  # type: ignore[arg-type]
    taken_over = await revisions.on_failure(plan.step("b"), StepOutcome("failed", error="b failed"))
    assert taken_over == "its replan was rejected"


def _stopped_by_the_run_s_error(engine: Engine, run_id: str) -> None:
    """b failed, and its dependents were stopped with the run (its end cancels what had not run)."""
    steps = [(s["id"], s["status"], s["error"]) for s in engine.report(run_id)["steps"]]
    assert steps[1][:2] == ("b", "failed") and steps[1][2].startswith("the model called no_such_tool")
    assert steps[2:] == [("c", "cancelled", None), ("d", "cancelled", None)]
    assert _started(engine, run_id) == ["a", "b"]


async def test_the_dependents_of_a_step_whose_replan_the_database_stopped_are_not_skipped_for_it(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replan found a plan; the database could not store it (a Postgres restart longer than
    a store call waits). Before, every error out of a replan had its step's dependents recorded
    `skipped` ('dependency 'b' failed'), as if the replan had found no valid plan: a run stopped
    to resume then showed them so, and kept that error on them once the redone replan replaced them."""
    away = "the database at postgresql://db.example/runs cannot be reached (the connection was refused)"

    def unreachable(*_args: Any, **_kwargs: Any) -> None:
        raise DatabaseUnavailableError(f"{away}: cannot revise the plan")

    monkeypatch.setattr(engine.store, "record_revision", unreachable)
    run = engine.create_run("replan it", model=f"scripted:{_chain_script(write_script)}", options=FAST)
    final = await engine.execute(run.id)
    assert (final.status, final.error) == ("failed", f"{away}: cannot revise the plan")
    _stopped_by_the_run_s_error(engine, run.id)


async def test_the_dependents_of_a_step_whose_replan_review_expired_are_not_skipped_for_it(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """The replan's review was closed unanswered (as the run's end by another process closes its
    requests): the run fails for that, not because the replan found no plan."""
    async with _executing_with_review(engine, _chain_script(write_script)) as (run, service, execution):
        replan = await _replan_after_approving_the_plan(service, run.id)
        assert engine.store.requests.close_run(run.id, "expired", keep_remember=True) == 1
        final = await asyncio.wait_for(execution, 60)
    assert (final.status, final.error) == (
        "failed",
        f"the replan of step b (request {replan.id}) was expired",
    )
    _stopped_by_the_run_s_error(engine, run.id)


async def test_a_replan_with_no_valid_plan_stays_the_run_s_error_when_skipping_its_dependents_fails(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the failure to record the skip replaced the planner's problems as the run's error."""
    refused = _planner(step("b2", "nowhere", tools=[]), purpose="replanner") | {"repeat": True}
    recorded = engine.store.update_step

    def full(run_id: str, step_id: str, **values: Any) -> None:
        if values.get("status") == "skipped":
            raise RunError("database sqlite:///runs.sqlite: cannot update a step: database or disk is full")
        recorded(run_id, step_id, **values)

    monkeypatch.setattr(engine.store, "update_step", full)
    script = _chain_script(write_script, refused)
    run = engine.create_run("replan it", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "failed" and final.error is not None
    assert final.error.startswith("step b failed (the model called no_such_tool"), final.error
    assert "replanning it found no valid plan" in final.error and "disk is full" not in final.error
    _stopped_by_the_run_s_error(engine, run.id)  # not recorded skipped: the run's end stopped them


async def test_an_output_that_falls_short_of_its_expected_output_is_replanned(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=[])),
            {"purpose": "step:a", "output": "a list of two colours"},
            {"purpose": "checker", "output": {"meets": True, "reason": "it is done"}},
            {"purpose": "step:b", "output": "nothing useful"},
            {
                "purpose": "checker",
                "expect": ["Expected output: b done", "nothing useful"],
                "output": {"meets": False, "reason": "it does not say b is done"},
            },
            _planner(step("b2", "a", tools=[]), purpose="replanner"),
            {"purpose": "step:b2", "output": "b done"},
            {"purpose": "checker", "output": {"meets": True, "reason": "says b is done"}},
            DRAFTS,
        ]
    )
    options = replace(FAST, check_outputs=True)
    run = engine.create_run("checked", model=f"scripted:{script}", options=options)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    assert final.output == "b done"
    checks = _events(engine, run.id, "output_checked")
    assert [(where, data["meets"]) for _, where, data in checks] == [("a", True), ("b", False), ("b2", True)]
    steps = {s["id"]: s for s in engine.report(run.id)["steps"]}
    assert steps["b"]["status"] == "replaced"
    assert steps["b"]["error"] == (
        "its output does not meet the expected output (b done): it does not say b is done"
    )


async def test_an_expand_step_runs_as_a_sub_plan_shown_under_it(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            _planner(
                step("a", tools=[]), step("b", "a", tools=[]) | {"expand": True}, step("c", "b", tools=[])
            ),
            {"purpose": "step:a", "output": "A-DATA"},
            # the sub-plan is made when b is ready, with a's output in view
            {
                "purpose": "planner",
                "expect": ["Break this one step", "- a: A-DATA"],
                "output": {"steps": [step("x", tools=[]), step("y", "x", tools=[])]},
            },
            {"purpose": "step:b--x", "expect": ["A-DATA"], "output": "X"},
            {"purpose": "step:b--y", "expect": ["X"], "output": "Y"},
            {"purpose": "step:c", "expect": ["Y"], "output": "C"},
            DRAFTS,
        ]
    )
    run = engine.create_run("expand b", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    assert final.output == "C"
    report = engine.report(run.id)
    assert [(s["id"], s["status"]) for s in report["steps"]] == [
        ("a", "succeeded"),
        ("b", "expanded"),
        ("c", "succeeded"),
    ]
    assert [(s["id"], s["status"]) for s in report["steps"][1]["sub_steps"]] == [
        ("b--x", "succeeded"),
        ("b--y", "succeeded"),
    ]
    assert "b" not in _started(engine, run.id)
    (expanded,) = _events(engine, run.id, "step_expanded")
    assert expanded == ("step_expanded", "b", {"retired": ["b"], "steps": ["b--x", "b--y"], "by": "auto"})
    plan = {s["id"]: s for s in report["plan"]["steps"]}
    assert plan["c"]["depends_on"] == ["b--y"]
    assert plan["b--x"]["depends_on"] == ["a"]
    # the CLI shows the same tree
    listed = shown(run.id)["steps"]
    assert [s["id"] for s in listed] == ["a", "b", "c"]
    assert [s["id"] for s in listed[1]["sub_steps"]] == ["b--x", "b--y"]
    text = mp("runs", "show", run.id).stdout
    assert "│   └ b--x │ succeeded │" in text
    assert "step_expanded b into b--x, b--y (by auto)" in text


async def test_a_sub_plan_naming_a_tool_its_step_was_not_approved_with_is_refused(
    engine: Engine, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    # the approved step may read files; its sub-plan proposes a step that remembers and writes
    evil = step("evil", tools=["remember", "write_file"])
    script = write_script(
        [
            _planner(step("work", tools=["read_file"]) | {"expand": True}),
            {"purpose": "planner", "output": {"steps": [evil]}, "repeat": True},
            {"purpose": "step:work", "output": "WORKED"},
            DRAFTS,
        ]
    )
    workspace = tmp_path / "ws"
    run = engine.create_run("expand work", model=f"scripted:{script}", options=FAST, workspace=workspace)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    assert final.output == "WORKED"  # the step ran as itself, with its own tools
    (failed,) = _events(engine, run.id, "expand_failed")
    assert failed == (
        "expand_failed",
        "work",
        {
            "problems": [
                "step 'evil': tool 'remember' is not one of the tools step 'work' was approved with"
                " (a sub-step may use only those: read_file)",
                "step 'evil': tool 'write_file' is not one of the tools step 'work' was approved with"
                " (a sub-step may use only those: read_file)",
            ]
        },
    )
    assert [s.id for s in engine.store.steps(run.id)] == ["work"]
    assert "work--evil" not in engine.store.get_run(run.id).agents


async def test_a_sub_step_keeps_the_tool_policies_set_for_its_step_at_review(
    engine: Engine, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    write = {"name": "write_file", "args": {"path": "out.txt", "content": "x"}}
    script = write_script(
        [
            _planner(step("work", tools=["read_file", "write_file"]) | {"expand": True}),
            {"purpose": "planner", "output": {"steps": [step("save", tools=["write_file"])]}},
            {"purpose": "step:work--save", "tool_calls": [write]},
            {"purpose": "step:work--save", "output": "SAVED"},
            DRAFTS,
        ]
    )

    async def review(run: Any, _catalog: Any) -> dict[str, Any]:
        agents = {step_id: agent.to_json_dict() for step_id, agent in run.agents.items()}
        work = agents["work"] | {"tool_policies": {"write_file": "deny"}}
        return {"action": "approve", "plan": run.plan.to_json_dict(), "agents": agents | {"work": work}}

    workspace = tmp_path / "ws"
    options = RunOptions(prompt_rounds=0, retry_backoff_s=0.01)
    run = engine.create_run("expand work", model=f"scripted:{script}", options=options, workspace=workspace)
    final = await execute_answering(engine, run.id, review=review)
    assert final.status == "succeeded", final.error
    assert not (workspace / "out.txt").exists()
    denied = [(e.step, e.data) for e in engine.store.events(run.id) if e.kind == "tool_denied"]
    assert denied == [("work--save", {"tool": "write_file", "by": "policy"})]
    assert engine.store.get_run(run.id).agents["work--save"].tool_policies == {"write_file": "deny"}


async def test_the_steps_of_a_replan_keep_the_tool_policies_set_at_review_for_the_steps_they_replace(
    engine: Engine, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """The replacement of a step whose write_file the person denied at review wrote the file."""
    write = {"name": "write_file", "args": {"path": "out.txt", "content": "x"}}
    script = write_script(
        [
            _planner(step("a", tools=[]), step("c", "a", tools=["write_file", "read_file"])),
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:c"} | GARBAGE,
            _planner(step("c1", "a", tools=["write_file", "read_file"]), purpose="replanner")
            | {"repeat": True},
            {"purpose": "step:c1", "tool_calls": [write]},
            {"purpose": "step:c1", "output": "C1"},
            DRAFTS,
        ]
    )
    workspace = tmp_path / "ws"
    async with _executing_with_review(engine, script, "replan c", workspace=workspace) as (
        run,
        service,
        execution,
    ):
        review = await _opened(service, run.id, "plan_review")
        agents = review.payload["agents"]
        denied = {"write_file": "deny", "read_file": "ask"}
        c = agents["c"] | {"tool_policies": denied}
        await service.answer(review.id, {"action": "approve", "agents": agents | {"c": c}}, by="test")
        request = await _opened(service, run.id, "replan")
        shown = request.payload["agents"]["c1"]
        assert shown["tool_policies"] == denied  # the person sees what the new step keeps
        # an answer that loosens them (as a client sending back an edited agent might) is
        # refused, saying why, and asked again; one that tightens them is taken
        loosened = shown | {"tool_policies": {"write_file": "auto", "read_file": "deny"}}
        await service.answer(request.id, {"action": "approve", "agents": {"c1": loosened}}, by="test")
        again = await asyncio.wait_for(_opened(service, run.id, "replan", besides=request.id), 60)
        assert again.payload["refused_edit"] == (
            "step 'c1': write_file is 'deny' for the steps it replaces (set at review), "
            "so it cannot be 'auto' here"
        )
        tightened = shown | {"tool_policies": {"read_file": "deny"}}
        await service.answer(again.id, {"action": "approve", "agents": {"c1": tightened}}, by="test")
        final = await asyncio.wait_for(execution, 60)
    assert (final.status, final.output) == ("succeeded", "C1"), final.error
    assert not (workspace / "out.txt").exists()
    refused = [(e.step, e.data) for e in engine.store.events(run.id) if e.kind == "tool_denied"]
    assert refused == [("c1", {"tool": "write_file", "by": "policy"})]
    kept = engine.store.get_run(run.id).agents["c1"].tool_policies
    assert kept == {"write_file": "deny", "read_file": "deny"}  # the stricter of each


def test_without_yes_the_replan_is_a_request_answered_from_another_process(
    write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTERPLANNER_RUN_LEASE_S", str(LEASE_S))
    script = replan_script(write_script)
    calls = json.loads(script.read_text())["calls"]
    note = {"name": "set_note", "args": {"key": "unit", "value": "metres"}}
    calls.insert(1, {"purpose": "step:a", "tool_calls": [note]})  # a leaves a note first
    script.write_text(json.dumps({"calls": calls}))
    run = start("run", "replan it", "--model", f"scripted:{script}", "--rounds", "0", "--json")
    try:
        answer(pending("plan_review")["id"], "--approve")
        request = pending("replan")
        assert request["step_id"] == "c"
        payload = request["payload"]
        assert (payload["replaced_steps"], payload["new_steps"]) == (["c"], ["c1", "c2"])
        assert payload["error"].startswith("the model called no_such_tool")
        assert [s["id"] for s in payload["plan"]["steps"]] == ["a", "b", "c1", "c2"]
        assert [(n["key"], n["value"], n["step"]) for n in payload["notes"]] == [("unit", "metres", "a")]
        listed = mp("runs", "pending")
        assert "step c failed: run new steps c1, c2 in its place? approve, reject or edit" in listed.stdout
        answer(request["id"], "--approve")
        out, err = run.communicate(timeout=90)
    finally:
        run.kill()
    assert run.returncode == 0, err
    report = json.loads(out)
    assert (report["status"], report["output"]) == ("succeeded", "C2")
    started = [e["step"] for e in run_events(report["run_id"]) if e["kind"] == "step_started"]
    assert sorted(started) == ["a", "b", "c", "c1", "c2"]  # a and b once
    replanned = next(e for e in run_events(report["run_id"]) if e["kind"] == "replanned")
    assert replanned["data"]["by"].startswith("cli@")
    assert [(s["id"], s["status"]) for s in shown(report["run_id"])["steps"]] == [
        ("a", "succeeded"),
        ("b", "succeeded"),
        ("c", "replaced"),
        ("c1", "succeeded"),
        ("c2", "succeeded"),
    ]
    text = mp("runs", "show", report["run_id"])
    assert text.returncode == 0, text.stderr
    assert "replanned c into c1, c2 (by cli@" in text.stdout


async def test_an_edited_replan_is_applied_and_one_that_cannot_be_is_asked_again(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """Every edit of a replan failed the run: the failed step it replaces counted as "has run"."""
    async with _executing_with_review(engine, replan_script(write_script)) as (run, service, execution):
        first = await _replan_after_approving_the_plan(service, run.id)
        plan = first.payload["plan"]
        # the retired step's agent is not offered back (the run page sent it, and was refused)
        assert set(first.payload["agents"]) == {"a", "b", "c1", "c2"}
        finished_changed = {**plan, "steps": [{**plan["steps"][0], "title": "redo a"}, *plan["steps"][1:]]}
        await service.answer(first.id, {"action": "approve", "plan": finished_changed}, by="test")
        again = await _opened(service, run.id, "replan", besides=first.id)
        assert again.payload["refused_edit"] == "step 'a': it has run, so it cannot change"
        reworded = {**plan, "steps": [*plan["steps"][:3], {**plan["steps"][3], "instruction": "Do c2 well."}]}
        await service.answer(again.id, {"action": "approve", "plan": reworded}, by="test")
        final = await asyncio.wait_for(execution, 60)
    assert (final.status, final.output) == ("succeeded", "C2"), final.error
    assert final.plan is not None and final.plan.step("c2").instruction == "Do c2 well."
    assert sorted(_started(engine, run.id)) == ["a", "b", "c", "c1", "c2"]  # a and b once


async def test_independent_steps_go_on_while_a_replan_waits_for_its_review(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """b2 (after b, on another branch than the failed a) started only once the replan was answered."""
    script = write_script(
        [
            _planner(
                step("a", tools=[]),
                step("b", tools=[]),
                step("b2", "b", tools=[]),
                step("z", "a", "b2", tools=[]),
            ),
            {"purpose": "step:a"} | GARBAGE,
            {"purpose": "step:b", "output": "B", "delay_s": 0.5},
            {"purpose": "step:b2", "output": "B2"},
            _planner(step("a2", tools=[]), step("z2", "a2", "b2", tools=[]), purpose="replanner")
            | {"repeat": True},
            {"purpose": "step:a2", "output": "A2"},
            {"purpose": "step:z2", "expect": ["A2", "B2"], "output": "Z2"},
            DRAFTS,
        ]
    )
    async with _executing_with_review(engine, script, "branches") as (run, service, execution):
        replan = await _replan_after_approving_the_plan(service, run.id)
        while "b2" not in [step.id for step in engine.store.steps(run.id) if step.status == "succeeded"]:
            assert not execution.done(), execution.result().error
            await asyncio.sleep(0.05)
        assert (await service.request(replan.id)).state == "open"  # b2 ran while the review waited
        await service.answer(replan.id, {"action": "approve"}, by="test")
        final = await asyncio.wait_for(execution, 60)
    assert (final.status, final.output) == ("succeeded", "Z2"), final.error


async def test_a_retry_after_a_replan_review_that_expired_asks_again(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """The retry found the expired request of the failed run again, and failed again at once."""
    options = replace(FAST, auto_approve=False, max_wall_s=2.0)
    run = engine.create_run("replan it", model=f"scripted:{replan_script(write_script)}", options=options)
    service = RunService(engine.settings)

    try:
        execution = asyncio.ensure_future(engine.execute(run.id))
        left = await _replan_after_approving_the_plan(service, run.id)  # left: the seconds run out
        failed = await asyncio.wait_for(execution, 30)
        assert failed.status == "failed" and "wall-time budget" in (failed.error or ""), failed.error
        engine.retry(run.id, max_wall_s=600)
        execution = asyncio.ensure_future(engine.execute(run.id))
        fresh = await asyncio.wait_for(_opened(service, run.id, "replan"), 30)
        assert fresh.id != left.id
        await service.answer(fresh.id, {"action": "approve"}, by="test")
        final = await asyncio.wait_for(execution, 60)
    finally:
        service.close()
    assert (final.status, final.output) == ("succeeded", "C2"), final.error


async def test_the_audit_names_who_created_a_run_approved_with_no_review_for_its_plan_and_replan(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    from masterplanner import RunService

    service = RunService(Settings.load())
    try:
        model = f"scripted:{replan_script(write_script)}"
        run = await service.create("replan it", model=model, options=FAST, by="nightly-job@ci:7")
        assert (await service.execute(run.id)).status == "succeeded"
        entries = await service.audit(run.id)
        library = await service.create("made by the library", model=model, options=FAST)
        (made,) = await service.audit(library.id)
    finally:
        service.close()
    with_no_review = "with no review (the run was created to be approved so)"
    assert [(entry.by, entry.action, entry.step) for entry in entries] == [
        ("nightly-job@ci:7", "created the run", None),
        ("nightly-job@ci:7", f"approved the plan {with_no_review}", None),
        ("nightly-job@ci:7", f"approved the replan of step c {with_no_review}", "c"),
    ]
    assert [entry.at for entry in entries] == sorted(entry.at for entry in entries)
    assert (made.action, made.front_end) == ("created the run", "library")


async def _replan_answered(
    engine: Engine, script: Path, answer_of: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[Any, list[str], dict[str, Any]]:
    """Run `script` with a review; answer its replan with `answer_of(payload)`.

    The run as it ended, its audit's actions and the replan request's payload.
    """
    async with _executing_with_review(engine, script) as (run, service, execution):
        request = await asyncio.wait_for(_replan_after_approving_the_plan(service, run.id), 30)
        await service.answer(request.id, answer_of(request.payload), by="test")
        final = await asyncio.wait_for(execution, 60)
        audit = [entry.action for entry in await service.audit(run.id)]
    return final, audit, request.payload


async def test_a_replan_answered_as_proposed_is_no_edit(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """Front ends send the whole proposal back: it was recorded as the person's edit of all of it."""

    def as_shown(payload: dict[str, Any]) -> dict[str, Any]:  # as the web form sends it
        agents = {
            step_id: {**agent, "prompt": agent["prompt"] + "\n"}
            for step_id, agent in payload["agents"].items()
        }
        return {
            "action": "approve",
            "plan": payload["plan"],
            "agents": agents,
            "tool_policies": payload["tool_policies"],
        }

    final, audit, payload = await _replan_answered(engine, replan_script(write_script), as_shown)
    assert (final.status, final.output) == ("succeeded", "C2"), final.error
    assert audit[-1] == "approved the replan of step c"
    assert {step_id: final.agents[step_id].to_json_dict() for step_id in ("c1", "c2")} == {
        step_id: payload["agents"][step_id] for step_id in ("c1", "c2")
    }


async def test_a_replan_s_answer_naming_one_step_s_agent_keeps_the_others_as_proposed(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """The plan sent back as proposed beside it counted as an edit of the plan."""

    def one_prompt(payload: dict[str, Any]) -> dict[str, Any]:
        c1 = {**payload["agents"]["c1"], "prompt": "You write C1 carefully.", "edited": True}
        return {"action": "approve", "plan": payload["plan"], "agents": {"c1": c1}}

    final, audit, payload = await _replan_answered(engine, replan_script(write_script), one_prompt)
    assert (final.status, final.output) == ("succeeded", "C2"), final.error
    assert audit[-1] == "approved the replan of step c with edits to the prompts of c1"
    assert (final.agents["c1"].prompt, final.agents["c1"].edited) == ("You write C1 carefully.", True)
    assert final.agents["c2"].to_json_dict() == payload["agents"]["c2"]


async def test_a_replan_s_answer_changing_the_run_s_tool_policies_is_refused_and_asked_again(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    """The run-wide policies of a replan's answer (the run page's form shows them) were dropped silently."""
    async with _executing_with_review(engine, replan_script(write_script)) as (run, service, execution):
        first = await asyncio.wait_for(_replan_after_approving_the_plan(service, run.id), 30)
        answer = {"action": "approve", "plan": first.payload["plan"], "tool_policies": {"read_file": "deny"}}
        await service.answer(first.id, answer, by="test")
        again = await asyncio.wait_for(_opened(service, run.id, "replan", besides=first.id), 30)
        assert again.payload["refused_edit"] == (
            "the run's tool policies cannot change when a step is replanned; "
            "set a policy in a new step's agent instead"
        )
        await service.answer(again.id, {"action": "approve"}, by="test")
        final = await asyncio.wait_for(execution, 60)
    assert (final.status, final.output) == ("succeeded", "C2"), final.error
    assert final.options.tool_policies == {}


def test_the_estimate_at_a_replan_counts_only_the_steps_still_to_run(
    write_script: Callable[..., Path],
) -> None:
    """It counted every step of the revised plan, a and b too, which have run and will not again:
    a replan of one step late in a long plan was estimated as the whole plan."""
    script = replan_script(write_script)
    result = mp(
        "run", "replan it", "--model", f"scripted:{script}", "--rounds", "0", "--json", stdin="a\na\n"
    )
    assert result.returncode == 0, result.stderr
    estimates = [line for line in result.stderr.splitlines() if line.startswith("estimate for the steps:")]
    calls = [line.split(":", 1)[1].split(",")[0].strip() for line in estimates]
    assert calls == ["about 3 model calls", "about 2 model calls"]  # a, b, c; then c1, c2


@pytest.mark.parametrize("front_end", ["runs answer --deny", "the others"])
async def test_a_rejection_whose_reason_is_blank_says_no_reason_was_given(
    engine: Engine, write_script: Callable[..., Path], front_end: str
) -> None:
    """A reason of spaces alone (`runs answer --deny --reason '   '`, or the API's) is no reason.

    It went past `NO_REASON`: the run said "rejected:    " and the audit "rejected the plan:    ".
    The reason given is kept without the blanks around it.
    """

    async def reject(service: RunService, request_id: str, reason: str) -> None:
        if front_end == "runs answer --deny":
            await service.answer_plainly(request_id, approve=False, reason=reason, by="test")
        else:
            await service.answer(request_id, {"action": "reject", "reason": reason}, by="test")

    options = replace(FAST, auto_approve=False)
    outcomes = []
    service = RunService(engine.settings)
    try:
        for reason in (" \n\t ", "  too broad \n"):
            run = engine.create_run(
                "reject it", model=f"scripted:{replan_script(write_script)}", options=options
            )
            execution = asyncio.ensure_future(engine.execute(run.id))
            await reject(service, (await _opened(service, run.id, "plan_review")).id, reason)
            final = await asyncio.wait_for(execution, 60)
            audit = [entry.action for entry in await service.audit(run.id)]
            outcomes.append((final.status, final.error, _events(engine, run.id, "rejected")[0][2], audit[-1]))
    finally:
        service.close()
    assert outcomes == [
        (
            "cancelled",
            "rejected: no reason given",
            {"reason": "no reason given", "by": "test"},
            "rejected the plan",
        ),
        (
            "cancelled",
            "rejected: too broad",
            {"reason": "too broad", "by": "test"},
            "rejected the plan: too broad",
        ),
    ]


def _revision_of(engine: Engine, run_id: str) -> tuple[list[str], list[tuple[str, str]]]:
    """The run's plan (its step ids) and its recorded steps with their statuses."""
    run = engine.store.get_run(run_id)
    assert run.plan is not None
    return run.plan.ids, [(record.id, record.status) for record in engine.store.steps(run_id)]


@pytest.mark.parametrize("failure", ["killed", "full disk"])
async def test_a_replan_is_written_whole_or_not_at_all(
    engine: Engine, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    """The process dies (or the disk fills) between the revised plan's write and its `replanned`.

    Before, the revised plan with its steps was one write and the event another: the run went on
    with the new steps and no `replanned` for good (the audit lost the replan and who approved
    it, and the run's next replan took the same number, so its recorded proposal and its
    request's answer were this one's). Now they are one transaction: nothing of the replan was
    written, and it is made once, on resume (or on retry).
    """
    run = engine.create_run("replan it", model=f"scripted:{replan_script(write_script)}", options=FAST)
    if failure == "killed":
        killed = failing_as_the_event_is_written(monkeypatch, "replanned", Killed())
        with pytest.raises(Killed):
            await engine.execute(run.id)
        assert killed == [run.id]
    else:
        full_disk = sa.exc.OperationalError("INSERT INTO mp_events", {}, Exception("disk I/O error"))
        failed = failing_as_the_event_is_written(monkeypatch, "replanned", full_disk)
        stopped = await engine.execute(run.id)
        assert failed == [run.id]
        assert stopped.status == "failed"
        assert stopped.error is not None and stopped.error.endswith("disk I/O error")
    assert _revision_of(engine, run.id) == (
        ["a", "b", "c"],
        [("a", "succeeded"), ("b", "succeeded"), ("c", "failed")],
    )
    assert _events(engine, run.id, "replanned") == []

    if failure == "full disk":
        engine.retry(run.id)  # room again: c runs again, fails again, and is replanned
    final = await engine.execute(run.id)
    assert (final.status, final.output) == ("succeeded", "C2"), final.error
    assert _revision_of(engine, run.id) == (
        ["a", "b", "c1", "c2"],
        [("a", "succeeded"), ("b", "succeeded"), ("c", "replaced"), ("c1", "succeeded"), ("c2", "succeeded")],
    )
    replanned = {"retired": ["c"], "steps": ["c1", "c2"], "by": "auto", "n": 1}
    assert _events(engine, run.id, "replanned") == [("replanned", "c", replanned)]
    assert sorted(_started(engine, run.id)).count("c1") == 1


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_a_process_that_lost_the_run_while_its_replan_was_open_records_no_decision(
    database_url: str, write_script: Callable[..., Path], decision: str
) -> None:
    """A process stalls past its lease while a replan's request is open; another takes the run over.

    Before, the stalled one applied the answer under the new holder's lease: approved, it wrote
    the revised plan and ran the new steps itself; rejected, it recorded the rejection and failed
    the run. Now it records nothing and stops; the holder applies the answer, once.
    """
    from masterplanner.engine.store import RunStore

    script = replan_script(write_script)
    other = RunStore(database_url)
    stalled = Engine(Settings.load(run_lease_s=1))
    service = RunService(stalled.settings)
    reply = {"action": "approve"} if decision == "approve" else {"action": "reject", "reason": "no"}

    def take_over(run_id: str) -> None:
        """The other process takes the run once the stalled one's lease lapsed."""
        deadline = time.monotonic() + 30
        while not other.claim(run_id, "other", lease_s=60):
            assert time.monotonic() < deadline, "the stalled process's lease never lapsed"
            time.sleep(0.05)

    try:
        run = stalled.create_run(
            "replan it", model=f"scripted:{script}", options=replace(FAST, auto_approve=False)
        )
        with pytest.MonkeyPatch.context() as patch:
            # stalled: its guard neither renews its lease nor sees it taken over
            patch.setattr(stalled.store, "heartbeats", lambda owners, **_: None)
            patch.setattr(stalled.store, "watched", lambda owners: dict.fromkeys(owners, (True, False)))
            execution = asyncio.ensure_future(stalled.execute(run.id))
            replan = await asyncio.wait_for(_replan_after_approving_the_plan(service, run.id), 60)
            await asyncio.to_thread(take_over, run.id)
            await service.answer(replan.id, reply, by="test")
            final = await asyncio.wait_for(execution, 60)
        assert (final.status, final.error) == ("running", None)
        assert _revision_of(stalled, run.id) == (
            ["a", "b", "c"],
            [("a", "succeeded"), ("b", "succeeded"), ("c", "failed")],
        )
        assert _events(stalled, run.id, "replanned", "replan_failed") == []
        lease = other.lease(run.id)
        assert lease is not None and lease.owner == "other"
    finally:
        service.close()
        stalled.close()
    other.release(run.id, "other")
    going_on = Engine(Settings.load())
    try:
        final = await going_on.execute(run.id)  # the answer given is applied by the holder, once
        decided = _events(going_on, run.id, "replanned", "replan_failed")
        if decision == "approve":
            assert (final.status, final.output) == ("succeeded", "C2"), final.error
            replanned = {"retired": ["c"], "steps": ["c1", "c2"], "by": "test", "n": 1}
            assert decided == [("replanned", "c", replanned)]
            assert sorted(_started(going_on, run.id)) == ["a", "b", "c", "c1", "c2"]
        else:
            assert final.status == "failed"
            assert final.error is not None and final.error.endswith(" (its replan was rejected by test: no)")
            assert decided == [("replan_failed", "c", {"n": 1, "rejected": "no", "by": "test"})]
            assert sorted(_started(going_on, run.id)) == ["a", "b", "c"]
    finally:
        going_on.close()
        other.close()
