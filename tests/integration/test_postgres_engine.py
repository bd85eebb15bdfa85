"""The engine on Postgres (the multi-worker database): same lifecycle, events and recovery rules."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from masterplanner import Settings
from masterplanner.engine import Engine, RunOptions

pytestmark = pytest.mark.postgres

SERVER = "postgresql://postgres@127.0.0.1:5432"


def step(step_id: str, *deps: str, tools: list[str]) -> dict[str, object]:
    return {
        "id": step_id,
        "title": step_id,
        "instruction": f"Do {step_id}.",
        "agent_role": "worker",
        "tools": tools,
        "depends_on": list(deps),
        "expected_output": "",
    }


@pytest.fixture
def database() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    name = f"mp_test_{secrets.token_hex(4)}"
    try:
        admin = psycopg.connect(f"{SERVER}/postgres", autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no Postgres server at {SERVER}: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{SERVER}/{name}"
    with psycopg.connect(f"{SERVER}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
        assert kinds[-5:] == [
            ("step_started", "a"),
            ("step_succeeded", "a"),
            ("step_started", "b"),
            ("step_succeeded", "b"),
            ("run_succeeded", None),
        ]
        assert engine.report(run.id)["usage"]["by_purpose"]["step:b"]["calls"] == 1
        # a second executor cannot take a run whose owner is alive
        assert not engine.store.claim(run.id, "elsewhere:1:x") or engine.store.get_run(run.id).finished
    finally:
        engine.close()
