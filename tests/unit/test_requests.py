"""Every pause of a run is a stored request that another process answers (real processes, scripted model)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from _cli import LEASE_S, answer, mp, pending, run_events, start
from _plans import step

from masterplanner import Request, RequestError, RunOptions, Settings
from masterplanner.engine import RunStore
from masterplanner.sandbox import sandbox_problems

needs_sandbox = pytest.mark.skipif(bool(sandbox_problems()), reason="the code sandbox cannot start here")

CODE = {"name": "code_execution", "args": {"code": "print(6 * 7)"}}


def _plan_review(steps: int) -> Request:
    plan = {"steps": [{"id": f"s{number}"} for number in range(steps)]}
    return Request("q1", "r1", None, "plan_review", {"plan": plan}, "pending", None, None, "2026-01-01", None)


def test_a_plan_review_says_its_count_of_steps_in_words() -> None:
    """It said `review the plan of 1 step(s)`, whatever the count."""
    assert _plan_review(1).summary() == "review the plan of 1 step: approve, reject or edit"
    assert _plan_review(3).summary() == "review the plan of 3 steps: approve, reject or edit"


@pytest.fixture(autouse=True)
def short_leases(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose process is killed may be taken over 2 s after it was last heard from."""
    monkeypatch.setenv("MASTERPLANNER_RUN_LEASE_S", str(LEASE_S))


def _script(write_script: Callable[..., Path], *, delay_s: float = 0.0) -> Path:
    """Step `a` writes a note; step `b` (after it) runs code (policy `ask`), asks a question, answers."""
    return write_script(
        [
            {
                "purpose": "planner",
                "output": {
                    "steps": [step("a", tools=[]), step("b", "a", tools=["code_execution", "ask_user"])]
                },
            },
            {"purpose": "step:a", "output": "A done"},
            {"purpose": "step:b", "tool_calls": [CODE], "delay_s": delay_s},
            {"purpose": "step:b", "tool_calls": [{"name": "ask_user", "args": {"question": "Which city?"}}]},
            {"purpose": "step:b", "output": "B done"},
            {"purpose": "*", "repeat": True},
        ]
    )


@needs_sandbox
def test_a_run_with_no_terminal_input_is_answered_from_another_process(
    write_script: Callable[..., Path],
) -> None:
    run = start("run", "note then compute", "--model", f"scripted:{_script(write_script)}", "--json")
    try:
        review = pending("plan_review")
        assert review["payload"]["plan"]["steps"][1]["tools"] == ["code_execution", "ask_user"]
        wrong = mp("runs", "answer", review["id"], "--text", "yes please")
        assert (wrong.returncode, wrong.stderr.strip()) == (
            2,
            f"error: request {review['id']} asks yes or no: approve or deny it, not a text",
        )
        answer(review["id"], "--approve")

        approval = pending("tool_approval")
        assert (approval["step_id"], approval["payload"]["tool"]) == ("b", "code_execution")
        assert approval["payload"]["arguments"] == {
            "code": "print(6 * 7)",
            "language": "python",
            "stdin": "",
            "timeout_s": 30,
        }
        answer(approval["id"], "--approve")

        question = pending("ask_user")
        assert question["payload"] == {"question": "Which city?"}
        empty = mp("runs", "answer", question["id"], "--text", "  ")
        assert (empty.returncode, empty.stderr) == (
            2,
            f"error: request {question['id']}: the answer is empty; write what the agent asked for\n",
        )
        answer(question["id"], "--text", "Lisbon")
        out, err = run.communicate(timeout=90)
    finally:
        run.kill()
    assert run.returncode == 0, err
    report = json.loads(out)
    assert (report["status"], report["output"]) == ("succeeded", "B done")
    # this terminal could not ask: it said how to answer from elsewhere, once per request
    for request in (review, approval, question):
        assert err.count(f"waiting for an answer to request {request['id']}:") == 1
    # the call and its arguments are on the line (cut there; the request holds them whole)
    assert (
        f'waiting for an answer to request {approval["id"]}: allow code_execution(language="python", '
        'code="print(6 * 7)", stdin="", timeout_s=30) (step b)?'
    ) in err
    events = run_events(report["run_id"])
    results = [e["data"] for e in events if e["kind"] == "tool_result"]
    assert [r["tool"] for r in results] == ["code_execution", "ask_user"]
    assert results[0]["result"].startswith("exit code 0") and "42" in results[0]["result"]
    assert results[1] == {"tool": "ask_user", "result": "Lisbon"}
    answered = [e["data"] for e in events if e["kind"] == "request_answered"]
    assert [a["request"] for a in answered] == [review["id"], approval["id"], question["id"]]
    assert all(a["by"].startswith("cli@") for a in answered)
    approved = next(e["data"] for e in events if e["kind"] == "tool_approved")
    assert approved["by"].startswith("cli@") and approved["request"] == approval["id"]

    # the same answer given again from this host's command line (a script run twice): taken once
    same = mp("runs", "answer", approval["id"], "--approve")
    assert same.returncode == 0, same.stderr
    assert same.stderr.startswith(
        f"request {approval['id']} of run {report['run_id']} was answered so already (by cli@"
    )
    assert same.stderr.rstrip().endswith("): taken once, nothing stored again")
    assert [e["kind"] for e in run_events(report["run_id"])].count("request_answered") == 3
    # a closed request cannot be answered again; nothing changes
    again = mp("runs", "answer", approval["id"], "--deny")
    assert again.returncode == 2
    assert again.stderr.startswith(f"error: request {approval['id']} is already answered (by cli@")
    # closed first: not "answer it with a text", which then says it is closed
    asked_again = mp("runs", "answer", question["id"], "--approve")
    assert asked_again.returncode == 2
    assert asked_again.stderr.startswith(f"error: request {question['id']} is already answered (by cli@")
    unknown = mp("runs", "answer", "nosuchrequest", "--approve")
    assert (unknown.returncode, unknown.stderr.strip()) == (
        2,
        "error: no request 'nosuchrequest' (see `masterplanner runs pending`)",
    )
    both = mp("runs", "answer", approval["id"], "--approve", "--text", "x")
    assert (both.returncode, both.stderr.strip()) == (
        2,
        "error: answer with exactly one of --approve, --deny or --text",
    )
    assert run_events(report["run_id"]) == events
    assert json.loads(mp("runs", "pending", "--json").stdout) == []


def test_runs_answer_json_says_whether_the_answer_was_taken_before_and_what_failed_after_it(
    write_script: Callable[..., Path],
) -> None:
    """`runs answer --json` carries `taken_before` and `follow_up_failed`, as the API's answer does.

    Before, they were said only on stderr: a script reading the JSON took a resend, or a team
    that could not be stored, for a plain answer.
    """
    from masterplanner import RunOptions
    from masterplanner.engine import Engine

    engine = Engine(Settings.load())
    try:  # a run never planned: the team its remember question approves cannot be stored
        run = engine.create_run("t", model=f"scripted:{write_script([])}", options=RunOptions())
        question, _ = engine.store.requests.open(run.id, "remember", {"agents": 2}, key=f"remember:{run.id}")
    finally:
        engine.close()
    first = mp("runs", "answer", question.id, "--approve", "--json")
    assert first.returncode == 0, first.stderr
    taken = json.loads(first.stdout)
    assert (taken["id"], taken["state"], taken["answer"]) == (question.id, "answered", {"approved": True})
    assert (taken["taken_before"], taken["follow_up_failed"]) == (
        False,
        f"storing the run's team failed (run {run.id} has no plan: there is no team to store); your yes "
        f"stands: once that is fixed, send the same answer again, or run `masterplanner runs remember "
        f"{run.id}`, to store the team",
    )
    # sent again, the team it approved, not stored, is tried again (and fails again here)
    again = mp("runs", "answer", question.id, "--approve", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == taken | {"taken_before": True}


@needs_sandbox
def test_kill_9_while_a_tool_approval_is_open_then_answer_then_resume(
    write_script: Callable[..., Path],
) -> None:
    script = _script(write_script)
    run = start("run", "note then compute", "--model", f"scripted:{script}")
    try:
        answer(pending("plan_review")["id"], "--approve")
        approval = pending("tool_approval")
    finally:
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
    # the model's first reply in b (the code call) is checkpointed; a new process's scripted
    # model goes on from the replies not given yet
    calls = json.loads(script.read_text())["calls"]
    script.write_text(json.dumps({"calls": [entry for entry in calls if entry.get("tool_calls") != [CODE]]}))
    run_id = approval["run_id"]
    assert json.loads(mp("runs", "show", run_id, "--json").stdout)["status"] == "running"
    answer(approval["id"], "--approve")  # the process that asked is gone; the answer is stored

    resumed = start("runs", "resume", run_id, "--json")
    try:
        question = pending("ask_user")
        answer(question["id"], "--text", "Porto")
        out, err = resumed.communicate(timeout=90)
    finally:
        resumed.kill()
    assert resumed.returncode == 0, err
    assert json.loads(out)["status"] == "succeeded"
    events = run_events(run_id)
    calls = [e["data"]["tool"] for e in events if e["kind"] == "tool_called"]
    assert calls == ["code_execution", "ask_user"]  # the approved code ran exactly once
    started = [e["step"] for e in events if e["kind"] == "step_started"]
    assert started.count("a") == 1  # the finished step was not started again
    assert [e["kind"] for e in events].count("tool_approval_requested") == 1  # asked once, answered once


@needs_sandbox
def test_a_resumed_run_asks_for_an_ask_policy_tool_instead_of_denying_it(
    write_script: Callable[..., Path],
) -> None:
    # b's model call waits until the process is killed, however long this test takes to see that
    # b started (a 10 s wait ran out once on a busy machine: b asked for the tool before the kill);
    # the process that resumes the run reads the script again, and finds the call quick (below)
    script = _script(write_script, delay_s=3600.0)
    run = start("run", "note then compute", "--model", f"scripted:{script}")
    try:
        review = pending("plan_review")
        store = RunStore(Settings.load().database_url)
        run_id = review["run_id"]
        answer(review["id"], "--approve")
        deadline = time.monotonic() + 300  # only so a broken run cannot hang the suite
        while not any(e.kind == "step_started" and e.step == "b" for e in store.events(run_id)):
            assert run.poll() is None and time.monotonic() < deadline, f"step b of run {run_id} never started"
            time.sleep(0.05)
        store.close()
    finally:
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
    script.write_text(script.read_text().replace('"delay_s": 3600.0', '"delay_s": 0.0'))
    assert not any(e["kind"] == "tool_approval_requested" for e in run_events(run_id))

    resumed = start("runs", "resume", run_id, "--json")
    try:
        approval = pending("tool_approval")
        assert approval["run_id"] == run_id
        answer(approval["id"], "--deny", "--reason", "not on this machine")
        answer(pending("ask_user")["id"], "--text", "Rome")
        out, err = resumed.communicate(timeout=90)
    finally:
        resumed.kill()
    assert resumed.returncode == 0, err
    assert json.loads(out)["status"] == "succeeded"
    events = run_events(run_id)
    denied = next(e["data"] for e in events if e["kind"] == "tool_denied")
    assert denied["reason"] == "not on this machine" and denied["by"].startswith("cli@")
    assert "code_execution" not in [e["data"]["tool"] for e in events if e["kind"] == "tool_called"]


async def test_follow_yields_every_event_once_in_order_until_the_run_ends(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    import asyncio

    from masterplanner import RunService
    from masterplanner.engine import RunOptions

    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[]), step("b", "a", tools=[])]}},
            {"purpose": "step:a", "output": "A", "delay_s": 0.3},
            {"purpose": "step:b", "output": "B", "delay_s": 0.3},
            {"purpose": "*", "repeat": True},
        ]
    )
    service = RunService(Settings.load())
    try:
        run = await service.create(
            "a then b", model=f"scripted:{script}", options=RunOptions(auto_approve=True, prompt_rounds=0)
        )
        execution = asyncio.ensure_future(service.execute(run.id))
        followed = [event async for event in service.follow(run.id)]
        assert (await execution).status == "succeeded"
    finally:
        service.close()
    assert [event.seq for event in followed] == list(range(1, len(followed) + 1))
    kinds = [(event.kind, event.step) for event in followed]
    assert kinds[0] == ("run_created", None)
    assert kinds.index(("step_succeeded", "a")) < kinds.index(("step_started", "b"))
    assert kinds[-2:] == [("run_succeeded", None), ("team_stored", None)]  # the end is never cut off


def test_runs_audit_says_who_did_what_and_when_with_secrets_removed(
    write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTERPLANNER_TOOL_POLICIES", '{"write_file": "ask"}')
    write = {"name": "write_file", "args": {"path": "k.txt", "content": "x"}}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=["ask_user", "write_file"])]}},
            {
                "purpose": "step:a",
                "turn": 1,
                "tool_calls": [
                    {"name": "ask_user", "args": {"question": "Key? The old sk-abcdefghijklmnop1234 failed"}}
                ],
            },
            {"purpose": "step:a", "turn": 2, "tool_calls": [write]},
            {"purpose": "step:a", "turn": 3, "output": "done"},
            {"purpose": "*", "repeat": True},
        ]
    )
    run = start("run", "ask then write", "--model", f"scripted:{script}", "--json")
    try:
        answer(pending("plan_review")["id"], "--approve")
        question = pending("ask_user")
        # a secret the person types is refused (test_typed_secrets.py); the model's is shown redacted
        answer(question["id"], "--text", "not sk-abcdefghijklmnop1234 again, the new one is in the vault")
        approval = pending("tool_approval")
        answer(approval["id"], "--deny", "--reason", "not that file")
        out, err = run.communicate(timeout=90)
    finally:
        run.kill()
    assert run.returncode == 0, err
    run_id = json.loads(out)["run_id"]
    audited = mp("runs", "audit", run_id, "--json")
    assert audited.returncode == 0, audited.stderr
    entries = json.loads(audited.stdout)
    assert [(entry["action"], entry["step"], entry["front_end"]) for entry in entries] == [
        ("created the run", None, "cli"),
        ("approved the plan", None, "cli"),
        (
            "answered the question 'Key? The old [secret removed] failed': "
            "'not [secret removed] again, the new one is in the vault'",
            "a",
            "cli",
        ),
        ("denied a call to write_file: not that file", "a", "cli"),
    ]
    assert all(entry["by"].startswith("cli@") for entry in entries)
    assert entries[3]["request"] == approval["id"]
    assert [entry["at"] for entry in entries] == sorted(entry["at"] for entry in entries)
    assert "sk-abcdef" not in mp("runs", "audit", run_id).stdout

    # a cancel is in the log too, with who asked for it
    waiting = start("run", "ask then write", "--model", f"scripted:{script}", "--json")
    try:
        review = pending("plan_review")
        cancelled = mp("runs", "cancel", review["run_id"], "--wait", "20")
        assert cancelled.returncode == 0, cancelled.stderr
        waiting.communicate(timeout=60)
    finally:
        waiting.kill()
    created, cancel = json.loads(mp("runs", "audit", review["run_id"], "--json").stdout)
    assert (created["action"], created["front_end"]) == ("created the run", "cli")
    assert (cancel["action"], cancel["front_end"]) == ("asked to cancel the run", "cli")


@needs_sandbox
def test_a_call_put_to_a_person_is_shown_whole_and_one_too_long_to_show_is_refused_unasked(
    write_script: Callable[..., Path],
) -> None:
    hidden = "# harmless\n" + "\n".join(f"# line {n}: tidy the rows" for n in range(100)) + "\nopen('x', 'w')"
    huge = "#" * 200_001
    plan = {"purpose": "planner", "output": {"steps": [step("b", tools=["code_execution"])]}}
    script = write_script(
        [
            plan,
            {"purpose": "step:b", "tool_calls": [{"name": "code_execution", "args": {"code": hidden}}]},
            {"purpose": "step:b", "tool_calls": [{"name": "code_execution", "args": {"code": huge}}]},
            {"purpose": "step:b", "output": "B done"},
            {"purpose": "*", "repeat": True},
        ]
    )
    run = start("run", "compute", "--model", f"scripted:{script}", "--json")  # no --yes: calls are asked
    try:
        answer(pending("plan_review")["id"], "--approve")
        approval = pending("tool_approval")
        assert len(hidden) > 2_000
        assert approval["payload"]["arguments"]["code"] == hidden  # every character the person approves
        answer(approval["id"], "--deny")
        out, err = run.communicate(timeout=90)
    finally:
        run.kill()
    assert run.returncode == 0, err
    report = json.loads(out)
    events = run_events(report["run_id"])
    assert [e["kind"] for e in events].count("tool_approval_requested") == 1  # the huge call: nobody asked
    results = [e["data"] for e in events if e["kind"] == "tool_result"]
    assert results == [
        {
            "tool": "code_execution",
            "error": "this call's arguments are 200,035 characters long, too long to be shown to the person "
            "who approves code_execution calls (at most 200,000): make the call smaller, for example by "
            "splitting it into several calls",
        }
    ]


def test_an_agent_s_question_takes_a_text_and_nothing_else_not_even_a_blank_reason(tmp_path: Path) -> None:
    """A blank reason was dropped before the answer's keys were checked, so `{"text": …,
    "reason": "   "}` was taken for an agent's question, which takes a text and nothing else."""
    store = RunStore(f"sqlite:///{tmp_path / 'runs.sqlite'}")
    try:
        store.create_run("r1", "x", model="scripted:x", workspace="/tmp", options=RunOptions())
        question, _ = store.requests.open("r1", "ask_user", {"question": "Which?"}, key="r1:ask")
        with pytest.raises(
            RequestError, match=r'is a question: its answer is \{"text": …\} and nothing else'
        ):
            store.requests.answer(question.id, {"text": "this", "reason": "   "}, by="cli@host:1")
        assert store.requests.get(question.id).state == "open"
    finally:
        store.close()
