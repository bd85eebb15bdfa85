"""ask_user through the front end, and generate_image against a real local images API (openai client)."""

from __future__ import annotations

import asyncio
import base64
import json
import struct
import threading
import zlib
from collections.abc import Callable, Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from _answers import execute_answering
from _plans import step

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


@pytest.fixture
def images_api() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    server, received = _images_server(
        200, {"created": 0, "data": [{"b64_json": base64.b64encode(_png()).decode()}]}
    )
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", received
    server.shutdown()


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
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            reply = b"<html>hello</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
        workspace = Workspace(tmp_path / "ws").create()
        with pytest.raises(ToolError) as failed:
            asyncio.run(generate_image(ImageConfig(model="m", base_url=url), workspace, "a cat", "cat.png"))
    finally:
        server.shutdown()
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


def _images_server(status: int, body: dict[str, Any]) -> tuple[ThreadingHTTPServer, list[dict[str, Any]]]:
    """An images API on 127.0.0.1 answering every request with `status` and `body`; what it was sent
    (each request's path, its `Authorization` and its JSON body's fields)."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            sent = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append({"path": self.path, "auth": self.headers["Authorization"], **sent})
            reply = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, received


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
    status: int, message: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK tried a failed request once more unseen, and its own text (advice, links) was the error."""
    error = {"message": message, "type": "server_error", "code": "invalid_api_key" if status == 401 else None}
    server, received = _images_server(status, {"error": error})
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
        workspace = Workspace(tmp_path / "ws").create()
        with pytest.raises(ToolError) as failed:
            asyncio.run(generate_image(ImageConfig(model="m", base_url=url), workspace, "a cat", "cat.png"))
    finally:
        server.shutdown()
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
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An image request's cost was never counted: reports left it out and --max-cost let it through."""
    from masterplanner.models import pricing

    monkeypatch.setattr(pricing, "_loopback", lambda url: False)  # the test's API is priced as OpenAI's
    reply = {"created": 0, "data": [{"b64_json": base64.b64encode(_png()).decode()}], "usage": _IMAGE_USAGE}
    server, received = _images_server(200, reply)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
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
        server.shutdown()


@pytest.mark.parametrize(
    "usage",
    [{"prompt_tokens": 10, "completion_tokens": 4160, "total_tokens": 4170}, {"total_tokens": 4170}, "lots"],
    ids=["chat-form", "total-only", "not-an-object"],
)
async def test_an_image_reply_whose_usage_says_no_tokens_is_of_unknown_price_and_gives_back_its_hold(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, usage: object
) -> None:
    """Counting it failed with Python's `None + None`: the step failed so, the image priced $0, and
    its budget reservation stayed held."""
    from masterplanner.models import pricing

    monkeypatch.setattr(pricing, "_loopback", lambda url: False)  # the test's API is priced as OpenAI's
    reply = {"created": 0, "data": [{"b64_json": base64.b64encode(_png()).decode()}], "usage": usage}
    server, received = _images_server(200, reply)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
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
        server.shutdown()


async def test_an_image_request_the_api_failed_is_a_failed_call_of_the_step(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was made (the API answered HTTP 500) but not counted: the run's calls left it out."""
    server, received = _images_server(500, {"error": {"message": "the server had an error"}})
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
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
        server.shutdown()


async def test_an_image_model_of_unknown_price_is_refused_under_a_money_budget(
    isolated: Path, write_script: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a run's model of unknown price is: its cost could not be held to the budget."""
    from masterplanner.models import pricing

    monkeypatch.setattr(pricing, "_loopback", lambda url: False)
    reply = {"created": 0, "data": [{"b64_json": base64.b64encode(_png()).decode()}]}
    server, received = _images_server(200, reply)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
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
        server.shutdown()
