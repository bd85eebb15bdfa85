"""The web app in the tests: a client of it, and its REST API's answers read."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from pydantic import TypeAdapter

from masterplanner import Settings
from masterplanner.service import RunService
from masterplanner.web import create_app


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
