"""`masterplanner run` and `runs` as a person uses them: real processes, scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from _cli import LEASE_S, mp, run_events
from _plans import APPROVED_AS_SHOWN, step, to_approval

from masterplanner import RunError, RunService, Settings
from masterplanner.engine import Engine, RunOptions
from masterplanner.engine.control import open_run_store
from masterplanner.engine.records import RunRecord, RunStatus
from masterplanner.engine.store import RunStore

DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}


@pytest.fixture(autouse=True)
def short_leases(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose process is killed may be taken over 2 s after it was last heard from."""
    monkeypatch.setenv("MASTERPLANNER_RUN_LEASE_S", str(LEASE_S))


def _planner(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"purpose": "planner", "output": {"steps": list(steps)}}


def test_three_independent_steps_of_one_second_overlap(write_script: Callable[..., Path]) -> None:
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", tools=[]), step("c", tools=[])),
            *({"purpose": f"step:{name}", "output": name, "delay_s": 1.0} for name in "abc"),
            {"purpose": "*", "repeat": True},
        ]
    )
    result = mp("run", "three independent things", "--model", f"scripted:{script}", "--yes", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "succeeded"
    assert set(report) >= {"run_id", "status", "output", "plan", "steps", "usage"}
    usage = report["usage"]
    assert set(usage) == {
        "llm_calls",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "unpriced_calls",
        "failed_calls",
        "by_purpose",
    }
    # money per purpose: the scripted model costs nothing, and every call has that known price
    assert usage["by_purpose"]["step:a"] | {"seconds": 0} == {
        "calls": 1,
        "input_tokens": usage["by_purpose"]["step:a"]["input_tokens"],
        "output_tokens": 1,
        "seconds": 0,
        "cost_usd": 0.0,
        "unpriced_calls": 0,
        "failed_calls": 0,
    }
    assert (usage["cost_usd"], usage["unpriced_calls"], usage["failed_calls"]) == (0.0, 0, 0)
    starts = [datetime.fromisoformat(s["started_at"]) for s in report["steps"]]
    ends = [datetime.fromisoformat(s["finished_at"]) for s in report["steps"]]
    assert all(s["started_at"].endswith("Z") and s["attempts"] == 1 for s in report["steps"])
    span = (max(ends) - min(starts)).total_seconds()
    assert span >= 1.0, span
    # overlapping, not one after another: every step started before any finished (how much
    # faster than one after another is for bench/engine.py, not a test on a shared machine)
    assert max(starts) < min(ends), report["steps"]


def _events(run_id: str) -> list[dict[str, Any]]:
    engine = Engine(Settings.load())
    try:
        return [event.to_json_dict() for event in engine.store.events(run_id)]
    finally:
        engine.close()


def _chain_killed_after_s2(write_script: Callable[..., Path], *, lease_s: float = LEASE_S) -> str:
    """Start a 5-step scripted chain, `kill -9` it while s3 runs (s2 finished); return the run id."""
    chain = [step("s1", tools=[])] + [step(f"s{n}", f"s{n - 1}", tools=[]) for n in range(2, 6)]

    def calls(s3_delay: float) -> list[dict[str, Any]]:
        return [
            _planner(*chain),
            *(
                {"purpose": f"step:s{n}", "output": f"out{n}", "delay_s": s3_delay if n == 3 else 0.3}
                for n in range(1, 6)
            ),
            {"purpose": "*", "repeat": True},
        ]

    # s3 waits until it is killed, however long this test takes to see that it started; the
    # process that resumes the run reads the script again, and finds s3 quick (below)
    script = write_script(calls(s3_delay=3600.0))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "masterplanner",
            "run",
            "a chain of five",
            "--model",
            f"scripted:{script}",
            "--yes",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MASTERPLANNER_RUN_LEASE_S": str(lease_s)},
    )
    run_id = None
    deadline = time.monotonic() + 300  # only so a broken run cannot hang the suite
    engine = Engine(Settings.load())
    try:
        while True:
            # s3 has started (so its workflow is recorded) and waits: s2 has finished
            runs = engine.store.list_runs()
            run_id = runs[0].id if runs else None
            if run_id and any(
                e.kind == "step_started" and e.step == "s3" for e in engine.store.events(run_id)
            ):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise AssertionError(
                    f"s3 of run {run_id} never started (the run exited with {process.returncode})"
                )
            time.sleep(0.02)
    finally:
        engine.close()
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    script.write_text(json.dumps({"calls": calls(s3_delay=3.0)}))
    events = _events(run_id)
    assert not any(e["kind"] == "step_succeeded" and e["step"] == "s3" for e in events), events
    return run_id


def _assert_resumed_without_repeats(run_id: str, resumed: tuple[str, ...] = ("s3",)) -> None:
    """Every step started once, `resumed` (cut short by the kill) resumed once, the answer right."""
    shown = json.loads(mp("runs", "show", run_id, "--json").stdout)
    started = [e["step"] for e in shown["events"] if e["kind"] == "step_started"]
    assert started == ["s1", "s2", "s3", "s4", "s5"]  # s3, running when killed, was not started again
    assert tuple(e["step"] for e in shown["events"] if e["kind"] == "step_resumed") == resumed
    assert [s["status"] for s in shown["steps"]] == ["succeeded"] * 5
    assert [s["output"] for s in shown["steps"]] == [f"out{n}" for n in range(1, 6)]
    # each reply counted once against the budgets: those replayed on resume are not counted again
    # (s3's request, cut off by the kill, was never answered, so never counted, and made again)
    by_purpose = shown["usage"]["by_purpose"]
    assert [by_purpose[f"step:s{n}"]["calls"] for n in range(1, 6)] == [1] * 5
    assert by_purpose["planner"]["calls"] == 1
    kinds = [e["kind"] for e in shown["events"]]
    assert kinds[kinds.index("run_succeeded") + 1 :] == ["team_stored"]  # the registry comes last
    assert [e["seq"] for e in shown["events"]] == list(range(1, len(shown["events"]) + 1))


def test_kill_9_then_resume_never_repeats_finished_steps(write_script: Callable[..., Path]) -> None:
    # the killed process holds its lease long enough that the resume surely finds it still held
    # (its holder sets how long it lasts; a 2 s lease could lapse while the resume starts up, and
    # an 8 s one did, once, with the machine's two cores running several test jobs)
    run_id = _chain_killed_after_s2(write_script, lease_s=15)
    resumed = mp("runs", "resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["output"] == "out5"
    # no process id is asked about: the killed process's lease lapses and the run is taken over
    assert re.search(
        rf"run {run_id} was being executed by \S+, last heard from [\d.]+ s ago: waiting up to "
        r"[\d.]+ s for it to be heard from again or for its lease to lapse",
        resumed.stderr,
    ), resumed.stderr
    _assert_resumed_without_repeats(run_id)
    # the timeline says where s3 started and where it was resumed
    shown = mp("runs", "show", run_id, "--timeline").stdout
    timeline = {line.split()[0]: line for line in shown.splitlines()}
    where = re.search(r"succeeded +[\d.]+ s +(\S+) → (\S+)$", timeline["s3"])
    assert where is not None and where[1] != where[2] and where[2] in timeline["s4"], shown
    assert "→" not in timeline["s2"], shown


def test_the_next_run_resumes_a_crashed_run(write_script: Callable[..., Path]) -> None:
    crashed = _chain_killed_after_s2(write_script)
    engine = Engine(Settings.load())
    deadline = time.monotonic() + 60
    try:  # the killed process's lease lapses (in database time, as the next run reads it)
        while crashed not in engine.store.abandoned_runs():
            assert time.monotonic() < deadline, f"the lease of crashed run {crashed} never lapsed"
            time.sleep(0.1)
    finally:
        engine.close()
    script = write_script([_planner(step("x", tools=[])), {"purpose": "*", "repeat": True}])
    result = mp("run", "something else", "--model", f"scripted:{script}", "--yes", "--json")
    assert result.returncode == 0, result.stderr
    assert f"resuming run {crashed}, interrupted by a crash" in result.stderr
    assert f"run {crashed}: succeeded" in result.stderr
    _assert_resumed_without_repeats(crashed)


def test_the_next_run_says_which_worker_left_the_run_it_resumes_when_it_stopped(
    write_script: Callable[..., Path],
) -> None:
    """A run a stopping worker handed over was not interrupted by a crash: the line says who left it.

    Before, every run taken over beside the new one was said "interrupted by a crash".
    """
    script = write_script([_planner(step("x", tools=[])), {"purpose": "*", "repeat": True}])
    worker = "worker-host:4242:0a1b2c3d"
    engine = Engine(Settings.load())
    try:
        left = engine.create_run("left", model=f"scripted:{script}", options=RunOptions(auto_approve=True))
        assert asyncio.run(engine.execute(left.id)).status == "succeeded"
        # a worker held it (its end, say, telling the registry) and handed it over as it stopped
        assert engine.store.claim(left.id, f"{worker}/e5f6a7", lease_s=30)
        engine.store.hand_over(left.id, f"{worker}/e5f6a7")
        assert engine.store.abandoned_runs() == [left.id]
    finally:
        engine.close()
    result = mp("run", "something else", "--model", f"scripted:{script}", "--yes", "--json")
    assert result.returncode == 0, result.stderr
    line = f"resuming run {left.id}, left by worker {worker} when it stopped, beside this one\n"
    assert line in result.stderr
    assert "interrupted by a crash" not in result.stderr
    assert f"run {left.id}: succeeded" in result.stderr


def test_a_step_killed_before_its_first_event_is_resumed_not_waited_on(
    write_script: Callable[..., Path],
) -> None:
    # A step's workflow is recorded before its `step_started` event: a kill between the two
    # leaves a pending workflow behind a step the store still calls pending. That is the state
    # made here (s3 running, its events and status rolled back), since the window is too short
    # to hit on purpose; resuming once waited for ever on the dead process's workflow.
    import sqlite3

    run_id = _chain_killed_after_s2(write_script)
    database = Settings.load().home / "masterplanner.sqlite"
    with sqlite3.connect(database) as db:
        (s2_done,) = db.execute(
            "SELECT seq FROM mp_events WHERE run_id = ? AND kind = 'step_succeeded' AND step = 's2'",
            (run_id,),
        ).fetchone()
        db.execute("DELETE FROM mp_events WHERE run_id = ? AND seq > ?", (run_id, s2_done))
        db.execute(
            "UPDATE mp_steps SET status = 'pending', started_at = NULL, attempts = 0 "
            "WHERE run_id = ? AND step_id = 's3'",
            (run_id,),
        )
        (pending,) = db.execute(
            "SELECT status FROM workflow_status WHERE workflow_uuid = ?", (f"{run_id}.s3",)
        ).fetchone()
    assert pending == "PENDING"
    resumed = mp("runs", "resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["output"] == "out5"
    _assert_resumed_without_repeats(run_id, resumed=())  # s3 had not started: it starts here


def _planning_killed_with_two_prompts_written(write_script: Callable[..., Path], stop: signal.Signals) -> str:
    """Start a 3-step run, stop it with `stop` once two steps' prompts are written; return the run id.

    The third step's draft waits until the process is stopped; the two others are drafted,
    critiqued and revised (4 `prompt_creator` calls and 2 `critic` calls counted).
    """
    drafts = [{"purpose": "prompt_creator", "output": f"Draft {n}.", "delay_s": 0.1} for n in (1, 2)]
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", tools=[]), step("c", tools=[])),
            *drafts,
            {"purpose": "prompt_creator", "output": "Draft 3.", "delay_s": 3600.0},
            {"purpose": "prompt_creator", "output": "Revised before the stop.", "repeat": True},
            {"purpose": "*", "repeat": True},
        ]
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "masterplanner",
            "run",
            "three things",
            "--model",
            f"scripted:{script}",
            "--yes",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    run_id = None
    deadline = time.monotonic() + 120  # only so a broken run cannot hang the suite
    engine = Engine(Settings.load())
    try:
        while True:
            runs = engine.store.list_runs()
            run_id = runs[0].id if runs else None
            by_purpose = engine.store.usage(run_id)["by_purpose"] if run_id else {}
            counted = [by_purpose.get(purpose, {}).get("calls") for purpose in ("prompt_creator", "critic")]
            kept = engine.store.kept_planning(run_id) if run_id else None
            if counted == [4, 2] and len((kept or {}).get("prompts") or {}) == 2:
                break  # the second prompt, its last call counted, is kept a moment after
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise AssertionError(f"run {run_id} never kept two prompts ({by_purpose}, {kept})")
            time.sleep(0.02)
    finally:
        engine.close()
    process.send_signal(stop)
    process.wait(timeout=60)
    # the resumed run's third draft is quick (and so is any call made again)
    script.write_text(
        json.dumps(
            {
                "calls": [
                    _planner(step("a", tools=[]), step("b", tools=[]), step("c", tools=[])),
                    {"purpose": "prompt_creator", "output": "Draft after the stop."},
                    {"purpose": "prompt_creator", "output": "Revised after the stop.", "repeat": True},
                    {"purpose": "*", "repeat": True},
                ]
            }
        )
    )
    assert run_id is not None
    return run_id


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_planning_stopped_is_resumed_from_its_plan_and_written_prompts(
    write_script: Callable[..., Path], stop: signal.Signals
) -> None:
    """Before, a resumed run planned again from the start: the planner and every prompt paid twice."""
    run_id = _planning_killed_with_two_prompts_written(write_script, stop)
    resumed = mp("runs", "resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    shown = json.loads(mp("runs", "show", run_id, "--json").stdout)
    assert shown["status"] == "succeeded"
    # each call counted once: only the third step's prompt is written after the stop
    by_purpose = shown["usage"]["by_purpose"]
    assert {purpose: by_purpose[purpose]["calls"] for purpose in ("planner", "prompt_creator", "critic")} == {
        "planner": 1,
        "prompt_creator": 6,
        "critic": 3,
    }
    engine = Engine(Settings.load())
    try:
        held = engine.store.get_run(run_id).agents
    finally:
        engine.close()
    agents = {step_id: (agent.draft, agent.prompt) for step_id, agent in held.items()}
    assert sorted(agents.values()) == [
        ("Draft 1.", "Revised before the stop."),
        ("Draft 2.", "Revised before the stop."),
        ("Draft after the stop.", "Revised after the stop."),
    ]
    progress = [e["data"] for e in shown["events"] if e["kind"] == "planning_progress"]
    resumed_at = next(at for at, data in enumerate(progress) if data["stage"] == "resumed")
    took_over = progress[resumed_at].pop("process")  # named: the process that went on with it
    assert progress[resumed_at:] == [
        {"stage": "resumed", "prompts": 2},
        {"stage": "prompts", "draft": 3, "of": 3},
        {"stage": "review", "round": 1},
    ]
    assert {e["data"]["process"] for e in shown["events"] if e["kind"] == "step_started"} == {took_over}
    kinds = [e["kind"] for e in shown["events"]]
    assert kinds.count("plan_ready") == 1
    text = mp("runs", "show", run_id).stdout
    assert f"resuming planning in {took_over} (its plan and 2 of its prompts were made before)" in text


EDITOR = """
import pathlib, sys
path = pathlib.Path(sys.argv[-1])
text = path.read_text()
log = pathlib.Path(__file__).with_suffix(".log")
log.write_text(log.read_text() + "\\n=====\\n" + text if log.exists() else text)
if "# ERROR:" not in text:  # first opening: make a and b depend on each other
    text = text.replace("depends_on: []", "depends_on: [b]", 1)
    text = text.replace("depends_on: []", "depends_on: [a]", 1)
else:  # reopened with the error on top: fix the cycle and retitle a
    kept = [line for line in text.splitlines() if not line.startswith("# ERROR:")]
    text = "\\n".join(kept).replace("depends_on: [b]", "depends_on: []")
    text = text.replace("title: do a", "title: edited a")
path.write_text(text)
"""


def _two_things_edited_by(
    source: str, write_script: Callable[..., Path], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """`run "two things"` (steps a, b), its review edited by a Python editor running `source`."""
    script = write_script(
        [_planner(step("a", tools=[]), step("b", tools=[])), DRAFTS, {"purpose": "*", "repeat": True}]
    )
    editor = tmp_path / "editor.py"
    editor.write_text(source)
    return mp(
        "run",
        "two things",
        "--model",
        f"scripted:{script}",
        "--json",
        stdin="e\na\n",
        env={"EDITOR": f"{sys.executable} {editor}", "VISUAL": ""},
    )


def test_an_invalid_edit_is_reopened_with_the_error_on_top(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    result = _two_things_edited_by(EDITOR, write_script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "the edit is invalid: steps form a cycle" in result.stderr
    opened = (tmp_path / "editor.log").read_text().split("\n=====\n")
    assert len(opened) == 2
    assert not opened[0].startswith("# ERROR:")
    assert opened[1].startswith("# ERROR: steps form a cycle")
    report = json.loads(result.stdout)
    assert report["status"] == "succeeded"
    assert report["plan"]["steps"][0]["title"] == "edited a"
    kinds = [e["kind"] for e in _events(report["run_id"])]
    assert kinds.index("plan_edited") < kinds.index("approved") < kinds.index("step_started")


def test_reject_exits_1_and_read_only_commands_never_execute(write_script: Callable[..., Path]) -> None:
    script = write_script([_planner(step("a", tools=[])), DRAFTS, {"purpose": "*", "repeat": True}])
    # Enter alone approves nothing (a stray one once approved a plan that may run code), and an
    # answer that is not one is asked again without the plan drawn again
    rejected = mp("run", "one thing", "--model", f"scripted:{script}", "--json", stdin="\nmaybe\nr\n")
    assert rejected.returncode == 1, rejected.stderr
    assert json.loads(rejected.stdout)["status"] == "cancelled"
    assert rejected.stderr.count("approve, reject or edit? [a/r/e]") == 3
    assert rejected.stderr.count("answer a (approve), r (reject) or e (edit)") == 2
    assert rejected.stderr.count("estimate for the steps:") == 1

    # input closed: the run waits for its review to be answered from elsewhere
    waiting = subprocess.Popen(
        [sys.executable, "-m", "masterplanner", "run", "another thing", "--model", f"scripted:{script}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        pending: list[dict[str, Any]] = []
        while not pending and time.monotonic() < deadline:
            pending = json.loads(mp("runs", "pending", "--json").stdout)
        [review] = pending
        listed = json.loads(mp("runs", "list", "--json").stdout)
        assert [(r["status"], r["idle"]) for r in listed] == [
            ("awaiting_approval", None),
            ("cancelled", None),
        ]
        run_id = listed[0]["run_id"]
        assert review["run_id"] == run_id and review["kind"] == "plan_review"
        assert json.loads(mp("runs", "show", run_id, "--json").stdout)["status"] == "awaiting_approval"

        cancelled = mp("runs", "cancel", run_id)
        assert cancelled.returncode == 0, cancelled.stderr
        _out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 1
    assert f"waiting for an answer to request {review['id']}: review the plan of 1 step:" in err
    assert json.loads(mp("runs", "show", run_id, "--json").stdout)["status"] == "cancelled"
    assert json.loads(mp("runs", "pending", "--json").stdout) == []
    closed = mp("runs", "answer", review["id"], "--approve")
    assert (closed.returncode, closed.stderr.strip()) == (
        2,
        f"error: request {review['id']} is cancelled: its run {run_id} was cancelled",
    )
    again = mp("runs", "cancel", run_id)
    assert again.returncode == 1
    assert again.stderr.strip() == f"error: run {run_id} already cancelled"


def test_a_rejection_at_the_terminal_takes_an_optional_reason_kept_as_the_other_front_ends_keep_it(
    write_script: Callable[..., Path],
) -> None:
    script = write_script([_planner(step("a", tools=[])), DRAFTS, {"purpose": "*", "repeat": True}])
    given = mp(
        "run", "one thing", "--model", f"scripted:{script}", "--json", stdin="r\n  not what I asked  \n"
    )
    assert given.returncode == 1, given.stderr
    run_id = json.loads(given.stdout)["run_id"]
    assert given.stderr.count("reason for the rejection (Enter for none): ") == 1
    [rejected] = [event for event in run_events(run_id) if event["kind"] == "rejected"]
    assert rejected["data"]["reason"] == "not what I asked"
    assert rejected["data"]["by"].startswith("terminal@")
    show = mp("runs", "show", run_id)
    assert show.returncode == 0, show.stderr
    events = [line[9:] for line in show.stdout.splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
    assert [line for line in events if line.startswith("rejected")] == ["rejected not what I asked"]
    [_created, audited] = json.loads(mp("runs", "audit", run_id, "--json").stdout)
    assert (audited["action"], audited["front_end"]) == ("rejected the plan: not what I asked", "terminal")

    # Enter for none: the run says no reason was given, as a rejection with none from any front end
    bare = mp("run", "one thing", "--model", f"scripted:{script}", "--json", stdin="r\n\n")
    assert bare.returncode == 1, bare.stderr
    run_id = json.loads(bare.stdout)["run_id"]
    [rejected] = [event for event in run_events(run_id) if event["kind"] == "rejected"]
    assert rejected["data"]["reason"] == "no reason given"
    [_created, audited] = json.loads(mp("runs", "audit", run_id, "--json").stdout)
    assert audited["action"] == "rejected the plan"


def test_with_nothing_to_read_the_review_question_is_not_printed_and_a_pipe_still_answers(
    write_script: Callable[..., Path],
) -> None:
    script = write_script([_planner(step("a", tools=[])), DRAFTS, {"purpose": "*", "repeat": True}])
    # input piped in answers the question: it is asked, then taken (not echoed, so the line ends)
    piped = mp("run", "one thing", "--model", f"scripted:{script}", "--json", stdin="a\n")
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["status"] == "succeeded"
    lines = piped.stderr.splitlines()
    assert lines.count("approve, reject or edit? [a/r/e] ") == 1
    assert not [line for line in lines if "waiting for an answer" in line or "answer it with" in line]

    # no input at all (/dev/null, or a pipe closed at once): a question that cannot be answered
    # here is not printed; what is printed is how to answer it from elsewhere
    reading, writing = os.pipe()
    os.close(writing)  # a pipe whose writer is gone: the first read is its end
    for stdin in (subprocess.DEVNULL, reading):
        waiting = subprocess.Popen(
            [sys.executable, "-m", "masterplanner", "run", "another thing", "--model", f"scripted:{script}"],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        try:
            deadline = time.monotonic() + 60
            pending: list[dict[str, Any]] = []
            while not pending and time.monotonic() < deadline:
                pending = json.loads(mp("runs", "pending", "--json").stdout)
            [review] = pending
            answered = mp("runs", "answer", review["id"], "--approve")
            assert answered.returncode == 0, answered.stderr
            out, err = waiting.communicate(timeout=60)
        finally:
            waiting.kill()
        assert waiting.returncode == 0, err
        assert out.strip() == "ok"
        lines = err.splitlines()
        assert not [line for line in lines if "[a/r/e]" in line]
        at = lines.index(
            f"waiting for an answer to request {review['id']}: review the plan of 1 step: "
            "approve, reject or edit"
        )
        assert lines[at + 1] == (
            f"  answer it with: masterplanner runs answer {review['id']} --approve   "
            "(or --deny [--reason '…'])"
        )
        assert lines[at - 1].startswith("estimate for the steps: ")
    os.close(reading)


def test_unknown_run_and_bad_options_are_clear_errors() -> None:
    missing = mp("runs", "show", "nope-nope")
    assert missing.returncode == 2  # a usage error, as an unknown request id is
    assert missing.stderr.startswith("error: no run 'nope-nope'")
    bad = mp("run", "x", "--model", "scripted:/nonexistent.json", "--max-parallel", "0")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "error: --max-parallel must be between 1 and 64, got 0"
    for value in ("nan", "100000"):  # not a duration, or more than a day: named by its flag
        slow = mp("run", "x", "--model", "scripted:/nonexistent.json", "--step-timeout", value)
        assert slow.returncode == 2
        assert slow.stderr.strip() == (
            f"error: --step-timeout must be more than 0 and at most 86,400 seconds, got {float(value):g}"
        )


NUL_EDITOR = """
import pathlib, sys
path = pathlib.Path(sys.argv[-1])
text = path.read_text()
log = pathlib.Path(__file__).with_suffix(".log")
log.write_text(log.read_text() + "\\n=====\\n" + text if log.exists() else text)
if "# ERROR:" not in text:  # first opening: a NUL in a's title and prompt, as YAML writes it
    text = text.replace("title: do a", 'title: "do\\\\0 a"')
    prompt = "prompt: You are a worker. Do the step."
    text = text.replace(prompt, prompt.replace(": ", ': "').replace("are", "are\\\\0") + '"', 1)
else:  # reopened with the errors on top: retitle a, its prompt as it was
    kept = [line for line in text.splitlines() if not line.startswith("# ERROR:")]
    text = "\\n".join(kept).replace('title: "do\\\\0 a"', "title: edited a")
    text = text.replace('"You are\\\\0 a worker. Do the step."', "You are a worker. Do the step.")
path.write_text(text)
"""


def test_an_edit_holding_a_nul_is_reopened_naming_where(
    database_url: str, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """On SQLite the title was stored with its NUL; on Postgres the run failed in the database's words."""
    result = _two_things_edited_by(NUL_EDITOR, write_script, tmp_path)
    assert result.returncode == 0, result.stderr
    opened = (tmp_path / "editor.log").read_text().split("\n=====\n")
    assert len(opened) == 2
    assert 'title: "do\\0 a"' in opened[1]
    assert opened[1].splitlines()[:2] == [
        "# ERROR: step a: prompt: must not hold a NUL character",
        "# ERROR: step 'a': title: must not hold a NUL character",
    ]
    report = json.loads(result.stdout)
    assert (report["status"], [s["title"] for s in report["plan"]["steps"]]) == (
        "succeeded",
        ["edited a", "do b"],
    )


RETASKING_EDITOR = """
import pathlib, sys
path = pathlib.Path(sys.argv[-1])
text = path.read_text()
if "# ERROR:" not in text:  # first opening: another task
    path.write_text(text.replace("task: two things", "task: delete everything"))
# reopened with the error on top: closed without saving
"""


def test_the_task_is_not_edited_at_review_and_an_edit_closed_unsaved_is_given_up(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    result = _two_things_edited_by(RETASKING_EDITOR, write_script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert (
        "the edit is invalid: task: is the run's task and cannot be edited; "
        "start a new run for another task\n"
        "the edit was given up; the plan is unchanged\n"
    ) in result.stderr
    report = json.loads(result.stdout)
    assert (report["status"], report["plan"]["task"]) == ("succeeded", "two things")
    assert "plan_edited" not in [e["kind"] for e in _events(report["run_id"])]


UNTASKING_EDITOR = """
import pathlib, sys
path = pathlib.Path(sys.argv[-1])
text = path.read_text()
if "# ERROR:" not in text:  # reopened with an error on top: closed without saving
    path.write_text(text.replace("task: two things\\n", "").replace("title: do b", "title: do b well"))
"""


def test_an_edit_without_its_task_keeps_the_run_task_as_its_header_says(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    result = _two_things_edited_by(UNTASKING_EDITOR, write_script, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "the edit is invalid" not in result.stderr
    report = json.loads(result.stdout)
    assert (report["status"], report["plan"]["task"]) == ("succeeded", "two things")
    assert [s["title"] for s in report["plan"]["steps"]] == ["do a", "do b well"]


def _fake_editor(tmp_path: Path, body: str) -> str:
    script = tmp_path / "fake-editor.sh"
    script.write_text("#!/bin/sh\nfor file; do :; done\n" + body + "\n")  # the file is the last argument
    script.chmod(0o755)
    return str(script)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("exit 1", "the editor '{editor}' exited with status 1"),
        (None, "the editor '{editor}' could not be started: No such file or directory"),
        ('rm -- "$file"', "the editor '{editor}' removed the file it was editing"),
        (
            'printf "\\377\\376" > "$file"',
            "the editor '{editor}' saved text that is not UTF-8 (byte 0xff at offset 0)",
        ),
    ],
    ids=["exit-status", "not-found", "deletes-the-file", "not-utf8"],
)
def test_a_failing_editor_is_one_line_and_the_review_is_asked_again(
    write_script: Callable[..., Path], tmp_path: Path, body: str | None, problem: str
) -> None:
    script = write_script([_planner(step("a", tools=[])), DRAFTS, {"purpose": "*", "repeat": True}])
    command = f"{_fake_editor(tmp_path, body)} --bad" if body else str(tmp_path / "no-such-editor")
    # VISUAL comes first (as git and click read it): EDITOR would fail differently
    env = {"VISUAL": command, "EDITOR": str(tmp_path / "never-used")}
    result = mp("run", "one thing", "--model", f"scripted:{script}", "--json", stdin="e\na\n", env=env)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    # the answer typed at the prompt is not echoed (input is not a terminal): the prompt's line ends
    assert (
        f"approve, reject or edit? [a/r/e] \n{problem.format(editor=command)}; the plan is unchanged\n"
        in (result.stderr)
    )
    assert result.stderr.count("approve, reject or edit? [a/r/e]") == 2  # asked again, then approved
    report = json.loads(result.stdout)
    assert report["status"] == "succeeded"
    assert report["plan"]["steps"] == [step("a", tools=[])]  # nothing changed by the failed edit


def test_without_a_terminal_events_are_plain_lines_and_the_summary_comes_last(
    write_script: Callable[..., Path],
) -> None:
    writes = [
        {
            "purpose": f"step:{name}",
            "tool_calls": [{"name": "write_file", "args": {"path": path, "content": name}}],
        }
        for name, path in (("a", "z/a.md"), ("b", "b.txt"))
    ]
    script = write_script(
        [
            _planner(step("a", tools=["write_file"]), step("b", "a", tools=["write_file"])),
            *writes,
            {"purpose": "step:a", "output": "a done"},
            {"purpose": "step:b", "output": "b done"},
            {"purpose": "*", "repeat": True},
        ]
    )
    env = dict.fromkeys(("FORCE_COLOR", "TTY_COMPATIBLE"), "")  # set but empty: nothing forces colour
    result = mp("run", "two files", "--model", f"scripted:{script}", "--yes", env=env)
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stderr
    assert result.stdout == "b done\n"
    lines = result.stderr.splitlines()
    run_id, workspace = re.fullmatch(r"run (\S+) · workspace (\S+)", lines[0]).groups()  # type: ignore[union-attr]
    kinds = [line.split(" ")[1] for line in lines[1:-4]]
    assert kinds == [
        *["planning_progress"] * 5,
        "plan_ready",
        "approved",  # --yes: no review request is opened
        *(["step_started", "tool_called", "tool_result", "step_succeeded"] * 2),
        "run_succeeded",
        "team_stored",
    ], result.stderr  # failed once in CI with one planning_progress line fewer: show them all
    assert [line.partition(" planning_progress ")[2] for line in lines[1:6]] == [
        "finding similar teams",
        "planning the steps",
        "writing prompts (1 of 2)",
        "writing prompts (2 of 2)",
        "reviewing prompts (round 1)",
    ]
    totals = r"\d+\.\d s · \d+ model calls · \d+ in / \d+ out tokens · \$0\.00"
    assert re.fullmatch(rf"run {run_id} succeeded · {totals}", lines[-4])
    assert lines[-3:] == [f"2 files written in {workspace}:", "  b.txt", "  z/a.md"]


def test_files_this_process_writes_its_output_to_are_not_the_run_s(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """`run … --workspace . > out.txt 2> err.txt`: the summary listed out.txt and err.txt as the run's."""
    script = write_script(
        [
            _planner(step("a", tools=["write_file"])),
            {
                "purpose": "step:a",
                "tool_calls": [{"name": "write_file", "args": {"path": "total.txt", "content": "7"}}],
            },
            {"purpose": "step:a", "output": "a done"},
            {"purpose": "*", "repeat": True},
        ]
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with (workspace / "out.txt").open("w") as out, (workspace / "err.txt").open("w") as err:
        command = [sys.executable, "-m", "masterplanner", "run", "add up", "--model", f"scripted:{script}"]
        done = subprocess.run(
            [*command, "--yes", "--workspace", str(workspace)], stdout=out, stderr=err, timeout=120
        )
    assert done.returncode == 0, (workspace / "err.txt").read_text()
    said = (workspace / "err.txt").read_text().splitlines()
    assert said[-2:] == [f"1 file written in {workspace}:", "  total.txt"]


def test_runs_show_prints_the_plan(write_script: Callable[..., Path]) -> None:
    """`runs show` (its help and the README say it shows the plan) gave the steps' ids alone.

    What each step was told to do, by whom, with which tools and after which steps was only in
    `--json`.
    """
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=["read_file"])),
            DRAFTS,
            {"purpose": "*", "repeat": True},
        ]
    )
    result = mp("run", "two things", "--model", f"scripted:{script}", "--yes", "--json")
    assert result.returncode == 0, result.stderr
    run_id = json.loads(result.stdout)["run_id"]
    shown = mp("runs", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    lines = [line.lstrip(" │├└─") for line in shown.stdout.splitlines()]
    start = lines.index("two things")
    assert lines[start : start + 9] == [
        "two things",
        "a do a (starts at once)",
        "role worker   tools —",
        "Do a.",
        "→ a done",
        "b do b after a",
        "role worker   tools read_file",
        "Do b.",
        "→ b done",
    ]


def test_the_review_shows_an_estimate_and_runs_show_the_cost_per_purpose(
    write_script: Callable[..., Path],
) -> None:
    script = write_script(
        [_planner(step("a", tools=[]), step("b", "a", tools=[])), DRAFTS, {"purpose": "*", "repeat": True}]
    )
    result = mp("run", "two things", "--model", f"scripted:{script}", "--json", stdin="a\n")
    assert result.returncode == 0, result.stderr
    # two steps without tools: a request each; tokens and seconds as the planning calls measured
    assert re.search(
        r"estimate for the steps: about 2 model calls, [\d,]+ tokens, [\d.]+ s, cost \$0\.00 \(one request "
        r"a step, two with tools; tokens and time a request as this run's calls so far\)\n",
        result.stderr,
    )
    report = json.loads(result.stdout)
    assert report["usage"]["by_purpose"]["step:b"]["cost_usd"] == 0.0
    shown = mp("runs", "show", report["run_id"])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1] == f"workspace {report['workspace']}"  # where its files are
    rows = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines() if line.count("│") == 7}
    assert set(rows) >= {"planner", "step:a", "step:b", "all"}
    assert rows["step:b"].split("│")[2].strip() == "1"  # one call
    assert rows["all"].split("│")[6].strip() == "$0.00"


def test_a_cancel_that_cannot_take_effect_yet_says_what_it_waits_for(
    write_script: Callable[..., Path],
) -> None:
    """Before, `runs cancel` printed "run X planning" and exit 1, and `runs show` said nothing of it."""
    engine = Engine(Settings.load())
    try:
        run = engine.create_run("x", model=f"scripted:{write_script([{'purpose': '*', 'repeat': True}])}")
        assert engine.store.claim(run.id, "worker@elsewhere:7", lease_s=60)  # held by another process
    finally:
        engine.close()
    cancelled = mp("runs", "cancel", run.id, "--wait", "0")
    assert cancelled.returncode == 1
    lines = cancelled.stderr.splitlines()
    assert lines[0] == f"run {run.id} planning"
    assert re.fullmatch(
        r"a cancel was asked \(cli@\S+ at \S+\): worker@elsewhere:7, which executes the run \(last heard "
        r"from \d s ago\), stops it within moments; if that process died, the run is cancelled when the "
        r"next process takes it, once its hold lapses \(in (?:5\d|60) s\)",
        lines[1],
    ), lines
    shown = mp("runs", "show", run.id)
    assert lines[1].split("): ")[0] + "): worker@elsewhere:7, which executes the run" in shown.stdout


def test_a_cancel_that_lands_as_the_run_ends_leaves_it_succeeded(
    write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel from another process that read the run still running, and went on once it had ended.

    Before, it found the lease given up, took it and marked the succeeded run cancelled: its
    status, its steps and a `run_cancelled` after `team_stored`.
    """
    script = write_script(
        [
            _planner(step("a", tools=[])),
            {"purpose": "step:a", "output": "done a", "delay_s": 2.0},
            {"purpose": "*", "repeat": True},
        ]
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "masterplanner", "run", "one step", "--model", f"scripted:{script}", "--yes"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        run_id = _started(process, "a")
        # the canceller reads the run while it runs; its next call comes once the run has ended
        read = RunStore.get_run

        def read_then_wait(store: RunStore, wanted: str) -> RunRecord:
            record = read(store, wanted)
            process.wait(timeout=60)
            return record

        service = RunService(Settings.load())
        try:
            with monkeypatch.context() as patched, pytest.raises(RunError) as refused:
                patched.setattr(RunStore, "get_run", read_then_wait)
                asyncio.run(service.cancel(run_id, by="cli@elsewhere:1"))
        finally:
            service.close()
    finally:
        process.kill()
        process.wait()
    assert str(refused.value) == f"run {run_id} already succeeded"
    assert process.returncode == 0
    shown = json.loads(mp("runs", "show", run_id, "--json").stdout)
    assert (shown["status"], shown["output"]) == ("succeeded", "done a")
    assert [s["status"] for s in shown["steps"]] == ["succeeded"]
    kinds = [e["kind"] for e in shown["events"]]
    assert kinds[-2:] == ["run_succeeded", "team_stored"]
    assert "cancel_requested" not in kinds


def test_a_cancel_asked_as_the_run_records_its_end_leaves_no_cancel_to_come(
    write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancel that lands once the run is ending, before its outcome is written: too late.

    The run succeeds and the cancel stays on record as asked. Before, its flag stayed set on the
    succeeded run: the next execution of it (`runs resume`, which finishes an end a crash cut
    short) was stopped as cancelled before it could see the run had ended, and raised.
    """
    from masterplanner import RunOptions

    script = write_script(
        [
            _planner(step("a", tools=[])),
            {"purpose": "step:a", "output": "done a"},
            {"purpose": "*", "repeat": True},
        ]
    )
    ends = RunStore.end_run

    def asked_as_it_ends(store: RunStore, run_id: str, status: Any, *args: Any, **values: Any) -> bool:
        if status == "succeeded":  # another process asks the run to stop as it writes its outcome
            assert store.ask_cancel(run_id, by="cli@elsewhere:1")
        return ends(store, run_id, status, *args, **values)

    async def run_it() -> RunRecord:
        service = RunService(Settings.load())
        try:
            created = await service.create(
                "one step", model=f"scripted:{script}", options=RunOptions(auto_approve=True)
            )
            return await service.execute(created.id)
        finally:
            service.close()

    with monkeypatch.context() as patched:
        patched.setattr(RunStore, "end_run", asked_as_it_ends)
        record = asyncio.run(run_it())
    assert (record.status, record.output) == ("succeeded", "done a"), record.error
    kinds = [e["kind"] for e in run_events(record.id)]
    assert kinds.count("cancel_requested") == 1 and kinds[-2:] == ["run_succeeded", "team_stored"]

    # the run resumed (slow to read its record, as on a busy machine): nothing to do, and it says so
    read = RunStore.get_run

    def slow_read(store: RunStore, wanted: str) -> RunRecord:
        time.sleep(0.5)  # past the watch's first look at the run's lease and cancel flag
        return read(store, wanted)

    with monkeypatch.context() as patched:
        patched.setattr(RunStore, "get_run", slow_read)
        service = RunService(Settings.load())
        try:
            resumed = asyncio.run(service.execute(record.id))
        finally:
            service.close()
    assert (resumed.status, resumed.output) == ("succeeded", "done a")
    assert [e["kind"] for e in run_events(record.id)] == kinds
    resumed_cli = mp("runs", "resume", record.id)
    assert (resumed_cli.returncode, resumed_cli.stderr) == (
        0,
        f"run {record.id} succeeded: there is nothing to resume\n",
    )


def _started(process: subprocess.Popen[bytes], step_id: str) -> str:
    """The id of the run `process` executes, once its step `step_id` has started."""
    store = open_run_store(Settings.load())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and process.poll() is None:
            for run in store.list_runs():
                if any(e.kind == "step_started" and e.step == step_id for e in store.events(run.id)):
                    return run.id
            time.sleep(0.02)
    finally:
        store.close()
    raise AssertionError(f"step {step_id} did not start (exit code {process.poll()})")


def test_run_ids_are_listed_whole_in_a_narrow_terminal(write_script: Callable[..., Path]) -> None:
    script = write_script([{"purpose": "*", "repeat": True}])
    created = mp("run", "a task " * 10, "--model", f"scripted:{script}", "--yes", "--detach")
    run_id = created.stdout.strip()
    listed = mp("runs", "list", env={"COLUMNS": "50"})
    assert listed.returncode == 0, listed.stderr
    assert run_id in listed.stdout  # whole, to be copied into `runs show` or `runs resume`
    wide = mp("runs", "list", env={"COLUMNS": "200"}).stdout
    assert "planning (queued)" in wide  # no worker has taken it
    [row] = json.loads(mp("runs", "list", "--json").stdout)
    assert (row["run_id"], row["idle"]) == (run_id, "queued")
    # the keys the README gives (the API's `GET /runs` names the id `id`): a public contract
    assert sorted(row) == ["created_at", "idle", "model", "run_id", "status", "task"]


def _stored_runs(runs: dict[str, tuple[str, RunStatus]]) -> RunStore:
    """Record runs (id: task and status) straight in the run store, which is returned open."""
    from masterplanner import RunOptions

    settings = Settings.load()
    settings.ensure_home()
    store = RunStore(settings.database_url)
    for run_id, (task, status) in runs.items():
        store.create_run(run_id, task, model="scripted", workspace=".", options=RunOptions())
        if status != "planning":
            assert store.set_status(run_id, status)
    return store


def test_runs_list_searches_the_task_in_any_case_and_filters_by_status() -> None:
    """`runs list` had only --limit: finding a run by its task, as the web app's search and the
    API's `q=` and `status=` do, meant reading the whole list."""
    _stored_runs(
        {
            "r1": ("Write a poem about Ärger", "succeeded"),
            "r2": ("Summarise the REPORT", "failed"),
            "r3": ("write the report again", "planning"),
        }
    ).close()

    def listed(*flags: str) -> list[str]:
        result = mp("runs", "list", *flags, "--json")
        assert (result.returncode, result.stderr) == (0, ""), flags
        return sorted(row["run_id"] for row in json.loads(result.stdout))

    assert listed("--search", "report") == ["r2", "r3"]
    assert listed("--search", "ärger") == ["r1"]  # any case, beyond ASCII
    assert listed("--status", "failed") == ["r2"]
    assert listed("--search", "REPORT", "--status", "planning") == ["r3"]
    assert listed("--search", "poem", "--status", "failed") == []
    table = mp("runs", "list", "--search", "poem")
    assert table.returncode == 0, table.stderr
    assert [line.split("│")[1].strip() for line in table.stdout.splitlines() if line.count("│") == 5] == [
        "r1"
    ]
    # nothing found says what was looked for, not that there are no runs
    for flags, said in [
        (("--search", "sonnet"), "no runs match the search 'sonnet'"),
        (("--status", "cancelled"), "no runs match status cancelled"),
        (("--search", "poem", "--status", "failed"), "no runs match status failed and the search 'poem'"),
    ]:
        found = mp("runs", "list", *flags)
        assert (found.returncode, found.stdout, found.stderr) == (0, "", said + "\n"), flags
    # a status that is not one, in our words, naming the flag; a limit out of range too
    bad = mp("runs", "list", "--status", "done")
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == (
        "error: --status must be one of planning, awaiting_approval, running, succeeded, failed, "
        "cancelled, got 'done'\n"
    )
    over = mp("runs", "list", "--limit", "0")
    assert (over.returncode, over.stderr) == (2, "error: --limit must be from 1 to 10,000, not 0\n")


def test_runs_list_says_a_status_in_words_and_json_keeps_its_value() -> None:
    """The table printed `awaiting_approval`, where the rest of the terminal says `awaiting approval`."""
    _stored_runs({"r1": ("Write a poem", "awaiting_approval")}).close()
    table = mp("runs", "list", env={"COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    [row] = [line.split("│")[1:3] for line in table.stdout.splitlines() if line.count("│") == 5]
    assert [cell.strip() for cell in row] == ["r1", "awaiting approval (stopped)"]
    [listed] = json.loads(mp("runs", "list", "--json").stdout)
    assert listed["status"] == "awaiting_approval"


@pytest.mark.parametrize(
    ("zone", "started", "finished"),
    [("IST-5:30", "05:20:07", "05:31:02"), ("PST+8", "15:50:07", "16:01:02")],
)
def test_runs_show_gives_the_steps_times_in_local_time_as_its_event_lines(
    zone: str, started: str, finished: str
) -> None:
    """The steps table sliced the stored UTC times (`23:50:07.123`) while the event lines under it
    gave this machine's local time: in any zone but UTC the two disagreed."""
    store = _stored_runs({"r1": ("two things", "succeeded")})
    try:
        store.init_steps("r1", ["a", "b"])
        store.update_step(
            "r1",
            "a",
            status="succeeded",
            attempts=1,
            started_at="2026-03-01T23:50:07.123Z",
            finished_at="2026-03-02T00:01:02.456Z",
        )
        store.append_event("r1", "step_started", "a")
        [event] = store.events("r1")
    finally:
        store.close()
    shown = mp("runs", "show", "r1", env={"TZ": zone})
    assert shown.returncode == 0, shown.stderr
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in shown.stdout.splitlines()]
    assert [row for row in rows if len(row) == 6 and row[0] in ("a", "b")] == [
        ["a", "succeeded", "1", started, finished, ""],
        ["b", "waiting", "0", "", "", ""],
    ]
    # the event line's clock is the same local one
    at = datetime.fromisoformat(event.at.replace("Z", "+00:00"))
    offset = {"IST-5:30": timedelta(hours=5, minutes=30), "PST+8": timedelta(hours=-8)}[zone]
    local = (at + offset).strftime("%H:%M:%S")
    assert f"{local} step_started a" in shown.stdout.splitlines()


def test_a_workspace_that_does_not_exist_is_made_and_said_or_refused(
    write_script: Callable[..., Path], tmp_path: Path, isolated: Path
) -> None:
    script = write_script([{"purpose": "*", "repeat": True}])
    model = ("--model", f"scripted:{script}", "--detach")
    made = mp("run", "x", *model, "--workspace", str(tmp_path / "typo"))
    assert made.returncode == 0, made.stderr
    assert f"workspace {tmp_path / 'typo'} did not exist: made it, empty" in made.stderr
    nowhere = mp("run", "x", *model, "--workspace", str(tmp_path / "no" / "such"))
    missing, parent = tmp_path / "no" / "such", tmp_path / "no"
    assert (nowhere.returncode, nowhere.stderr.strip()) == (
        2,
        f"error: workspace {missing}: no such folder, nor {parent} to make it in; check the path",
    )
    assert not (tmp_path / "no").exists()
    # the folder where every run's own workspace is made holds other runs' files
    shared = mp("run", "x", *model, "--workspace", str(isolated / "workspaces"))
    assert shared.returncode == 2
    assert shared.stderr.startswith(
        f"error: workspace {isolated / 'workspaces'} is inside masterplanner's home"
    )


def _run_in(
    cwd: Path, workspace: str, *flags: str, prefix: tuple[str, ...] = (), home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`masterplanner run --workspace WORKSPACE FLAGS` from `cwd` (`prefix`: the command it runs under)."""
    model = ["--model", "scripted:none.json", "--yes"]
    return subprocess.run(
        [
            *prefix,
            sys.executable,
            "-m",
            "masterplanner",
            "run",
            "Do it.",
            *model,
            "--workspace",
            workspace,
            *flags,
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200", **({"HOME": str(home)} if home else {})},
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_a_workspace_under_tilde_is_the_home_s_and_an_empty_one_is_refused(tmp_path: Path) -> None:
    """Before, `~` made a folder named `~` in the current one, and `''` was the current folder."""
    home = tmp_path / "person"
    home.mkdir()
    (tmp_path / "none.json").write_text('{"calls": [{"purpose": "*", "repeat": true}]}')
    mine = _run_in(tmp_path, "~", home=home)
    assert mine.returncode == 2, mine.stderr
    assert mine.stderr.endswith(
        f"workspace {home} is a home folder itself; steps write and delete files there. "
        "Choose a folder of its own\n"
    )
    made = _run_in(tmp_path, "~/sub", "--detach", home=home)
    assert made.returncode == 0, made.stderr
    assert f"workspace {home / 'sub'} did not exist: made it, empty" in made.stderr
    assert (home / "sub").is_dir() and not (tmp_path / "~").exists()
    nobody = _run_in(tmp_path, "~no-such-user-here/x")  # before: a traceback
    assert (nobody.returncode, nobody.stderr) == (
        2,
        "error: workspace ~no-such-user-here/x: ~no-such-user-here names no user's home on this machine\n",
    )
    empty = _run_in(tmp_path, "")
    assert (empty.returncode, empty.stderr) == (
        2,
        "error: the workspace must be a folder's path, got '' (it is empty)\n",
    )


def test_a_workspace_the_person_cannot_write_to_is_refused(tmp_path: Path) -> None:
    """Before, the run succeeded with each write 'permission denied'. Root passes every permission:
    it runs without the capabilities that let it (as a person without them would be). It is
    refused before its files are measured: a folder in it that cannot be read made the refusal
    "cannot measure", and a large tree took seconds to measure before it (the API's `/`)."""
    (tmp_path / "none.json").write_text('{"calls": [{"purpose": "*", "repeat": true}]}')
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "unreadable").mkdir(mode=0o000)
    locked.chmod(0o555)
    dropped = "-dac_override,-dac_read_search"
    prefix = ("setpriv", f"--bounding-set={dropped}", f"--inh-caps={dropped}") if os.geteuid() == 0 else ()
    done = _run_in(tmp_path, str(locked), prefix=prefix)
    assert (done.returncode, done.stderr) == (2, f"error: workspace {locked} is not writable\n")


LOGGING_EDITOR = """
import pathlib, sys
path = pathlib.Path(sys.argv[-1])
pathlib.Path(__file__).with_suffix(".log").write_text(path.read_text())
"""
PROMPT_EDITOR = """
import pathlib, sys
path = pathlib.Path(sys.argv[-1])
path.write_text(path.read_text().replace("You are a worker. Do the step.", "Write it short."))
"""


def test_the_review_says_a_reused_agent_s_prompt_was_written_by_a_person(
    write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """The plan shown and the YAML edited say so, as the web review does; only the page did."""
    script = write_script([_planner(step("write", tools=[])), DRAFTS, {"purpose": "*", "repeat": True}])
    words = {"MASTERPLANNER_EMBEDDER": "none"}  # the team is found by its task's words: no model loads
    first = mp("run", "summarise", "--model", f"scripted:{script}", "--yes", "--json", env=words)
    assert first.returncode == 0, first.stderr
    first_id = json.loads(first.stdout)["run_id"]
    agent_id = f"{first_id}.write"
    editor = tmp_path / "prompt.py"
    editor.write_text(PROMPT_EDITOR)
    edited = mp("agents", "edit", agent_id, env={"VISUAL": f"{sys.executable} {editor}"})
    assert edited.returncode == 0, edited.stderr
    logger = tmp_path / "review.py"
    logger.write_text(LOGGING_EDITOR)
    second = mp(
        "run",
        "summarise",
        "--model",
        f"scripted:{script}",
        "--json",
        stdin="e\na\n",
        env=words | {"EDITOR": f"{sys.executable} {logger}", "VISUAL": ""},
    )
    assert second.returncode == 0, second.stderr
    origin = f"{agent_id} from run {first_id}, its prompt written by a person"
    assert f"    └── prompt (reused agent {origin})\n" in second.stderr  # the plan shown
    [shown] = yaml.safe_load((tmp_path / "review.log").read_text())["steps"]  # the YAML edited
    assert (shown["agent"], shown["prompt"]) == (f"reused {origin}", "Write it short.")
    report = json.loads(second.stdout)
    assert report["status"] == "succeeded"
    # the line left as it was keeps the agent: the run counts on it, and stores no other
    agents = json.loads(mp("agents", "list", "--json").stdout)
    assert [(agent["id"], agent["stats"]["uses"]) for agent in agents] == [(agent_id, 2)]
    # the YAML saved as it was shown is no edit: nothing recorded, nothing marked edited
    assert "the edit changed nothing; the plan is unchanged\n" in second.stderr
    kinds = [event["kind"] for event in _events(report["run_id"])]
    assert to_approval(kinds) == (APPROVED_AS_SHOWN, False)


def test_a_policy_for_a_tool_missing_here_saved_unchanged_is_no_edit(
    write_script: Callable[..., Path],
) -> None:
    """`web_search: deny` with no search backend: the review shows it, and saving it as shown is taken.

    It was refused ("'web_search' is not a tool of this run"), and the review reopened for good.
    """
    script = write_script([_planner(step("a", tools=[])), DRAFTS, {"purpose": "*", "repeat": True}])
    result = mp(
        "run",
        "one thing",
        "--model",
        f"scripted:{script}",
        "--json",
        stdin="e\na\n",
        env={"EDITOR": "true", "VISUAL": "", "MASTERPLANNER_TOOL_POLICIES": '{"web_search": "deny"}'},
    )
    assert result.returncode == 0, result.stderr
    assert "the edit changed nothing; the plan is unchanged\n" in result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "succeeded"
    engine = Engine(Settings.load())
    try:
        assert engine.store.get_run(report["run_id"]).options.tool_policies == {"web_search": "deny"}
    finally:
        engine.close()
    audit = json.loads(mp("runs", "audit", report["run_id"], "--json").stdout)
    assert [entry["action"] for entry in audit][1:] == ["approved the plan"]


LONG = (
    "Read every line of the quarterly report, note each figure that changed since the last quarter "
    "together with its page number, and say in one sentence why each change matters to the reader."
)


def test_an_edit_saved_unchanged_is_no_edit(write_script: Callable[..., Path]) -> None:
    """Long values wrapped at width 100, a multi-line prompt, policies, saved as shown: no `plan_edited`."""
    long_step = step("a", tools=["read_file"]) | {"instruction": LONG, "expected_output": LONG}
    prompt = {
        "purpose": "prompt_creator",
        "output": "You are a worker.\n\n  Do the step:\n" + LONG,
        "repeat": True,
    }
    script = write_script(
        [_planner(long_step, step("b", "a", tools=[])), prompt, {"purpose": "*", "repeat": True}]
    )
    result = mp(
        "run",
        "two things, the first at length",
        "--model",
        f"scripted:{script}",
        "--json",
        stdin="e\na\n",
        env={"EDITOR": "true", "VISUAL": "", "MASTERPLANNER_TOOL_POLICIES": '{"read_file": "ask"}'},
    )
    assert result.returncode == 0, result.stderr
    assert "the edit changed nothing; the plan is unchanged\n" in result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "succeeded"
    assert report["plan"]["steps"][0]["instruction"] == LONG
    engine = Engine(Settings.load())
    try:
        agents = engine.store.get_run(report["run_id"]).agents
    finally:
        engine.close()
    assert [agent.edited for agent in agents.values()] == [False, False]
    kinds = [event["kind"] for event in _events(report["run_id"])]
    assert to_approval(kinds) == (APPROVED_AS_SHOWN, False)
    audit = json.loads(mp("runs", "audit", report["run_id"], "--json").stdout)
    assert [entry["action"] for entry in audit][1:] == ["approved the plan"]


def test_a_step_named_end_runs_to_the_end(write_script: Callable[..., Path]) -> None:
    """A step id the run's own workflows also had (`<run>.end`) is the step's alone.

    Before, the run's end workflow took the id of step `end`'s: the run failed at its very end
    with DBOS's `DBOSConflictingWorkflowError` as a traceback, exit 1.
    """
    script = write_script(
        [
            _planner(*(step(f"s{n}", tools=[]) for n in range(3)), step("end", "s0", "s1", "s2", tools=[])),
            {"purpose": "step:end", "output": "all put together"},
            {"purpose": "*", "repeat": True},
        ]
    )
    result = mp("run", "three then an end", "--model", f"scripted:{script}", "--yes", "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(result.stdout)
    assert (report["status"], report["output"]) == ("succeeded", "all put together")
    assert [(s["id"], s["status"]) for s in report["steps"]] == [
        ("s0", "succeeded"),
        ("s1", "succeeded"),
        ("s2", "succeeded"),
        ("end", "succeeded"),
    ]
    kinds = [event["kind"] for event in run_events(report["run_id"])]
    assert kinds[-2:] == ["run_succeeded", "team_stored"]
