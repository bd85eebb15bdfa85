"""The REST API through the ASGI app (httpx), over a real run service and the scripted model."""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import os
import re
import stat
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from _api import stopped_run, typed, web_client
from _cli import mp, start
from _faults import sqlite_failing
from _plans import APPROVED_AS_SHOWN, step, to_approval

from masterplanner import ConfigError, Settings
from masterplanner.database import shown_url
from masterplanner.engine.control import open_run_store
from masterplanner.engine.records import RunOptions
from masterplanner.engine.store import RunStore
from masterplanner.errors import DatabaseUnavailableError, MissingCredentialError, RequestClosedError
from masterplanner.registry import embedders
from masterplanner.service import RunService
from masterplanner.tools import BUILTIN_TOOL_NAMES
from masterplanner.tools.team import TEAM_TOOL_NAMES
from masterplanner.web import MAX_BODY_BYTES, check_bind, create_app, web_token
from masterplanner.web.api_responses import (
    AnsweredRequestOut,
    EventOut,
    FeedbackOut,
    ListedRunOut,
    RequestOut,
    RunOut,
    RunReportOut,
)

DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}


@pytest.fixture
async def service(isolated: Path) -> AsyncIterator[RunService]:
    created = RunService(Settings.load())
    yield created
    created.close()


@pytest.fixture
async def client(service: RunService) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(service)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765/api/v1") as opened:
        yield opened
    await app.state.executions.stop()


def _script(write_script: Callable[..., Path]) -> Path:
    return write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[]), step("b", "a", tools=[])]}},
            {"purpose": "step:a", "output": "A done"},
            {"purpose": "step:b", "expect": ["A done"], "output": "B done"},
            DRAFTS,
        ]
    )


async def _wait_for(client: httpx.AsyncClient, path: str, test: Callable[[Any], bool]) -> Any:
    for _ in range(600):
        response = await client.get(path)
        assert response.status_code == 200, response.text
        if test(response.json()):
            return response.json()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{path} never met the condition: {response.text}")


async def test_a_run_started_reviewed_and_followed_through_the_api(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    body = {
        "task": "do a then b",
        "model": f"scripted:{_script(write_script)}",
        "options": {"prompt_rounds": 0},
    }
    created = await client.post("/runs", json=body)
    assert created.status_code == 201, created.text
    run = created.json()
    assert (run["task"], run["status"]) == ("do a then b", "planning")
    assert typed(RunOut, created).model_dump() == run

    (review,) = await _wait_for(client, f"/requests?run_id={run['id']}", lambda found: len(found) == 1)
    assert review["kind"] == "plan_review"
    [listed] = typed(list[ListedRunOut], await client.get("/runs"))
    assert (listed.status, listed.idle) == ("awaiting_approval", None)  # the server executes it
    assert typed(list[RequestOut], await client.get("/requests"))[0].kind == "plan_review"
    assert [s["id"] for s in review["payload"]["plan"]["steps"]] == ["a", "b"]
    answered = await client.post(f"/requests/{review['id']}/answer", json={"approve": True})
    assert answered.status_code == 200, answered.text
    assert typed(AnsweredRequestOut, answered).state == "answered"
    assert answered.json()["answered_by"].startswith("web@")

    stream = await client.get(f"/runs/{run['id']}/events/stream")  # ends when the run is over
    assert stream.headers["content-type"].startswith("text/event-stream")
    frames = [frame for frame in stream.text.split("\n\n") if frame.strip()]
    events = []
    for frame in frames:
        fields = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
        events.append((fields["event"], int(fields["id"]), json.loads(fields["data"])))
    kinds = [kind for kind, _, _ in events]
    assert kinds[0] == "run_created" and "run_succeeded" in kinds
    assert [seq for _, seq, _ in events] == list(range(1, len(events) + 1))
    assert all(data["kind"] == kind and data["seq"] == seq for kind, seq, data in events)

    report = (await client.get(f"/runs/{run['id'][:12]}")).json()  # a unique prefix is enough
    stated = typed(RunReportOut, await client.get(f"/runs/{run['id']}"))
    assert (stated.run_id, stated.usage.by_purpose["step:b"].calls, stated.plan is not None) == (
        run["id"],
        1,
        True,
    )
    assert len(typed(list[EventOut], await client.get(f"/runs/{run['id']}/events"))) == len(events)
    assert (report["status"], report["output"]) == ("succeeded", "B done")
    assert [(s["id"], s["status"]) for s in report["steps"]] == [("a", "succeeded"), ("b", "succeeded")]
    assert set(report["agents"]) == {"a", "b"}
    later = (await client.get(f"/runs/{run['id']}/events", params={"after": len(events) - 2})).json()
    assert [e["seq"] for e in later] == [len(events) - 1, len(events)]
    listed = (await client.get("/runs", params={"status": "succeeded", "q": "A THEN"})).json()
    assert [r["id"] for r in listed] == [run["id"]]
    assert (await client.get("/runs", params={"status": "failed"})).json() == []
    assert (await client.get("/runs", params={"q": "a%b"})).json() == []  # % and _ are plain text
    assert (await client.get(f"/requests?run_id={run['id']}")).json() == []

    rated = await client.post(f"/runs/{run['id']}/feedback", json={"rating": 4, "comment": "fine"})
    assert rated.status_code == 200, rated.text
    assert typed(FeedbackOut, rated).lessons == {}
    assert (await client.post(f"/runs/{run['id']}/feedback", json={"rating": 6})).status_code == 422
    # a rating sent again (a client that retried) is not counted twice
    twice = await client.post(f"/runs/{run['id']}/feedback", json={"rating": 4, "comment": "fine"})
    assert twice.status_code == 409
    assert twice.json()["error"].startswith(f"run {run['id']} was rated 4 already (by web@")
    assert twice.json()["error"].endswith("): a run is rated once")

    again = await client.post(f"/requests/{review['id']}/answer", json={"approve": False})
    assert again.status_code == 409
    assert again.json()["error"].startswith(f"request {review['id']} is answered by web@")


async def _review_of_new_run(client: httpx.AsyncClient, write_script: Callable[..., Path]) -> dict[str, Any]:
    body = {
        "task": "do a then b",
        "model": f"scripted:{_script(write_script)}",
        "options": {"prompt_rounds": 0},
    }
    created = await client.post("/runs", json=body)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    (review,) = await _wait_for(client, f"/requests?run_id={run_id}", lambda found: len(found) == 1)
    return dict(review)


async def _answered_events(client: httpx.AsyncClient, run_id: str) -> list[dict[str, Any]]:
    events = (await client.get(f"/runs/{run_id}/events")).json()
    return [event["data"] for event in events if event["kind"] == "request_answered"]


async def test_an_answer_sent_again_by_its_answerer_is_taken_once_and_another_is_refused(
    client: httpx.AsyncClient, service: RunService, write_script: Callable[..., Path]
) -> None:
    """A client that lost the reply to its answer sends it again: it was taken, and is said so.

    Before, the resend was a 409 ("it takes no answer now"): a browser that lost the connection
    after the server stored its answer was told its answer was not taken.
    """
    review = await _review_of_new_run(client, write_script)
    answer = f"/requests/{review['id']}/answer"
    first = await client.post(answer, json={"approve": True})
    assert first.status_code == 200, first.text
    taken = typed(AnsweredRequestOut, first)
    assert (taken.taken_before, taken.follow_up_failed) == (False, None)
    again = await client.post(answer, json={"approve": True})
    assert again.status_code == 200, again.text
    assert typed(AnsweredRequestOut, again).model_dump() == taken.model_dump() | {"taken_before": True}
    # a different answer is refused, as before; nothing of either send was stored twice
    other = await client.post(answer, json={"approve": False, "reason": "no"})
    assert (other.status_code, other.json()["error"]) == (
        409,
        f"request {review['id']} is answered by {taken.answered_by}: it takes no answer now",
    )
    assert (await client.get(f"/requests/{review['id']}")).json()["answer"] == {"action": "approve"}
    await _wait_for(client, f"/runs/{review['run_id']}", lambda report: report["status"] == "succeeded")
    assert await _answered_events(client, review["run_id"]) == [
        {"request": review["id"], "kind": "plan_review", "by": taken.answered_by}
    ]

    # another answerer's answer: the same answer from this server is refused, as the server's
    # answerer is not the one who answered; that answerer's own, from another process, is taken
    second = await _review_of_new_run(client, write_script)
    host = taken.answered_by.split("@", 1)[1].rsplit(":", 1)[0]
    elsewhere = await service.answer_plainly(second["id"], by=f"cli@{host}:1", approve=True)
    assert (elsewhere.state, elsewhere.taken_before) == ("answered", False)
    resent = await service.answer_plainly(second["id"], by=f"cli@{host}:2", approve=True)
    assert (resent.taken_before, resent.answered_by, resent.answered_at) == (
        True,
        f"cli@{host}:1",
        elsewhere.answered_at,
    )
    with pytest.raises(RequestClosedError, match=rf"^request {second['id']} is already answered \(by cli@"):
        await service.answer(second["id"], {"action": "approve"}, by=f"cli@{host}x:1")  # another host
    refused = await client.post(f"/requests/{second['id']}/answer", json={"approve": True})
    assert (refused.status_code, refused.json()["error"]) == (
        409,
        f"request {second['id']} is answered by cli@{host}:1: it takes no answer now",
    )


async def test_an_answer_whose_commit_lost_its_acknowledgement_is_this_send_not_a_resend(
    client: httpx.AsyncClient, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connection drops after the answer's COMMIT reached the server: the store call is made
    again (`reconnecting`), finds the answer stored, and takes it as this send's.

    Before, the call made again took its own answer for a resend: `taken_before`, no
    `request_answered` event, and the page told the one person who sent it that it was "taken
    already … when you sent it before".
    """
    review = await _review_of_new_run(client, write_script)
    begin = RunStore.begin
    dropped: list[str] = []

    @contextlib.contextmanager
    def dropping_after_commit(store: RunStore, action: str) -> Iterator[Any]:
        with begin(store, action) as connection:
            yield connection
        if action == "answer a request" and not dropped:  # committed; its acknowledgement lost
            dropped.append(action)
            raise DatabaseUnavailableError(f"database x: cannot {action}: server closed the connection")

    with monkeypatch.context() as flaky:
        flaky.setattr(RunStore, "begin", dropping_after_commit)
        answered = await client.post(f"/requests/{review['id']}/answer", json={"approve": True})
    assert dropped == ["answer a request"]
    taken = typed(AnsweredRequestOut, answered)
    assert (taken.state, taken.answer, taken.taken_before, taken.follow_up_failed) == (
        "answered",
        {"action": "approve"},
        False,
        None,
    )
    await _wait_for(client, f"/runs/{review['run_id']}", lambda report: report["status"] == "succeeded")
    assert await _answered_events(client, review["run_id"]) == [
        {"request": review["id"], "kind": "plan_review", "by": taken.answered_by}
    ]
    # sent again by another call: that one is a resend
    again = await client.post(f"/requests/{review['id']}/answer", json={"approve": True})
    assert typed(AnsweredRequestOut, again).taken_before is True
    assert len(await _answered_events(client, review["run_id"])) == 1


@pytest.mark.parametrize(
    ("failure", "why"),
    [
        (
            DatabaseUnavailableError("the database cannot be reached (refused): cannot append an event"),
            "the database cannot be reached (refused): cannot append an event",
        ),
        (RuntimeError("a bug"), "an unexpected error; the log has the details"),
    ],
)
async def test_an_answer_stored_whose_event_fails_is_said_taken(
    client: httpx.AsyncClient,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    failure: Exception,
    why: str,
) -> None:
    """The answer is stored before its event is appended: a failure then is no refusal.

    Before, it was the API's 503 or 500 (the page: "not sent … send it again"), and the answer
    sent again was refused as answered.
    """
    review = await _review_of_new_run(client, write_script)
    append = RunStore.append_event

    def failing(store: RunStore, run_id: str, kind: Any, *args: Any, **kwargs: Any) -> Any:
        if kind == "request_answered":
            raise failure
        return append(store, run_id, kind, *args, **kwargs)

    with monkeypatch.context() as broken:
        broken.setattr(RunStore, "append_event", failing)
        answered = await client.post(f"/requests/{review['id']}/answer", json={"approve": True})
    assert answered.status_code == 200, answered.text
    taken = typed(AnsweredRequestOut, answered)
    assert (taken.state, taken.answer, taken.taken_before) == ("answered", {"action": "approve"}, False)
    assert taken.follow_up_failed == f"recording it in the run's events failed ({why})"
    assert [record.exc_info[1] for record in caplog.records if record.exc_info] == [failure]
    assert [record.getMessage() for record in caplog.records if record.exc_info] == [
        f"request {review['id']}: answered, but recording it in the run's events failed"
    ]
    # the run took it and went on; sent again, it is said taken
    again = await client.post(f"/requests/{review['id']}/answer", json={"approve": True})
    assert typed(AnsweredRequestOut, again).taken_before is True
    await _wait_for(client, f"/runs/{review['run_id']}", lambda report: report["status"] == "succeeded")
    assert await _answered_events(client, review["run_id"]) == []


async def test_a_remember_answer_whose_team_cannot_be_stored_is_said_taken(
    client: httpx.AsyncClient, service: RunService, write_script: Callable[..., Path]
) -> None:
    """Storing the team an approved `remember` question names fails after the answer is stored.

    Before, the failure (here: the run has no plan) was the API's 400, a refusal, though the
    answer was taken; sent again, it was refused as answered.
    """
    run = await service.create("t", model=f"scripted:{write_script([])}")  # never planned
    store = open_run_store(service.settings)
    try:
        question, _ = store.requests.open(run.id, "remember", {"agents": 2}, key=f"remember:{run.id}")
    finally:
        store.close()
    answered = await client.post(f"/requests/{question.id}/answer", json={"approve": True})
    assert answered.status_code == 200, answered.text
    taken = typed(AnsweredRequestOut, answered)
    assert (taken.state, taken.answer, taken.taken_before) == ("answered", {"approved": True}, False)
    assert taken.follow_up_failed == (
        f"storing the run's team failed (run {run.id} has no plan: there is no team to store); your yes "
        f"stands: once that is fixed, send the same answer again, or run `masterplanner runs remember "
        f"{run.id}`, to store the team"
    )
    events = await _answered_events(client, run.id)
    assert [(event["request"], event["kind"]) for event in events] == [(question.id, "remember")]


@pytest.mark.parametrize(
    ("body", "problems"),
    [
        ({}, ["body.task: is missing"]),
        ({"task": ""}, ["body.task: must not be empty"]),
        (
            {"task": "x", "colour": "red"},
            ["body.colour: unknown field; known: model, options, task, workspace"],
        ),
        (
            {"task": "x", "options": {"max_parallel": 0}},
            ["body.options.max_parallel: must be at least 1, got 0"],
        ),
        (
            {"task": "x", "options": {"tool_policies": {"code_execution": "maybe"}}},
            ["body.options.tool_policies.code_execution: should be 'auto', 'ask' or 'deny', got 'maybe'"],
        ),
        ({"task": 5}, ["body.task: should be text, got a number"]),
        ({"task": "x" * 20_001}, ["body.task: is 20,001 characters; the limit is 20,000"]),
        ({"task": "x", "model": ""}, ["body.model: must not be empty"]),  # not "the setting"
        (
            {"task": "\ud800"},
            ["body.task: should be text, and it holds a character that is not one (a lone surrogate)"],
        ),
        (
            {"task": "x", "options": {"tool_policies": {"code-execution": "auto"}}},
            [
                "body.options.tool_policies: tool_policies names 'code-execution', which is not a tool; "
                "did you mean 'code_execution'? tools are "
                + ", ".join(sorted([*BUILTIN_TOOL_NAMES, *TEAM_TOOL_NAMES]))
                + ", and <server>_<tool> for the MCP servers in mcp_servers"
            ],
        ),
        (
            {"task": "x", "workspace": "/tmp/a\u0000b"},
            ["body.workspace: must not hold a NUL character"],
        ),
    ],
)
async def test_bad_requests_name_the_field_and_store_nothing(
    client: httpx.AsyncClient, body: dict[str, Any], problems: list[str]
) -> None:
    # as JSON text with escapes (a lone surrogate is only sent so)
    content = json.dumps(body).encode()
    response = await client.post("/runs", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["problems"] == problems
    assert response.json()["error"] == "the request is invalid: " + "; ".join(problems)
    assert (await client.get("/runs")).json() == []


async def test_unknown_ids_malformed_json_huge_bodies_and_bad_models(client: httpx.AsyncClient) -> None:
    missing = await client.get("/runs/nosuchrun")
    assert (missing.status_code, missing.json()) == (404, {"error": "no run 'nosuchrun'"})
    assert (await client.post("/requests/nosuch/answer", json={"approve": True})).status_code == 404
    assert (await client.get("/nowhere")).json() == {"error": "no such page or resource"}
    wrong = await client.delete("/runs")
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET, HEAD, POST")
    assert wrong.json() == {"error": "that method is not allowed here"}
    head = await client.head("/health")  # uptime checks ask so
    assert (head.status_code, head.content, head.headers["content-type"]) == (200, b"", "application/json")
    assert (await client.head("/runs/nosuchrun")).status_code == 404
    malformed = await client.post("/runs", content=b'{"task": ', headers={"content-type": "application/json"})
    assert malformed.status_code == 422
    assert malformed.json()["problems"] == ["the body is not valid JSON (near character 9)"]
    plain = await client.post("/runs", content=b'{"task": "x"}', headers={"content-type": "text/plain"})
    assert plain.json()["problems"] == [
        "body: should be JSON, sent with the header Content-Type: application/json"
    ]
    listed = await client.post("/runs", json=[])
    assert listed.json()["problems"] == ["body: should be a JSON object, got a list"]
    huge = await client.post("/runs", json={"task": "x" * (MAX_BODY_BYTES + 1)})
    assert (huge.status_code, huge.json()) == (413, {"error": "the request body is over 4 MiB"})

    async def chunks() -> AsyncIterator[bytes]:  # no length declared: cut off as it arrives
        yield b'{"task": "'
        for _ in range(5):
            yield b"x" * (1024 * 1024)

    streamed = await client.post("/runs", content=chunks(), headers={"content-type": "application/json"})
    assert (streamed.status_code, streamed.json()) == (413, {"error": "the request body is over 4 MiB"})
    model = await client.post("/runs", json={"task": "x", "model": "nonsense:thing"})
    assert model.status_code == 400
    assert "nonsense:thing" in model.json()["error"]
    assert (await client.get("/runs")).json() == []


async def test_a_long_id_is_cut_where_an_error_repeats_it(client: httpx.AsyncClient) -> None:
    """Before, `GET /runs/<5,000 characters>` repeated all 5,000 in its 404."""
    long_id = "r" * 40 + "x" * 4_960
    cut = "'" + "r" * 40 + "…'"
    for path, error in [
        (f"/runs/{long_id}", f"no run {cut}"),
        (f"/requests/{long_id}", f"no request {cut}"),
        (f"/teams/{long_id}", f"no team {cut} in the registry"),
        (f"/agents/{long_id}", f"no agent {cut} in the registry"),
    ]:
        missing = await client.get(path)
        assert (missing.status_code, missing.json()) == (404, {"error": error}), path
    answered = await client.post(f"/requests/{long_id}/answer", json={"approve": True})
    assert (answered.status_code, answered.json()) == (404, {"error": f"no request {cut}"})
    forgotten = await client.delete(f"/memories/{long_id}")
    assert (forgotten.status_code, forgotten.json()) == (404, {"error": f"no memory {cut}"})


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def either_database(isolated: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test's home on SQLite, then on a Postgres database of its own."""
    if request.param == "postgres":
        monkeypatch.setenv("MASTERPLANNER_DATABASE_URL", request.getfixturevalue("postgres_database"))
    return str(request.param)


async def _a_run_awaiting_review(client: httpx.AsyncClient, write_script: Callable[..., Path]) -> Any:
    script = write_script([{"purpose": "*", "repeat": True}])
    created = await client.post("/runs", json={"task": "x", "model": f"scripted:{script}"})
    run = await _wait_for(
        client, f"/runs/{created.json()['id']}", lambda found: found["status"] == "awaiting_approval"
    )
    # the review request opens just after the status is set (it failed once under load: no request yet)
    await _wait_for(client, f"/requests?run_id={run['id']}", lambda found: len(found) == 1)
    return run


async def test_an_id_or_a_search_holding_a_nul_names_nothing(
    either_database: str, write_script: Callable[..., Path]
) -> None:
    """On Postgres each was a 400 in the database's words, naming its URL; on SQLite the search
    matched every run. (Found by fuzzing the API, 2026-11-28.)
    """
    async with web_client("/api/v1") as client:
        run = await _a_run_awaiting_review(client, write_script)
        nul = r"'a\x00b'"
        for method, path, error in [
            ("GET", "/runs/a%00b", f"no run {nul}"),
            ("GET", "/runs/a%00b/events", f"no run {nul}"),
            ("POST", "/runs/a%00b/cancel", f"no run {nul}"),
            ("GET", "/requests?run_id=a%00b", f"no run {nul}"),
            ("GET", "/requests/a%00b", f"no request {nul}"),
            ("GET", "/agents/a%00b", f"no agent {nul} in the registry"),
            ("DELETE", "/agents/a%00b", f"no agent {nul} in the registry"),
            ("GET", "/teams/a%00b", f"no team {nul} in the registry"),
            ("DELETE", "/teams/a%00b", f"no team {nul} in the registry"),
            ("DELETE", "/memories/a%00b", f"no memory {nul}"),
        ]:
            refused = await client.request(method, path)
            assert (refused.status_code, refused.json()) == (404, {"error": error}), path
        for path in ("/runs?q=%00", "/runs?q=x%00", "/agents?q=a%00", "/memories?q=a%00"):
            found = await client.get(path)
            assert (found.status_code, found.json()) == (200, []), path
        assert [listed["id"] for listed in (await client.get("/runs?q=x")).json()] == [run["id"]]
        assert (await client.get(f"/runs/{run['id']}")).json()["status"] == "awaiting_approval"


async def test_a_body_holding_a_nul_is_refused_naming_the_field(
    either_database: str, write_script: Callable[..., Path]
) -> None:
    """On Postgres a rejection's reason with a NUL was taken (200) and the run then failed in the
    database's words; an agent's keyword with one was a 400 naming the database's URL.
    """
    async with web_client("/api/v1") as client:
        run = await _a_run_awaiting_review(client, write_script)
        review = (await client.get(f"/requests?run_id={run['id']}")).json()[0]
        for method, path, body, field in [
            ("POST", f"/requests/{review['id']}/answer", {"approve": False, "reason": "no\x00pe"}, "reason"),
            ("PUT", "/agents/someone", {"keywords": ["a\x00b"]}, "keywords.0"),
            (
                "POST",
                "/runs",
                {"task": "x", "options": {"tool_policies": {"web_search": "a\x00"}}},
                "options.tool_policies.web_search",
            ),
            (  # a key holding one is named with it written out: the message held the NUL itself
                "POST",
                "/runs",
                {"task": "x", "options": {"tool_policies": {"web\x00search": "deny"}}},
                "options.tool_policies.web\\x00search",
            ),
        ]:
            refused = await client.request(method, path, json=body)
            problem = f"body.{field}: must not hold a NUL character"
            assert (refused.status_code, refused.json()) == (
                422,
                {"error": f"the request is invalid: {problem}", "problems": [problem]},
            ), path
        assert (await client.get(f"/requests/{review['id']}")).json()["state"] == "open"
        assert (await client.get(f"/runs/{run['id']}")).json()["status"] == "awaiting_approval"


@pytest.mark.parametrize(
    "content_type",
    [
        "application/vnd.api+json",
        "application/merge-patch+json; charset=utf-8",
        "Application/JSON",
        'application/problem+JSON; profile="x"',
    ],
)
async def test_a_body_holding_a_nul_is_refused_whatever_json_type_it_is_sent_as(
    isolated: Path, write_script: Callable[..., Path], content_type: str
) -> None:
    """FastAPI reads any `application/…+json` body as JSON; the NUL check read only
    `application/json`, so a feedback comment with one was a 400 where others are 422 (found by
    a fuzz review, 2026-11-28)."""
    script = write_script([{"purpose": "*", "repeat": True}])
    async with web_client("/api/v1") as client:
        run = await _a_run_awaiting_review(client, write_script)
        review = (await client.get(f"/requests?run_id={run['id']}")).json()[0]
        body = {"task": "x", "model": f"scripted:{script}", "options": {"auto_approve": True}}
        ended = (await client.post("/runs", json=body)).json()
        await _wait_for(
            client, f"/runs/{ended['id']}", lambda found: found["status"] in ("failed", "succeeded")
        )
        for path, body, field in [
            (f"/runs/{ended['id']}/feedback", {"rating": 4, "comment": "a\x00b"}, "comment"),
            (f"/requests/{review['id']}/answer", {"approve": False, "reason": "no\x00pe"}, "reason"),
        ]:
            refused = await client.post(
                path, content=json.dumps(body), headers={"content-type": content_type}
            )
            problem = f"body.{field}: must not hold a NUL character"
            assert (refused.status_code, refused.json()) == (
                422,
                {"error": f"the request is invalid: {problem}", "problems": [problem]},
            ), path
        assert (await client.get(f"/requests/{review['id']}")).json()["state"] == "open"


async def test_ids_numbers_and_bodies_past_what_is_taken(
    client: httpx.AsyncClient, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """Each was a 500 or a library's words (found by an exploratory session, 2026-11-27)."""
    script = write_script([{"purpose": "*", "repeat": True}])
    # approved at once: the script's smallest plan is a valid one, and the run then ends
    first = (
        await client.post(
            "/runs", json={"task": "x", "model": f"scripted:{script}", "options": {"auto_approve": True}}
        )
    ).json()
    second = (await client.post("/runs", json={"task": "y", "model": f"scripted:{script}"})).json()
    shared = next(
        first["id"][:n] for n in range(len(first["id"]), 0, -1) if second["id"].startswith(first["id"][:n])
    )
    ambiguous = await client.get(f"/runs/{shared}")
    assert (ambiguous.status_code, ambiguous.json()) == (
        404,
        {"error": f"{shared!r} is the start of more than one run's id: give more of it"},
    )
    # '%' and '_' are not patterns
    pattern = "%25" + first["id"][-6:]
    assert (await client.get(f"/runs/{pattern}")).json() == {"error": f"no run '%{first['id'][-6:]}'"}
    huge = await client.get(f"/runs/{first['id']}/events", params={"after": 10**23})
    assert huge.status_code == 422
    assert huge.json()["problems"] == [
        "query.after: must be at most 9,007,199,254,740,991, got 100000000000000000000000"
    ]
    version = await client.get("/agents/someone", params={"version": 10**23})
    assert version.status_code == 422
    latin = await client.post(
        "/runs",
        content='{"task": "café"}'.encode("latin-1"),
        headers={"content-type": "application/json; charset=latin-1"},
    )
    unread = (
        "the body could not be read as JSON: it is not UTF-8, nests too deep or holds a number of "
        "more than 4,300 digits"
    )
    assert (latin.status_code, latin.json()["problems"]) == (422, [unread])
    long_number = await client.post(
        "/runs",
        content=b'{"task": "x", "options": {"max_parallel": ' + b"9" * 5000 + b"}}",
        headers={"content-type": "application/json"},
    )
    assert (long_number.status_code, long_number.json()["problems"]) == (422, [unread])
    # an integer past what a float holds is said by its length (its digits were a 500)
    endless = await client.post(
        "/runs/nobody/feedback",
        content=b'{"rating": 1' + b"0" * 400 + b"}",
        headers={"content-type": "application/json"},
    )
    assert (endless.status_code, endless.json()["problems"]) == (
        422,
        ["body.rating: must be at most 5, got a number of about 401 digits"],
    )
    # a float is shown as written, not as the integer its binary value spells out
    vast = await client.post("/runs", json={"task": "x", "options": {"max_wall_s": 1e308}})
    assert vast.json()["problems"] == ["body.options.max_wall_s: must be at most 604,800, got 1e+308"]
    relative = await client.post("/runs", json={"task": "x", "workspace": "relative/dir"})
    assert relative.json()["problems"] == [
        "body.workspace: must be an absolute path on the server, got 'relative/dir'"
    ]
    deep = await client.post(
        "/runs", json={"task": "x", "model": f"scripted:{script}", "workspace": "/a" * 2000}
    )
    assert (deep.status_code, deep.json()["error"]) == (
        400,
        "workspace path is 2,001 folders deep; at most 256 are taken",
    )
    # a path with a typo above the folder makes no folders (the terminal's rule too)
    typo = tmp_path / "typo" / "deeper" / "ws"
    refused = await client.post(
        "/runs", json={"task": "x", "model": f"scripted:{script}", "workspace": str(typo)}
    )
    assert (refused.status_code, refused.json()["error"], (tmp_path / "typo").exists()) == (
        400,
        f"workspace {typo}: no such folder, nor {typo.parent} to make it in; check the path",
        False,
    )
    assert len((await client.get("/runs")).json()) == 2
    # a run that has ended cannot be cancelled: the API's 409, as for a retry
    ended = ("failed", "succeeded")
    finished = await _wait_for(client, f"/runs/{first['id']}", lambda found: found["status"] in ended)
    cancel = await client.post(f"/runs/{first['id']}/cancel")
    assert (cancel.status_code, cancel.json()) == (
        409,
        {"error": f"run {first['id']} already {finished['status']}"},
    )


async def test_answers_that_do_not_fit_the_request_are_refused(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    body = {
        "task": "do a then b",
        "model": f"scripted:{_script(write_script)}",
        "options": {"prompt_rounds": 0},
    }
    run = (await client.post("/runs", json=body)).json()
    (review,) = await _wait_for(client, f"/requests?run_id={run['id']}", lambda found: len(found) == 1)
    cases = [
        ({"text": "yes"}, f"request {review['id']} asks yes or no: answer it with approve true or false"),
        ({}, "answer with exactly one of approve (true or false), text, or decision"),
        ({"approve": True, "reason": "why"}, "a reason goes with approve false"),
        (
            {"decision": {"action": "approve", "plan": {"task": "t", "steps": []}}},
            "invalid plan: plan: steps: must not be empty",
        ),
        (  # the fields taken are named: before, only "agents.a.system_prompt: unknown field"
            {"decision": {"action": "approve", "agents": {"a": {"system_prompt": "x"}}}},
            f"request {review['id']}: the answer does not fit a plan review: agents.a.system_prompt: "
            "unknown field; known: agent_id, critique, draft, edited, fresh, prompt, prompt_by_person, "
            "reused_from, rounds, tool_policies",
        ),
        (
            {"decision": {"action": "approve", "colour": "red"}},
            f"request {review['id']}: the answer does not fit a plan review: colour: unknown field; "
            "known: action, agents, plan, reason, tool_policies",
        ),
        # one limit for a reason however it is sent (before: "must be text of at most 20000
        # characters" for a number, and 4,000 in `approve: false`'s own field)
        (
            {"decision": {"action": "reject", "reason": 5}},
            f"request {review['id']}: the reason should be text, got a number",
        ),
        (
            {"decision": {"action": "reject", "reason": "x" * 20_001}},
            f"request {review['id']}: the reason is 20,001 characters; the limit is 20,000",
        ),
        (
            {"approve": False, "reason": "x" * 20_001},
            "the request is invalid: body.reason: is 20,001 characters; the limit is 20,000",
        ),
    ]
    for answer, error in cases:
        refused = await client.post(f"/requests/{review['id']}/answer", json=answer)
        assert (refused.status_code, refused.json()["error"]) == (422, error)
    assert (await client.get(f"/requests/{review['id']}")).json()["state"] == "open"  # nothing changed
    reason = "not now: " + "why " * 1_500  # 6,009 characters, within the limit
    rejected = await client.post(
        f"/requests/{review['id']}/answer", json={"approve": False, "reason": reason}
    )
    # kept without the blanks around it (its final space)
    assert rejected.json()["answer"] == {"action": "reject", "reason": reason.strip()}
    final = await _wait_for(
        client,
        f"/runs/{run['id']}",
        lambda report: report["status"] == "cancelled" or report["status"] == "failed",
    )
    assert final["error"]


async def test_the_run_actions_document_the_database_s_failures(service: RunService) -> None:
    """Each run action and an answer document the 500 of a database failing a call and the 503 of
    one not reached, with the error body, as they do their refusals: before, only the refusals."""
    paths = create_app(service).openapi()["paths"]
    actions = [f"/api/v1/runs/{{run_id}}/{action}" for action in ("cancel", "resume", "retry", "feedback")]
    for path in [*actions, "/api/v1/runs/{run_id}/remember", "/api/v1/requests/{request_id}/answer"]:
        responses = paths[path]["post"]["responses"]
        failures = [("500", "the database failed the call (a full disk)"), ("503", "cannot be reached")]
        for code, said in failures:
            assert said in responses[code]["description"], (path, code)
            schema = responses[code]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorOut"}, (path, code)


async def test_a_token_is_required_when_set(service: RunService) -> None:
    app = create_app(service, token="t" * 43)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://example.test"
    ) as client:
        refused = await client.get("/api/v1/runs")
        assert refused.status_code == 401
        assert refused.json()["error"].startswith("this server needs its token")
        documented = app.openapi()["paths"]["/api/v1/runs"]["get"]["responses"]["401"]
        assert documented["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/ErrorOut"
        }
        assert (
            await client.get("/api/v1/runs", headers={"Authorization": "Bearer wrong"})
        ).status_code == 401
        allowed = await client.get("/api/v1/runs", headers={"Authorization": "Bearer " + "t" * 43})
        assert (allowed.status_code, allowed.json()) == (200, [])
        browser = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
        page = await client.get("/runs?status=failed", headers=browser)  # a browser without it logs in first
        assert (page.status_code, page.headers["location"]) == (303, "/login?next=%2Fruns%3Fstatus%3Dfailed")
        form = (await client.get(page.headers["location"])).text
        assert 'type="password"' in form and 'name="next" value="/runs?status=failed"' in form
        wrong = await client.post("/login", data={"token": "nope", "next": "/runs?status=failed"})
        assert wrong.status_code == 401 and "that is not this server&#39;s token" in wrong.text
        # after logging in, the page asked for; never another site
        for asked, shown in [
            ("/runs?status=failed", "/runs?status=failed"),
            ("//evil.example", "/runs"),
            ("/\\evil.example", "/runs"),
            ("https://evil.example", "/runs"),
        ]:
            right = await client.post("/login", data={"token": "t" * 43, "next": asked})
            assert (right.status_code, right.headers["location"]) == (303, shown)
        cookie = right.headers["set-cookie"]
        assert "masterplanner_token=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert (await client.get("/api/v1/runs")).status_code == 200  # the cookie is kept by the client


async def test_a_login_ended_is_a_401_in_json_for_all_but_a_page_a_browser_opens(service: RunService) -> None:
    """Only a browser opening a page is sent to log in: anything else is told, in JSON.

    The run page's refresh (HTMX) followed the redirect and showed the login page inside the run's
    body (its `next` the body alone); a program reading /openapi.json got the login page's HTML.
    """
    app = create_app(service, token="t" * 43)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://example.test"
    ) as client:
        ended = {"masterplanner_token": "an older token of this server, from before it was changed"}
        client.cookies.update(ended)
        htmx = {"hx-request": "true", "accept": "*/*"}
        needed = (
            "this server needs its token: send `Authorization: Bearer TOKEN` or log in at /login "
            "(the token is in the web-token file of the server's home directory)"
        )
        expected = (401, {"error": needed})
        for method, path, headers in [
            ("GET", "/runs/20260101-000000-abcdef/body", htmx),
            ("GET", "/runs/20260101-000000-abcdef/body", {**htmx, "accept": "text/html"}),
            ("POST", "/runs/20260101-000000-abcdef/requests/abc", htmx),
            ("GET", "/runs/20260101-000000-abcdef/changes?after=3", {"accept": "text/event-stream"}),
            ("GET", "/openapi.json", {"accept": "application/json"}),
            ("GET", "/api/v1/runs", {"accept": "text/html"}),
            ("HEAD", "/runs", {"accept": "*/*"}),
        ]:
            refused = await client.request(method, path, headers=headers)
            assert "location" not in refused.headers, (method, path)
            got = (refused.status_code, refused.json() if method != "HEAD" else expected[1])
            assert got == expected, (method, path)
        page = await client.get("/runs/20260101-000000-abcdef", headers={"accept": "text/html"})
        assert (page.status_code, page.headers["location"]) == (
            303,
            "/login?next=%2Fruns%2F20260101-000000-abcdef",
        )


def _hidden_fields(page: str) -> list[tuple[str, str]]:
    """The login form's hidden fields, as a browser sends them."""
    return [
        (html.unescape(name), html.unescape(value))
        for name, value in re.findall(r'<input type="hidden" name="([^"]*)" value="([^"]*)">', page)
    ]


async def test_a_form_sent_when_the_login_has_ended_is_the_login_page_and_sent_again_after_it(
    service: RunService,
) -> None:
    """A browser's plain form (a new task, an agent's edit, a delete) was answered with a 401 in JSON.

    Now it is the login page (401) saying the form was not saved, carrying what was typed; the
    login sends it on to where it was sent (a 307: the browser posts it again, logged in). What
    holds a secret is not carried back: the login then goes on to the form's page, to fill in again.
    """
    app = create_app(service, token="t" * 43)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://example.test"
    ) as client:
        client.cookies.update({"masterplanner_token": "an older token of this server"})
        browser = {
            "accept": "text/html,application/xhtml+xml,*/*;q=0.8",
            "referer": "http://example.test/new",
            "sec-fetch-site": "same-origin",
        }
        typed = [("task", 'write a haiku\nabout <tea> & "cakes"'), ("model", ""), ("max_parallel", "99")]
        # a form another site posted (an older browser: no Sec-Fetch-Site, `Origin: null`) is not
        # carried: the person's login would send it again from this server's own origin
        for elsewhere in ({"origin": "null"}, {"origin": "http://evil.test"}, {}):
            foreign = await client.post(
                "/new", data=dict(typed), headers={"accept": "text/html", **elsewhere}
            )
            assert foreign.status_code in (401, 403)
            assert ("task", typed[0][1]) not in _hidden_fields(foreign.text)
        refused = await client.post("/new", data=dict(typed), headers=browser)
        page = refused.text
        assert (refused.status_code, refused.headers["content-type"].split(";")[0]) == (401, "text/html")
        assert "<h1>Log in</h1>" in page
        assert html.unescape(re.findall(r'class="error" role="alert">([^<]*)<', page)[0]) == (
            "Not saved: your login to this server has ended, so the form you sent was not taken. Log in "
            "and it is sent again, as you filled it in."
        )
        carried = _hidden_fields(page)
        assert carried == [
            ("next", "/new"),
            ("resend", "post"),
            *typed,
        ]

        form = browser | {"content-type": "application/x-www-form-urlencoded"}
        wrong = await client.post("/login", content=urlencode([*carried, ("token", "nope")]), headers=form)
        assert wrong.status_code == 401 and _hidden_fields(wrong.text) == carried  # still carried
        sent = urlencode([*carried, ("token", "t" * 43)])
        logged_in = await client.post("/login", content=sent, headers=form)
        assert (logged_in.status_code, logged_in.headers["location"]) == (307, "/new")
        # the browser sends the login's form again to /new, now with the cookie
        again = await client.post("/new", content=sent, headers=form)
        assert again.status_code == 422  # the form, as typed, with what is wrong in it
        assert "Steps running at once must be a whole number from 1 to" in again.text
        assert "write a haiku\nabout &lt;tea&gt; &amp; &#34;cakes&#34;</textarea>" in again.text

        client.cookies.clear()
        secret = "use the key sk-proj-Abcdefghijklmnop1234567890QRSTuvwx"
        refused = await client.post("/new", data={"task": secret}, headers=browser)
        assert refused.status_code == 401 and "sk-proj" not in refused.text
        assert html.unescape(re.findall(r'class="error" role="alert">([^<]*)<', refused.text)[0]) == (
            "Not saved: your login to this server has ended, so the form you sent was not taken. What "
            "you typed holds a secret, which this page does not send back: log in, then fill the form "
            "in again."
        )
        assert _hidden_fields(refused.text) == [("next", "/new")]

        # a form of no fields (a delete button): sent empty, as a browser does
        deleted = await client.post("/teams/a-team", content=b"", headers=form)
        assert (deleted.status_code, _hidden_fields(deleted.text)) == (
            401,
            [("next", "/teams/a-team"), ("resend", "post")],
        )
        # the API and the page's own requests keep the JSON
        for headers in ({"accept": "application/json"}, {**browser, "hx-request": "true"}):
            refused = await client.post("/new", data={"task": "t"}, headers=headers)
            assert refused.status_code == 401 and refused.json()["error"].startswith(
                "this server needs its token"
            )


async def test_other_sites_and_other_host_names_are_refused(client: httpx.AsyncClient) -> None:
    body = {"task": "x"}
    for headers, error in [
        ({"sec-fetch-site": "cross-site"}, "a request from another site cannot change anything here"),
        ({"origin": "http://evil.example"}, "a request from http://evil.example cannot change anything here"),
        (
            {"host": "rebound.example:8765"},
            "this server answers only to a loopback address, not to host 'rebound.example:8765'",
        ),
    ]:
        refused = await client.post("/runs", json=body, headers=headers)
        assert (refused.status_code, refused.json()) == (403, {"error": error})
    for host in ("localhost:8765", "[::1]:8765"):
        assert (await client.get("/runs", headers={"host": host})).status_code == 200
    assert (await client.get("/runs")).json() == []


def test_binding_off_loopback_needs_auth_and_the_token_file_is_private(tmp_path: Path) -> None:
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.5"):
        check_bind(host, auth=False)
    for host in ("0.0.0.0", "192.168.1.4", "example.com", "::"):
        with pytest.raises(ConfigError, match=f"--host {host} can be reached from other machines"):
            check_bind(host, auth=False)
        check_bind(host, auth=True)
    token, path = web_token(tmp_path / "home")
    assert len(token) >= 40 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert web_token(tmp_path / "home") == (token, path)  # the same token next time
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="can be read by other users: run `chmod 600"):
        web_token(tmp_path / "home")


def test_serve_refuses_a_public_address_without_auth() -> None:
    result = mp("serve", "--host", "0.0.0.0")
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: --host 0.0.0.0 can be reached from other machines")


async def test_a_run_started_in_the_terminal_is_approved_through_the_api(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    process = start(
        "run", "do a then b", "--model", f"scripted:{_script(write_script)}", "--rounds", "0", "--json"
    )
    try:
        (review,) = await _wait_for(client, "/requests", lambda found: len(found) == 1)
        answered = await client.post(f"/requests/{review['id']}/answer", json={"approve": True})
        assert answered.status_code == 200, answered.text
        out, err = await asyncio.to_thread(process.communicate, timeout=90)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert json.loads(out)["output"] == "B done"
    report = (await client.get(f"/runs/{review['run_id']}")).json()
    assert report["status"] == "succeeded"


async def test_a_run_started_through_the_api_is_answered_in_the_terminal(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=["delete_file"])]}},
            {"purpose": "step:a", "tool_calls": [{"name": "delete_file", "args": {"path": "old.txt"}}]},
            {"purpose": "step:a", "expect": ["the call to delete_file was not approved"], "output": "kept"},
            DRAFTS,
        ]
    )
    body = {"task": "tidy up", "model": f"scripted:{script}", "options": {"prompt_rounds": 0}}
    run = (await client.post("/runs", json=body)).json()
    (review,) = await _wait_for(client, f"/requests?run_id={run['id']}", lambda found: len(found) == 1)
    await client.post(f"/requests/{review['id']}/answer", json={"approve": True})
    await _wait_for(client, f"/requests?run_id={run['id']}", lambda found: len(found) == 1)

    listed = await asyncio.to_thread(mp, "runs", "pending", "--json")
    (approval,) = json.loads(listed.stdout)
    assert (approval["kind"], approval["run_id"], approval["payload"]["tool"]) == (
        "tool_approval",
        run["id"],
        "delete_file",
    )
    denied = await asyncio.to_thread(mp, "runs", "answer", approval["id"], "--deny", "--reason", "keep it")
    assert denied.returncode == 0, denied.stderr
    report = await _wait_for(client, f"/runs/{run['id']}", lambda report: report["status"] == "succeeded")
    assert report["output"] == "kept"
    events = (await client.get(f"/runs/{run['id']}/events")).json()
    (refusal,) = [event["data"] for event in events if event["kind"] == "tool_denied"]
    assert refusal["reason"] == "keep it" and refusal["by"].startswith("cli@")


async def test_a_failed_run_is_retried_through_the_api(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[]), step("b", "a", tools=[])]}},
            {"purpose": "step:a", "output": "A done"},
            {"purpose": "step:b", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True},
            DRAFTS,
        ]
    )
    options = {"prompt_rounds": 0, "auto_approve": True, "max_replans": 0}
    created = await client.post(
        "/runs", json={"task": "a then b", "model": f"scripted:{script}", "options": options}
    )
    run_id = created.json()["id"]
    await _wait_for(client, f"/runs/{run_id}", lambda found: found["status"] == "failed")

    bad = await client.post(
        f"/runs/{run_id}/retry",
        json={"max_model_calls": 0, "prompt_rounds": 6, "colour": "red"},
    )
    assert bad.status_code == 422
    assert bad.json()["problems"] == [
        "body.max_model_calls: must be at least 1, got 0",
        "body.prompt_rounds: must be at most 5, got 6",
        "body.colour: unknown field; known: max_cost_usd, max_model_calls, max_tokens, max_wall_s, "
        "prompt_rounds",
    ]
    for rounds, problem in [
        (-1, "must be at least 0, got -1"),
        (1.5, "should be a whole number, got a number"),
        ("2", "should be a whole number, got text"),
    ]:
        refused = await client.post(f"/runs/{run_id}/retry", json={"prompt_rounds": rounds})
        assert (refused.status_code, refused.json()["problems"]) == (422, [f"body.prompt_rounds: {problem}"])
    spent = await client.post(f"/runs/{run_id}/retry", json={"max_model_calls": 10})
    assert spent.status_code == 409
    assert spent.json()["error"] == (
        f"run {run_id} cannot go on: the run used its budget of 10 model calls; retry it with a larger budget"
    )
    assert (await client.get(f"/runs/{run_id}")).json()["status"] == "failed"

    script.write_text(json.dumps({"calls": [{"purpose": "step:b", "output": "B at last"}]}))
    retried = await client.post(f"/runs/{run_id}/retry", json={"prompt_rounds": 0})
    assert retried.status_code == 200, retried.text
    assert (retried.json()["status"], retried.json()["retries"]) == ("running", 1)
    events = (await client.get(f"/runs/{run_id}/events")).json()
    (retry,) = [event["data"] for event in events if event["kind"] == "run_retried"]
    assert ("budgets" in retry, retry["prompt_rounds"]) == (False, 0)
    report = await _wait_for(client, f"/runs/{run_id}", lambda found: found["status"] == "succeeded")
    assert report["output"] == "B at last"
    assert [(s["id"], s["status"]) for s in report["steps"]] == [("a", "succeeded"), ("b", "succeeded")]
    refused = await client.post(f"/runs/{run_id}/retry", json={})
    assert (refused.status_code, refused.json()["error"]) == (
        409,
        f"run {run_id} succeeded: only a failed run can be retried",
    )
    assert (await client.post("/runs/nope-nope/retry")).status_code == 404


async def test_a_team_nothing_stored_is_stored_through_the_api_once(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`POST /runs/{id}/remember` stores the team of a run that succeeded when nothing stored it
    (here `remember_runs = never`), as `runs remember` does, and refuses as it does.

    Before, only the CLI could: the API had no such route (404), so a team a server's run left
    unstored needed a terminal on the server's machine.
    """
    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "never")
    script = _script(write_script)
    elsewhere = RunService(Settings.load())  # made and left: nobody executes it, it stays planning
    try:
        planning = await elsewhere.create("do a then b", model=f"scripted:{script}")
    finally:
        elsewhere.close()
    async with web_client("/api/v1") as client:
        options = {"prompt_rounds": 0, "auto_approve": True}
        body = {"task": "do a then b", "model": f"scripted:{script}", "options": options}
        run_id = (await client.post("/runs", json=body)).json()["id"]
        await client.get(f"/runs/{run_id}/events/stream")  # ends when the run is over
        assert (await client.get(f"/runs/{run_id}")).json()["status"] == "succeeded"
        assert (await client.get(f"/teams/{run_id}")).status_code == 404

        # a process still ending the run (holding its lease) stores its team or asks, not this
        store = open_run_store(Settings.load())
        try:
            assert store.claim(run_id, "ending-it", lease_s=60)
            ending = await client.post(f"/runs/{run_id}/remember")
            assert (ending.status_code, ending.json()["error"]) == (
                409,
                f"run {run_id} is still ending (its team is being stored or asked about): "
                "try again in a moment",
            )
            store.release(run_id, "ending-it")
        finally:
            store.close()
        assert (await client.get(f"/teams/{run_id}")).status_code == 404

        stored = await client.post(f"/runs/{run_id}/remember")
        assert (stored.status_code, stored.json()) == (200, {"cohort": run_id})
        team = (await client.get(f"/teams/{run_id}")).json()
        assert (team["run_id"], team["agents"]) == (run_id, {"a": f"{run_id}.a", "b": f"{run_id}.b"})
        events = (await client.get(f"/runs/{run_id}/events")).json()
        (told,) = [event["data"] for event in events if event["kind"] == "team_stored"]
        assert told["cohort"] == run_id and told["by"].startswith("web@")

        for asked, status, error in [
            (
                run_id,
                409,
                f"run {run_id}: its team is stored already (GET /api/v1/teams/{run_id})",
            ),
            (
                planning.id,
                409,
                f"run {planning.id} is planning: only a run that succeeded has a team to store",
            ),
            ("nosuchrun", 404, "no run 'nosuchrun'"),
        ]:
            refused = await client.post(f"/runs/{asked}/remember")
            assert (refused.status_code, refused.json()) == (status, {"error": error}), asked
        assert [team["id"] for team in (await client.get("/teams")).json()] == [run_id]
        events = (await client.get(f"/runs/{run_id}/events")).json()
        assert [event["kind"] for event in events].count("team_stored") == 1


@contextlib.asynccontextmanager
async def _unstored_team_server(
    monkeypatch: pytest.MonkeyPatch, write_script: Callable[..., Path]
) -> AsyncIterator[tuple[RunService, httpx.AsyncClient, str]]:
    """A server (its service, a client of its API and pages) with a run that succeeded and is over,
    its team not stored (`remember_runs = never`): the run's id third."""
    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "never")
    service = RunService(Settings.load())
    app = create_app(service)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8765"
        ) as client:
            options = {"prompt_rounds": 0, "auto_approve": True}
            body = {"task": "do a then b", "model": f"scripted:{_script(write_script)}", "options": options}
            run_id = str((await client.post("/api/v1/runs", json=body)).json()["id"])
            await client.get(f"/api/v1/runs/{run_id}/events/stream")  # ends when the run is over
            assert (await client.get(f"/api/v1/runs/{run_id}")).json()["status"] == "succeeded"
            yield service, client, run_id
    finally:
        await app.state.executions.stop()
        app.state.registry.close()
        service.close()


async def test_a_team_whose_storing_fails_in_the_database_is_a_server_failure_not_a_refusal(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry's database failing as the team is stored (a full disk) is the API's and the
    page's 500, in our words: nothing was refused, and the same press stores it once that is fixed.

    Before, both said 409, the answer to a run not in a state that takes it.
    """
    async with _unstored_team_server(monkeypatch, write_script) as (service, client, run_id):
        url = shown_url(service.settings.database_url)
        failed = {"error": f"database {url}: cannot store a run's team: database or disk is full"}
        with sqlite_failing("INSERT INTO mp_cohorts"):
            api = await client.post(f"/api/v1/runs/{run_id}/remember")
            page = await client.post(f"/runs/{run_id}/remember", headers={"HX-Request": "true"})
        assert (api.status_code, api.json()) == (500, failed)
        assert (page.status_code, page.json()) == (500, failed)  # the page says "not sent … send it again"
        assert (await client.get(f"/api/v1/teams/{run_id}")).status_code == 404
        stored = await client.post(f"/api/v1/runs/{run_id}/remember")
        assert (stored.status_code, stored.json()) == (200, {"cohort": run_id})


async def test_a_team_stored_whose_event_was_lost_is_said_stored_by_the_next_press(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The registry stores the team, then the run's database fails as its `team_stored` event is
    written (a full disk): the press is a 500. The page still offers the button (no event says the
    team is stored), and the next press is taken: the event is written then, with who pressed,
    the team is not stored again, and the button is gone. A press after that is refused.

    Before, every later press was refused as "stored already" while the page offered the button
    for good.
    """
    button = '<button type="submit">Remember this team</button>'
    async with _unstored_team_server(monkeypatch, write_script) as (service, client, run_id):
        url = shown_url(service.settings.database_url)
        with sqlite_failing("INSERT INTO mp_events", times=1) as failed:
            lost = await client.post(f"/api/v1/runs/{run_id}/remember")
        assert (len(failed), lost.status_code, lost.json()) == (
            1,
            500,
            {"error": f"database {url}: cannot append an event: database or disk is full"},
        )
        assert (await client.get(f"/api/v1/teams/{run_id}")).status_code == 200  # the registry has it
        events = (await client.get(f"/api/v1/runs/{run_id}/events")).json()
        assert "team_stored" not in [event["kind"] for event in events]
        assert button in (await client.get(f"/runs/{run_id}/body")).text

        taken = await client.post(f"/runs/{run_id}/remember", headers={"HX-Request": "true"})
        assert taken.status_code == 200, taken.text
        assert f'This run\'s team is stored: <a href="/teams/{run_id}">' in html.unescape(taken.text)
        assert button not in taken.text
        assert button not in (await client.get(f"/runs/{run_id}/body")).text
        events = (await client.get(f"/api/v1/runs/{run_id}/events")).json()
        [told] = [event["data"] for event in events if event["kind"] == "team_stored"]
        assert (sorted(told), told["cohort"]) == (["by", "cohort"], run_id)
        assert told["by"].startswith("web@")
        assert [team["id"] for team in (await client.get("/api/v1/teams")).json()] == [run_id]
        stored = (await client.get("/api/v1/agents")).json()
        agents = {agent["id"]: agent["stats"]["uses"] for agent in stored}
        assert agents == {f"{run_id}.a": 1, f"{run_id}.b": 1}  # stored once, counted once

        again = await client.post(f"/api/v1/runs/{run_id}/remember")
        assert (again.status_code, again.json()) == (
            409,
            {"error": f"run {run_id}: its team is stored already (GET /api/v1/teams/{run_id})"},
        )
        events = (await client.get(f"/api/v1/runs/{run_id}/events")).json()
        assert [event["kind"] for event in events].count("team_stored") == 1


async def test_a_team_the_embedder_setting_cannot_store_is_the_same_400_from_the_api_and_the_page(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An embedder setting the registry refuses as it is opened to store the team (a provider's,
    its key not set) is a configuration error: the API's 400, as for any other, and the page's too.

    Before, the page said 422, the answer to a form filled in wrong, where the API said 400.
    """
    refusal = MissingCredentialError("OPENAI_API_KEY", "openai:text-embedding-3-small", what="embedder")
    check, refused = embedders.check_embedder, []

    def refusing_once(spec: str) -> None:  # the registry opened to store the team: the page reads it after
        if not refused:
            refused.append(spec)
            raise refusal
        check(spec)

    misconfigured = {
        "error": "embedder 'openai:text-embedding-3-small' needs the environment variable OPENAI_API_KEY, "
        "which is not set"
    }
    async with _unstored_team_server(monkeypatch, write_script) as (_, client, run_id):
        monkeypatch.setattr(embedders, "check_embedder", refusing_once)
        api = await client.post(f"/api/v1/runs/{run_id}/remember")
        refused.clear()
        page = await client.post(f"/runs/{run_id}/remember", headers={"HX-Request": "true"})
        assert (api.status_code, api.json()) == (400, misconfigured)
        assert (page.status_code, page.json()) == (400, misconfigured)  # "not sent: the server refused it"
        assert (await client.get(f"/api/v1/teams/{run_id}")).status_code == 404


async def test_a_review_answered_with_the_plan_as_it_was_is_no_edit(
    client: httpx.AsyncClient, service: RunService, write_script: Callable[..., Path]
) -> None:
    """A client that sends the whole review back unchanged approves it: nothing is recorded as edited."""
    body = {
        "task": "do a then b",
        "model": f"scripted:{_script(write_script)}",
        "options": {"prompt_rounds": 0, "tool_policies": {"read_file": "ask"}},
    }
    run = (await client.post("/runs", json=body)).json()
    (review,) = await _wait_for(client, f"/requests?run_id={run['id']}", lambda found: len(found) == 1)
    payload = review["payload"]
    decision = {
        "action": "approve",
        "plan": payload["plan"],
        "agents": payload["agents"],
        "tool_policies": payload["tool_policies"],
    }
    answered = await client.post(f"/requests/{review['id']}/answer", json={"decision": decision})
    assert answered.status_code == 200, answered.text
    report = await _wait_for(client, f"/runs/{run['id']}", lambda found: found["status"] == "succeeded")
    assert not any(agent.get("edited") for agent in report["agents"].values())
    kinds = [event["kind"] for event in (await client.get(f"/runs/{run['id']}/events")).json()]
    assert to_approval(kinds) == (APPROVED_AS_SHOWN, False)
    audit = await service.audit(run["id"])
    assert [entry.action for entry in audit][1:] == ["approved the plan"]


async def test_a_plan_edit_without_the_task_keeps_the_runs_task(
    client: httpx.AsyncClient, service: RunService, write_script: Callable[..., Path]
) -> None:
    """An edited plan sent without `task` keeps the run's, as the terminal's edit does.

    Before, the API refused it ("plan: task: is missing"): a client editing the steps had to send
    the task back word for word.
    """
    body = {
        "task": "do a then b",
        "model": f"scripted:{_script(write_script)}",
        "options": {"prompt_rounds": 0},
    }
    run = (await client.post("/runs", json=body)).json()
    (review,) = await _wait_for(client, f"/requests?run_id={run['id']}", lambda found: len(found) == 1)
    steps = review["payload"]["plan"]["steps"]
    edited = [steps[0] | {"title": "Do a, retitled"}, steps[1]]
    decision = {"action": "approve", "plan": {"steps": edited}}
    answered = await client.post(f"/requests/{review['id']}/answer", json={"decision": decision})
    assert answered.status_code == 200, answered.text
    report = await _wait_for(client, f"/runs/{run['id']}", lambda found: found["status"] == "succeeded")
    assert report["plan"]["task"] == "do a then b"
    assert [step["title"] for step in report["plan"]["steps"]] == ["Do a, retitled", steps[1]["title"]]
    audit = await service.audit(run["id"])
    assert [entry.action for entry in audit][1:] == ["approved the plan with edits to the plan"]
    # another task is still refused, naming it
    second = (await client.post("/runs", json=body)).json()
    (review,) = await _wait_for(client, f"/requests?run_id={second['id']}", lambda found: len(found) == 1)
    other = {"action": "approve", "plan": {"task": "do c", "steps": edited}}
    refused = await client.post(f"/requests/{review['id']}/answer", json={"decision": other})
    assert (refused.status_code, refused.json()["problems"]) == (
        422,
        ["task: is the run's task and cannot be edited; start a new run for another task"],
    )


async def test_a_review_answer_naming_some_steps_agents_leaves_the_others_as_they_were(
    client: httpx.AsyncClient, service: RunService, write_script: Callable[..., Path]
) -> None:
    """An answer's agents are the ones it edits: before, the steps it left out lost their agents."""
    model = f"scripted:{_script(write_script)}"
    body = {"task": "do a then b", "model": model, "options": {"prompt_rounds": 0}}
    run = (await client.post("/runs", json=body)).json()
    (review,) = await _wait_for(client, f"/requests?run_id={run['id']}", lambda found: len(found) == 1)
    held = review["payload"]["agents"]
    decision = {"action": "approve", "agents": {"a": held["a"] | {"prompt": "Do a, and say so."}}}
    answered = await client.post(f"/requests/{review['id']}/answer", json={"decision": decision})
    assert answered.status_code == 200, answered.text
    report = await _wait_for(client, f"/runs/{run['id']}", lambda found: found["status"] == "succeeded")
    assert report["agents"]["a"]["prompt"] == "Do a, and say so."
    assert report["agents"]["b"] == held["b"]
    assert report["usage"]["by_purpose"]["prompt_creator"]["calls"] == 2  # b's prompt not written anew
    audit = await service.audit(run["id"])
    assert [entry.action for entry in audit][1:] == ["approved the plan with edits to the prompts of a"]
    # the audit of an answer that changes one step's tool policies alone says so
    from masterplanner.audit import audit_entries
    from masterplanner.engine import Request

    shown = (await client.get(f"/requests/{review['id']}")).json()
    answered_review = Request(**{name: shown[name] for name in Request.__dataclass_fields__ if name in shown})
    policies = {"b": held["b"] | {"tool_policies": {"read_file": "ask"}}}
    other = replace(answered_review, answer={"action": "approve", "agents": policies | decision["agents"]})
    assert [entry.action for entry in audit_entries([other], [])] == [
        "approved the plan with edits to the prompts of a and the tool policies of b"
    ]


async def test_a_run_search_finds_the_task_in_any_case_beyond_ascii(either_database: str) -> None:
    """`q=Ärger` and `q=ärger` found none of the tasks "Ärger task …": the query was lowered in
    Python and compared with SQL's `lower(task)`, ASCII only on SQLite. Wildcards stay literal.
    (Found by fuzzing the API, 2026-11-28.)
    """
    settings = Settings.load()
    settings.ensure_home()
    store = RunStore(settings.database_url)
    tasks = {
        "r1": "Ärger task 1",
        "r2": "ärger task 2",
        "r3": "ÄRGER TASK 3",
        "r4": "Die Straße",
        "r5": "ΣΊΣΥΦΟΣ rolls",
        "r6": "100% done",
        "r7": "a_b c",
        "r8": "Unrelated job",
    }
    for run_id, task in tasks.items():
        store.create_run(run_id, task, model="scripted", workspace=".", options=RunOptions())
    store.engine.dispose()
    async with web_client() as client:
        for q, found in [
            ("Ärger", {"r1", "r2", "r3"}),
            ("ärger", {"r1", "r2", "r3"}),
            ("ÄRGER task 3", {"r3"}),
            ("STRASSE", {"r4"}),
            ("straße", {"r4"}),
            ("σίσυφος", {"r5"}),
            ("%", {"r6"}),
            ("a_b", {"r7"}),
            ("_", {"r7"}),
            ("a%b", set()),
        ]:
            listed = await client.get("/api/v1/runs", params={"q": q})
            assert (listed.status_code, {run["id"] for run in listed.json()}) == (200, found), q
        page = await client.get("/runs", params={"q": "ärger"})
        assert page.status_code == 200
        assert [task for task in tasks.values() if html.escape(task) in page.text] == [
            "Ärger task 1",
            "ärger task 2",
            "ÄRGER TASK 3",
        ]


async def test_a_workspace_refused_for_where_it_is_is_refused_before_it_is_measured(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write_script: Callable[..., Path]
) -> None:
    """`{"workspace": "/"}` took 7-15 s, measuring the whole file system, before its refusal
    (found by fuzzing the API, 2026-11-28). The root, a system folder, a home folder and a folder
    holding masterplanner's home or inside it are refused first, measuring nothing, making no
    folder and recording nothing."""
    from masterplanner.settings import known_workspaces
    from masterplanner.tools.workspace import Workspace

    measured: list[Path] = []
    measure = Workspace.allocated_bytes

    def allocated_bytes(workspace: Workspace) -> int:
        measured.append(workspace.root)
        return measure(workspace)

    monkeypatch.setattr(Workspace, "allocated_bytes", allocated_bytes)
    home, parent = await asyncio.to_thread(isolated.resolve), await asyncio.to_thread(tmp_path.resolve)
    model = f"scripted:{write_script([{'purpose': '*', 'repeat': True}])}"
    own = "steps write and delete files there. Choose a folder of its own"
    async with web_client("/api/v1") as client:
        for folder, error in [
            ("/", f"workspace / is the root of the file system; {own}"),
            ("/usr", f"workspace /usr is the system folder /usr; {own}"),
            (
                "/usr/share/new-folder",
                f"workspace /usr/share/new-folder is inside the system folder /usr; {own}",
            ),
            ("/home/someone", f"workspace /home/someone is a home folder itself; {own}"),
            (
                str(tmp_path),
                f"workspace {parent} holds masterplanner's home {home}; steps could change "
                "its settings, agents and runs there. Choose a folder outside it",
            ),
            (
                str(isolated / "mine"),
                f"workspace {home / 'mine'} is inside masterplanner's home {home}, among its own data "
                "or the runs' workspaces; steps could change them there. Choose a folder outside it",
            ),
        ]:
            refused = await client.post("/runs", json={"task": "t", "model": model, "workspace": folder})
            assert (refused.status_code, refused.json()) == (400, {"error": error}), folder
        assert (await client.get("/runs")).json() == []
    made = _removed_if_made(Path("/usr/share/new-folder"), Path("/home/someone"), isolated / "mine")
    assert (measured, known_workspaces(isolated), made) == ([], [], [])


def _removed_if_made(*folders: Path) -> list[Path]:
    """Those of the (empty) `folders` that exist, removed: a test that fails leaves none behind."""
    made = [folder for folder in folders if folder.exists()]
    for folder in made:
        folder.rmdir()
    return made


async def test_a_retry_of_a_stopped_run_says_to_resume_it_with_the_api_s_endpoint(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    """It named the terminal's command (`masterplanner runs resume RUN`) to a program."""
    made = await stopped_run(write_script)
    async with web_client("/api/v1") as client:
        retried = await client.post(f"/runs/{made.id}/retry")
    assert (retried.status_code, retried.json()) == (
        409,
        {
            "error": f"run {made.id} is planning but no process is executing it (the one that was "
            f"stopped): continue it with POST /api/v1/runs/{made.id}/resume"
        },
    )


async def test_of_simultaneous_resumes_of_a_stopped_run_one_starts_it_and_the_others_are_409(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    """All four were 200 (one execution started), where README promises a 409 for a run being
    executed (found by a fuzz review, 2026-11-28)."""
    made = await stopped_run(write_script)
    async with web_client("/api/v1") as client:
        answers = await asyncio.gather(*(client.post(f"/runs/{made.id}/resume") for _ in range(4)))
        statuses = sorted(answer.status_code for answer in answers)
        refusals = [answer.json() for answer in answers if answer.status_code == 409]
        assert (statuses, refusals) == (
            [200, 409, 409, 409],
            [{"error": f"run {made.id} is being executed: there is nothing to resume"}] * 3,
        )
        done = await _wait_for(client, f"/runs/{made.id}", lambda found: found["status"] == "succeeded")
    assert done["output"] == "A done"
