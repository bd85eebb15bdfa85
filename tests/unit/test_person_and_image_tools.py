"""ask_user through the front end, and generate_image against a real local images API (openai client)."""

from __future__ import annotations

import asyncio
import base64
import struct
import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _answers import execute_answering
from _plans import step

from _http_server import Received, Reply, http_server, json_reply
from masterplanner import Settings, ToolError
from masterplanner.engine import Engine, RunOptions
from masterplanner.errors import RequestError
from masterplanner.service import RunService
from masterplanner.tools.images import ImageConfig, generate_image
from masterplanner.tools.workspace import Workspace


def _png() -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00"))
        + chunk(b"IEND", b"")
    )


ImagesServer = Callable[[int, dict[str, Any]], tuple[str, list[dict[str, Any]]]]
"""Starts an images API (see `images_server`): its base URL and what it was sent."""


@pytest.fixture
def images_server() -> Iterator[ImagesServer]:
    """Starts images APIs on 127.0.0.1 (stopped after the test), each answering every request with
    `status` and `body`: its base URL, and what it was sent (each request's path, its
    `Authorization` and its JSON body's fields)."""
    with ExitStack() as servers:

        def start(status: int, body: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
            received: list[dict[str, Any]] = []

            def answer(request: Received) -> Reply:
                received.append(
                    {"path": request.path, "auth": request.headers["Authorization"], **request.json()}
                )
                return json_reply(body, status)

            served = servers.enter_context(http_server(answer))
            return f"{served.url}/v1", received

        yield start


@pytest.fixture
def images_api(images_server: ImagesServer) -> tuple[str, list[dict[str, Any]]]:
    return images_server(200, {"created": 0, "data": [{"b64_json": base64.b64encode(_png()).decode()}]})


def test_generate_image_saves_the_png(
    images_api: tuple[str, list[dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url, received = images_api
    workspace = Workspace(tmp_path / "ws").create()
    config = ImageConfig(model="test-image", base_url=url)
    with pytest.raises(ToolError, match="OPENAI_API_KEY, which is not set"):
        asyncio.run(generate_image(config, workspace, "a lighthouse", "art/light.png"))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    assert asyncio.run(generate_image(config, workspace, "a lighthouse", "art/light.png", "512x512")) == (
        f"wrote {len(_png())} bytes to art/light.png"
    )
    assert (workspace.root / "art" / "light.png").read_bytes() == _png()
    assert received == [
        {
            "path": "/v1/images/generations",
            "auth": "Bearer sk-local-test",
            "model": "test-image",
            "prompt": "a lighthouse",
            "size": "512x512",
            "n": 1,
            "response_format": "b64_json",
        }
    ]
    with pytest.raises(ToolError, match=r"path must end in \.png"):
        asyncio.run(generate_image(config, workspace, "x", "x.jpg"))
    with pytest.raises(ToolError, match="size must be one of"):
        asyncio.run(generate_image(config, workspace, "x", "x.png", "3x3"))


def test_an_images_api_answering_with_something_that_is_not_json_is_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    workspace = Workspace(tmp_path / "ws").create()
    with http_server(Reply(200, b"<html>hello</html>", "text/html")) as server:
        url = f"{server.url}/v1"
        with pytest.raises(ToolError) as failed:
            asyncio.run(generate_image(ImageConfig(model="m", base_url=url), workspace, "a cat", "cat.png"))
    assert str(failed.value) == f"the images API at {url} answered with something that is not JSON"


async def test_ask_user_goes_to_the_front_end(isolated: Path, write_script: Callable[..., Path]) -> None:
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("q", tools=["ask_user"])]}},
            {"purpose": "step:q", "tool_calls": [{"name": "ask_user", "args": {"question": "Which city?"}}]},
            {"purpose": "step:q", "output": "noted"},
            {"purpose": "*", "repeat": True},
        ]
    )
    asked: list[str] = []

    async def person(question: str) -> str:
        asked.append(question)
        return "Lisbon"

    engine = Engine(Settings.load())
    try:
        options = RunOptions(auto_approve=True, prompt_rounds=0)
        run = engine.create_run("ask", model=f"scripted:{script}", options=options)
        final = await execute_answering(engine, run.id, ask_person=person)
        assert final.status == "succeeded", final.error
        assert asked == ["Which city?"]
        result = next(e.data for e in engine.store.events(run.id) if e.kind == "tool_result")
        assert result == {"tool": "ask_user", "result": "Lisbon"}

        # unanswered, the question waits as a stored request; cancelling the run closes it
        run = engine.create_run("ask", model=f"scripted:{script}", options=options)
        execution = asyncio.ensure_future(engine.execute(run.id))
        service = RunService(engine.settings)
        try:
            pending: list[Any] = []
            while not pending:
                await asyncio.sleep(0.05)
                pending = await service.pending(run.id)
            [question] = pending
            assert (question.kind, question.step_id, question.payload) == (
                "ask_user",
                "q",
                {"question": "Which city?"},
            )
            with pytest.raises(RequestError, match="is an agent's question: answer it with a text"):
                await service.answer_plainly(question.id, approve=True, by="test")
            await service.cancel(run.id)
            final = await asyncio.wait_for(execution, 10)
            assert final.status == "cancelled"
            assert (await service.request(question.id)).state == "cancelled"
            with pytest.raises(RequestError, match=f"request {question.id} is cancelled"):
                await service.answer_plainly(question.id, text="Porto", by="test")
        finally:
            service.close()
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("status", "message", "said"),
    [
        (
            500,
            "The server had an error while processing your request. Sorry about that! You can retry your "
            "request, or contact us through our help center at help.openai.com if the error persists.",
            ": the server failed",
        ),
        (
            401,
            "Incorrect API key provided: sk-local-test. You can find your API key at "
            "https://platform.openai.com/account/api-keys.",
            " (invalid_api_key): it refused the key in OPENAI_API_KEY",
        ),
    ],
)
def test_a_failing_images_api_is_asked_once_and_said_in_our_words(
    status: int,
    message: str,
    said: str,
    images_server: ImagesServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK tried a failed request once more unseen, and its own text (advice, links) was the error."""
    error = {"message": message, "type": "server_error", "code": "invalid_api_key" if status == 401 else None}
    url, received = images_server(status, {"error": error})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    workspace = Workspace(tmp_path / "ws").create()
    with pytest.raises(ToolError) as failed:
        asyncio.run(generate_image(ImageConfig(model="m", base_url=url), workspace, "a cat", "cat.png"))
    assert str(failed.value) == f"the images API at {url} failed with HTTP {status}{said}"
    assert [sent["path"] for sent in received] == ["/v1/images/generations"]


_IMAGE_USAGE = {
    "input_tokens": 10,
    "output_tokens": 4160,
    "total_tokens": 4170,
    "input_tokens_details": {"text_tokens": 10, "image_tokens": 0},
}
"""What OpenAI's images API reports for a 1024x1024 image of gpt-image-1 at high quality."""


def _image_run(write_script: Callable[..., Path]) -> Path:
    return write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("a", tools=["generate_image"])]}},
            {
                "purpose": "step:a",
                "tool_calls": [
                    {"name": "generate_image", "args": {"prompt": "a lighthouse", "path": "light.png"}}
                ],
            },
            {"purpose": "step:a", "output": "drawn"},
            {"purpose": "*", "repeat": True},
        ]
    )


async def test_generate_image_is_counted_in_the_run_s_cost_and_held_to_its_money_budget(
    isolated: Path,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    images_server: ImagesServer,
) -> None:
    """An image request's cost was never counted: reports left it out and --max-cost let it through."""
    from masterplanner.models import pricing

    monkeypatch.setattr(pricing, "_loopback", lambda url: False)  # the test's API is priced as OpenAI's
    reply = {"created": 0, "data": [{"b64_json": base64.b64encode(_png()).decode()}], "usage": _IMAGE_USAGE}
    url, received = images_server(200, reply)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    engine = Engine(Settings.load(image_base_url=url, image_model="gpt-image-1"))
    options = RunOptions(auto_approve=True, prompt_rounds=0, tool_policies={"generate_image": "auto"})
    try:
        run = engine.create_run("draw", model=f"scripted:{_image_run(write_script)}", options=options)
        final = await engine.execute(run.id)
        assert final.status == "succeeded", final.error
        step_usage = engine.report(run.id)["usage"]["by_purpose"]["step:a"]
        # gpt-image-1 in the price table: $5 a million text tokens in, $40 a million out
        assert step_usage["calls"] == 3  # the step's two model requests and the image
        assert step_usage["cost_usd"] == pytest.approx(10 * 5e-6 + 4160 * 40e-6)
        assert step_usage["unpriced_calls"] == 0
        assert len(received) == 1

        # its worst case (the prompt's 12 bytes and 16 in, 4,160 out) cannot fit $0.10: not requested
        budgeted = replace(options, max_cost_usd=0.1)
        run = engine.create_run("draw", model=f"scripted:{_image_run(write_script)}", options=budgeted)
        final = await engine.execute(run.id)
        assert final.status == "failed"
        assert (
            "the run's money budget of $0.10 cannot take its next model request: it may cost up to $0.1665 "
            "and $0.1000 is left"
        ) in (final.error or "")
        assert len(received) == 1
    finally:
        engine.close()


@pytest.mark.parametrize(
    "usage",
    [{"prompt_tokens": 10, "completion_tokens": 4160, "total_tokens": 4170}, {"total_tokens": 4170}, "lots"],
    ids=["chat-form", "total-only", "not-an-object"],
)
async def test_an_image_reply_whose_usage_says_no_tokens_is_of_unknown_price_and_gives_back_its_hold(
    isolated: Path,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    usage: object,
    images_server: ImagesServer,
) -> None:
    """Counting it failed with Python's `None + None`: the step failed so, the image priced $0, and
    its budget reservation stayed held."""
    from masterplanner.models import pricing

    monkeypatch.setattr(pricing, "_loopback", lambda url: False)  # the test's API is priced as OpenAI's
    reply = {"created": 0, "data": [{"b64_json": base64.b64encode(_png()).decode()}], "usage": usage}
    url, received = images_server(200, reply)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    engine = Engine(Settings.load(image_base_url=url, image_model="gpt-image-1"))
    options = RunOptions(auto_approve=True, prompt_rounds=0, tool_policies={"generate_image": "auto"})
    try:
        run = engine.create_run("draw", model=f"scripted:{_image_run(write_script)}", options=options)
        final = await engine.execute(run.id)
        assert (final.status, final.error, len(received)) == ("succeeded", None, 1)
        step_usage = engine.report(run.id)["usage"]["by_purpose"]["step:a"]
        assert (step_usage["calls"], step_usage["unpriced_calls"]) == (3, 1)
        assert engine.store.spending(run.id).held_calls == 0
    finally:
        engine.close()


async def test_an_image_request_the_api_failed_is_a_failed_call_of_the_step(
    isolated: Path,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    images_server: ImagesServer,
) -> None:
    """It was made (the API answered HTTP 500) but not counted: the run's calls left it out."""
    url, received = images_server(500, {"error": {"message": "the server had an error"}})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    engine = Engine(Settings.load(image_base_url=url, image_model="gpt-image-1"))
    options = RunOptions(
        auto_approve=True, prompt_rounds=0, tool_policies={"generate_image": "auto"}, max_model_calls=10
    )
    try:
        run = engine.create_run("draw", model=f"scripted:{_image_run(write_script)}", options=options)
        final = await engine.execute(run.id)
        assert (final.status, final.error, len(received)) == ("succeeded", None, 1)  # the agent was told
        step_usage = engine.report(run.id)["usage"]["by_purpose"]["step:a"]
        assert (step_usage["calls"], step_usage["failed_calls"], step_usage["cost_usd"]) == (3, 1, 0.0)
        assert engine.store.spending(run.id).held_calls == 0
    finally:
        engine.close()


async def test_an_image_model_of_unknown_price_is_refused_under_a_money_budget(
    isolated: Path,
    write_script: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
    images_server: ImagesServer,
) -> None:
    """As a run's model of unknown price is: its cost could not be held to the budget."""
    from masterplanner.models import pricing

    monkeypatch.setattr(pricing, "_loopback", lambda url: False)
    reply = {"created": 0, "data": [{"b64_json": base64.b64encode(_png()).decode()}]}
    url, received = images_server(200, reply)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    engine = Engine(Settings.load(image_base_url=url, image_model="my-inhouse-painter"))
    options = RunOptions(
        auto_approve=True, prompt_rounds=0, tool_policies={"generate_image": "auto"}, max_cost_usd=1.0
    )
    try:
        run = engine.create_run("draw", model=f"scripted:{_image_run(write_script)}", options=options)
        final = await engine.execute(run.id)
        assert final.status == "succeeded", final.error
        result = next(e.data for e in engine.store.events(run.id) if e.kind == "tool_result")
        assert result == {
            "tool": "generate_image",
            "error": "the run has a money budget, and generate_image's model my-inhouse-painter is not in "
            "the price table, so the budget could not hold its cost: no image was requested",
        }
        assert received == []

        # without a budget it is made, and counted as of unknown price (the reply reported no tokens)
        unbudgeted = replace(options, max_cost_usd=None)
        run = engine.create_run("draw", model=f"scripted:{_image_run(write_script)}", options=unbudgeted)
        final = await engine.execute(run.id)
        assert final.status == "succeeded", final.error
        step_usage = engine.report(run.id)["usage"]["by_purpose"]["step:a"]
        assert (step_usage["calls"], step_usage["cost_usd"], step_usage["unpriced_calls"]) == (3, 0.0, 1)
        assert [sent["path"] for sent in received] == ["/v1/images/generations"]
    finally:
        engine.close()
