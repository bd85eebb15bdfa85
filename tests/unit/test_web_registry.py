"""Agents, teams and memory in the web app (API and pages), over a team a finished run stored."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from _api import typed, web_client
from _plans import step

from masterplanner.registry import Cohort
from masterplanner.web.api_responses import AgentOut, ListedAgentOut, MemoryOut, StoredAgentOut

DRAFTS = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}


@pytest.fixture
async def client(isolated: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with web_client() as opened:
        yield opened


async def _finished_run(client: httpx.AsyncClient, write_script: Callable[..., Path]) -> dict[str, Any]:
    script = write_script(
        [
            {
                "purpose": "planner",
                "output": {"steps": [step("gather", tools=[]), step("write", "gather", tools=[])]},
            },
            {"purpose": "step:gather", "output": "facts"},
            {"purpose": "step:write", "output": "the summary"},
            DRAFTS,
            {"purpose": "*", "repeat": True},
        ]
    )
    body = {
        "task": "summarise the facts",
        "model": f"scripted:{script}",
        "options": {"auto_approve": True, "prompt_rounds": 0},
    }
    run = (await client.post("/api/v1/runs", json=body)).json()
    for _ in range(600):
        teams = (await client.get("/api/v1/teams")).json()
        if teams:
            return {"run": run, "team": teams[0]}
        await asyncio.sleep(0.05)
    raise AssertionError((await client.get(f"/api/v1/runs/{run['id']}")).text)


async def test_agents_and_teams_through_the_api(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    stored = await _finished_run(client, write_script)
    team = stored["team"]
    assert team["run_id"] == stored["run"]["id"] and set(team["agents"]) == {"gather", "write"}
    assert typed(list[Cohort], await client.get("/api/v1/teams"))[0].id == team["id"]
    agents = (await client.get("/api/v1/agents")).json()
    assert len(agents) == 2 and all(agent["stats"]["uses"] == 1 for agent in agents)
    assert [agent.score for agent in typed(list[ListedAgentOut], await client.get("/api/v1/agents"))] == [
        None
    ] * 2
    found = typed(list[ListedAgentOut], await client.get("/api/v1/agents", params={"q": agents[0]["role"]}))
    assert found and found[0].score is not None

    agent_id = team["agents"]["write"]
    agent = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    assert typed(StoredAgentOut, await client.get(f"/api/v1/agents/{agent_id}")).versions == [1]
    edited = await client.put(f"/api/v1/agents/{agent_id}", json=agent | {"system_prompt": "Write it short."})
    assert edited.status_code == 200, edited.text
    assert (typed(AgentOut, edited).version, edited.json()["system_prompt"]) == (2, "Write it short.")
    assert (await client.get(f"/api/v1/agents/{agent_id}", params={"version": 1})).json()["version"] == 1
    # an edit made from a version read before another was stored is refused when it says so (If-Match)
    read = await client.get(f"/api/v1/agents/{agent_id}", params={"version": 1})
    assert (read.headers["etag"], edited.headers["etag"]) == ('"1"', '"2"')
    stale = await client.put(
        f"/api/v1/agents/{agent_id}",
        json=read.json() | {"system_prompt": "Write it long."},
        headers={"If-Match": read.headers["etag"]},
    )
    assert (stale.status_code, stale.json()) == (
        412,
        {
            "error": f'agent {agent_id!r} changed since it was read (If-Match "1", version 2 now): '
            "nothing was saved; read it again and send the edit made from it"
        },
    )
    assert (await client.get(f"/api/v1/agents/{agent_id}")).json()["system_prompt"] == "Write it short."
    fresh = await client.put(
        f"/api/v1/agents/{agent_id}",
        json=agent | {"system_prompt": "Write it short."},
        headers={"If-Match": 'W/"0", "2"'},
    )
    assert (fresh.status_code, typed(AgentOut, fresh).version) == (200, 2)  # the latest named: taken
    assert (await client.get(f"/api/v1/agents/{agent_id}", params={"version": 99})).status_code == 404
    bad = await client.put(
        f"/api/v1/agents/{agent_id}", json=agent | {"system_prompt": "", "tools": ["nope"]}
    )
    assert bad.status_code == 422  # every problem, each on its own as for any invalid body
    assert bad.json()["problems"] == ["system_prompt: must not be empty"]
    assert (
        bad.json()["error"]
        == "the edit is not a valid agent, nothing changed: system_prompt: must not be empty"
    )
    both = await client.put(f"/api/v1/agents/{agent_id}", json=agent | {"name": " ", "model": "bogus"})
    assert [problem.split(":")[0] for problem in both.json()["problems"]] == ["name", "model"]
    # spaces alone for a prompt, a tool listed twice: the run's review refuses neither less
    blank = {"system_prompt": " \n ", "tools": ["read_file", "write_file", "read_file"]}
    refused = await client.put(f"/api/v1/agents/{agent_id}", json=agent | blank)
    assert (refused.status_code, refused.json()["problems"]) == (
        422,
        ["system_prompt: must not be blank", "tools: lists read_file twice"],
    )
    # what the registry keeps is not edited; sent back unchanged it is fine, and changes nothing
    current = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    kept = await client.put(
        f"/api/v1/agents/{agent_id}", json=current | {"id": "other", "version": 7, "origin": {}}
    )
    assert kept.json()["problems"] == [
        "id: cannot be edited (it names the agent)",
        "origin: cannot be edited (it is where the agent was made)",
    ]
    same = await client.put(f"/api/v1/agents/{agent_id}", json=current)
    assert (same.status_code, typed(AgentOut, same).version) == (200, current["version"])
    prefix = "the edit is not a valid agent, nothing changed: "
    for change, problem in (
        ({"tools": ["nope"]}, "tools names 'nope', which is not a tool; tools are "),
        (
            {"model": "bogus"},
            "model: 'bogus' is not a model spec (PROVIDER:NAME, or local; empty: the run's model)",
        ),
        ({"name": "  "}, "name: must not be blank"),
        ({"role": "a\u0007b"}, "role: must be one line of text without control characters"),
    ):
        refused = await client.put(f"/api/v1/agents/{agent_id}", json=agent | change)
        assert refused.status_code == 422
        assert refused.json()["error"].startswith(prefix + problem)
    moved = await client.put(
        f"/api/v1/agents/{agent_id}", json=agent | {"origin": {"run_id": "x", "step_id": "y"}}
    )
    # where it was made is its history: refused, not silently kept as it was
    assert (moved.status_code, moved.json()["problems"]) == (
        422,
        ["origin: cannot be edited (it is where the agent was made)"],
    )
    assert (await client.get(f"/api/v1/agents/{agent_id}")).json()["version"] == 2

    assert (await client.get("/api/v1/agents/nobody")).json() == {
        "error": "no agent 'nobody' in the registry"
    }
    assert (await client.delete(f"/api/v1/teams/{team['id']}")).status_code == 204
    assert (await client.get(f"/api/v1/teams/{team['id']}")).status_code == 404
    assert (await client.delete(f"/api/v1/agents/{agent_id}")).status_code == 204
    assert [a["id"] for a in (await client.get("/api/v1/agents")).json()] == [team["agents"]["gather"]]

    memories = (await client.get("/api/v1/memories", params={"kind": "episode"})).json()
    assert typed(list[MemoryOut], await client.get("/api/v1/memories"))[0].kind == "episode"
    assert len(memories) == 1 and "summarise the facts" in memories[0]["text"]
    assert (await client.delete(f"/api/v1/memories/{memories[0]['id']}")).status_code == 204
    assert (await client.delete(f"/api/v1/memories/{memories[0]['id']}")).status_code == 404


KEY = "sk-proj-Abc123def456ghi789jkl"
SECRET = (
    "it holds what looks like a secret (an API key, a token or a password, such as "
    "`OPENAI_API_KEY=…`): put secrets in the environment or the settings file, not in an agent"
)


def _copies(home: Path, text: str) -> list[Path]:
    """The files under the home (the database, its WAL, logs) whose bytes hold `text`."""
    return [path for path in home.rglob("*") if path.is_file() and text.encode() in path.read_bytes()]


async def test_an_agent_edit_refuses_a_lesson_or_keyword_past_its_limit_and_a_secret_keyword(
    client: httpx.AsyncClient, isolated: Path, write_script: Callable[..., Path]
) -> None:
    """Before, lessons and keywords had a count and no length: 45 lessons of 80,000 characters were
    stored (every later run of the agent failed on its token budget), a 100,000-character keyword,
    and a keyword holding an API key (keywords are indexed and embedded with the agent).
    """
    from masterplanner import Settings
    from masterplanner.registry import open_registry

    stored = await _finished_run(client, write_script)
    agent_id = stored["team"]["agents"]["write"]
    agent = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    too_long = {
        "lessons": ["Cite the source.", "a" * 80_000],
        "keywords": ["summary", "k" * 100_000, f"key {KEY}"],
    }
    refused = await client.put(f"/api/v1/agents/{agent_id}", json=agent | too_long)
    assert (refused.status_code, refused.json()["problems"]) == (
        422,
        [
            f"keywords.2: {SECRET}",
            "keywords.1: is 100,000 characters; the limit for a keyword is 100",
            "lessons.1: is 80,000 characters; the limit for a lesson is 600",
        ],
    )
    assert (await client.get(f"/api/v1/agents/{agent_id}")).json()["version"] == 1
    at_limit = {"lessons": ["Cite the source.", "a" * 600], "keywords": ["summary", "k" * 100]}
    taken = await client.put(f"/api/v1/agents/{agent_id}", json=agent | at_limit)
    assert taken.status_code == 200, taken.text
    assert (taken.json()["version"], taken.json()["lessons"], taken.json()["keywords"]) == (
        2,
        at_limit["lessons"],
        at_limit["keywords"],
    )
    assert _copies(isolated, KEY) == []

    # an agent stored before the limits (by the store itself here) still reads, lists and searches;
    # an edit names its long items, and is taken once they are shortened
    old = {"lessons": ["b" * 5000], "keywords": ["verylong" * 20]}
    registry = open_registry(Settings.load())
    registry.put_agent(registry.get_agent(agent_id).model_copy(update=old))
    read = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    assert (read["version"], read["lessons"], read["keywords"]) == (3, old["lessons"], old["keywords"])
    assert agent_id in [listed["id"] for listed in (await client.get("/api/v1/agents")).json()]
    kept = await client.put(f"/api/v1/agents/{agent_id}", json=read | {"description": "Writes it."})
    assert kept.json()["problems"] == [
        "keywords.0: is 160 characters; the limit for a keyword is 100",
        "lessons.0: is 5,000 characters; the limit for a lesson is 600",
    ]
    shortened = await client.put(
        f"/api/v1/agents/{agent_id}", json=read | {"lessons": ["b" * 600], "keywords": ["verylong"]}
    )
    assert (shortened.status_code, shortened.json()["version"]) == (200, 4)


async def test_agents_teams_and_memory_pages(
    client: httpx.AsyncClient, write_script: Callable[..., Path]
) -> None:
    stored = await _finished_run(client, write_script)
    team, agent_id = stored["team"], stored["team"]["agents"]["write"]
    listed = (await client.get("/agents")).text
    assert f'href="/agents/{agent_id}"' in listed
    page = (await client.get(f"/agents/{agent_id}")).text
    assert "Used 1 times, succeeded 1" in page and 'name="system_prompt"' in page

    form = {
        "action": "save",
        "name": "writer",
        "role": "writer",
        "description": "",
        "system_prompt": "Write it in one line.",
        "tools": "",
        "keywords": "summary, short",
        "lessons": "Keep it short.\nName the source.",
    }
    saved = await client.post(f"/agents/{agent_id}", data=form)
    assert saved.status_code == 200 and "Saved as version 2." in saved.text
    spec = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    assert (spec["lessons"], spec["keywords"]) == (
        ["Keep it short.", "Name the source."],
        ["summary", "short"],
    )
    # the same form sent again as a browser sends a textarea (CRLF) changes nothing
    again = await client.post(
        f"/agents/{agent_id}",
        data=form | {"system_prompt": "Write it in one line.\r\nCite it.", "action": "save"},
    )
    assert "Saved as version 3." in again.text
    resent = await client.post(
        f"/agents/{agent_id}", data=form | {"system_prompt": "Write it in one line.\r\nCite it."}
    )
    assert resent.status_code == 200
    stored = (await client.get(f"/api/v1/agents/{agent_id}")).json()
    assert (stored["version"], stored["system_prompt"]) == (3, "Write it in one line.\nCite it.")
    typed = {"role": "", "system_prompt": "My new prompt, typed.", "lessons": "A lesson typed."}
    refused = await client.post(f"/agents/{agent_id}", data=form | typed)
    assert refused.status_code == 422 and "role: must not be empty" in refused.text
    # what was typed comes back beside the problem, not the stored agent
    assert ">\nMy new prompt, typed.</textarea>" in refused.text
    assert ">\nA lesson typed.</textarea>" in refused.text
    assert 'id="role" name="role" value=""' in refused.text

    team_page = (await client.get(f"/teams/{team['id']}")).text
    assert "<svg" in team_page and f'href="/agents/{agent_id}"' in team_page
    assert (await client.post(f"/teams/{team['id']}")).status_code == 303
    assert "No teams yet" in (await client.get("/teams")).text

    memory = (await client.get("/memory")).text
    forget = re.search(r'action="/memory/([^"]+)"', memory)
    assert forget is not None and "summarise the facts" in memory
    assert (await client.post(f"/memory/{forget[1]}")).status_code == 303
    assert "No memories" in (await client.get("/memory")).text
    assert (await client.post(f"/agents/{agent_id}", data={"action": "delete"})).status_code == 303
    assert (await client.get(f"/agents/{agent_id}")).status_code == 404
