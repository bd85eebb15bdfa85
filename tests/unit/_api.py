"""The web app in the tests: a client of it, and its REST API's answers read."""

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
from _plans import step
from pydantic import TypeAdapter

from masterplanner import Settings
from masterplanner.engine.records import RunOptions, RunRecord
from masterplanner.service import RunService
from masterplanner.web import create_app


async def stopped_run(write_script: Callable[..., Path]) -> RunRecord:
    """A run of one step `a` (its output "A done"), made by a process that stopped before executing it.

    Nothing executes it until it is resumed. `write_script`: the fixture that writes its model's script.
    """
    drafts = {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=[])]}},
            {"purpose": "step:a", "output": "A done"},
            drafts,
            {"purpose": "*", "repeat": True},
        ]
    )
    elsewhere = RunService(Settings.load())
    try:
        options = RunOptions(auto_approve=True)
        return await elsewhere.create("do a", model=f"scripted:{script}", options=options)
    finally:
        elsewhere.close()


@asynccontextmanager
async def web_client(prefix: str = "") -> AsyncIterator[httpx.AsyncClient]:
    """A client of the web app over the home's settings (paths under `prefix`, e.g. "/api/v1").

    The app's runs, registry and service are closed after.
    """
    service = RunService(Settings.load())
    app = create_app(service)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=f"http://127.0.0.1:8765{prefix}") as opened:
        yield opened
    await app.state.executions.stop()
    app.state.registry.close()
    service.close()


def typed(model: Any, response: httpx.Response) -> Any:
    """The answer read as the OpenAPI document says it is (the models forbid fields they do not name)."""
    assert response.is_success, response.text
    return TypeAdapter(model).validate_python(response.json())
