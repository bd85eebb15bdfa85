"""The embedded SmolLM2 model through llama.cpp: the real offline path."""

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import pytest
from pydantic import BaseModel, Field
from pydantic_ai import Agent, RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.direct import model_request
from pydantic_ai.messages import ModelRequest, ToolCallPart
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import ToolDefinition

from masterplanner import UsageLedger, labelled, resolve_model

pytestmark = pytest.mark.local_model


class Item(BaseModel):
    name: str
    quantity: int = Field(ge=1)
    kind: Literal["fruit", "vegetable", "dairy", "bakery"]


class Basket(BaseModel):
    owner: str
    priority: Literal["low", "normal", "urgent"]
    items: list[Item]


PEOPLE = ["Ann", "Bob", "Cleo", "Dan", "Eve"]
GOODS = ["apples and carrots", "milk, bread and pears", "three onions", "cheese and grapes"]


async def test_nested_schema_is_valid_20_of_20() -> None:
    ledger = UsageLedger()
    agent = Agent(labelled(resolve_model("local"), "chat", ledger), output_type=Basket, retries=0)
    baskets = []
    for index in range(20):
        prompt = f"Make a shopping basket for {PEOPLE[index % 5]} with {GOODS[index % 4]}."
        result = await agent.run(prompt)
        baskets.append(result.output)
    assert len(baskets) == 20
    assert all(isinstance(basket, Basket) for basket in baskets)
    # retries=0: every one of the 20 answers validated on its first generation.
    assert ledger.by_purpose()["chat"]["calls"] == 20


WRITE_FILE = ToolDefinition(
    name="write_file",
    description="Write text content to a file in the workspace.",
    parameters_json_schema={
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "file name"},
            "content": {"type": "string"},
            "mode": {"enum": ["create", "overwrite", "append"]},
            "line_count": {"type": "integer", "minimum": 1},
        },
        "required": ["path", "content", "mode", "line_count"],
        "additionalProperties": False,
    },
)


async def test_tool_call_with_typed_arguments_is_valid() -> None:
    model = resolve_model("local")
    response = await model_request(
        model,
        [ModelRequest.user_text_prompt("Write a haiku about the sea to haiku.txt")],
        model_settings={"tool_choice": "required"},
        model_request_parameters=ModelRequestParameters(function_tools=[WRITE_FILE]),
    )
    assert len(response.parts) == 1
    call = response.parts[0]
    assert isinstance(call, ToolCallPart)
    assert call.tool_name == "write_file"
    args = call.args_as_dict()
    assert set(args) == {"path", "content", "mode", "line_count"}
    assert isinstance(args["path"], str)
    assert isinstance(args["content"], str)
    assert args["mode"] in ("create", "overwrite", "append")
    assert isinstance(args["line_count"], int) and args["line_count"] >= 1
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0


async def test_agent_executes_the_local_models_tool_call() -> None:
    class Sum(BaseModel):
        total: int

    @dataclass
    class AddFirst(AbstractCapability[None]):
        """Require the add tool on the first request, then the answer (as the engine will)."""

        def get_model_settings(self) -> Callable[[RunContext[None]], ModelSettings]:
            return lambda ctx: {"tool_choice": ["add"] if ctx.run_step <= 1 else "none"}

    calls: list[tuple[int, int]] = []
    agent = Agent(resolve_model("local"), output_type=Sum, capabilities=[AddFirst()])

    @agent.tool_plain
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append((a, b))
        return a + b

    result = await agent.run("Use the add tool to add 17 and 25.")
    assert len(calls) == 1
    assert all(isinstance(a, int) and isinstance(b, int) for a, b in calls)
    assert isinstance(result.output, Sum)
    assert result.usage.requests == 2


async def test_concurrent_calls_share_one_loaded_model() -> None:
    from masterplanner.models.local import LocalModel

    first = resolve_model("local")
    second = resolve_model("local")
    assert isinstance(first, LocalModel) and isinstance(second, LocalModel)
    assert first.runtime() is second.runtime()
    results = await asyncio.gather(
        *(
            Agent(model).run(f"Say the number {n}.", model_settings={"max_tokens": 16})
            for n, model in enumerate([first, second, first])
        )
    )
    assert all(isinstance(result.output, str) and result.output for result in results)


async def test_cancelled_generation_leaves_the_model_usable() -> None:
    model = resolve_model("local")
    agent = Agent(model)
    task = asyncio.create_task(
        agent.run("Write a very long story about the sea.", model_settings={"max_tokens": 1000})
    )
    await asyncio.sleep(0.5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    result = await agent.run("Reply with one word.", model_settings={"max_tokens": 8})
    assert result.output.strip()


def test_cli_chat_local_prints_answer_and_usage() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "masterplanner", "chat", "Name three colors", "--model", "local", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    assert payload["output"].strip()
    chat = payload["usage"]["by_purpose"]["chat"]
    assert chat["calls"] == 1
    assert chat["input_tokens"] > 0 and chat["output_tokens"] > 0


def test_cli_doctor_passes() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "masterplanner", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {check["name"]: check for check in json.loads(result.stdout)["checks"]}
    for name in ("embedded model file", "llama.cpp loads the model", "llama.cpp answers", "database"):
        assert checks[name]["ok"], checks[name]
    assert {check["required"] for name, check in checks.items() if name.startswith("sandbox")} == {False}


def test_a_request_past_the_context_window_is_told_so_in_our_words() -> None:
    from masterplanner import ModelError, chat

    with pytest.raises(ModelError) as refused:
        chat("sea " * 12_000, model="local")
    assert str(refused.value).endswith(
        "more than its context window of 8,192 (setting local_context_tokens): give it a shorter task "
        "or inputs, or a model with a larger window"
    )
    assert "Requested tokens" not in str(refused.value)
