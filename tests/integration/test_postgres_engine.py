"""The engine on Postgres (the multi-worker database): same lifecycle, events and recovery rules."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _cluster import plan_step as step

from masterplanner import RunService, Said, Settings
from masterplanner.engine import Engine, RunOptions

pytestmark = pytest.mark.postgres


@pytest.fixture
def database(postgres_database: str) -> str:
    return postgres_database


async def test_a_run_on_postgres(database: str, write_script: Callable[..., Path]) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[]), step("b", "a", tools=[])]}},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b", "output": "B"},
            {"purpose": "*", "repeat": True},
        ]
    )
    engine = Engine(Settings.load(database_url=database))
    try:
        run = engine.create_run("a then b", model=f"scripted:{script}", options=RunOptions(auto_approve=True))
        final = await engine.execute(run.id)
        assert (final.status, final.output) == ("succeeded", "B")
        kinds = [(event.kind, event.step) for event in engine.store.events(run.id)]
        assert kinds[-6:] == [
            ("step_started", "a"),
            ("step_succeeded", "a"),
            ("step_started", "b"),
            ("step_succeeded", "b"),
            ("run_succeeded", None),
            ("team_stored", None),
        ]
        assert engine.report(run.id)["usage"]["by_purpose"]["step:b"]["calls"] == 1
        # the lease in Postgres's clock: held while renewed, taken over once it lapses
        assert engine.store.lease(run.id) is None  # given up when the run ended
        assert engine.store.claim(run.id, "first:1:x", lease_s=10)
        assert not engine.store.claim(run.id, "second:2:y", lease_s=10)
        assert engine.store.lease(run.id).owner == "first:1:x"  # type: ignore[union-attr]
        await asyncio.sleep(0.6)
        assert engine.store.heartbeat(run.id, "first:1:x", lease_s=0.5)
        assert not engine.store.claim(run.id, "second:2:y", lease_s=10)  # renewed just now, for 0.5 s
        await asyncio.sleep(0.6)
        assert engine.store.claim(run.id, "second:2:y", lease_s=10)  # its 0.5 s ran out
        assert not engine.store.heartbeat(run.id, "first:1:x", lease_s=0.5)  # the first holder lost it
    finally:
        engine.close()


async def test_steps_named_end_and_aggregate_run_on_postgres(
    database: str, write_script: Callable[..., Path]
) -> None:
    """The run's own workflows (`<run>._aggregate`, `<run>._end`) never take a step's id."""
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("aggregate", tools=[]), step("end", tools=[])]}},
            {"purpose": "step:aggregate", "output": "AGG"},
            {"purpose": "step:end", "output": "END"},
            {"purpose": "aggregator", "expect": ["AGG", "END"], "output": "both"},
            {"purpose": "*", "repeat": True},
        ]
    )
    engine = Engine(Settings.load(database_url=database))
    try:
        run = engine.create_run(
            "two sinks", model=f"scripted:{script}", options=RunOptions(auto_approve=True)
        )
        final = await engine.execute(run.id)
        assert (final.status, final.error, final.output) == ("succeeded", None, "both")
        kinds = [event.kind for event in engine.store.events(run.id)]
        assert kinds[-2:] == ["run_succeeded", "team_stored"]
    finally:
        engine.close()


async def test_workers_sharing_postgres_share_the_registry(
    database: str, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {
                "purpose": "planner",
                "output": {
                    "steps": [
                        {**step("a", tools=[]), "instruction": "Total sales.csv by month."},
                        {**step("b", "a", tools=[]), "instruction": "Write the totals to report.md."},
                    ]
                },
            },
            {"purpose": "*", "output": "done", "repeat": True},
        ]
    )
    first_worker = Engine(Settings.load(database_url=database))
    second_worker = Engine(Settings.load(database_url=database))
    try:
        task = "Read sales.csv and write the monthly totals to report.md"
        first = first_worker.create_run(
            task, model=f"scripted:{script}", options=RunOptions(auto_approve=True, prompt_rounds=0)
        )
        done = await first_worker.execute(first.id)
        assert done.status == "succeeded", done.error
        repeat = "Read orders.csv and write the monthly totals to summary.md"
        second = second_worker.create_run(
            repeat, model=f"scripted:{script}", options=RunOptions(auto_approve=True, prompt_rounds=0)
        )
        final = await second_worker.execute(second.id)
        assert final.status == "succeeded", final.error
        ready = next(e.data for e in second_worker.store.events(second.id) if e.kind == "plan_ready")
        assert (ready["reused_cohort"], ready["adaptation"]) == (first.id, "parameters")
        usage = second_worker.report(second.id)["usage"]["by_purpose"]
        assert set(usage) == {"step:a", "step:b"}
    finally:
        first_worker.close()
        second_worker.close()


async def test_a_worker_stopped_as_its_run_ends_reports_the_run_ended_not_handed_over(
    database: str, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from masterplanner.engine.store import RunStore
    from masterplanner.engine.worker import Worker

    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "*", "repeat": True},
        ]
    )
    settings = Settings.load(database_url=database, remember_runs="never", embedder="none")
    released = asyncio.Event()
    release = RunStore.release

    def slow_release(store: RunStore, run_id: str, owner: str) -> None:
        # the status is written, the lease not given up yet: the stop comes in between
        loop.call_soon_threadsafe(released.set)
        time.sleep(0.5)
        release(store, run_id, owner)

    monkeypatch.setattr(RunStore, "release", slow_release)
    loop = asyncio.get_running_loop()
    worker = Worker(settings, providers=["scripted"], grace_s=10)
    try:
        run = worker.engine.create_run(
            "one step", model=f"scripted:{script}", options=RunOptions(auto_approve=True), for_workers=True
        )
        stop = asyncio.Event()
        working = asyncio.ensure_future(worker.run(stop))
        await asyncio.wait_for(released.wait(), 60)
        assert worker.engine.store.get_run(run.id).status == "succeeded"
        stop.set()
        summary = await asyncio.wait_for(working, 60)
        assert (summary.runs, summary.handed_over) == ({run.id: "succeeded"}, [])
        assert worker.engine.store.lease(run.id) is None  # given up, not left to lapse
    finally:
        worker.close()


async def test_a_run_whose_end_outlasts_a_stopping_worker_is_ended_by_the_next_worker(
    database: str, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that succeeded but whose end (telling the registry) outlasts the stop is handed over.

    Before, the stopping worker gave its lease up: a finished run held by nobody is neither
    queued nor abandoned, so no worker finished its end (the registry was never told), while
    the worker said it handed the run over.
    """
    from masterplanner.engine import workflows
    from masterplanner.engine.worker import Worker

    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "*", "repeat": True},
        ]
    )
    settings = Settings.load(database_url=database, remember_runs="never", embedder="none")
    built = workflows.resources_of
    ends: list[str] = []

    async def slow_end(run_id: str, settings: Settings, store: Any, **kwargs: Any) -> Any:
        if store.get_run(run_id).finished:  # the end workflow, about to tell the registry
            ends.append(run_id)
            if len(ends) == 1:
                await asyncio.sleep(600)  # the first worker's end never gets further
        return await built(run_id, settings, store, **kwargs)

    monkeypatch.setattr(workflows, "resources_of", slow_end)
    first = Worker(settings, providers=["scripted"], grace_s=0.5)
    try:
        run = first.engine.create_run(
            "one step", model=f"scripted:{script}", options=RunOptions(auto_approve=True), for_workers=True
        )
        stop = asyncio.Event()
        working = asyncio.ensure_future(first.run(stop))
        deadline = time.monotonic() + 60
        while not ends:
            assert time.monotonic() < deadline, "the run did not reach its end"
            await asyncio.sleep(0.05)
        assert first.engine.store.get_run(run.id).status == "succeeded"
        stop.set()
        summary = await asyncio.wait_for(working, 60)
        assert (summary.runs, summary.handed_over) == ({}, [run.id])
    finally:
        first.close()
    ended = asyncio.Event()
    second = Worker(
        settings,
        providers=["scripted"],
        note=lambda message, **fields: ended.set() if fields.get("event") == "run_ended" else None,
    )
    try:
        stop = asyncio.Event()
        working = asyncio.ensure_future(second.run(stop))
        with contextlib.suppress(TimeoutError):  # before, it never took the run
            await asyncio.wait_for(ended.wait(), 30)
        stop.set()
        summary = await asyncio.wait_for(working, 60)
        assert (summary.runs, summary.handed_over) == ({run.id: "succeeded"}, [])
        assert ends == [run.id, run.id]  # the end went on, and told the registry
        assert second.engine.store.lease(run.id) is None
    finally:
        second.close()


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("gone.gguf", "gone.gguf"),
        # a key in the reason (here the file's name) reaches neither the worker's log nor the event
        ("sk-proj-a1b2c3d4e5f6g7h8i9j0.gguf", "[secret removed].gguf"),
    ],
)
async def test_a_run_a_worker_cannot_coordinate_with_its_settings_is_refused_once_and_says_why(
    database: str, tmp_path: Path, name: str, shown: str
) -> None:
    from masterplanner.engine.worker import Worker

    gguf = tmp_path / name
    gguf.write_bytes(b"GGUF" + bytes(60))  # starts like a model: the run is accepted
    settings = Settings.load(database_url=database, remember_runs="never", embedder="none")
    notes: list[tuple[str, dict[str, object]]] = []
    worker = Worker(
        settings, providers=["local"], note=lambda message, **fields: notes.append((message, fields))
    )
    try:
        run = worker.engine.create_run(
            "one step", model=f"local:{gguf}", options=RunOptions(auto_approve=True), for_workers=True
        )
        gguf.unlink()  # not on this worker's disk any more
        stop = asyncio.Event()
        working = asyncio.ensure_future(worker.run(stop))
        reason = f"model file {tmp_path / shown}: no such file"
        deadline = time.monotonic() + 60
        while not [event for event in worker.engine.store.events(run.id) if event.kind == "run_refused"]:
            assert time.monotonic() < deadline, "no refusal recorded"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # four more claim rounds: it is not taken again
        service = RunService(settings)
        try:  # the one worker that takes local runs refused it: whoever looks is told why it waits
            waits = await service.waiting(await service.get(run.id))
        finally:
            service.close()
        assert waits == Said(
            f"every running worker that takes local runs refused it ({reason}): "
            "the run waits for a worker that can take it"
        )
        stop.set()
        await asyncio.wait_for(working, 60)
        refused = [event.data for event in worker.engine.store.events(run.id) if event.kind == "run_refused"]
        assert refused == [{"process": worker.id, "reason": reason}]
        stopped = [fields for _message, fields in notes if fields.get("event") == "run_stopped"]
        assert stopped == [
            {"event": "run_stopped", "run": run.id, "reason": f"{reason}; this worker does not take it again"}
        ]
        assert worker.engine.store.get_run(run.id).status == "planning"  # left for a worker that has the file
    finally:
        worker.close()


async def test_a_worker_stopped_with_half_a_second_of_grace_lets_its_running_step_finish(
    database: str, write_script: Callable[..., Path]
) -> None:
    """Before, the grace was truncated to whole seconds (`int`): `--grace 0.5` gave none."""
    from masterplanner.engine.worker import Worker

    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "step:a", "output": "A", "delay_s": 0.5},
            {"purpose": "*", "repeat": True},
        ]
    )
    settings = Settings.load(database_url=database, remember_runs="never", embedder="none")
    worker = Worker(settings, providers=["scripted"], grace_s=0.5)
    try:
        run = worker.engine.create_run(
            "one step", model=f"scripted:{script}", options=RunOptions(auto_approve=True), for_workers=True
        )
        stop = asyncio.Event()
        working = asyncio.ensure_future(worker.run(stop))
        deadline = time.monotonic() + 60
        while not [event for event in worker.engine.store.events(run.id) if event.kind == "step_started"]:
            assert time.monotonic() < deadline, "the step did not start"
            await asyncio.sleep(0.02)
        stop.set()  # its model request takes 0.5 s
        summary = await asyncio.wait_for(working, 60)
        assert summary.handed_over == [run.id]
        finished = [event.kind for event in worker.engine.store.events(run.id) if event.step == "a"]
        assert finished[-1] == "step_succeeded", finished
    finally:
        worker.close()


class _EndingWorker:
    """A worker whose first run has ended but whose end (telling the registry) never gets further.

    Stopping, the worker lets that run's end go on for the whole grace (`_let_finished_runs_end`).
    """

    def __init__(
        self, database: str, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from masterplanner.engine import workflows
        from masterplanner.engine.worker import Worker

        self.write_script = write_script
        self.ends: list[str] = []
        built = workflows.resources_of

        async def endless_end(run_id: str, settings: Settings, store: Any, **kwargs: Any) -> Any:
            if store.get_run(run_id).finished:  # the end workflow, about to tell the registry
                self.ends.append(run_id)
                await asyncio.sleep(600)
            return await built(run_id, settings, store, **kwargs)

        monkeypatch.setattr(workflows, "resources_of", endless_end)
        settings = Settings.load(
            database_url=database, remember_runs="never", embedder="none", worker_concurrency=1
        )
        self.grace_s = 5.0
        self.worker = Worker(settings, providers=["scripted"], grace_s=self.grace_s)
        self.stop = asyncio.Event()

    def create(self, task: str, steps: list[dict[str, Any]], delay_s: float) -> str:
        script = self.write_script(
            [
                {"purpose": "planner", "output": {"steps": steps}},
                *[
                    {"purpose": f"step:{each['id']}", "output": each["id"], "delay_s": delay_s}
                    for each in steps
                ],
                {"purpose": "*", "repeat": True},
            ]
        )
        run = self.worker.engine.create_run(
            task, model=f"scripted:{script}", options=RunOptions(auto_approve=True), for_workers=True
        )
        return run.id

    async def start_with_an_ended_run(self) -> tuple[str, asyncio.Future[Any]]:
        """The worker working, once its first run has ended and is stuck in its end; that run's id."""
        ended = self.create("one step", [step("a", tools=[])], 0)
        working = asyncio.ensure_future(self.worker.run(self.stop))
        deadline = time.monotonic() + 60
        while not self.ends:
            assert time.monotonic() < deadline, "the run did not reach its end"
            await asyncio.sleep(0.05)
        assert self.worker.engine.store.get_run(ended).status == "succeeded"
        return ended, working

    async def started(self, run_id: str, count: int) -> list[str]:
        """The steps of the run started, once at least `count` of them have."""
        deadline = time.monotonic() + 60
        while True:
            found = [
                str(event.step)
                for event in self.worker.engine.store.events(run_id)
                if event.kind == "step_started"
            ]
            if len(found) >= count:
                return found
            assert time.monotonic() < deadline, f"{count} steps of {run_id} did not start"
            await asyncio.sleep(0.02)


async def test_a_stopping_worker_takes_no_new_step_from_its_queues_while_its_ended_runs_finish(
    database: str, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the stop, the worker takes no more steps from the shared queues, at once.

    Before, its queues were dequeued until DBOS stopped, after the wait for its ended runs: a step
    started then was cut short by the shutdown and left to another worker to replay (its model
    requests made twice).
    """
    ending = _EndingWorker(database, write_script, monkeypatch)
    try:
        ended, working = await ending.start_with_an_ended_run()
        # six steps side by side, one at a time here (`worker_concurrency`), 2 s each
        queued = ending.create("six steps", [step(f"b{n}", tools=[]) for n in range(6)], 2.0)
        before = await ending.started(queued, 1)  # the one running: the next starts in 2 s at the soonest
        ending.stop.set()
        summary = await asyncio.wait_for(working, 60)
        assert sorted(summary.handed_over) == sorted([ended, queued])
        assert await ending.started(queued, 1) == before  # no step started after the stop
        step_events = [event.kind for event in ending.worker.engine.store.events(queued) if event.step]
        assert step_events == ["step_started", "step_succeeded"]  # the running one had its grace
    finally:
        ending.worker.close()


async def test_a_stopping_worker_gives_its_ended_runs_and_its_running_steps_one_grace_together(
    database: str, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grace is one deadline from the stop: what the ended runs' ends take, the steps do not get.

    Before, the ended runs' ends got the whole grace, then the running steps the whole grace again:
    a worker told to stop took twice its grace (a pod killed before it recorded its stop).
    """
    ending = _EndingWorker(database, write_script, monkeypatch)
    try:
        ended, working = await ending.start_with_an_ended_run()
        long = ending.create("one long step", [step("b", tools=[])], 600)
        await ending.started(long, 1)
        stop = time.monotonic()
        ending.stop.set()
        summary = await asyncio.wait_for(working, 60)
        took = time.monotonic() - stop
        # the end waited for takes the whole grace; at least twice the grace it took before (the
        # bound leaves room for DBOS's whole-second rounding and its threads' teardown on a slow machine)
        assert ending.grace_s <= took < 1.8 * ending.grace_s
        assert sorted(summary.handed_over) == sorted([ended, long])
    finally:
        ending.worker.close()


async def test_a_run_a_worker_is_still_claiming_is_not_taken_up_again_by_its_next_claim_round(
    database: str, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claim slower than the claim rounds (a loaded machine) leaves one coordination per run.

    Before, a round that listed the run again before the first claim was made started a second
    coordination of it and forgot the first: that one was neither handed over nor cancelled when
    the worker stopped, and ran on after DBOS stopped.
    """
    from masterplanner.engine.store import RunStore
    from masterplanner.engine.worker import Worker

    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "*", "repeat": True},
        ]
    )
    settings = Settings.load(database_url=database, remember_runs="never", embedder="none")
    claims: list[str] = []
    claim = RunStore.claim

    def slow_claim(store: RunStore, run_id: str, owner: str, **kwargs: Any) -> bool:
        claims.append(run_id)
        time.sleep(1.0)  # four claim rounds go by meanwhile
        return claim(store, run_id, owner, **kwargs)

    monkeypatch.setattr(RunStore, "claim", slow_claim)
    worker = Worker(settings, providers=["scripted"], grace_s=10)
    try:
        run = worker.engine.create_run(
            "one step", model=f"scripted:{script}", options=RunOptions(auto_approve=True), for_workers=True
        )
        stop = asyncio.Event()
        working = asyncio.ensure_future(worker.run(stop))
        deadline = time.monotonic() + 60
        while worker.engine.store.get_run(run.id).status != "succeeded":
            assert time.monotonic() < deadline, "the run did not succeed"
            await asyncio.sleep(0.05)
        stop.set()
        summary = await asyncio.wait_for(working, 60)
    finally:
        worker.close()
    assert claims == [run.id]
    assert summary.runs == {run.id: "succeeded"}
