"""The `openai:` path against a real OpenAI-compatible server: llama-cpp-python's own server
on 127.0.0.1, serving the embedded GGUF, reached through the official `openai` client."""

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Literal

import pytest
from _llama_server import llama_server
from pydantic import BaseModel
from pydantic_ai import Agent

from masterplanner import UsageLedger, labelled, resolve_model

pytestmark = [pytest.mark.server, pytest.mark.local_model]


class Color(BaseModel):
    name: str
    warmth: Literal["warm", "cool", "neutral"]


class Palette(BaseModel):
    title: str
    colors: list[Color]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with llama_server(tmp_path_factory.mktemp("server"), "--n_ctx", "4096") as base_url:
        yield base_url


@pytest.fixture
def openai_env(server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    from pydantic_ai import models

    monkeypatch.setenv("OPENAI_BASE_URL", server)
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)  # loopback server only
    return server


def test_official_client_chat_and_schema_output(server: str) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server, api_key="not-needed")
    assert [model.id for model in client.models.list().data] == ["smollm2"]
    reply = client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Name three colors"}], max_tokens=48
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    structured = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "A warm palette called Sunset"}],
        response_format={"type": "json_object", "schema": Palette.model_json_schema()},  # type: ignore[typeddict-unknown-key]
        max_tokens=400,
    )
    Palette.model_validate_json(structured.choices[0].message.content or "")


async def test_openai_path_text(openai_env: str) -> None:
    ledger = UsageLedger()
    agent = Agent(labelled(resolve_model("openai:smollm2"), "chat", ledger))
    result = await agent.run("Name three colors", model_settings={"max_tokens": 48})
    assert result.output.strip()
    usage = ledger.by_purpose()["chat"]
    assert usage["calls"] == 1
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0


async def test_openai_path_structured_output(openai_env: str) -> None:
    from masterplanner.models.openai_compat import OpenAICompatibleModel
    from masterplanner.models.retries import RetriedModel

    resolved = resolve_model("openai:smollm2")
    assert isinstance(resolved, RetriedModel)
    model = resolved.wrapped
    assert isinstance(model, OpenAICompatibleModel)
    agent = Agent(resolved, output_type=Palette, retries=0)
    result = await agent.run("A cool palette called Ocean", model_settings={"max_tokens": 400})
    assert isinstance(result.output, Palette)
    # This server refuses json_schema; the model switched to json_object with the schema.
    assert model.json_object_schema is True
    second = await agent.run("A warm palette called Autumn", model_settings={"max_tokens": 400})
    assert isinstance(second.output, Palette)


def test_cli_chat_through_the_server(openai_env: str) -> None:
    import os

    result = subprocess.run(
        [sys.executable, "-m", "masterplanner", "chat", "Say hello", "--model", "openai:smollm2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["output"].strip()
    assert payload["usage"]["by_purpose"]["chat"]["calls"] == 1
