"""Step agents working together, through the engine with the scripted model: messages, questions, notes."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _cli import LEASE_S, mp, run_events, shown, start
from _plans import step

from masterplanner import Settings
from masterplanner.engine import Engine, RunOptions

FAST = RunOptions(auto_approve=True, prompt_rounds=0, retry_backoff_s=0.01)
DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}


@pytest.fixture
def engine(isolated: Path) -> Iterator[Engine]:
    created = Engine(Settings.load())
    yield created
    created.close()


def _planner(*steps: dict[str, Any]) -> dict[str, Any]:
    return {"purpose": "planner", "output": {"steps": list(steps)}}


def _call(purpose: str, tool: str, delay_s: float = 0.0, **args: Any) -> dict[str, Any]:
    return {"purpose": purpose, "tool_calls": [{"name": tool, "args": args}], "delay_s": delay_s}


def _events(engine: Engine, run_id: str, *kinds: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    return [
        (event.kind, event.step, event.data) for event in engine.store.events(run_id) if event.kind in kinds
    ]


async def test_a_question_to_a_finished_step_and_a_message_to_a_running_one(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=[]), step("c", tools=[]), step("d", tools=[])),
            {"purpose": "step:a", "output": "A found 42"},
            _call("step:b", "ask_agent", to="a", question="What number did you find?"),
            {
                "purpose": "consult:a",
                "expect": ["A found 42", "What number did you find?"],
                "output": "It was 42.",
            },
            {"purpose": "step:b", "expect": ["step a answers: It was 42."], "output": "B-OUT"},
            _call("step:c", "send_message", to="d", content="Use blue, not red."),
            {"purpose": "step:c", "output": "C-OUT"},
            # d is running (its first request takes a while) when c's message arrives; 0.6 s was
            # too short once in a loaded CI, where c's two requests each wait for SQLite's writer
            _call("step:d", "list_notes", delay_s=2.0),
            {
                "purpose": "step:d",
                "expect": ["message #1 from step c: Use blue, not red."],
                "output": "D-OUT",
            },
            {"purpose": "aggregator", "output": "ALL"},
            DRAFTS,
        ]
    )
    run = engine.create_run("work together", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    # each message shows once in the events (steps c and a run side by side: the order varies)
    sent = _events(engine, run.id, "message_sent", "message_delivered", "question_answered")
    assert sorted((kind, where) for kind, where, _ in sent) == [
        ("message_delivered", "d"),
        ("message_sent", "b"),
        ("message_sent", "c"),
        ("question_answered", "a"),
    ]
    by_kind = {(kind, where): data for kind, where, data in sent}
    assert by_kind["message_sent", "c"] == {
        "ids": [1],
        "to": ["d"],
        "kind": "message",
        "chars": 18,
        "content": "Use blue, not red.",
    }
    assert by_kind["message_delivered", "d"] == {"id": 1, "from": "c", "kind": "message"}
    assert by_kind["question_answered", "a"] == {"id": 2, "from": "b", "by": "consult", "chars": 10}
    messages = engine.store.messages.of_run(run.id)
    assert [(m.sender, m.recipient, m.kind, m.state) for m in messages] == [
        ("c", "d", "message", "delivered"),
        ("b", "a", "question", "answered"),
    ]
    assert messages[1].answer == "It was 42."
    assert engine.report(run.id)["usage"]["by_purpose"]["consult:a"]["calls"] == 1


async def test_two_steps_asking_each_other_are_told_at_once(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", tools=[])),
            _call("step:a", "ask_agent", delay_s=0.2, to="b", question="What is your result?"),
            _call("step:b", "ask_agent", delay_s=0.6, to="a", question="And yours?"),
            {"purpose": "step:a", "expect": ["not answered: steps would wait on each other"], "output": "A"},
            {"purpose": "step:b", "expect": ["not answered: steps would wait on each other"], "output": "B"},
            {"purpose": "aggregator", "output": "AB"},
            DRAFTS,
        ]
    )
    options = replace(FAST, ask_timeout_s=60.0)
    run = engine.create_run("ask each other", model=f"scripted:{script}", options=options)
    started = time.monotonic()
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    assert time.monotonic() - started < 30  # told when the cycle formed, not after the 60 s timeout
    closed = _events(engine, run.id, "question_closed")
    assert sorted(where for _, where, _ in closed) == ["a", "b"]
    assert all("a → b → a" in data["reason"] or "b → a → b" in data["reason"] for _, _, data in closed)
    assert [m.state for m in engine.store.messages.of_run(run.id)] == ["closed", "closed"]


async def test_a_question_to_a_running_step_is_answered_with_reply(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", tools=[])),
            _call("step:a", "ask_agent", delay_s=0.2, to="b", question="Which unit?"),
            # b's second request shows the question; it answers with reply
            _call("step:b", "list_notes", delay_s=0.6),
            {
                "purpose": "step:b",
                "expect": ["question #1 from step a: Which unit?", "reply(question_id=1"],
                "tool_calls": [{"name": "reply", "args": {"question_id": 1, "answer": "metres"}}],
            },
            {"purpose": "step:b", "output": "B"},
            {"purpose": "step:a", "expect": ["step b answers: metres"], "output": "A"},
            {"purpose": "aggregator", "output": "AB"},
            DRAFTS,
        ]
    )
    run = engine.create_run("reply", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    answered = _events(engine, run.id, "question_answered")
    assert answered == [("question_answered", "b", {"id": 1, "from": "a", "by": "reply", "chars": 6})]


async def test_bounds_and_bad_addresses_are_tool_results_not_crashes(
    engine: Engine, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=[]), step("c", "b", tools=[])),
            _call("step:a", "send_message", to="b", content="first"),
            _call("step:a", "send_message", to="b", content="first"),
            _call("step:a", "send_message", to="nobody", content="hello"),
            _call("step:a", "send_message", to="c", content="x" * 5000),
            _call("step:a", "ask_agent", to="b", question="ready?"),
            _call("step:a", "send_message", to="c", content="second"),
            _call("step:a", "broadcast", content="third"),
            {
                "purpose": "step:a",
                "expect": [
                    "not sent: you already sent step b exactly this message",
                    "no step 'nobody' in this run; its other steps are: b, c",
                    "the message has 5000 characters; at most 4000 are sent",
                    "not asked: step b has not started",
                    "not sent: this step has sent its 2 messages (the bound per step)",
                ],
                "output": "A",
            },
            {"purpose": "step:b", "expect": ["message #1 from step a: first"], "output": "B"},
            {"purpose": "step:c", "expect": ["message #2 from step a: second"], "output": "C"},
            DRAFTS,
        ]
    )
    options = replace(FAST, messages_per_step=2)
    run = engine.create_run("bounded", model=f"scripted:{script}", options=options)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    assert [(m.recipient, m.content) for m in engine.store.messages.of_run(run.id)] == [
        ("b", "first"),
        ("c", "second"),
    ]
    delivered = _events(engine, run.id, "message_delivered")
    assert [(where, data["id"]) for _, where, data in delivered] == [("b", 1), ("c", 2)]


async def test_notes_on_the_blackboard(engine: Engine, write_script: Callable[..., Path]) -> None:
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=[])),
            _call("step:a", "set_note", key="format", value="CSV with a header"),
            {"purpose": "step:a", "output": "A"},
            _call("step:b", "get_note", key="format"),
            {"purpose": "step:b", "expect": ["CSV with a header\n(written by step a)"], "output": "B"},
            DRAFTS,
        ]
    )
    run = engine.create_run("notes", model=f"scripted:{script}", options=FAST)
    final = await engine.execute(run.id)
    assert final.status == "succeeded", final.error
    assert [(n.key, n.value, n.step) for n in engine.store.messages.notes(run.id)] == [
        ("format", "CSV with a header", "a")
    ]
    assert _events(engine, run.id, "note_set") == [
        ("note_set", "a", {"key": "format", "chars": 17, "value": "CSV with a header"})
    ]


def test_a_message_sent_before_a_kill_is_delivered_once_after_resume(
    write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTERPLANNER_RUN_LEASE_S", str(LEASE_S))
    script = write_script(
        [
            _planner(step("a", tools=[]), step("c", tools=[]), step("b", "c", tools=[])),
            _call("step:a", "send_message", to="b", content="Round to two decimals."),
            # a and c wait until the process is killed, however long this test takes to see the
            # message sent (b cannot start before c); the resumed run's are quick (below)
            {"purpose": "step:a", "output": "A-OUT", "delay_s": 3600.0},
            {"purpose": "step:c", "output": "C-OUT", "delay_s": 3600.0},
            {
                "purpose": "step:b",
                "expect": ["message #1 from step a: Round to two decimals."],
                "output": "B",
            },
            {"purpose": "aggregator", "output": "ALL"},
            DRAFTS,
        ]
    )
    engine = Engine(Settings.load())
    store = engine.store
    run = start("run", "tell b", "--model", f"scripted:{script}", "--yes", "--rounds", "0", "--json")
    try:
        deadline = time.monotonic() + 300  # only so a broken run cannot hang the suite
        sent: list[str] = []
        while not sent:
            assert run.poll() is None and time.monotonic() < deadline, "step a never sent its message"
            sent = [
                r.id for r in store.list_runs() if any(e.kind == "message_sent" for e in store.events(r.id))
            ]
            time.sleep(0.05)
    finally:
        os.kill(run.pid, signal.SIGKILL)
        run.wait()
    (run_id,) = sent
    assert [(m.recipient, m.state) for m in store.messages.of_run(run_id)] == [("b", "pending")]
    assert not any(e.step == "b" for e in store.events(run_id))  # b had not started
    engine.close()
    # a's first reply (the send) is checkpointed; the new process's model goes on from the rest
    calls = json.loads(script.read_text())["calls"]
    rest = [call | {"delay_s": 0.0} for call in calls if call.get("tool_calls") is None]
    script.write_text(json.dumps({"calls": rest}))

    resumed = mp("runs", "resume", run_id, "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["status"] == "succeeded"
    kinds = [(e["kind"], e["step"]) for e in run_events(run_id) if e["kind"].startswith("message_")]
    assert kinds == [("message_sent", "a"), ("message_delivered", "b")]
    (message,) = shown(run_id)["messages"]
    assert {key: message[key] for key in ("id", "from", "to", "kind", "content", "state")} == {
        "id": 1,
        "from": "a",
        "to": "b",
        "kind": "message",
        "content": "Round to two decimals.",
        "state": "delivered",
    }


def test_team_text_holding_a_nul_is_refused_to_the_agent_and_nothing_is_stored(
    database_url: str, write_script: Callable[..., Path]
) -> None:
    """On SQLite a message, question or note was stored with its NUL; on Postgres each failed in
    the database's words (or, a note's key, a search for it did)."""
    import asyncio

    calls = [
        ("send_message", {"to": "b", "content": "use\x00 blue"}),
        ("broadcast", {"content": "use\x00 blue"}),
        ("ask_agent", {"to": "b", "question": "which\x00?"}),
        ("reply", {"question_id": 1, "answer": "metres\x00"}),
        ("set_note", {"key": "for\x00mat", "value": "CSV"}),
        ("set_note", {"key": "format", "value": "C\x00SV"}),
        ("get_note", {"key": "for\x00mat"}),
    ]
    script = write_script(
        [
            _planner(step("a", tools=[]), step("b", "a", tools=[])),
            *[_call("step:a", tool, **args) for tool, args in calls],
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:b", "output": "B"},
            DRAFTS,
        ]
    )

    async def program() -> tuple[str, list[Any], list[Any], list[Any]]:
        engine = Engine(Settings.load())
        try:
            run = engine.create_run("refused", model=f"scripted:{script}", options=FAST)
            final = await engine.execute(run.id)
            results = [data for _, _, data in _events(engine, run.id, "tool_result")]
            messages = engine.store.messages
            return final.status, results, messages.of_run(run.id), messages.notes(run.id)
        finally:
            engine.close()

    status, results, messages, notes = asyncio.run(program())
    assert (status, messages, notes) == ("succeeded", [], [])
    assert results == [
        {"tool": "send_message", "error": "the message must not hold a NUL character"},
        {"tool": "broadcast", "error": "the message must not hold a NUL character"},
        {"tool": "ask_agent", "error": "the question must not hold a NUL character"},
        {"tool": "reply", "error": "the answer must not hold a NUL character"},
        {"tool": "set_note", "error": "a note's key must not hold a NUL character"},
        {"tool": "set_note", "error": "the note must not hold a NUL character"},
        {"tool": "get_note", "error": "a note's key must not hold a NUL character"},
    ]
