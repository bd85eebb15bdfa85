"""A failed run retried from where it failed (`Engine.retry`, `RunService.retry`, `runs retry`).

The scripted model's file is rewritten before each retry: the retry reads it afresh, and a step
that ran again would find no entry of its own left and fail, so a success proves it did not.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from _cli import mp
from _plans import step

from masterplanner import RunError, Settings
from masterplanner.engine import Engine, RunOptions
from masterplanner.errors import BudgetExceededError, ConfigError
from masterplanner.event_text import planning_stage
from masterplanner.service import RunService

FAST = RunOptions(auto_approve=True, prompt_rounds=0, retry_backoff_s=0.01, max_replans=0)
DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}
BROKEN = {"purpose": "step:b", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True}


@pytest.fixture
def engine(isolated: Path) -> Iterator[Engine]:
    created = Engine(Settings.load())
    yield created
    created.close()


def _planner(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"purpose": "planner", "output": {"steps": list(steps)}}


def _rewrite(script: Path, calls: list[dict[str, Any]]) -> None:
    script.write_text(json.dumps({"calls": calls}))


def _kinds_after(engine: Engine, run_id: str, seq: int) -> list[tuple[str, str | None]]:
    return [(event.kind, event.step) for event in engine.store.events(run_id, after=seq)]


WRITES_A = [
    {
        "purpose": "step:a",
        "turn": 1,
        "tool_calls": [{"name": "write_file", "args": {"path": "a.txt", "content": "A"}}],
    },
    {"purpose": "step:a", "turn": 2, "output": "a wrote a.txt"},
]
"""Step a writes a file (a side effect a retry must not repeat), then answers."""


async def _failed_run(engine: Engine, script: Path, options: RunOptions = FAST) -> str:
    """A run of a (writes a.txt), b (fails: a tool it does not have) and c (after both): failed."""
    plan = _planner(step("a", tools=["write_file"]), step("b", tools=[]), step("c", "a", "b", tools=[]))
    _rewrite(script, [plan, *WRITES_A, BROKEN, DRAFTS])
    run = engine.create_run("a and b, then c", model=f"scripted:{script}", options=options)
    final = await engine.execute(run.id)
    assert final.status == "failed"
    steps = {record.id: record.status for record in engine.store.steps(run.id)}
    assert steps == {"a": "succeeded", "b": "failed", "c": "skipped"}
    return run.id


async def test_a_retried_run_runs_only_what_failed_and_succeeds(engine: Engine, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    run_id = await _failed_run(engine, script)
    before = engine.store.events(run_id)[-1].seq
    # the outage is over: b answers now, and c after it; a has no entry left (it must not run)
    _rewrite(script, [{"purpose": "step:b", "output": "b ok"}, {"purpose": "step:c", "output": "c ok"}])

    retried = engine.retry(run_id, by="cli@test:1")
    assert (retried.status, retried.retries, retried.error) == ("running", 1, None)
    assert {record.id: record.status for record in engine.store.steps(run_id)} == {
        "a": "succeeded",
        "b": "pending",
        "c": "pending",
    }
    final = await engine.execute(run_id)

    assert final.status == "succeeded", final.error
    assert final.output == "c ok"
    report = engine.report(run_id)
    assert [(s["id"], s["status"], s["output"]) for s in report["steps"]] == [
        ("a", "succeeded", "a wrote a.txt"),
        ("b", "succeeded", "b ok"),
        ("c", "succeeded", "c ok"),
    ]
    assert (Path(final.workspace) / "a.txt").read_text() == "A"
    assert _kinds_after(engine, run_id, before) == [
        ("run_retried", None),
        ("step_started", "b"),
        ("step_succeeded", "b"),
        ("step_started", "c"),
        ("step_succeeded", "c"),
        ("run_succeeded", None),
        ("team_stored", None),
    ]
    events = engine.store.events(run_id)
    assert [e.data for e in events if e.kind == "run_retried"] == [
        {"retry": 1, "status": "running", "steps": ["b", "c"], "by": "cli@test:1"}
    ]
    # a's side effect happened once, in the first execution
    assert sum(1 for e in events if e.kind == "tool_called" and e.step == "a") == 1


async def test_a_run_that_failed_again_can_be_retried_again(engine: Engine, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    run_id = await _failed_run(engine, script)
    _rewrite(script, [BROKEN])  # still broken
    engine.retry(run_id)
    again = await engine.execute(run_id)
    assert again.status == "failed"
    assert again.error is not None and again.error.startswith("step b failed: the model called no_such_tool")
    assert {record.id: record.status for record in engine.store.steps(run_id)} == {
        "a": "succeeded",
        "b": "failed",
        "c": "skipped",
    }
    _rewrite(script, [{"purpose": "step:b", "output": "b ok"}, {"purpose": "step:c", "output": "c ok"}])
    assert engine.retry(run_id).retries == 2
    final = await engine.execute(run_id)
    assert (final.status, final.output) == ("succeeded", "c ok")
    started = [e.step for e in engine.store.events(run_id) if e.kind == "step_started"]
    assert sorted(started) == ["a", "b", "b", "b", "c"]  # a and b ran side by side at first


async def test_a_run_that_failed_at_planning_is_planned_again(engine: Engine, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    _rewrite(script, [{"purpose": "planner", "output": {"steps": []}, "repeat": True}])
    run = engine.create_run("plan me", model=f"scripted:{script}", options=FAST)
    failed = await engine.execute(run.id)
    assert failed.status == "failed"
    assert failed.plan is None
    _rewrite(script, [_planner(step("only", tools=[])), {"purpose": "step:only", "output": "done"}, DRAFTS])
    assert engine.retry(run.id).status == "planning"
    final = await engine.execute(run.id)
    assert (final.status, final.output) == ("succeeded", "done")
    # nothing was kept of its planning: the audit does not say it went on from it
    assert "retried the run after it failed (planned again)" in mp("runs", "audit", run.id).stdout


async def test_a_run_that_failed_writing_its_prompts_keeps_its_plan_when_retried(
    engine: Engine, tmp_path: Path
) -> None:
    """Before, the retry planned it again from the start: the planner was asked (and paid) twice."""
    script = tmp_path / "script.json"
    _rewrite(script, [_planner(step("only", tools=[])), {"purpose": "*", "repeat": True}])
    options = RunOptions(auto_approve=True, prompt_rounds=0, max_model_calls=1)
    run = engine.create_run("plan me", model=f"scripted:{script}", options=options)
    failed = await engine.execute(run.id)
    assert (failed.status, failed.error, failed.plan) == (
        "failed",
        "the run used its budget of 1 model call",
        None,
    )
    _rewrite(script, [DRAFTS, {"purpose": "step:only", "output": "done"}])  # no planner: it is not asked
    assert engine.retry(run.id, max_model_calls=3).status == "planning"
    final = await engine.execute(run.id)
    assert (final.status, final.output) == ("succeeded", "done")
    by_purpose = engine.report(run.id)["usage"]["by_purpose"]
    assert {purpose: entry["calls"] for purpose, entry in by_purpose.items()} == {
        "planner": 1,
        "prompt_creator": 1,
        "step:only": 1,
    }
    progress = [event.data for event in engine.store.events(run.id) if event.kind == "planning_progress"]
    resumed = {"stage": "resumed", "prompts": 0, "process": engine.owner}
    assert progress[progress.index(resumed) :] == [resumed, {"stage": "prompts", "draft": 1, "of": 1}]
    audit = mp("runs", "audit", run.id)
    said = "its planning goes on from what it had made; model-call budget set to 3"
    assert f"retried the run after it failed ({said})" in audit.stdout


async def test_a_retry_is_refused_unless_the_run_failed_and_nothing_changes(
    engine: Engine, tmp_path: Path, write_script: Callable[..., Path]
) -> None:
    done = write_script([_planner(step("a", tools=[])), {"purpose": "step:a", "output": "fine"}, DRAFTS])
    run = engine.create_run("fine", model=f"scripted:{done}", options=FAST)
    with pytest.raises(RunError) as planning:
        engine.retry(run.id)
    assert str(planning.value) == (
        f"run {run.id} is planning but no process is executing it (the one that was stopped): "
        f"continue it with `masterplanner runs resume {run.id}`"
    )
    await engine.execute(run.id)
    with pytest.raises(RunError) as succeeded:
        engine.retry(run.id)
    assert str(succeeded.value) == f"run {run.id} succeeded: only a failed run can be retried"

    script = tmp_path / "script.json"
    failed = await _failed_run(engine, script)
    with pytest.raises(ConfigError) as bad:
        engine.retry(failed, max_model_calls=0)
    assert str(bad.value) == "max_model_calls must be a whole number from 1 to 1,000,000, got 0"
    with pytest.raises(ConfigError) as costly:
        engine.retry(failed, max_cost_usd=-1.0)
    assert str(costly.value) == "max_cost_usd must be more than 0 and at most 1,000,000, got -1.0"
    record = engine.store.get_run(failed)
    assert (record.status, record.retries) == ("failed", 0)
    assert not [e for e in engine.store.events(failed) if e.kind == "run_retried"]

    # two retries at once: the second is told the first took it, not to resume a stopped run
    engine.retry(failed)
    with pytest.raises(RunError) as twice:
        engine.retry(failed)
    assert str(twice.value) == f"run {failed} is being retried already: it goes on from where it failed"


async def test_a_used_up_budget_is_refused_until_it_is_raised(engine: Engine, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    plan = _planner(step("a", tools=[]), step("b", "a", tools=[]))
    _rewrite(script, [plan, {"purpose": "step:a", "output": "kept"}, {"purpose": "*", "repeat": True}])
    options = RunOptions(auto_approve=True, prompt_rounds=0, max_model_calls=4)
    run = engine.create_run("budget", model=f"scripted:{script}", options=options)
    failed = await engine.execute(run.id)
    assert failed.error == "the run used its budget of 4 model calls"

    with pytest.raises(BudgetExceededError) as spent:
        engine.retry(run.id)
    assert str(spent.value) == (
        f"run {run.id} cannot go on: the run used its budget of 4 model calls; retry it with a larger budget"
    )
    assert spent.value.budget == "max_model_calls"
    assert engine.store.get_run(run.id).status == "failed"

    _rewrite(script, [{"purpose": "step:b", "output": "b at last"}])
    retried = engine.retry(run.id, max_model_calls=6, by="web@test:2")
    assert retried.options.max_model_calls == 6
    final = await engine.execute(run.id)
    assert (final.status, final.output) == ("succeeded", "b at last")
    assert engine.report(run.id)["usage"]["llm_calls"] == 5
    retry_event = next(e for e in engine.store.events(run.id) if e.kind == "run_retried")
    assert retry_event.data["budgets"] == {"max_model_calls": 6}


async def test_the_audit_log_names_who_retried_and_what(isolated: Path, tmp_path: Path) -> None:
    service = RunService(Settings.load())
    try:
        script = tmp_path / "script.json"
        run_id = await _failed_by_service(service, script)
        _rewrite(script, [{"purpose": "step:b", "output": "b ok"}, {"purpose": "step:c", "output": "c ok"}])
        retried = await service.retry(run_id, by="web@host:7", max_wall_s=900.0)
        assert retried.options.max_wall_s == 900.0
        assert (await service.execute(run_id)).status == "succeeded"
        entries = [(entry.by, entry.action) for entry in await service.audit(run_id)]
    finally:
        service.close()
    assert entries[-1] == (
        "web@host:7",
        "retried the run after it failed (steps b, c run again; wall-time budget (seconds) set to 900)",
    )


def test_runs_retry_in_the_terminal(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    plan = _planner(step("a", tools=[]), step("b", "a", tools=[]))
    _rewrite(script, [plan, {"purpose": "step:a", "output": "A"}, BROKEN, DRAFTS])
    first = mp(
        "run",
        "a then b",
        "--model",
        f"scripted:{script}",
        "--yes",
        "--rounds",
        "0",
        "--max-replans",
        "0",
        "--json",
    )
    assert first.returncode == 1, first.stderr
    run_id = json.loads(first.stdout)["run_id"]
    assert f"to run it again from where it failed: masterplanner runs retry {run_id}\n" in first.stderr
    resumed = mp("runs", "resume", run_id)
    assert resumed.returncode == 1
    assert resumed.stderr == (  # one line: no summary of a run nothing was done to
        f"run {run_id} failed: there is nothing to resume (to run it again from where it failed: "
        f"masterplanner runs retry {run_id})\n"
    )
    assert resumed.stdout == ""
    other = mp("run", "a then b", "--model", f"scripted:{script}", "--yes", "--rounds", "0", "--detach")
    second_id = other.stdout.strip()
    shared = next(run_id[:n] for n in range(len(run_id), 0, -1) if second_id.startswith(run_id[:n]))
    ambiguous = mp("runs", "retry", shared)
    assert (ambiguous.returncode, ambiguous.stderr.strip()) == (
        2,
        f"error: {shared!r} is the start of more than one run's id: give more of it "
        "(see `masterplanner runs list`)",
    )

    refused = mp("runs", "retry", run_id, "--max-calls", "0")
    assert (refused.returncode, refused.stderr.strip()) == (
        2,
        "error: --max-calls must be from 1 to 1,000,000, got 0",
    )

    for flags, message in [
        (("--max-seconds", "nan"), "--max-seconds must be more than 0 and at most 604,800, got nan"),
        (("--max-cost", "inf"), "--max-cost must be more than 0 and at most 1,000,000 (US dollars), got inf"),
        (("--max-tokens", "10000000001"), "--max-tokens must be from 1 to 10,000,000,000, got 10000000001"),
    ]:
        bad = mp("runs", "retry", run_id, *flags)
        assert (bad.returncode, bad.stderr.strip()) == (2, f"error: {message}")
    nan = mp("run", "x", "--model", f"scripted:{script}", "--max-seconds", "nan")
    assert (nan.returncode, nan.stderr.strip()) == (
        2,
        "error: --max-seconds must be more than 0 and at most 604,800, got nan",
    )

    _rewrite(script, [{"purpose": "step:b", "output": "B"}])
    retried = mp("runs", "retry", run_id[: len(shared) + 1], "--json")  # a unique prefix
    assert retried.returncode == 0, retried.stderr
    assert f"retrying run {run_id} (running)" in retried.stderr
    report = json.loads(retried.stdout)
    assert (report["status"], report["output"]) == ("succeeded", "B")
    assert [(s["id"], s["status"]) for s in report["steps"]] == [("a", "succeeded"), ("b", "succeeded")]

    shown = mp("runs", "show", run_id, "--timeline")
    assert shown.stdout.startswith(f"run {run_id} · succeeded · retried 1 time · a then b\n")
    assert report["retries"] == 1
    again = mp("runs", "retry", run_id)
    assert (again.returncode, again.stderr.strip()) == (
        1,
        f"error: run {run_id} succeeded: only a failed run can be retried",
    )
    audit = mp("runs", "audit", run_id)
    assert "retried the run after it failed (step b runs again)" in audit.stdout


def test_runs_retry_names_the_flag_of_the_budget_the_run_used_up(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    plan = _planner(step("a", tools=[]), step("b", "a", tools=[]))
    _rewrite(script, [plan, {"purpose": "step:a", "output": "kept"}, {"purpose": "*", "repeat": True}])
    args = ("--model", f"scripted:{script}", "--yes", "--rounds", "0", "--json")
    first = mp("run", "a then b", *args, "--max-calls", "4")
    assert first.returncode == 1, first.stderr
    run_id = json.loads(first.stdout)["run_id"]
    refused = mp("runs", "retry", run_id)
    assert (refused.returncode, refused.stderr.strip()) == (
        1,
        f"error: run {run_id} cannot go on: the run used its budget of 4 model calls; "
        "retry it with a larger budget (--max-calls)",
    )
    too_many = mp("runs", "retry", run_id, "--max-calls", "6", "--rounds", "6")
    assert (too_many.returncode, too_many.stderr.strip()) == (
        2,
        "error: --rounds must be between 0 and 5, got 6",
    )
    _rewrite(script, [{"purpose": "step:b", "output": "B"}])
    retried = mp("runs", "retry", run_id, "--max-calls", "6", "--rounds", "2", "--json")
    assert retried.returncode == 0, retried.stderr
    report = json.loads(retried.stdout)
    assert report["output"] == "B"
    shown = json.loads(mp("runs", "show", run_id, "--json").stdout)
    [event] = [e for e in shown["events"] if e["kind"] == "run_retried"]
    assert (event["data"]["budgets"], event["data"]["prompt_rounds"]) == ({"max_model_calls": 6}, 2)


async def test_a_retried_run_counts_once_for_the_agents_it_reused(engine: Engine, tmp_path: Path) -> None:
    from masterplanner.registry import RegistryStore

    script = tmp_path / "script.json"
    task = "load the numbers, then report them"
    plan = _planner(step("a", tools=[]), step("b", "a", tools=[]))
    _rewrite(
        script, [plan, {"purpose": "step:a", "output": "A"}, {"purpose": "step:b", "output": "B"}, DRAFTS]
    )
    first = engine.create_run(task, model=f"scripted:{script}", options=FAST)
    assert (await engine.execute(first.id)).status == "succeeded"

    _rewrite(script, [{"purpose": "step:a", "output": "A"}, BROKEN, {"purpose": "*", "repeat": True}])
    second = engine.create_run(task, model=f"scripted:{script}", options=FAST)
    assert (await engine.execute(second.id)).status == "failed"
    assert next(e for e in engine.store.events(second.id) if e.kind == "plan_ready").data[
        "reused_cohort"
    ] == (first.id)
    registry = RegistryStore(engine.settings.database_url)
    try:
        counted = {name: registry.get_agent(f"{first.id}.{name}").stats for name in "ab"}
        assert [(s.uses, s.successes, s.failures) for s in counted.values()] == [(2, 1, 1), (2, 1, 1)]

        _rewrite(script, [{"purpose": "step:b", "output": "B"}])
        engine.retry(second.id)
        assert (await engine.execute(second.id)).status == "succeeded"
        # the run counts once, as it ended: its failure became a success, for a (not run again) too
        counted = {name: registry.get_agent(f"{first.id}.{name}").stats for name in "ab"}
        assert [(s.uses, s.successes, s.failures) for s in counted.values()] == [(2, 2, 0), (2, 2, 0)]
    finally:
        registry.close()


async def test_a_retry_that_changes_the_rounds_writes_again_the_prompts_kept_under_other_rounds(
    engine: Engine, tmp_path: Path
) -> None:
    """Before, a prompt kept from the failed planning was taken as it was, with the critique
    rounds of the run before its retry (none here) and not those the retry asked for."""
    script = tmp_path / "script.json"
    too_long = " ".join(["word"] * 300)  # over the script's cap: the second draft fails (after the first)
    calls = [
        _planner(step("a", tools=[]), step("b", "a", tools=[])),
        {"purpose": "prompt_creator", "output": "Kept draft."},
        {"purpose": "prompt_creator", "output": too_long, "delay_s": 0.5},
    ]
    script.write_text(json.dumps({"calls": calls, "max_output_tokens": 200}))
    run = engine.create_run("a, then b", model=f"scripted:{script}", options=FAST)
    failed = await engine.execute(run.id)
    assert failed.status == "failed" and failed.plan is None
    kept = engine.store.kept_planning(run.id)
    assert kept is not None and [brief.get("draft") for brief in kept["prompts"].values()] == ["Kept draft."]

    with pytest.raises(ConfigError) as bad:
        engine.retry(run.id, prompt_rounds=6)
    assert str(bad.value) == "prompt_rounds must be a whole number from 0 to 5, got 6"
    _rewrite(
        script,
        [
            {"purpose": "prompt_creator", "output": "Written again.", "repeat": True},
            {"purpose": "critic", "repeat": True},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b", "output": "B"},
        ],
    )
    retried = engine.retry(run.id, prompt_rounds=1, by="cli@test:1")
    assert (retried.status, retried.options.prompt_rounds) == ("planning", 1)
    final = await engine.execute(run.id)
    assert (final.status, final.output) == ("succeeded", "B")
    # both prompts written under the retry's one round: the kept one, of none, was written again
    assert {step_id: (agent.draft, len(agent.rounds)) for step_id, agent in final.agents.items()} == {
        "a": ("Written again.", 1),
        "b": ("Written again.", 1),
    }
    assert engine.report(run.id)["usage"]["by_purpose"]["critic"]["calls"] == 2
    progress = [event.data for event in engine.store.events(run.id) if event.kind == "planning_progress"]
    resumed = {"stage": "resumed", "prompts": 0, "rewritten": 1, "process": engine.owner}
    assert resumed in progress
    assert planning_stage(resumed) == (
        f"resuming planning in {engine.owner} (its plan was made before; 1 prompt written under "
        "other critique rounds is written again)"
    )
    retry_event = next(e for e in engine.store.events(run.id) if e.kind == "run_retried")
    assert retry_event.data["prompt_rounds"] == 1
    said = "its planning goes on from what it had made; critique rounds per prompt set to 1"
    assert f"retried the run after it failed ({said})" in mp("runs", "audit", run.id).stdout


ELSEWHERE = "run@elsewhere:4242:0badc0de/abc123"
"""The lease owner of another process sharing the database (a `runs resume`, a worker)."""


async def _created_by_service(service: RunService, script: Path) -> str:
    """A run of a, b (fails) and c, created through the service; its id."""
    plan = _planner(step("a", tools=["write_file"]), step("b", tools=[]), step("c", "a", "b", tools=[]))
    _rewrite(script, [plan, *WRITES_A, BROKEN, DRAFTS])
    created = await service.create("a and b, then c", model=f"scripted:{script}", options=FAST)
    return created.id


async def _failed_by_service(service: RunService, script: Path) -> str:
    """A run of a, b (fails) and c, failed through the service; its end done and its lease given up."""
    run_id = await _created_by_service(service, script)
    assert (await service.execute(run_id)).status == "failed"
    return run_id


async def test_a_retry_and_a_claim_at_once_never_wipe_the_claimer_s_lease(
    isolated: Path, tmp_path: Path
) -> None:
    """Another process claims the failed run between the retry's read of it and its reset.

    Before, the retry read the run unheld, the other process (a `runs resume` taking the run
    to finish its end) claimed it, and the retry's reset wiped that live lease: the run was
    reset while another process executed it. Now the retry locks the run's row first: the
    claim waits for it, and takes the run as retried, its lease kept.
    """
    import threading

    import sqlalchemy as sa

    from masterplanner.engine.store import RunStore

    service = RunService(Settings.load())
    other = RunStore(Settings.load().database_url)
    claimed: list[bool] = []
    claiming: list[threading.Thread] = []

    def claim() -> None:
        claimed.append(other.claim(run_id, ELSEWHERE, lease_s=60.0))

    def before_reset(
        _connection: Any, _cursor: Any, statement: str, *_args: Any, **_kwargs: Any
    ) -> None:  # the other process claims the run just as the retry resets it
        if statement.startswith("UPDATE mp_runs SET status=") and not claiming:
            claiming.append(threading.Thread(target=claim))
            claiming[0].start()
            claiming[0].join(timeout=2.0)  # done at once, unless the retry's lock holds it back

    try:
        run_id = await _failed_by_service(service, tmp_path / "script.json")
        sa.event.listen(sa.engine.Engine, "before_cursor_execute", before_reset)
        try:
            retried = await service.retry(run_id, by="cli@test:1")
        finally:
            sa.event.remove(sa.engine.Engine, "before_cursor_execute", before_reset)
        claiming[0].join(timeout=30.0)
        lease = other.lease(run_id)
        events = [event.kind for event in other.events(run_id)]
    finally:
        other.close()
        service.close()
    assert (retried.status, retried.retries) == ("running", 1)
    assert claimed == [True]
    assert lease is not None and lease.owner == ELSEWHERE  # the claimer holds the retried run
    assert events.count("run_retried") == 1


async def test_a_retry_of_a_run_a_live_process_holds_is_refused_naming_it(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process holding the failed run (ending it) is named, with what to do; nothing changes."""
    import httpx

    from masterplanner.engine.store import RunStore
    from masterplanner.web import create_app

    service = RunService(Settings.load())
    other = RunStore(Settings.load().database_url)
    try:
        run_id = await _failed_by_service(service, tmp_path / "script.json")
        assert other.claim(run_id, ELSEWHERE, lease_s=120.0)
        service.close()  # the retry's own service waits a lease and a second for the holder
        monkeypatch.setenv("MASTERPLANNER_RUN_LEASE_S", "1")
        service = RunService(Settings.load())
        with pytest.raises(RunError) as refused:
            await service.retry(run_id, by="cli@test:1")
        app = create_app(service)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765/api/v1") as client:
            answered = await client.post(f"/runs/{run_id}/retry", json={})
        await app.state.executions.stop()
        app.state.registry.close()
        run, lease = other.get_run(run_id), other.lease(run_id)
    finally:
        other.close()
        service.close()
    held = (  # the seconds since it was last heard from (each retry waited up to 2 s for it)
        re.escape(f"run {run_id} is held by another process, {ELSEWHERE} (last heard from ")
        + r"\d+"
        + re.escape(
            " s ago), which is still ending it (telling the registry how it went): "
            "retry it once that process lets go, with "
        )
    )
    assert re.fullmatch(held + re.escape(f"`masterplanner runs retry {run_id}`"), str(refused.value))
    assert answered.status_code == 409
    assert re.fullmatch(held + re.escape(f"POST /api/v1/runs/{run_id}/retry"), answered.json()["error"])
    assert (run.status, run.retries) == ("failed", 0)
    assert lease is not None and lease.owner == ELSEWHERE


async def test_a_retry_of_a_run_whose_process_died_ending_it_finishes_that_end_first(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry is told the failure once, by the retry, before the run is reset.

    Before, the retry took the run its dead process held (the lease lapsed) and reset it: the
    end that process left undone (telling the registry how the run went) was lost for good.
    """
    import sqlalchemy as sa
    from _faults import Killed

    from masterplanner.engine import workflows
    from masterplanner.engine.store import runs_table

    service = RunService(Settings.load())
    real = workflows._tell_registry
    told: list[bool] = []

    def dying(*_args: Any, **_kwargs: Any) -> None:  # the process dies while telling the registry
        raise Killed

    def telling(resources: Any, *, succeeded: bool) -> None:
        told.append(succeeded)
        real(resources, succeeded=succeeded)

    try:
        script = tmp_path / "script.json"
        run_id = await _created_by_service(service, script)
        with monkeypatch.context() as patched:
            patched.setattr(workflows, "_tell_registry", dying)
            with pytest.raises(Killed):
                await service.execute(run_id)
        assert (await service.get(run_id)).status == "failed"  # the outcome is recorded
        # it died there rather than stopped: its lease is left, lapsed
        store = service._store
        with store.begin("test") as connection:
            connection.execute(
                sa.update(runs_table)
                .where(runs_table.c.id == run_id)
                .values(owner=ELSEWHERE, heartbeat_at=0.0, lease_until=0.0)
            )
        monkeypatch.setattr(workflows, "_tell_registry", telling)
        _rewrite(script, [{"purpose": "step:b", "output": "b ok"}, {"purpose": "step:c", "output": "c ok"}])
        retried = await service.retry(run_id[:-2], by="cli@test:1")  # a prefix, as typed
        kinds = [event.kind for event in await service.events(run_id)]
        lease = store.lease(run_id)
        final = await service.execute(run_id)
    finally:
        service.close()
    assert told[0] is False  # the failure's end, finished before the reset
    assert (retried.status, retried.retries, lease) == ("running", 1, None)
    assert kinds.count("run_failed") == kinds.count("run_retried") == 1
    assert kinds.index("run_failed") < kinds.index("run_retried")
    assert (final.status, final.output) == ("succeeded", "c ok")
    assert told == [False, True]
