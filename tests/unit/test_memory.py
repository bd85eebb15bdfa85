"""Agents' long-term memory: remember / recall, time to live, the size cap, secrets, runs' episodes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _plans import step

from masterplanner import Settings
from masterplanner.engine import Engine, RunOptions
from masterplanner.errors import ToolError
from masterplanner.registry import RegistryStore
from masterplanner.registry.memory import MemoryStore


@pytest.fixture
def registry(database_url: str) -> RegistryStore:
    return RegistryStore(database_url)


def test_recall_finds_what_was_remembered_and_renews_it(registry: RegistryStore) -> None:
    memory = MemoryStore(registry)
    kept = memory.remember("The sales figures in sales.csv are in euros.", source="run-1")
    memory.remember("The team meeting is on Tuesdays at 10.")
    found = memory.recall("which currency are the sales in?")
    assert [item.id for item in found] == [kept.id]
    assert (found[0].kind, found[0].source) == ("fact", "run-1")
    assert memory.list()[0].id == kept.id  # recalled last, so listed first
    assert memory.recall("quantum chromodynamics") == []


def test_a_runs_later_episode_replaces_its_earlier_one(registry: RegistryStore) -> None:
    memory = MemoryStore(registry)
    memory.remember("Run r1 'sum it' failed. Error: step b failed.", kind="episode", source="r1")
    memory.remember("Run r2 'other' succeeded.", kind="episode", source="r2")
    fact = memory.remember("Sums are in euros.", source="r1")  # a fact of the run stays
    memory.remember("Run r1 'sum it' succeeded. Result: 42.", kind="episode", source="r1")  # retried
    kept = sorted((item.kind, item.source, item.text) for item in memory.list())
    assert kept == [
        ("episode", "r1", "Run r1 'sum it' succeeded. Result: 42."),
        ("episode", "r2", "Run r2 'other' succeeded."),
        ("fact", "r1", fact.text),
    ]
    recalled = [item.text for item in memory.recall("sum it failed") if item.kind == "episode"]
    assert recalled == ["Run r1 'sum it' succeeded. Result: 42."]  # the failed account is gone


def test_expired_memories_are_gone_and_the_cap_evicts_the_least_recently_used(
    registry: RegistryStore,
) -> None:
    short = MemoryStore(registry, ttl_days=0.5 / 86400)  # half a second
    short.remember("The build server is called hopper.")
    time.sleep(0.6)
    assert short.recall("build server") == []
    capped = MemoryStore(registry, max_items=3)
    first = capped.remember("Fact one about apples.")
    capped.remember("Fact two about bananas.")
    capped.remember("Fact three about cherries.")
    capped.recall("apples")  # the first is now the most recently used
    capped.remember("Fact four about dates.")
    texts = sorted(item.text for item in capped.list())
    assert texts == ["Fact four about dates.", "Fact one about apples.", "Fact three about cherries."]
    assert first.id in {item.id for item in capped.list()}


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "the text is empty"),
        ("x" * 2001, "at most 2000 characters"),
        ("the api_key = sk-live-0123456789abcdef", "looks like a secret"),
        ("use Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9 for the API", "looks like a secret"),
        ("-----BEGIN RSA PRIVATE KEY-----", "looks like a secret"),
    ],
)
def test_bad_memories_are_refused_and_nothing_is_stored(
    registry: RegistryStore, text: str, problem: str
) -> None:
    memory = MemoryStore(registry)
    with pytest.raises(ToolError, match=problem):
        memory.remember(text)
    assert memory.list() == []


def test_the_value_of_a_secret_variable_is_not_remembered_whatever_its_shape(
    registry: RegistryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key of no known shape, as a person's input is judged: before, only the shapes were refused."""
    monkeypatch.setenv("WEATHER_API_KEY", "zq7Hkd92LmPq0xWv3nRt")
    memory = MemoryStore(registry)
    with pytest.raises(ToolError) as refused:
        memory.remember("The weather API takes the key zq7Hkd92LmPq0xWv3nRt.")
    assert str(refused.value) == (
        "that looks like a secret (a key, token or password); secrets are not remembered"
    )
    assert memory.list() == []


def test_the_memory_commands(registry: RegistryStore) -> None:
    memory = MemoryStore(registry)
    kept = memory.remember("Invoices are due within 30 days.")

    def mp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "masterplanner", "memory", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )

    listed = json.loads(mp("list", "--json").stdout)
    assert [(item["id"], item["kind"], item["text"]) for item in listed] == [(kept.id, "fact", kept.text)]
    assert [item["id"] for item in json.loads(mp("search", "when are invoices due", "--json").stdout)] == [
        kept.id
    ]
    assert mp("list", "--kind", "opinion").returncode == 2
    assert mp("rm", kept.id).returncode == 0
    assert json.loads(mp("list", "--json").stdout) == []
    gone = mp("rm", kept.id)
    assert gone.returncode == 2 and f"no memory '{kept.id}'" in gone.stderr


async def test_agents_remember_and_a_later_run_recalls_the_fact_and_the_episode(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    fact = "The sales figures in sales.csv are in euros."
    teach = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("learn", tools=["remember"])]}},
            {"purpose": "step:learn", "tool_calls": [{"name": "remember", "args": {"fact": fact}}]},
            {"purpose": "step:learn", "output": "noted the currency"},
            {"purpose": "*", "repeat": True},
        ]
    )
    ask = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("look", tools=["recall"])]}},
            {
                "purpose": "step:look",
                "tool_calls": [{"name": "recall", "args": {"query": "sales currency euros"}}],
            },
            {"purpose": "step:look", "output": "euros"},
            {"purpose": "*", "repeat": True},
        ]
    )
    engine = Engine(Settings.load())
    try:
        options = RunOptions(auto_approve=True, prompt_rounds=0)
        first = engine.create_run(
            "Find out which currency sales.csv uses", model=f"scripted:{teach}", options=options
        )
        assert (await engine.execute(first.id)).status == "succeeded"
        second = engine.create_run("Tell me the sales currency", model=f"scripted:{ask}", options=options)
        assert (await engine.execute(second.id)).status == "succeeded"
        results = [e.data for e in engine.store.events(second.id) if e.kind == "tool_result"]
        assert len(results) == 1
        recalled: Any = results[0].get("result", "")
        assert "[fact, " in recalled and fact in recalled
        assert "[episode, " in recalled and "'Find out which currency sales.csv uses' succeeded" in recalled
    finally:
        engine.close()
