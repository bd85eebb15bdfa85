"""A secret a person types (a task, an answer, a plan or prompt edit, a comment, a chat prompt) is refused.

Refused where every front end's input passes (the engine's task check, the requests' answer
check, feedback, chat, the registry's agent edit), before anything is stored: the database holds
no copy, and a later input without the secret is taken.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from _api import web_client
from _cli import mp
from _plans import step

from masterplanner import (
    AgentEditError,
    ConfigError,
    Engine,
    PlanError,
    RunOptions,
    Settings,
    achat,
)
from masterplanner.service import RegistryService, RunService

KEY = "sk-proj-Abc123def456ghi789jkl"
SEEN = "such as `OPENAI_API_KEY=…`): put secrets in the environment or the settings file, not in"
SECRET = f"holds what looks like a secret (an API key, a token or a password, {SEEN}"
DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}


def _copies(home: Path, secret: str = KEY) -> list[str]:
    """The files under the home (the SQLite database, its WAL, logs) whose bytes hold `secret`."""
    return sorted(
        str(path.relative_to(home))
        for path in home.rglob("*")
        if path.is_file() and secret.encode() in path.read_bytes()
    )


def _one_step(write_script: Callable[..., Path], *extra: dict[str, Any]) -> Path:
    return write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}, "repeat": True},
            DRAFTS,
            *extra,
            {"purpose": "step:a", "output": "a done", "repeat": True},
            {"purpose": "*", "repeat": True},
        ]
    )


def test_a_task_holding_a_secret_is_refused_by_the_cli_and_nothing_is_stored(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    model = f"scripted:{_one_step(write_script)}"
    refused = mp("run", f"Fetch the weather with OPENAI_API_KEY={KEY}", "--model", model, "--yes", "--json")
    assert (refused.returncode, refused.stderr) == (
        2,
        f"error: invalid task: the task {SECRET} the task\n",
    )
    assert KEY not in refused.stdout
    assert json.loads(mp("runs", "list", "--json").stdout) == []
    assert _copies(isolated) == []

    done = mp("run", "Fetch the weather", "--model", model, "--yes", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "succeeded"
    assert _copies(isolated) == []


async def test_the_library_refuses_a_secret_task_chat_prompt_and_agent_edit(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    model = f"scripted:{_one_step(write_script, {'purpose': 'chat', 'output': 'hello', 'repeat': True})}"
    engine = Engine(Settings.load())
    try:
        with pytest.raises(PlanError) as refused:
            engine.create_run(f"Deploy it; DB_PASSWORD={KEY}", model=model)
        assert str(refused.value) == f"invalid task: the task {SECRET} the task"
        assert refused.value.problems == [f"the task {SECRET} the task"]
        assert engine.store.list_runs(10) == []
        done = engine.create_run(
            "Deploy it", model=model, options=RunOptions(auto_approve=True, prompt_rounds=0)
        )
        assert (await engine.execute(done.id)).status == "succeeded"
    finally:
        engine.close()
    # words that begin like a key are not one: the task is taken
    service = RunService(Settings.load())
    try:
        assert (
            await service.create("Write a skill-building workshop plan", model=model)
        ).status == "planning"
    finally:
        service.close()

    with pytest.raises(ConfigError) as chat_refused:
        await achat(f"my key is {KEY}, is it valid?", model=model)
    assert str(chat_refused.value) == f"the prompt {SECRET} a prompt"
    assert (await achat("say hello", model=model)).output == "hello"

    registry = RegistryService(Settings.load())
    try:
        [agent] = await registry.agents()
        edited = agent.model_dump(mode="json") | {"system_prompt": f"You deploy. Token: {KEY}"}
        with pytest.raises(AgentEditError) as edit_refused:
            await registry.edit_agent(agent.id, edited)
        assert edit_refused.value.problems == [f"system_prompt: it {SECRET} an agent"]
        assert (await registry.agent(agent.id)).system_prompt == agent.system_prompt
        clean = agent.model_dump(mode="json") | {"system_prompt": "You deploy. Read the token from the env."}
        assert (await registry.edit_agent(agent.id, clean)).version == agent.version + 1
    finally:
        registry.close()
    assert _copies(isolated) == []


@pytest.fixture
async def client(isolated: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with web_client("/api/v1") as opened:
        yield opened


async def _open(client: httpx.AsyncClient, run_id: str, kind: str) -> dict[str, Any]:
    for _ in range(600):
        found = [r for r in (await client.get(f"/requests?run_id={run_id}")).json() if r["kind"] == kind]
        if found:
            return dict(found[0])
        await asyncio.sleep(0.05)
    raise AssertionError(f"no open {kind} request")


async def test_the_api_refuses_a_secret_in_a_task_a_plan_or_prompt_edit_a_reason_and_an_answer(
    isolated: Path, client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    ask = {"name": "ask_user", "args": {"question": "Which city?"}}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=["ask_user"])]}},
            DRAFTS,
            {"purpose": "step:a", "tool_calls": [ask]},
            {"purpose": "step:a", "expect": ["Paris"], "output": "weather of Paris"},
            {"purpose": "*", "repeat": True},
        ]
    )
    body = {"model": f"scripted:{script}", "options": {"prompt_rounds": 0}}
    refused = await client.post("/runs", json=body | {"task": f"Fetch the weather, api_key={KEY}"})
    assert refused.status_code == 422
    assert refused.json() == {
        "error": f"invalid task: the task {SECRET} the task",
        "problems": [f"the task {SECRET} the task"],
    }
    assert (await client.get("/runs")).json() == []

    created = await client.post("/runs", json=body | {"task": "Fetch the weather"})
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    review = await _open(client, run_id, "plan_review")
    plan = review["payload"]["plan"]
    leaky = plan | {"steps": [plan["steps"][0] | {"instruction": f"Call the API with Bearer {KEY}."}]}
    where = f"/requests/{review['id']}/answer"
    still_open = "; nothing was stored, and the request is still open"
    for decision, what in [
        ({"action": "approve", "plan": leaky}, "the edited plan (step 'a', instruction)"),
        (
            {"action": "approve", "agents": {"a": {"prompt": f"You fetch. GITHUB_TOKEN={KEY}"}}},
            "the edited agent of step 'a' (prompt)",
        ),
        ({"action": "reject", "reason": f"do not use {KEY}"}, "the reason"),
    ]:
        answered = await client.post(where, json={"decision": decision})
        assert answered.status_code == 422
        assert answered.json() == {"error": f"request {review['id']}: {what} {SECRET} an answer{still_open}"}
        assert (await client.get(f"/requests/{review['id']}")).json()["state"] == "open"
    edited = plan | {"steps": [plan["steps"][0] | {"instruction": "Ask which city, then fetch its weather."}]}
    answered = await client.post(where, json={"decision": {"action": "approve", "plan": edited}})
    assert answered.status_code == 200, answered.text

    question = await _open(client, run_id, "ask_user")
    where = f"/requests/{question['id']}/answer"
    answered = await client.post(where, json={"text": f"Paris; my key is {KEY}"})
    assert answered.status_code == 422
    assert answered.json() == {
        "error": f"request {question['id']}: the answer {SECRET} an answer{still_open}"
    }
    assert (await client.get(f"/requests/{question['id']}")).json()["state"] == "open"
    answered = await client.post(where, json={"text": "Paris"})
    assert answered.status_code == 200, answered.text
    for _ in range(600):
        report = (await client.get(f"/runs/{run_id}")).json()
        if report["status"] == "succeeded":
            break
        await asyncio.sleep(0.05)
    assert (report["status"], report["output"]) == ("succeeded", "weather of Paris")
    assert report["plan"]["steps"][0]["instruction"] == "Ask which city, then fetch its weather."
    assert _copies(isolated) == []


EDITOR = """
import pathlib, sys
path = pathlib.Path(sys.argv[-1])
text = path.read_text()
log = pathlib.Path(__file__).with_suffix(".log")
log.write_text(log.read_text() + "\\n=====\\n" + text if log.exists() else text)
if "# ERROR:" not in text:  # first opening: a key typed into the step's instruction
    text = text.replace("instruction: Do a.", "instruction: Do a with OPENAI_API_KEY=KEY.", 1)
else:  # reopened with the refusal on top: the key taken out again, the title edited
    kept = [line for line in text.splitlines() if not line.startswith("# ERROR:")]
    text = "\\n".join(kept).replace("OPENAI_API_KEY=KEY", "the key from the environment")
    text = text.replace("title: do a", "title: edited a")
path.write_text(text)
""".replace("=KEY", f"={KEY}")


def test_a_secret_typed_in_the_terminals_plan_edit_reopens_the_editor_with_the_refusal_on_top(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    editor = tmp_path / "editor.py"
    editor.write_text(EDITOR)
    result = mp(
        "run",
        "one thing",
        "--model",
        f"scripted:{_one_step(write_script)}",
        "--json",
        stdin="e\na\n",
        env={"EDITOR": f"{sys.executable} {editor}", "VISUAL": ""},
    )
    assert result.returncode == 0, result.stderr
    refusal = f"the edited plan (step 'a', instruction) {SECRET} an answer"
    assert f"the edit is refused: {refusal}" in " ".join(result.stderr.split())
    assert KEY not in result.stderr
    opened = (tmp_path / "editor.log").read_text().split("\n=====\n")
    assert len(opened) == 2 and opened[1].startswith(f"# ERROR: {refusal}\n")
    report = json.loads(result.stdout)
    assert report["status"] == "succeeded"
    assert report["plan"]["steps"][0]["title"] == "edited a"
    assert report["plan"]["steps"][0]["instruction"] == "Do a with the key from the environment."
    assert _copies(isolated) == []


def test_a_comment_holding_a_secret_is_refused_and_the_run_is_rated_after(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    analysis = {"purpose": "feedback", "output": {"lessons": []}, "repeat": True}
    model = f"scripted:{_one_step(write_script, analysis)}"
    run = mp("run", "Summarise notes.txt", "--model", model, "--yes", "--json")
    assert run.returncode == 0, run.stderr
    run_id = json.loads(run.stdout)["run_id"]
    refused = mp("feedback", run_id, "--rating", "1", "--comment", f"it printed password: {KEY}", "--json")
    assert (refused.returncode, refused.stderr) == (
        2,
        f"error: the comment {SECRET} a rating's comment; the run is not rated\n",
    )
    assert _copies(isolated) == []
    rated = mp("feedback", run_id, "--rating", "1", "--comment", "it printed the key", "--json")
    assert rated.returncode == 0, rated.stderr
    lesson = 'A person rated an earlier run 1/5 and said: "it printed the key"'
    assert json.loads(rated.stdout)["lessons"] == {f"{run_id}.a": [lesson]}
    assert _copies(isolated) == []


def test_a_review_answer_is_judged_on_the_secrets_it_holds_not_on_text_the_plan_already_shows() -> None:
    """A secret the person types is refused even when it is the start of a longer one the plan shows."""
    from masterplanner.engine.requests import typed_secrets_removed
    from masterplanner.service import Request, secret_in_answer

    shown = f"Call the service with OPENAI_API_KEY={KEY}XYZ789 set."
    review = Request(
        id="r1",
        run_id="run",
        step_id=None,
        kind="plan_review",
        payload={"plan": {"steps": [step("a", tools=[])]}, "agents": {"a": {"prompt": shown}}},
        state="open",
        answer=None,
        answered_by=None,
        created_at="2026-11-28T00:00:00+00:00",
        answered_at=None,
    )

    def approve(prompt: str) -> dict[str, Any]:
        return {"action": "approve", "agents": {"a": {"prompt": prompt}}}

    # the prompt as shown, and a change around its secret, are the person's to keep
    assert secret_in_answer(review, approve(shown)) is None
    assert secret_in_answer(review, approve(shown + " Be brief.")) is None
    # a key the person typed, though the shown key starts with it
    typed = f"Call the service with {KEY} set."
    assert secret_in_answer(review, approve(typed)) == (
        f"the edited agent of step 'a' (prompt) {SECRET} an answer"
    )
    # shown as the form shows it back: the typed key taken out, the shown one whole
    assert typed_secrets_removed(review, approve(f"{typed} {shown}")) == approve(
        f"Call the service with [secret removed] set. {shown}"
    )
    # keys the plan shows next to a dash or an underscore, sent back as they were (the web form
    # sends the whole plan): taken, and shown back as they are
    for text in (f"with my-{KEY}", "id AKIAIOSFODNN7EXAMPLE-backup", "ghp_abcdefghijklmnopqrstuvwx-old"):
        held = replace(review, payload={"agents": {"a": {"prompt": text}}})
        assert secret_in_answer(held, approve(text)) is None
        assert typed_secrets_removed(held, approve(text)) == approve(text)
