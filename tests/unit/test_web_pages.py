"""The pages through the ASGI app (httpx): a task started, reviewed with edits, answered, and followed."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
from _api import stopped_run, web_client
from _cli import start
from _faults import sqlite_failing
from _plans import APPROVED_AS_SHOWN, step, to_approval

from masterplanner import RunOptions, Settings
from masterplanner.database import shown_url
from masterplanner.engine.store import RunStore
from masterplanner.errors import DatabaseUnavailableError
from masterplanner.service import RunService
from masterplanner.web import create_app

DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}
CRITIC = {
    "purpose": "critic",
    "output": {
        "clarity": 4,
        "completeness": 3,
        "tool_fit": 5,
        "output_format": 4,
        "defects": ["say the file"],
    },
    "repeat": True,
}
WRITE = {"name": "write_file", "args": {"path": "out.txt", "content": "hello from b"}}


@pytest.fixture
async def client(isolated: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with web_client() as opened:
        yield opened


async def _taken_already(client: httpx.AsyncClient, request_id: str) -> str:
    """What the run page says of an answer sent again that was taken before, from this server.

    Who sent it first is not known (whoever holds the web's one login is the same answerer), so
    the page says by what and when it was taken, not that the person sent it before.
    """
    taken = (await client.get(f"/api/v1/requests/{request_id}")).json()
    return (
        f"This answer was taken already (by {taken['answered_by']}, at {taken['answered_at']}): "
        "it is not stored twice."
    )


def _script(write_script: Callable[..., Path]) -> Path:
    return write_script(
        [
            {
                "purpose": "planner",
                "output": {"steps": [step("a", tools=["read_file"]), step("b", "a", tools=["write_file"])]},
            },
            {"purpose": "step:a", "output": "A done"},
            # b's prompt was edited at review: the step agent gets the person's words
            {"purpose": "step:b", "expect": ["Write out.txt politely."], "tool_calls": [WRITE]},
            {"purpose": "step:b", "output": "B done"},
            DRAFTS,
            CRITIC,
        ]
    )


async def _body_until(client: httpx.AsyncClient, run_id: str, pattern: str) -> str:
    for _ in range(600):
        body = (await client.get(f"/runs/{run_id}/body")).text
        if re.search(pattern, body):
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"the run's page never showed {pattern!r}:\n{body}")


async def test_a_task_is_started_reviewed_with_edits_answered_and_followed(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    form = {"task": "write out.txt", "model": f"scripted:{_script(write_script)}"}
    created = await client.post("/new", data=form)
    assert created.status_code == 303
    run_id = created.headers["location"].removeprefix("/runs/")
    page = (await client.get(f"/runs/{run_id}")).text
    assert 'sse-connect="/runs/' in page and "/static/htmx-2.0.11.min.js" in page

    body = await _body_until(client, run_id, "Review the plan")
    assert "<svg" in body and 'marker-end="url(#arrow)"' in body  # the graph, with an arrow a → b
    # the prompt shown is the revision; the critic's scores are of the text it replaced
    assert (
        "The critic scored the version before this revision: clarity 4, completeness 3, tool fit 5, "
        "output 4; defects the revision was to fix: say the file"
    ) in body
    assert "Critic: clarity" not in body
    assert "Estimate for the steps: about 4 model calls, " in body and ", cost $0.00 " in body
    review_id = re.search(r'hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', body)
    assert review_id is not None

    # an invalid edit is shown next to its step, and nothing changes
    bad = {"choice": "approve", "tools-shown.b": "1", "tools.b": "write_file", "instruction.b": "  "}
    refused = await client.post(f"/runs/{run_id}/requests/{review_id[1]}", data=bad)
    assert refused.status_code == 422
    assert "instruction: must not be empty" in refused.text and 'id="card-b"' in refused.text
    cycle = {"choice": "approve", "depends_on.a": "b", "depends_on.b": "a", "title.a": "EDITED A"}
    refused = await client.post(f"/runs/{run_id}/requests/{review_id[1]}", data=cycle)
    assert refused.status_code == 422 and "steps form a cycle" in refused.text
    # the form comes back as the person left it, the other edits too; the stored plan is unchanged
    assert 'value="EDITED A"' in refused.text and 'name="depends_on.a" value="b"' in refused.text
    stored = (await client.get(f"/api/v1/runs/{run_id}")).json()["plan"]["steps"]
    assert [(s["title"], s["depends_on"]) for s in stored] == [("do a", []), ("do b", ["a"])]
    # an answer to a request that is not on the page says why, once, above the open review
    unknown = await client.post(f"/runs/{run_id}/requests/0a0a0a", data={"choice": "approve"})
    assert unknown.status_code == 422 and "Review the plan" in unknown.text
    assert unknown.text.count("no request &#39;0a0a0a&#39;") == 1

    # untick a's read_file, rewrite b's prompt, allow write_file for the run, approve
    edit = {
        "choice": "approve",
        "tools-shown.a": "1",
        "tools-shown.b": "1",
        "tools.b": "write_file",
        "prompt.b": "Write out.txt politely.",
        "policy.write_file": "auto",
        "steppolicy.b.write_file": "auto",
    }
    approved = await client.post(f"/runs/{run_id}/requests/{review_id[1]}", data=edit)
    assert approved.status_code == 200, approved.text
    body = await _body_until(client, run_id, r"status status-succeeded")
    assert "B done" in body
    assert 'href="/runs/' + run_id + '/file?path=out.txt"' in body
    report = (await client.get(f"/api/v1/runs/{run_id}")).json()
    assert [s["tools"] for s in report["plan"]["steps"]] == [[], ["write_file"]]
    assert report["agents"]["b"]["prompt"] == "Write out.txt politely." and report["agents"]["b"]["edited"]
    assert report["agents"]["b"]["tool_policies"] == {"write_file": "auto"}
    service = RunService(Settings.load())
    try:  # the audit names what changed, not every prompt the form sent back
        approvals = [entry.action for entry in await service.audit(run_id) if entry.request is not None]
    finally:
        service.close()
    assert approvals == [
        "approved the plan with edits to the plan and the prompts of b and the tool policies"
    ]
    served = await client.get(f"/runs/{run_id}/file", params={"path": "out.txt"})
    assert (served.status_code, served.text) == (200, "hello from b")
    outside = await client.get(f"/runs/{run_id}/file", params={"path": "../../../etc/passwd"})
    assert outside.status_code == 404

    listed = (await client.get("/runs", params={"status": "succeeded"})).text
    assert f'href="/runs/{run_id}"' in listed
    assert "No runs match" in (await client.get("/runs", params={"q": "nothing like this"})).text


async def test_a_multi_line_task_from_the_form_is_stored_with_lf_line_ends(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """A browser sends a textarea's line breaks as CRLF; the task was stored with them."""
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "step:a", "output": "A done"},
            DRAFTS,
            CRITIC,
        ]
    )
    task = "Write a poem.\r\n\r\nKeep it short:\r\n- four lines"
    created = await client.post("/new", data={"task": task, "model": f"scripted:{script}", "yes": "on"})
    assert created.status_code == 303, created.text
    run_id = created.headers["location"].removeprefix("/runs/")
    stored = (await client.get(f"/api/v1/runs/{run_id}")).json()["task"]
    assert stored == "Write a poem.\n\nKeep it short:\n- four lines"
    await _body_until(client, run_id, r"status status-succeeded")


async def test_a_bad_task_is_shown_on_the_form_and_nothing_is_stored(client: httpx.AsyncClient) -> None:
    refused = await client.post("/new", data={"task": "   ", "model": "scripted:/nowhere.json"})
    assert refused.status_code == 422
    assert "invalid task: the task is empty" in refused.text
    typed = {"task": "t", "max_parallel": "99", "max_replans": "3", "team": "off", "check_outputs": "on"}
    bad = await client.post("/new", data=typed)
    # named as the form shows it (it said "max parallel", a name the form shows nowhere)
    assert bad.status_code == 422 and "Steps running at once must be a whole number from 1 to 64" in bad.text
    rounds = await client.post("/new", data={"task": "t", "prompt_rounds": "x"})
    assert "Critique-and-revise rounds per prompt must be a whole number from 0 to " in rounds.text
    # the form comes back as the person left it, its options open
    assert "<details open>" in bad.text and 'value="99"' in bad.text and 'value="3"' in bad.text
    assert '<option value="off" selected>' in bad.text and 'name="check_outputs" checked' in bad.text
    assert "Steps running at once (1-64)" in bad.text and "Replans of failed steps (0-10)" in bad.text
    # a relative workspace would be a folder wherever the server was started: refused, as the API does
    relative = await client.post("/new", data={"task": "t", "workspace": "relative/path"})
    assert relative.status_code == 422 and 'value="relative/path"' in relative.text
    assert (
        "the workspace folder must be an absolute path on the server, got &#39;relative/path&#39;"
        in relative.text
    )
    nul = await client.post("/api/v1/runs", json={"task": "a\u0000b"})
    assert (nul.status_code, nul.json()["problems"]) == (422, ["body.task: must not hold a NUL character"])
    assert (await client.get("/api/v1/runs")).json() == []


async def test_a_tool_approval_is_answered_inline(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {
                "purpose": "planner",
                "output": {"steps": [step("a", tools=["delete_file"]), step("b", "a", tools=[])]},
            },
            {"purpose": "step:a", "tool_calls": [{"name": "delete_file", "args": {"path": "gone.txt"}}]},
            {"purpose": "step:b", "output": "B done"},
            {
                "purpose": "step:a",
                "expect": ["the call to delete_file was not approved"],
                "output": "kept it",
            },
            DRAFTS,
            CRITIC,
        ]
    )
    run_id = (await client.post("/new", data={"task": "t", "model": f"scripted:{script}"})).headers[
        "location"
    ][6:]
    body = await _body_until(client, run_id, "Review the plan")
    # the README's words, as the terminal says them: not the raw `awaiting_approval` and `pending`
    assert '<span class="status status-awaiting_approval">awaiting approval</span>' in body
    # event times as the terminal shows them (local), the stored ISO time kept in the element
    (first, *_) = (await client.get(f"/api/v1/runs/{run_id}/events")).json()
    local = datetime.fromisoformat(first["at"].replace("Z", "+00:00")).astimezone().strftime("%H:%M:%S")
    assert f'<li><time datetime="{first["at"]}" title="{first["at"]}">{local}</time> run_created' in body
    review = re.search(r'hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', body)
    assert review is not None
    await client.post(f"/runs/{run_id}/requests/{review[1]}", data={"choice": "approve"})
    body = await _body_until(client, run_id, "wants to call")
    assert "<code>delete_file</code>" in body and "gone.txt" in body
    assert '<tr class="status-pending"><td>b</td><td>waiting</td>' in body
    approval = re.search(r'hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', body)
    assert approval is not None
    denied = await client.post(
        f"/runs/{run_id}/requests/{approval[1]}", data={"choice": "deny", "reason": "not allowed here"}
    )
    assert denied.status_code == 200
    body = await _body_until(client, run_id, r"status status-succeeded")
    assert "kept it" in body


async def test_an_answer_taken_is_said_taken_when_the_run_cannot_be_shown_after_it(
    client: httpx.AsyncClient,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The answer is stored before the run is read for the body: a failure then is no "not sent".

    It was a 5xx: the page said the answer was not sent, to send again, and the answer sent again
    was refused as answered ("yours was not taken").
    """
    ask = {"name": "ask_user", "args": {"question": "Which colour?"}}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("q", tools=["ask_user"])]}},
            {"purpose": "step:q", "tool_calls": [ask]},
            {
                "purpose": "step:q",
                "expect": ["teal"],
                "tool_calls": [ask | {"args": {"question": "Which shade?"}}],
            },
            {"purpose": "step:q", "expect": ["dark"], "output": "dark teal"},
            DRAFTS,
            CRITIC,
        ]
    )
    created = await client.post("/new", data={"task": "ask", "model": f"scripted:{script}", "yes": "on"})
    run_id = created.headers["location"].removeprefix("/runs/")
    lost = "the database at postgresql://db.example/runs cannot be reached (refused): cannot read a run"
    for question, text, failure, why in [
        ("Which colour?", "teal", DatabaseUnavailableError(lost), lost),
        (
            "Which shade?",
            "dark",
            RuntimeError("a bug"),
            "the server failed to read it; its log has the details",
        ),
    ]:
        body = await _body_until(client, run_id, question)
        asked = re.search(r'hx-post="(/runs/[^/]+/requests/[0-9a-f]+)"', body)
        assert asked is not None

        async def fails(*_: object, failure: Exception = failure) -> None:
            raise failure

        with monkeypatch.context() as broken:
            broken.setattr(RunService, "report", fails)  # read for the body, after the answer is stored
            answered = await client.post(
                asked[1], data={"choice": "text", "text": text}, headers={"hx-request": "true"}
            )
        note = (
            f"Your answer was taken, but the page could not show the run as it is now ({why}): it shows "
            "it at the run's next change, or when the page is loaded again."
        )
        got = (answered.status_code, json.loads(answered.headers["hx-trigger"]))
        assert got == (204, {"runActionTaken": note})
        # sent again (the page said nothing of the first): taken once, and said so
        again = await client.post(asked[1], data={"choice": "text", "text": text})
        assert (again.status_code, json.loads(again.headers["hx-trigger-after-swap"])) == (
            200,
            {"runActionTaken": await _taken_already(client, asked[1].rsplit("/", 1)[1])},
        )
        assert "yours was not taken" not in again.text
    await _body_until(client, run_id, r"status status-succeeded")
    events = (await client.get(f"/api/v1/runs/{run_id}/events")).json()
    assert [event["data"]["kind"] for event in events if event["kind"] == "request_answered"] == [
        "ask_user"
    ] * 2
    assert [record.exc_info[1] for record in caplog.records if record.exc_info] == [failure]


async def test_an_answer_whose_event_fails_or_sent_again_is_shown_taken_on_the_page(
    client: httpx.AsyncClient,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An answer stored is said taken: also when its event then fails, and when it is sent again.

    Before, the event's failure was the page's "not sent … send it again" (a 500), and the answer
    sent again was refused: "… is already answered …; yours was not taken" (409).
    """
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "step:a", "output": "A done"},
            DRAFTS,
            CRITIC,
        ]
    )
    run_id = (
        (await client.post("/new", data={"task": "t", "model": f"scripted:{script}"}))
        .headers["location"]
        .removeprefix("/runs/")
    )
    review = re.search(
        r'hx-post="(/runs/[^/]+/requests/[0-9a-f]+)"', await _body_until(client, run_id, "Review the plan")
    )
    assert review is not None
    append = RunStore.append_event

    def failing(store: RunStore, run_id: str, kind: Any, *args: Any, **kwargs: Any) -> Any:
        if kind == "request_answered":
            raise RuntimeError("a bug")
        return append(store, run_id, kind, *args, **kwargs)

    sent = {"choice": "approve", "title.a": "Do a well"}
    with monkeypatch.context() as broken:
        broken.setattr(RunStore, "append_event", failing)
        answered = await client.post(review[1], data=sent, headers={"hx-request": "true"})
    failed = "recording it in the run's events failed (an unexpected error; the log has the details)"
    assert (answered.status_code, json.loads(answered.headers["hx-trigger-after-swap"])) == (
        200,
        {"runActionTaken": f"Your answer was taken, but {failed}."},
    )
    assert 'id="run-problem"' not in answered.text and "Review the plan" not in answered.text
    assert [str(record.exc_info[1]) for record in caplog.records if record.exc_info] == ["a bug"]
    again = await client.post(review[1], data=sent, headers={"hx-request": "true"})
    assert (again.status_code, json.loads(again.headers["hx-trigger-after-swap"])) == (
        200,
        {"runActionTaken": await _taken_already(client, review[1].rsplit("/", 1)[1])},
    )
    # another answer is refused, as before
    other = await client.post(review[1], data={"choice": "deny", "reason": "no"})
    assert other.status_code == 409 and "yours was not taken" in html.unescape(other.text)
    await _body_until(client, run_id, r"status status-succeeded")
    report = (await client.get(f"/api/v1/runs/{run_id}")).json()
    assert report["plan"]["steps"][0]["title"] == "Do a well"


async def test_a_run_started_in_the_terminal_is_approved_on_its_page(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "step:a", "output": "A done"},
            DRAFTS,
            CRITIC,
        ]
    )
    process = start("run", "just a", "--model", f"scripted:{script}", "--json")
    try:
        for _ in range(600):
            runs = re.findall(r'href="/runs/([0-9a-f-]{20,})"', (await client.get("/runs")).text)
            if runs:
                break
            await asyncio.sleep(0.05)
        body = await _body_until(client, runs[0], "Review the plan")
        review = re.search(r'hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', body)
        assert review is not None
        approved = await client.post(f"/runs/{runs[0]}/requests/{review[1]}", data={"choice": "approve"})
        assert approved.status_code == 200, approved.text
        out, err = await asyncio.to_thread(process.communicate, timeout=90)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert json.loads(out)["output"] == "A done"


async def test_a_failed_run_s_page_shows_its_money_budget_as_a_plain_amount(
    client: httpx.AsyncClient, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The retry form said `(now 1e-05; …)` of a budget of a thousandth of a cent."""
    from masterplanner.models import pricing

    monkeypatch.setattr(pricing, "_FREE_SYSTEMS", frozenset())  # the script priced at $1 a million tokens
    monkeypatch.setattr(
        pricing, "_priced", lambda provider, name, usage: (usage.input_tokens + usage.output_tokens) / 1e6
    )
    script = write_script([{"purpose": "*", "repeat": True}])
    options = {"auto_approve": True, "max_cost_usd": 0.00001}
    body = {"task": "a", "model": f"scripted:{script}", "options": options}
    created = await client.post("/api/v1/runs", json=body)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    body = await _body_until(client, run_id, r'class="status status-failed"')
    assert "the run&#39;s money budget of $0.00001 cannot take its next model request" in body
    assert "US dollars for the whole run (now $0.00001; used $0.00)" in body


async def test_a_failed_run_is_retried_from_its_page(
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
    form = {"task": "a then b", "model": f"scripted:{script}", "yes": "on", "prompt_rounds": "0"}
    form |= {"max_replans": "0", "max_model_calls": "13"}
    run_id = (await client.post("/new", data=form)).headers["location"].removeprefix("/runs/")
    body = await _body_until(client, run_id, r'class="status status-failed"')
    assert "Retry from where it failed" in body
    # the events say what the terminal's say: a run's reason too (before, only tools and errors)
    gave_up = "the model called no_such_tool, a tool this step does not have, 3 times in a row"
    assert (
        f'step_failed <strong>b</strong><span class="tone-bad"> {gave_up}; the step gave up after 3 '
        f"attempts</span></li><li><time datetime="
    ) in body
    assert f"run_failed step b failed: {gave_up}; the step gave up after 3 attempts</li></ol>" in body
    assert "Model calls for the whole run (now 13; used 13)" in body
    assert "Critique-and-revise rounds per prompt from now (now 0)" in body
    assert "Tokens for the whole run (now 2000000; used " in body
    assert (await client.get(f"/runs/{run_id}/body?failed=1")).status_code == 204  # still failed
    # a file whose name is not UTF-8 is shown escaped, not linked (the page was a 500)
    workspace = (await client.get(f"/api/v1/runs/{run_id}")).json()["workspace"]
    odd = os.open(os.path.join(os.fsencode(workspace), b"odd\xffname.txt"), os.O_CREAT | os.O_WRONLY)
    os.write(odd, b"x")
    os.close(odd)
    page = await client.get(f"/runs/{run_id}/body")
    assert page.status_code == 200 and "odd\\xffname.txt (its name is not UTF-8) (1 bytes)" in page.text
    assert (await client.get(f"/runs/{run_id}/file", params={"path": "a\x00b"})).status_code == 404
    # the page's live stream starts after the events it was rendered with: a failed run's has no
    # change to send, none that would refetch the body and close a retry form the person opened
    page = (await client.get(f"/runs/{run_id}")).text
    connect = re.search(rf'sse-connect="/runs/{run_id}/changes\?after=(\d+)"', page)
    assert connect is not None
    last = (await client.get(f"/api/v1/runs/{run_id}/events")).json()[-1]["seq"]
    assert int(connect[1]) == last
    nothing_new = (await client.get(f"/runs/{run_id}/changes?after={last}")).text
    assert "event: change" not in nothing_new and "event: over" in nothing_new
    earlier = (await client.get(f"/runs/{run_id}/changes?after={last - 1}")).text
    assert earlier.count("event: change") == 1 and f"id: {last}" in earlier
    # a second tab's cancel of a run that ended meanwhile shows the run as it is now
    late = await client.post(f"/runs/{run_id}/cancel", headers={"HX-Request": "true"})
    assert late.status_code == 200 and 'class="status status-failed"' in late.text

    headers = {"HX-Request": "true"}
    spent = await client.post(f"/runs/{run_id}/retry", data={"max_tokens": "5000000"}, headers=headers)
    assert spent.status_code == 409
    assert f"run {run_id} cannot go on: the run used its budget of 13 model calls; retry it" in spent.text
    assert 'value="5000000"' in spent.text and "<details open>" in spent.text  # what was typed is kept
    for field, typed, message in [
        ("max_model_calls", "²", "model calls must be a whole number from 1 to 1000000, not '²'"),
        (
            "max_cost_usd",
            "nan",
            "the money budget (US dollars) must be a number more than 0 and at most 1e+06",
        ),
        ("max_wall_s", "0", "seconds must be a number more than 0 and at most 604800, not '0'"),
        ("prompt_rounds", "6", "critique rounds per prompt must be a whole number from 0 to 5, not '6'"),
        ("prompt_rounds", "-1", "critique rounds per prompt must be a whole number from 0 to 5, not '-1'"),
    ]:
        bad = await client.post(f"/runs/{run_id}/retry", data={field: typed}, headers=headers)
        assert bad.status_code == 422
        assert message in html.unescape(bad.text)
        assert f'id="retry_{field}" name="{field}" inputmode="decimal" value="{typed}"' in bad.text
    assert (await client.get(f"/api/v1/runs/{run_id}")).json()["status"] == "failed"

    script.write_text(json.dumps({"calls": [{"purpose": "step:b", "output": "B at last"}]}))
    retried = await client.post(
        f"/runs/{run_id}/retry", data={"max_model_calls": "20", "prompt_rounds": "0"}, headers=headers
    )
    assert (retried.status_code, retried.headers["HX-Redirect"]) == (204, f"/runs/{run_id}")
    events = (await client.get(f"/api/v1/runs/{run_id}/events")).json()
    (retry,) = [event["data"] for event in events if event["kind"] == "run_retried"]
    assert (retry["budgets"], retry["prompt_rounds"]) == ({"max_model_calls": 20}, 0)
    # a page of the run still showing it failed loads again, live
    assert (await client.get(f"/runs/{run_id}/body?failed=1")).headers["HX-Refresh"] == "true"
    body = await _body_until(client, run_id, r'class="status status-succeeded"')
    assert "B at last" in body and "Retry from where it failed" not in body
    assert " · retried 1 time</p>" in body
    # a retry from a page that had not seen the run retried: that page loads again, as it is now
    late = await client.post(f"/runs/{run_id}/retry", data={}, headers=headers)
    assert (late.status_code, late.headers["HX-Redirect"]) == (204, f"/runs/{run_id}")


async def test_a_stopped_run_is_resumed_from_its_page_or_the_api(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "step:a", "output": "A done"},
            DRAFTS,
            {"purpose": "*", "repeat": True},
        ]
    )
    # made by another process that stopped before executing it: nobody executes it now
    elsewhere = RunService(Settings.load())
    try:
        made = await elsewhere.create(
            "do a", model=f"scripted:{script}", options=RunOptions(auto_approve=True)
        )
    finally:
        elsewhere.close()
    listed = (await client.get("/api/v1/runs")).json()
    assert [(run["id"], run["idle"]) for run in listed] == [(made.id, "stopped")]
    # the keys the README gives (`runs list --json` names the id `run_id`): a public contract
    keys = "id task status model workspace created_at updated_at output error retries idle"
    assert sorted(listed[0]) == sorted(keys.split())
    body = (await client.get(f"/runs/{made.id}/body")).text
    assert f'hx-post="/runs/{made.id}/resume"' in body and "Resume run" in body
    # what to do, said with the page's own button (it named the terminal's command); the API's endpoint
    stopped = "no process is executing it (the one that did stopped): continue it with"
    assert f'<p class="waiting" role="status">{stopped} its Resume run button</p>' in body
    waiting = (await client.get(f"/api/v1/runs/{made.id}")).json()["waiting"]
    assert waiting == f"{stopped} POST /api/v1/runs/{made.id}/resume"
    # a rating sent from a page that was stale: refused, and the page says why
    early = await client.post(
        f"/runs/{made.id}/feedback", data={"rating": "3"}, headers={"HX-Request": "true"}
    )
    assert early.status_code == 422
    assert f'role="alert">run {made.id} is planning: a run is rated once it has ended</p>' in early.text

    resumed = await client.post(f"/runs/{made.id}/resume", headers={"HX-Request": "true"})
    assert (resumed.status_code, resumed.headers["HX-Redirect"]) == (204, f"/runs/{made.id}")
    body = await _body_until(client, made.id, r'class="status status-succeeded"')
    assert "Resume run" not in body and "A done" in body
    again = await client.post(f"/api/v1/runs/{made.id}/resume")
    assert (again.status_code, again.json()["error"]) == (
        409,
        f"run {made.id} has ended (succeeded): there is nothing to resume",
    )


async def test_a_page_that_cannot_be_shown_is_a_page_that_says_why(client: httpx.AsyncClient) -> None:
    # a stale link or a mistyped address showed a browser a bare JSON document
    browser = {"accept": "text/html,application/xhtml+xml"}
    shown = []
    for path in ("/runs/nope", "/runs?status=bogus", "/nowhere"):
        answer = await client.get(path, headers=browser)
        body = answer.text
        heading = body[body.index("<h1>") + 4 : body.index("</h1>")]
        alert = body[body.index('role="alert">') + 13 : body.index("</p>", body.index('role="alert">'))]
        shown.append((answer.status_code, answer.headers["content-type"].split(";")[0], heading, alert))
    statuses = "planning, awaiting_approval, running, succeeded, failed, cancelled"
    assert shown == [
        (404, "text/html", "Not found", "no run &#39;nope&#39;"),
        (400, "text/html", "That cannot be shown", f"status must be one of {statuses}, got &#39;bogus&#39;"),
        (404, "text/html", "Not found", "no such page or resource"),
    ]
    # the API, a program, and the page's own HTMX requests keep the JSON
    for path, headers in (
        ("/api/v1/runs/nope", browser),
        ("/runs/nope", {}),
        ("/runs/nope", {"hx-request": "true"} | browser),
    ):
        answer = await client.get(path, headers=headers)
        assert (answer.status_code, answer.json()) == (404, {"error": "no run 'nope'"})


class _FormAsSent(HTMLParser):
    """The fields a browser sends for the form `form_id` as it is shown, untouched.

    Text inputs and hidden ones their value; ticked checkboxes theirs (`on` without one); a select
    its selected option (else its first); a textarea its text without the line break right after
    its start tag, with line breaks sent as CRLF. Buttons are left to the caller.
    """

    def __init__(self, form_id: str) -> None:
        super().__init__(convert_charrefs=True)
        self.form_id = form_id
        self.inside = False
        self.fields: list[tuple[str, str]] = []
        self._textarea: str | None = None
        self._text = ""
        self._select: str | None = None
        self._options: list[tuple[str, bool]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = {key: value or "" for key, value in attrs}
        if tag == "form":
            self.inside = found.get("id") == self.form_id
        if not self.inside:
            return
        if tag == "input" and "name" in found:
            kind = found.get("type", "text")
            if kind == "checkbox":
                if "checked" in found:
                    self.fields.append((found["name"], found.get("value") or "on"))
            elif kind not in ("submit", "button"):
                self.fields.append((found["name"], found.get("value", "")))
        elif tag == "textarea":
            self._textarea, self._text = found["name"], ""
        elif tag == "select":
            self._select, self._options = found["name"], []
        elif tag == "option" and self._select is not None:
            self._options.append((found.get("value", ""), "selected" in found))

    def handle_data(self, data: str) -> None:
        if self._textarea is not None:
            self._text += data

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self.inside = False
        elif tag == "textarea" and self._textarea is not None:
            text = self._text[1:] if self._text.startswith("\n") else self._text
            self.fields.append((self._textarea, text.replace("\n", "\r\n")))
            self._textarea = None
        elif tag == "select" and self._select is not None:
            chosen = [value for value, selected in self._options if selected] or [self._options[0][0]]
            self.fields.append((self._select, chosen[0]))
            self._select = None


def _form_as_sent(body: str, form_id: str) -> dict[str, Any]:
    parser = _FormAsSent(form_id)
    parser.feed(body)
    fields: dict[str, Any] = {}
    for name, value in parser.fields:
        fields.setdefault(name, []).append(value)
    return {name: values[0] if len(values) == 1 else values for name, values in fields.items()}


async def test_the_review_form_approved_as_shown_is_no_edit(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """The form sends the whole plan back; sent as shown, nothing is recorded or marked as edited."""
    long = (
        "Read every line of the quarterly report, note each figure that changed since the last quarter "
        "together with its page number, and say in one sentence why each change matters to the reader."
    )
    script = write_script(
        [
            {
                "purpose": "planner",
                "output": {
                    "steps": [
                        step("a", tools=["read_file"]) | {"instruction": long, "expected_output": long},
                        step("b", "a", tools=[]),
                    ]
                },
            },
            {
                "purpose": "prompt_creator",
                "output": "You are a worker.\n\n  Do the step:\n" + long,
                "repeat": True,
            },
            {"purpose": "*", "repeat": True},
        ]
    )
    options = {"prompt_rounds": 0, "tool_policies": {"read_file": "ask"}}
    body = {"task": "two things, the first at length", "model": f"scripted:{script}", "options": options}
    created = await client.post("/api/v1/runs", json=body)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    page = await _body_until(client, run_id, "Review the plan")
    review_id = re.search(r'hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', page)
    assert review_id is not None
    form = _form_as_sent(page, "review-form")
    assert form["instruction.a"] == long and form["policy.read_file"] == "ask"
    assert form["prompt.a"] == ("You are a worker.\n\n  Do the step:\n" + long).replace("\n", "\r\n")
    approved = await client.post(f"/runs/{run_id}/requests/{review_id[1]}", data=form | {"choice": "approve"})
    assert approved.status_code == 200, approved.text
    await _body_until(client, run_id, r"status status-succeeded")
    report = (await client.get(f"/api/v1/runs/{run_id}")).json()
    assert not any(agent.get("edited") for agent in report["agents"].values())
    kinds = [event["kind"] for event in (await client.get(f"/api/v1/runs/{run_id}/events")).json()]
    assert to_approval(kinds) == (APPROVED_AS_SHOWN, False)


async def test_texts_beginning_with_a_line_break_come_back_from_the_forms_as_they_were(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """HTML drops the line break right after a `<textarea>` start tag: the pages write one there.

    Before, an instruction or an agent's prompt beginning with a line break came back from the
    form without it: the review approved as shown was recorded as a plan edit, and the agent's
    page saved as shown stored a new version of the agent, its prompt marked a person's.
    """
    instruction = "\nRead the report and note each figure."
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[]) | {"instruction": instruction}]}},
            {"purpose": "step:a", "output": "A done"},
            DRAFTS,
            {"purpose": "*", "repeat": True},
        ]
    )
    body = {"task": "note the figures", "model": f"scripted:{script}", "options": {"prompt_rounds": 0}}
    created = await client.post("/api/v1/runs", json=body)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    page = await _body_until(client, run_id, "Review the plan")
    review_id = re.search(r'id="review-form" hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', page)
    assert review_id is not None, page
    form = _form_as_sent(page, "review-form")
    assert form["instruction.a"] == instruction.replace("\n", "\r\n")
    approved = await client.post(f"/runs/{run_id}/requests/{review_id[1]}", data=form | {"choice": "approve"})
    assert approved.status_code == 200, approved.text
    await _body_until(client, run_id, r"status status-succeeded")
    report = (await client.get(f"/api/v1/runs/{run_id}")).json()
    assert report["plan"]["steps"][0]["instruction"] == instruction
    kinds = [event["kind"] for event in (await client.get(f"/api/v1/runs/{run_id}/events")).json()]
    assert to_approval(kinds) == (APPROVED_AS_SHOWN, False)

    for _ in range(600):  # the run's team, and its agent, are stored as it ends
        teams = (await client.get("/api/v1/teams")).json()
        if teams:
            break
        await asyncio.sleep(0.05)
    agent_id = teams[0]["agents"]["a"]
    stored = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    prompt, description = "\nYou are a worker.\nDo the step.", "\nReads reports."
    edit = stored | {"system_prompt": prompt, "description": description, "prompt_by_person": False}
    edited = await client.put(f"/api/v1/agents/{agent_id}", json=edit)
    assert edited.status_code == 200, edited.text
    assert (edited.json()["version"], edited.json()["system_prompt"]) == (2, prompt)
    shown = _form_as_sent((await client.get(f"/agents/{agent_id}")).text, "agent-form")
    assert shown["system_prompt"] == prompt.replace("\n", "\r\n")
    saved = await client.post(f"/agents/{agent_id}", data=shown | {"action": "save"})
    assert saved.status_code == 200, saved.text
    after = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    assert (after["version"], after["system_prompt"], after["description"]) == (2, prompt, description)


@pytest.mark.parametrize("front_end", ["form", "api"])
async def test_a_policy_for_a_tool_missing_here_is_kept_by_reviews_and_replans_approved_as_shown(
    client: httpx.AsyncClient, write_script: Callable[..., Path], front_end: str
) -> None:
    """`web_search: deny` with no search backend: the form cannot show it, so it never sends it back.

    The first review approved as shown dropped it and was recorded as an edit of the tool
    policies; a replan approved as shown was refused as changing the run's policies, again and
    again, and the run was stuck.
    """
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[]), step("c", "a", tools=[])]}},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:c", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True},
            {"purpose": "replanner", "output": {"steps": [step("c1", "a", tools=[])]}, "repeat": True},
            {"purpose": "step:c1", "output": "C1"},
            DRAFTS,
            {"purpose": "*", "repeat": True},
        ]
    )
    options = {"prompt_rounds": 0, "max_replans": 1, "tool_policies": {"web_search": "deny"}}
    body = {"task": "a then c", "model": f"scripted:{script}", "options": options}
    created = await client.post("/api/v1/runs", json=body)
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    for heading in ("Review the plan", "Replan: step c failed"):
        page = await _body_until(client, run_id, heading)
        request = re.search(r'id="review-form" hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', page)
        assert request is not None, page
        if front_end == "api":
            approved = await client.post(f"/api/v1/requests/{request[1]}/answer", json={"approve": True})
            assert approved.status_code == 200, approved.text
            continue
        form = _form_as_sent(page, "review-form")
        assert "policy.web_search" not in form  # not a tool of this run: the form has no field for it
        sent = form | {"choice": "approve"}
        approved = await client.post(f"/runs/{run_id}/requests/{request[1]}", data=sent)
        assert approved.status_code == 200, approved.text
        assert 'class="error"' not in approved.text, approved.text
    await _body_until(client, run_id, r"status status-succeeded")
    service = RunService(Settings.load())
    try:
        policies = (await service.get(run_id)).options.tool_policies
        approvals = [entry.action for entry in await service.audit(run_id) if entry.request is not None]
    finally:
        service.close()
    assert policies == {"web_search": "deny"}
    assert approvals == ["approved the plan", "approved the replan of step c"]
    report = (await client.get(f"/api/v1/runs/{run_id}")).json()
    assert [(s["id"], s["status"]) for s in report["steps"]] == [
        ("a", "succeeded"),
        ("c", "replaced"),
        ("c1", "succeeded"),
    ]
    events = (await client.get(f"/api/v1/runs/{run_id}/events")).json()
    kinds = [event["kind"] for event in events]
    assert to_approval(kinds) == (APPROVED_AS_SHOWN, False)
    assert kinds.count("request_opened") == 1  # the replan's, answered once


async def test_a_folder_swapped_for_a_link_out_after_its_path_was_checked_serves_nothing(
    client: httpx.AsyncClient,
    write_script: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step's code swaps a folder for a link out between the path's check and its opening."""
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    (workspace / "d").mkdir(parents=True)
    outside.mkdir()
    (workspace / "d" / "key.txt").write_text("inside")
    (outside / "key.txt").write_text("outside secret")
    created = await client.post(
        "/api/v1/runs",
        json={"task": "t", "model": f"scripted:{_script(write_script)}", "workspace": str(workspace)},
    )
    run_id = created.json()["id"]
    resolve = os.path.realpath

    def swapped_once_resolved(path: Any, **kwargs: Any) -> Any:
        resolved = resolve(path, **kwargs)
        folder = workspace / "d"
        if str(path).endswith("key.txt") and not folder.is_symlink():
            (folder / "key.txt").unlink()
            folder.rmdir()
            folder.symlink_to(outside)
        return resolved

    with monkeypatch.context() as patched:  # undone here (not the fixtures' patches too)
        patched.setattr(os.path, "realpath", swapped_once_resolved)
        served = await client.get(f"/runs/{run_id}/file", params={"path": "d/key.txt"})
        assert served.status_code == 404 and "outside secret" not in served.text
    # a file that stays put is served, from a folder too
    (workspace / "e").mkdir()
    (workspace / "e" / "kept.txt").write_text("kept")
    served = await client.get(f"/runs/{run_id}/file", params={"path": "e/kept.txt"})
    assert (served.status_code, served.text) == (200, "kept")
    assert served.headers["content-disposition"] == 'inline; filename="kept.txt"'


async def _a_haiku_run_then_its_review_page(
    client: httpx.AsyncClient, write_script: Callable[..., Path], second_task: str
) -> tuple[str, str]:
    """A small model's run of a haiku task, stored; then `second_task`'s review page: the first
    run's id and the page's body."""
    calls = [
        {"purpose": "planner", "output": {"steps": [{"title": "Write the haiku", "agent_role": "poet"}]}},
        {"purpose": "prompt_creator", "output": "You are a poet.", "repeat": True},
        {"purpose": "*", "repeat": True},
    ]
    model = f"scripted:{write_script(None, raw=json.dumps({'small_model': True, 'calls': calls}))}"
    form = {
        "task": "Write a haiku about the sea to haiku.txt",
        "model": model,
        "prompt_rounds": "0",
        "yes": "on",
    }
    first = (await client.post("/new", data=form)).headers["location"].removeprefix("/runs/")
    await _body_until(client, first, r"status status-succeeded")
    form = {"task": second_task, "model": model, "prompt_rounds": "0"}
    run_id = (await client.post("/new", data=form)).headers["location"].removeprefix("/runs/")
    return first, await _body_until(client, run_id, "Review the plan")


async def test_the_review_page_says_why_a_small_model_did_not_reuse_the_stored_team(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """The terminal's review said so; the page's said nothing, and the stored team seemed ignored."""
    first, body = await _a_haiku_run_then_its_review_page(
        client, write_script, "Write a haiku about autumn leaves to leaves.txt"
    )
    assert (
        f'<p class="caution" role="note">Stored team not reused: cohort {first} could not be adapted: '
        "a small model reuses a stored team only for the same task, or one that differs only in file "
        "names, numbers, URLs or quoted text: it plans a reworded task afresh rather than rewrite "
        "another task&#39;s plan; planned afresh.</p>"
    ) in body


async def test_the_review_page_says_which_stored_team_it_reuses(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """Only the events said a team was reused; the estimate explained tokens and time it did not show."""
    first, body = await _a_haiku_run_then_its_review_page(
        client, write_script, "Write a haiku about the sea to poem.txt"
    )
    assert (
        f'<p class="reused" role="note">Reusing the team of run {first} (similarity 1.0, adapted: '
        "parameters).</p>"
    ) in body
    assert (
        "Estimate for the steps: about 2 model calls, cost $0.00 <small>(one request a step, two with "
        "tools; tokens and time are estimated once this run has made a model call)</small>"
    ) in body


async def test_a_page_rendered_as_the_run_changes_has_its_stream_start_before_what_it_does_not_show(
    client: httpx.AsyncClient, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page read the run's record, then its events: an event in between (here a cancel asked,
    the run's end say) was counted as shown, and its live stream started after it: the page showed
    the run as it was before the event for good."""
    form = {"task": "write out.txt", "model": f"scripted:{_script(write_script)}"}
    run_id = (await client.post("/new", data=form)).headers["location"].removeprefix("/runs/")
    await _body_until(client, run_id, "Review the plan")
    report = RunService.report

    async def cancelled_meanwhile(self: RunService, run: str) -> dict[str, Any]:
        monkeypatch.setattr(RunService, "report", report)  # once
        await self.cancel(run)
        return await report(self, run)

    monkeypatch.setattr(RunService, "report", cancelled_meanwhile)
    page = (await client.get(f"/runs/{run_id}")).text
    events = (await client.get(f"/api/v1/runs/{run_id}/events")).json()
    asked = next(event["seq"] for event in events if event["kind"] == "cancel_requested")
    after = re.search(rf'sse-connect="/runs/{run_id}/changes\?after=(\d+)"', page)
    assert after is not None and int(after[1]) < asked  # the stream sends it, and the page follows


async def test_a_run_s_page_offers_a_rating_only_where_the_service_takes_one(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """The page offered "Rate this run" to every finished run with a plan; the service refused most."""
    form_field = 'name="rating"'
    # failed at its step (not replanned), the registry empty: none of its agents is stored
    broken = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("z", tools=[])]}},
            DRAFTS,
            {"purpose": "critic", "repeat": True},
            {"purpose": "step:z", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True},
        ]
    )
    form = {"task": "count the zebras", "model": f"scripted:{broken}", "yes": "on", "max_replans": "0"}
    created = await client.post("/new", data=form)
    failed = created.headers["location"].removeprefix("/runs/")
    body = await _body_until(client, failed, r'class="status status-failed"')
    assert form_field not in body and "Rate this run" not in body
    assert (
        f'<p class="note">This run cannot be rated: run {failed} has no agents in the registry to rate: '
    ) in body
    # the service still refuses what the page does not offer
    refused = await client.post(
        f"/runs/{failed}/feedback", data={"rating": "3"}, headers={"HX-Request": "true"}
    )
    assert refused.status_code == 422
    assert f'role="alert">run {failed} has no agents in the registry to rate: ' in refused.text

    one_step = {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}}
    fine = write_script(
        [one_step, {"purpose": "step:a", "output": "A done"}, DRAFTS, {"purpose": "*", "repeat": True}]
    )
    created = await client.post("/new", data={"task": "do a", "model": f"scripted:{fine}", "yes": "on"})
    good = created.headers["location"].removeprefix("/runs/")
    body = await _body_until(client, good, r'class="status status-succeeded"')
    assert "Rate this run" in body and form_field in body
    rated = await client.post(f"/runs/{good}/feedback", data={"rating": "4"}, headers={"HX-Request": "true"})
    assert rated.status_code == 200, rated.text
    assert "Rated 4/5: 1 agents and the team" in rated.text and form_field not in rated.text
    # rated: who and when instead of the form, in the service's words
    events = (await client.get(f"/api/v1/runs/{good}/events")).json()
    (rating,) = [event for event in events if event["kind"] == "run_rated"]
    by = rating["data"]["by"]
    body = (await client.get(f"/runs/{good}/body")).text
    assert form_field not in body and "Rate this run" not in body
    assert re.search(
        rf'<p class="note">This run cannot be rated: run {good} was rated 4 already \(by {re.escape(by)} at '
        r"[^)]+\): a run is rated once</p>",
        body,
    )

    # rejected at review: nothing ran
    created = await client.post("/new", data={"task": "do a", "model": f"scripted:{fine}"})
    rejected = created.headers["location"].removeprefix("/runs/")
    body = await _body_until(client, rejected, "Review the plan")
    review_id = re.search(r'hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', body)
    assert review_id is not None
    await client.post(f"/runs/{rejected}/requests/{review_id[1]}", data={"choice": "reject"})
    body = await _body_until(client, rejected, r'class="status status-cancelled"')
    assert form_field not in body and "Rate this run" not in body
    assert (
        f'<p class="note">This run cannot be rated: run {rejected} was cancelled before any step ran: '
        "there is nothing to rate</p>"
    ) in body


async def test_a_succeeded_run_s_team_nothing_stored_is_remembered_from_its_page(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that succeeded whose team is not stored, and not asked about, has a "Remember this
    team" button; pressed, the team is stored (as `runs remember` stores it) and the page says so.

    Before, the page had no way: a team the person first declined to store, or one
    `remember_runs = never` left, needed `runs remember` in a terminal.
    """
    monkeypatch.setenv("MASTERPLANNER_REMEMBER_RUNS", "ask")
    one_step = {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}, "repeat": True}
    script = write_script(
        [
            one_step,
            {"purpose": "step:a", "output": "A done", "repeat": True},
            DRAFTS,
            {"purpose": "*", "repeat": True},
        ]
    )
    headers = {"HX-Request": "true"}
    async with web_client() as client:
        # reviewed: it asks whether to store its team; its question is answered, no button besides
        form = {"task": "do a", "model": f"scripted:{script}", "prompt_rounds": "0"}
        run_id = (await client.post("/new", data=form)).headers["location"].removeprefix("/runs/")
        body = await _body_until(client, run_id, "Review the plan")
        review = re.search(r'hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', body)
        assert review is not None
        await client.post(f"/runs/{run_id}/requests/{review[1]}", data={"choice": "approve"})
        body = await _body_until(client, run_id, r'class="status status-succeeded"')
        assert "Remember this team" not in body  # at any moment of its end
        assert "event: over" in (await client.get(f"/runs/{run_id}/changes")).text  # ends when it is over
        body = (await client.get(f"/runs/{run_id}/body")).text
        [question] = (await client.get(f"/api/v1/requests?run_id={run_id}")).json()
        assert question["kind"] == "remember" and f'id="request-{question["id"]}"' in body
        assert "Remember this team" not in body and f'hx-post="/runs/{run_id}/remember"' not in body
        # a press from a page that showed it (a second tab): the service's refusal, on the page
        early = await client.post(f"/runs/{run_id}/remember", headers=headers)
        assert early.status_code == 409
        assert (
            f'<p class="error" role="alert">run {run_id} asks whether to store its team: answer its '
            f"request {question['id']} (on the run's page)</p>"
        ) in html.unescape(early.text)

        # declined: the team is not stored, and the page offers to store it after all
        declined = await client.post(f"/runs/{run_id}/requests/{question['id']}", data={"choice": "deny"})
        assert declined.status_code == 200, declined.text
        assert f'<form hx-post="/runs/{run_id}/remember" hx-target="#run-body"' in declined.text
        assert '<button type="submit">Remember this team</button>' in declined.text
        assert (await client.get(f"/api/v1/teams/{run_id}")).status_code == 404

        remembered = await client.post(f"/runs/{run_id}/remember", headers=headers)
        assert remembered.status_code == 200, remembered.text
        assert (
            f'<p class="done" role="status">This run\'s team is stored: <a href="/teams/{run_id}">team '
            f"{run_id}</a>; later tasks like this one can reuse it.</p>"
        ) in html.unescape(remembered.text)
        assert "Remember this team" not in remembered.text
        team = (await client.get(f"/api/v1/teams/{run_id}")).json()
        assert (team["run_id"], team["agents"]) == (run_id, {"a": f"{run_id}.a"})
        events = (await client.get(f"/api/v1/runs/{run_id}/events")).json()
        (told,) = [event["data"] for event in events if event["kind"] == "team_stored"]
        assert told["by"].startswith("web@")
        body = (await client.get(f"/runs/{run_id}/body")).text
        assert "Remember this team" not in body

        # pressed again from a page that still showed the button: refused, nothing stored twice
        again = await client.post(f"/runs/{run_id}/remember", headers=headers)
        assert again.status_code == 409
        assert (
            f'<p class="error" role="alert">run {run_id}: its team is stored already (see it under Teams)</p>'
        ) in again.text
        assert "Remember this team" not in again.text
        assert [team["id"] for team in (await client.get("/api/v1/teams")).json()] == [run_id]

        # approved with --yes: its team is stored when it ends, and nothing is offered
        form = {"task": "do a", "model": f"scripted:{script}", "yes": "on", "prompt_rounds": "0"}
        stored_at_end = (await client.post("/new", data=form)).headers["location"].removeprefix("/runs/")
        body = await _body_until(client, stored_at_end, r'class="status status-succeeded"')
        # at any moment of its end (before, the page offered it while the team was being stored)
        assert "Remember this team" not in body and "/remember" not in body
        assert "event: over" in (await client.get(f"/runs/{stored_at_end}/changes")).text
        body = (await client.get(f"/runs/{stored_at_end}/body")).text
        assert "Remember this team" not in body and "/remember" not in body
        events = (await client.get(f"/api/v1/runs/{stored_at_end}/events")).json()
        assert [event["kind"] for event in events].count("team_stored") == 1
        missing = await client.post("/runs/nosuchrun/remember", headers=headers)
        assert (missing.status_code, missing.json()) == (404, {"error": "no run 'nosuchrun'"})


# The run page's forms answer the database's failure as the API answers it (`app._our_error`: 500 in
# its words, 503 when it cannot be reached), and the page says "not sent … send it again"; before,
# each showed it in the run's body as a refusal (409 or 422), as if the run or what was typed were
# wrong, and sending it again were no use.

HX = {"HX-Request": "true"}


def _failed(words: str) -> dict[str, str]:
    """The JSON error of a database failing a call (SQLite's `words`), as `database.transaction` says it."""
    url = shown_url(Settings.load().database_url)
    return {"error": f"database {url}: {words}"}


def _said(response: httpx.Response) -> tuple[int, Any]:
    """The status and what was said: the JSON of an error, else the page's text (a run's body)."""
    json_sent = response.headers.get("content-type", "").startswith("application/json")
    return response.status_code, response.json() if json_sent else response.text


async def _over(client: httpx.AsyncClient, run_id: str, status: str) -> None:
    """Wait for the run to be over (its process let go of it) with `status`."""
    assert "event: over" in (await client.get(f"/runs/{run_id}/changes")).text
    assert (await client.get(f"/api/v1/runs/{run_id}")).json()["status"] == status


async def test_an_answer_the_database_fails_to_store_is_the_server_s_failure_as_from_the_api(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """A full disk as the answer to a request is stored is the page's 500, as the API's: the answer
    was not taken, and the same answer sent once that is fixed is. Before, the page said 422 (an
    answer that does not fit) inside the run's body."""
    one_step = {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}}
    script = write_script([one_step, DRAFTS, {"purpose": "*", "repeat": True}])
    form = {"task": "do a", "model": f"scripted:{script}", "prompt_rounds": "0"}
    run_id = (await client.post("/new", data=form)).headers["location"].removeprefix("/runs/")
    body = await _body_until(client, run_id, "Review the plan")
    review = re.search(r'hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', body)
    assert review is not None
    rejected = {"choice": "reject", "reason": "not this"}
    with sqlite_failing("UPDATE mp_requests") as failed:
        page = await client.post(f"/runs/{run_id}/requests/{review[1]}", data=rejected, headers=HX)
        api = await client.post(
            f"/api/v1/requests/{review[1]}/answer", json={"approve": False, "reason": "not this"}
        )
    full = _failed("cannot answer a request: database or disk is full")
    assert len(failed) == 2
    assert _said(page) == (500, full)
    assert _said(api) == (500, full)
    assert (await client.get(f"/api/v1/requests/{review[1]}")).json()["state"] == "open"
    taken = await client.post(f"/runs/{run_id}/requests/{review[1]}", data=rejected, headers=HX)
    assert taken.status_code == 200, taken.text
    await _over(client, run_id, "cancelled")


async def test_a_rating_the_database_or_a_setting_fails_is_the_server_s_answer_as_from_the_api(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """A full disk as the rating is stored is the page's 500, and the run's model that cannot be
    made for a low rating's analysis (its script gone) its 400, as the API's; a comment the
    rating cannot take is still the page's 422, shown with the form. Before, all were 422. So is
    SQLite locked as whether the run was rated is read (it was said as a refusal: 409, 422)."""
    one_step = {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}}
    script = write_script(
        [one_step, {"purpose": "step:a", "output": "A done"}, DRAFTS, {"purpose": "*", "repeat": True}]
    )
    created = await client.post("/new", data={"task": "do a", "model": f"scripted:{script}", "yes": "on"})
    run_id = created.headers["location"].removeprefix("/runs/")
    await _over(client, run_id, "succeeded")
    with sqlite_failing("INSERT INTO mp_run_ratings") as failed:
        page = await client.post(f"/runs/{run_id}/feedback", data={"rating": "4"}, headers=HX)
        api = await client.post(f"/api/v1/runs/{run_id}/feedback", json={"rating": 4})
    full = _failed("cannot rate a run: database or disk is full")
    assert len(failed) == 2
    assert _said(page) == (500, full)
    assert _said(api) == (500, full)
    # failing as whether the run was rated is read: not a refusal (nor "it cannot be rated")
    with sqlite_failing("FROM mp_run_ratings WHERE run_id", "database is locked") as failed:
        page = await client.post(f"/runs/{run_id}/feedback", data={"rating": "4"}, headers=HX)
        api = await client.post(f"/api/v1/runs/{run_id}/feedback", json={"rating": 4})
        body = await client.get(f"/runs/{run_id}/body")
    locked = _failed("cannot read a run's rating: database is locked")
    assert failed and _said(page) == (500, locked)
    assert _said(api) == (500, locked)
    assert body.status_code == 500

    script.unlink()  # a low rating's analysis needs the run's model
    page = await client.post(f"/runs/{run_id}/feedback", data={"rating": "1"}, headers=HX)
    api = await client.post(f"/api/v1/runs/{run_id}/feedback", json={"rating": 1})
    gone = {"error": f"scripted model file {script} does not exist"}
    assert _said(page) == (400, gone)
    assert _said(api) == (400, gone)

    nul = await client.post(f"/runs/{run_id}/feedback", data={"rating": "4", "comment": "a\x00b"}, headers=HX)
    assert nul.status_code == 422
    assert (
        '<p class="error" role="alert">the comment must not hold a NUL character; the run is not rated</p>'
    ) in nul.text
    assert 'name="rating"' in nul.text  # the form again, its comment kept (`hx-preserve`)
    rated = await client.post(f"/runs/{run_id}/feedback", data={"rating": "4"}, headers=HX)
    assert rated.status_code == 200 and "Rated 4/5: 1 agents and the team" in rated.text


async def test_a_server_that_executes_no_runs_says_a_stopped_run_is_resumed_from_a_terminal(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    """`serve --workers` resumes nothing: its page names the command, not its Resume button."""
    made = await stopped_run(write_script)
    service = RunService(Settings.load())
    app = create_app(service, for_workers=True)
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8765") as client:
            body = (await client.get(f"/runs/{made.id}/body")).text
            refused = await client.post(f"/runs/{made.id}/resume", headers=HX)
            waiting = (await client.get(f"/api/v1/runs/{made.id}")).json()["waiting"]
    finally:
        await app.state.executions.stop()
        app.state.registry.close()
        service.close()
    command = f"`masterplanner runs resume {made.id}`"
    assert (
        f'<p class="waiting" role="status">no process is executing it (the one that did stopped): '
        f"continue it with {command}</p>"
    ) in body
    assert "Resume run" not in body  # it would be refused; a page shown before it was: refused
    assert waiting == f"no process is executing it (the one that did stopped): continue it with {command}"
    assert refused.status_code == 409
    assert (
        f'<p class="error" role="alert">this server executes no runs (it was started with --workers): '
        f"resume run {made.id} with {command}</p>"
    ) in html.unescape(refused.text)


async def test_a_resume_the_database_fails_to_read_is_the_server_s_failure_as_from_the_api(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """SQLite locked by another process past the wait as the run's hold is read is the page's 500,
    as the API's: resumed once the lock is gone. Before, the page said 409 (nothing to resume)."""
    made = await stopped_run(write_script)
    locked = _failed("cannot read leases: database is locked")
    for path in (f"/runs/{made.id}/resume", f"/api/v1/runs/{made.id}/resume"):
        with sqlite_failing("mp_runs.id IN (", "database is locked", times=1) as failed:
            answered = await client.post(path, headers=HX)
        assert len(failed) == 1
        assert _said(answered) == (500, locked)
    resumed = await client.post(f"/runs/{made.id}/resume", headers=HX)
    assert (resumed.status_code, resumed.headers["HX-Redirect"]) == (204, f"/runs/{made.id}")
    await _over(client, made.id, "succeeded")


async def test_a_retry_the_database_fails_to_store_is_the_server_s_failure_as_from_the_api(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """A full disk as a failed run is put back to go on is the page's 500, as the API's: the run is
    still failed, nothing changed. Before, the page said 409, as for a run used up its budget."""
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("z", tools=[])]}},
            DRAFTS,
            {"purpose": "step:z", "tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True},
        ]
    )
    form = {"task": "z", "model": f"scripted:{script}", "yes": "on", "max_replans": "0", "prompt_rounds": "0"}
    run_id = (await client.post("/new", data=form)).headers["location"].removeprefix("/runs/")
    await _over(client, run_id, "failed")
    with sqlite_failing("UPDATE mp_runs") as failed:
        page = await client.post(f"/runs/{run_id}/retry", data={}, headers=HX)
        api = await client.post(f"/api/v1/runs/{run_id}/retry")
    full = _failed("cannot retry a run: database or disk is full")
    assert len(failed) == 2
    assert _said(page) == (500, full)
    assert _said(api) == (500, full)
    run = (await client.get(f"/api/v1/runs/{run_id}")).json()
    assert (run["status"], run["retries"]) == ("failed", 0)
