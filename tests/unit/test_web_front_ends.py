"""Several front ends on one run or agent at once: a page loaded before another front end acted.

A review page open while the review is answered elsewhere, a refused edit holding a typed
secret, an agent's page open while a rating writes it a lesson: each says what happened, applies
nothing twice, loses nothing, and sends no typed secret back.
"""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from _api import web_client
from _plans import step

DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}
GARBAGE = {"tool_calls": [{"name": "no_such_tool", "args": {}}], "repeat": True}
KEY = "sk-proj-Abc123def456ghi789jkl"


@pytest.fixture
async def client(isolated: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with web_client() as opened:
        yield opened


async def _body_until(client: httpx.AsyncClient, run_id: str, pattern: str) -> str:
    body = ""
    for _ in range(600):
        body = html.unescape((await client.get(f"/runs/{run_id}/body")).text)
        if re.search(pattern, body):
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"the run's page never showed {pattern!r}:\n{body}")


async def _stored_team(client: httpx.AsyncClient) -> dict[str, Any]:
    """The first team the registry stores (a run that succeeds stores its team as it ends)."""
    for _ in range(600):
        teams = (await client.get("/api/v1/teams")).json()
        if teams:
            return dict(teams[0])
        await asyncio.sleep(0.05)
    raise AssertionError("no team was stored")


def _review_id(body: str) -> str:
    found = re.search(r'id="review-form" hx-post="/runs/[^/]+/requests/([0-9a-f]+)"', body)
    assert found is not None, body
    return found[1]


async def test_a_review_page_submitted_after_the_review_was_answered_elsewhere_takes_nothing(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    # a and b succeed; c fails; the replanner puts c1 in its place, a review of its own
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[]), step("c", "a", tools=[])]}},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "step:c"} | GARBAGE,
            {"purpose": "replanner", "output": {"steps": [step("c1", "a", tools=[])]}, "repeat": True},
            {"purpose": "step:c1", "output": "C1"},
            DRAFTS,
        ]
    )
    form = {"task": "a then c", "model": f"scripted:{script}", "prompt_rounds": "0", "max_replans": "1"}
    run_id = (await client.post("/new", data=form)).headers["location"].removeprefix("/runs/")
    review = _review_id(await _body_until(client, run_id, "Review the plan"))
    # the page is open with the review; another front end approves it as it is
    other = await client.post(f"/api/v1/requests/{review}/answer", json={"approve": True})
    assert other.status_code == 200, other.text
    body = await _body_until(client, run_id, "Replan: step c failed")
    replan = _review_id(body)
    assert 'id="card-c1"' in body

    # the page's edit, sent now: not taken, said so, and the replan's review shown as it is
    stale = {"choice": "approve", "title.a": "EDITED A", "tools-shown.a": "1"}
    sent = await client.post(f"/runs/{run_id}/requests/{review}", data=stale)
    shown = html.unescape(sent.text)
    assert _review_id(shown) == replan and 'id="card-c1"' in shown
    assert "EDITED A" not in shown and 'id="card-c"' not in shown
    assert sent.status_code == 409
    assert re.search(
        rf'<p id="run-problem" class="error" role="alert">request {review} is already answered '
        r"\(by web@[^ ]+ at [^)]+\); yours was not taken</p>",
        shown,
    ), shown
    answered = await client.post(f"/runs/{run_id}/requests/{replan}", data={"choice": "approve"})
    assert answered.status_code == 200, answered.text
    await _body_until(client, run_id, "status status-succeeded")
    report = (await client.get(f"/api/v1/runs/{run_id}")).json()
    assert [(s["id"], s["status"]) for s in report["steps"]] == [
        ("a", "succeeded"),
        ("c", "replaced"),
        ("c1", "succeeded"),
    ]
    assert [(s["id"], s["title"]) for s in report["plan"]["steps"]] == [("a", "do a"), ("c1", "do c1")]


async def test_a_refused_review_edit_is_shown_again_without_the_secret_typed_into_it(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            DRAFTS,
            {"purpose": "step:a", "output": "a done"},
        ]
    )
    form = {"task": "one thing", "model": f"scripted:{script}", "prompt_rounds": "0"}
    run_id = (await client.post("/new", data=form)).headers["location"].removeprefix("/runs/")
    review = _review_id(await _body_until(client, run_id, "Review the plan"))
    edit = {
        "choice": "approve",
        "title.a": "EDITED A",
        "instruction.a": f"Call the API with Bearer {KEY} then stop.",
        "prompt.a": f"You fetch. Your key: {KEY}",
    }
    refused = await client.post(f"/runs/{run_id}/requests/{review}", data=edit)
    assert refused.status_code == 422
    assert KEY not in refused.text
    shown = html.unescape(refused.text)
    assert (
        f'<p class="error" role="alert">request {review}: the edited plan (step \'a\', instruction) holds '
        "what looks like a secret (an API key, a token or a password, such as `OPENAI_API_KEY=…`): put "
        "secrets in the environment or the settings file, not in an answer; nothing was stored, and the "
        "request is still open; the form shows your edit with the secret taken out (marked "
        "[secret removed])</p>"
    ) in shown
    # the rest of the edit as typed; each secret taken out where it was
    assert 'name="title.a" value="EDITED A"' in shown
    assert ">\nCall the API with [secret removed] then stop.</textarea>" in shown
    assert ">\nYou fetch. Your key: [secret removed]</textarea>" in shown
    assert (await client.get(f"/api/v1/requests/{review}")).json()["state"] == "open"


async def test_a_refused_new_task_is_shown_again_without_the_secret_typed_into_it(
    client: httpx.AsyncClient,
) -> None:
    form = {"task": f"Fetch the report with OPENAI_API_KEY={KEY} and sum it", "model": "scripted:/x.json"}
    refused = await client.post("/new", data=form)
    assert refused.status_code == 422
    assert KEY not in refused.text
    shown = html.unescape(refused.text)
    assert (
        '<p class="error" role="alert">invalid task: the task holds what looks like a secret (an API key, '
        "a token or a password, such as `OPENAI_API_KEY=…`): put secrets in the environment or the settings "
        "file, not in the task; the form shows your task with the secret taken out (marked "
        "[secret removed])</p>"
    ) in shown
    # the rest of the task as typed, the secret taken out where it was
    assert ">\nFetch the report with [secret removed] and sum it</textarea>" in shown
    assert (await client.get("/api/v1/runs")).json() == []


async def test_an_agent_page_saved_after_a_rating_taught_the_agent_keeps_the_lesson(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    lesson = {"step": "write", "lesson": "Always include the totals."}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("write", tools=[])]}},
            DRAFTS,
            {"purpose": "step:write", "output": "a summary"},
            {"purpose": "feedback", "output": {"lessons": [lesson]}},
            {"purpose": "*", "repeat": True},
        ]
    )
    body = {"task": "summarise", "model": f"scripted:{script}", "options": {"auto_approve": True}}
    run_id = (await client.post("/api/v1/runs", json=body)).json()["id"]
    agent_id = (await _stored_team(client))["agents"]["write"]
    page = html.unescape((await client.get(f"/agents/{agent_id}")).text)

    # while the page is open, a rating writes the agent a lesson (its version 2)
    rated = await client.post(f"/api/v1/runs/{run_id}/feedback", json={"rating": 1})
    assert rated.status_code == 200, rated.text
    assert rated.json()["lessons"] == {agent_id: ["Always include the totals."]}
    typed = {
        "action": "save",
        "latest": "1",
        "name": "writer",
        "role": "worker",
        "description": "Do write.",
        "system_prompt": "Write it short.",
        "tools": "",
        "keywords": "",
        "lessons": "",
    }
    refused = await client.post(f"/agents/{agent_id}", data=typed)
    stored = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    assert (stored["version"], stored["lessons"]) == (2, ["Always include the totals."])
    assert '<input type="hidden" name="latest" value="1">' in page
    assert refused.status_code == 409
    shown = html.unescape(refused.text)
    assert (
        f'<p class="error" role="alert">agent {agent_id} changed since this page was loaded (version 1 '
        "then, 2 now): nothing was saved; the form shows version 2 with your changes on top, and saving "
        "it stores them</p>"
    ) in shown
    assert ">\nWrite it short.</textarea>" in shown
    assert '<input type="hidden" name="latest" value="2">' in shown
    # the lessons the person left as loaded show the lesson the rating wrote meanwhile
    assert ">\nAlways include the totals.</textarea>" in shown

    # a refused edit holding a secret comes back without it
    leaky = await client.post(
        f"/agents/{agent_id}", data=typed | {"latest": "2", "system_prompt": f"Write it short. token={KEY}"}
    )
    assert leaky.status_code == 422
    assert KEY not in leaky.text
    shown = html.unescape(leaky.text)
    assert (
        '<p class="error" role="alert">the edit is not a valid agent, nothing changed: system_prompt: it '
        "holds what looks like a secret (an API key, a token or a password, such as `OPENAI_API_KEY=…`): "
        "put secrets in the environment or the settings file, not in an agent; the form shows your edit "
        "with the secret taken out (marked [secret removed])</p>"
    ) in shown
    assert ">\nWrite it short. [secret removed]</textarea>" in shown

    # the form as it came back, saved: version 3 holds the person's prompt and the rating's lesson
    again = await client.post(
        f"/agents/{agent_id}", data=typed | {"latest": "2", "lessons": "Always include the totals."}
    )
    assert again.status_code == 200 and "Saved as version 3." in again.text
    stored = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    assert (stored["version"], stored["system_prompt"], stored["lessons"]) == (
        3,
        "Write it short.",
        ["Always include the totals."],
    )
    # a page loaded at version 2 whose person changed the prompt, which version 3 changed too
    clash = await client.post(
        f"/agents/{agent_id}", data=typed | {"latest": "2", "lessons": "Totals last.", "system_prompt": "x"}
    )
    assert clash.status_code == 409
    assert "(you and version 3 both changed system_prompt: the form shows yours)" in html.unescape(clash.text)


async def test_a_review_of_reused_agents_says_so_and_which_prompts_a_person_wrote(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    """The review page of a run that reuses a stored team marks each reused agent (it failed to render)."""
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("write", tools=[])]}, "repeat": True},
            DRAFTS,
            {"purpose": "step:write", "output": "a summary", "repeat": True},
            {"purpose": "*", "repeat": True},
        ]
    )

    async def started(approve: bool) -> str:
        body = {"task": "summarise", "model": f"scripted:{script}", "options": {"auto_approve": approve}}
        created = await client.post("/api/v1/runs", json=body)
        assert created.status_code in (200, 201, 202), created.text
        return str(created.json()["id"])

    first = await started(True)
    agent_id = (await _stored_team(client))["agents"]["write"]
    marked = f"reuses agent {agent_id} from run {first}"
    body = await _body_until(client, await started(False), "review-form")
    assert f"{marked}</span>" in body
    agent = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    edited = await client.put(f"/api/v1/agents/{agent_id}", json=agent | {"system_prompt": "Write it short."})
    assert edited.status_code == 200, edited.text
    body = await _body_until(client, await started(False), "review-form")
    assert f"{marked}, its prompt written by a person</span>" in body
