"""Events keep no secret `runs audit` hides: a tool call's credential headers and secrets in its arguments."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _plans import step

from _http_server import Received, Reply, http_server, json_reply, text_reply
from masterplanner import Settings
from masterplanner.engine import Engine, Event, RunOptions, RunRecord
from masterplanner.engine.tool_calls import _shown_in_events
from masterplanner.redaction import REMOVED
from masterplanner.service import RunService

SECRET = "sk-proj-a1b2c3d4e5f6g7h8i9j0"
NOTES_SERVER = str(Path(__file__).with_name("mcp_notes_server.py"))


def test_an_http_requests_credential_headers_are_masked_in_its_event() -> None:
    arguments = {
        "url": "https://api.example.com/v1",
        "headers": {
            "Authorization": "Bearer abcdefghijklmnop1234",
            "X-Api-Key": "plain",
            "X-Auth": "hunter2",
            "X-Password": "hunter2",
            "Accept": "text/plain",
        },
        "body": "password=hunter2hunter2",
    }
    assert _shown_in_events(arguments) == {
        "url": "https://api.example.com/v1",
        "headers": {
            "Authorization": REMOVED,
            "X-Api-Key": REMOVED,
            "X-Auth": REMOVED,
            "X-Password": REMOVED,
            "Accept": "text/plain",
        },
        "body": REMOVED,
    }
    assert arguments["headers"]["Authorization"] == "Bearer abcdefghijklmnop1234"  # the call's own copy


def test_a_long_argument_is_cut_and_keeps_no_secret_near_its_start() -> None:
    content = "token=abcdefghij1234567890 " + "a_" * 20_000
    shown = _shown_in_events({"path": "notes.txt", "content": content})
    assert shown == {"path": "notes.txt", "content": f"{REMOVED} " + "a_" * 91 + "a…"}


async def _opened(service: RunService, run_id: str, kind: str) -> Any:
    while True:
        found = [request for request in await service.pending(run_id) if request.kind == kind]
        if found:
            return found[0]
        await asyncio.sleep(0.05)


async def test_denied_calls_keep_no_secret_of_their_arguments_or_the_reason_in_the_run_s_events(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """One call denied by a person (whose reason quotes the key), one by policy: neither event keeps it."""
    write = {"name": "write_file", "args": {"path": "creds.txt", "content": f"OPENAI_API_KEY={SECRET}"}}
    read = {"name": "read_file", "args": {"path": f"OPENAI_API_KEY={SECRET}.txt"}}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("w", tools=["write_file", "read_file"])]}},
            {"purpose": "step:w", "tool_calls": [write]},
            {"purpose": "step:w", "tool_calls": [read]},
            {"purpose": "step:w", "output": "done"},
            {"purpose": "prompt_creator", "output": "You are a worker.", "repeat": True},
        ]
    )
    options = RunOptions(prompt_rounds=0, tool_policies={"write_file": "ask", "read_file": "deny"})
    engine = Engine(Settings.load())
    service = RunService(engine.settings)
    try:
        run = engine.create_run("w", model=f"scripted:{script}", options=options, workspace=tmp_path / "ws")
        execution = asyncio.ensure_future(engine.execute(run.id))
        try:
            review = await _opened(service, run.id, "plan_review")
            await service.answer(review.id, {"action": "approve"}, by="test")
            approval = await _opened(service, run.id, "tool_approval")
            # the person decides on the call as it is: the request holds it whole
            assert approval.payload["arguments"]["content"] == f"OPENAI_API_KEY={SECRET}"
            reason = f"never write OPENAI_API_KEY={SECRET} to a file"
            await service.answer(approval.id, {"approved": False, "reason": reason}, by="test")
            final = await asyncio.wait_for(execution, 60)
        finally:
            if not execution.done():
                execution.cancel()
        events = engine.store.events(run.id)
    finally:
        service.close()
        engine.close()
    assert (final.status, final.output) == ("succeeded", "done"), final.error
    assert not (tmp_path / "ws" / "creds.txt").exists()
    denied = [(event.step, event.data) for event in events if event.kind == "tool_denied"]
    reason_shown = f"never write {REMOVED} to a file"
    assert denied == [
        ("w", {"tool": "write_file", "by": "test", "request": approval.id, "reason": reason_shown}),
        ("w", {"tool": "read_file", "by": "policy"}),
    ]
    (asked,) = [event.data for event in events if event.kind == "tool_approval_requested"]
    assert asked["arguments"] == {"path": "creds.txt", "content": REMOVED}
    stored = json.dumps([event.to_json_dict() for event in events])
    assert SECRET not in stored and "a1b2c3d4e5f6" not in stored


async def test_what_a_tool_read_or_failed_with_keeps_no_secret_in_the_run_s_events(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """The step reads a file holding a key, and a call fails naming one: the events keep neither."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "config.txt").write_text("x" * 490 + f" OPENAI_API_KEY={SECRET}\nend\n")
    read = {"name": "read_file", "args": {"path": "config.txt"}}
    missing = {"name": "read_file", "args": {"path": f"token={SECRET}.txt"}}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("r", tools=["read_file"])]}},
            {"purpose": "step:r", "tool_calls": [read]},
            {"purpose": "step:r", "tool_calls": [missing]},
            {"purpose": "step:r", "output": "done"},
            {"purpose": "prompt_creator", "output": "You are a worker.", "repeat": True},
        ]
    )
    engine = Engine(Settings.load())
    try:
        run = engine.create_run(
            "r",
            model=f"scripted:{script}",
            options=RunOptions(prompt_rounds=0, auto_approve=True),
            workspace=workspace,
        )
        final = await engine.execute(run.id)
        events = engine.store.events(run.id)
    finally:
        engine.close()
    assert (final.status, final.output) == ("succeeded", "done"), final.error
    results = [event.data for event in events if event.kind == "tool_result"]
    assert [sorted(data) for data in results] == [["result", "tool"], ["error", "tool"]]
    # the key begins at character 491: taken out before the result was cut at 500
    assert results[0]["result"] == "x" * 490 + f" OPENAI_API_KEY={REMOVED}"[:10]
    assert REMOVED in results[1]["error"]
    stored = json.dumps([event.to_json_dict() for event in events])
    assert SECRET not in stored and "a1b2c3d4" not in stored


async def test_a_step_that_kept_calling_a_failing_tool_keeps_no_secret_in_its_error(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """The step fails for its model requests, naming its last failed call: neither the step's error
    nor its `step_failed` event keeps the key that call's error quoted."""
    missing = {"name": "read_file", "args": {"path": f"token={SECRET}.txt"}}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("r", tools=["read_file"])]}},
            {"purpose": "step:r", "tool_calls": [missing], "repeat": True},
            {"purpose": "prompt_creator", "output": "You are a worker.", "repeat": True},
        ]
    )
    engine = Engine(Settings.load())
    try:
        run = engine.create_run(
            "r",
            model=f"scripted:{script}",
            options=RunOptions(prompt_rounds=0, auto_approve=True, max_replans=0),
            workspace=tmp_path / "ws",
        )
        final = await engine.execute(run.id)
        steps = engine.store.steps(run.id)
        events = engine.store.events(run.id)
    finally:
        engine.close()
    expected = (
        "the step agent used more than 12 model requests (its last tool call failed: "
        f"file '{REMOVED} does not exist in the workspace)"
    )
    assert final.status == "failed"
    assert [(s.id, s.status, s.error) for s in steps] == [("r", "failed", expected)]
    assert [event.data for event in events if event.kind == "step_failed"] == [{"error": expected}]
    stored = json.dumps([event.to_json_dict() for event in events]) + str(final.error)
    assert SECRET not in stored and "a1b2c3d4" not in stored


def test_an_images_api_error_echoing_the_key_reaches_the_model_without_it(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server answering 401 with the key it was sent: the step's model reads the failure, not the key.

    The key has no provider's shape: it is known as the value of the images API's variable here.
    """
    key = "images-key-0123456789abcdef"

    def refusing(request: Received) -> Reply:
        sent = request.headers["Authorization"].removeprefix("Bearer ")
        return json_reply({"error": {"message": f"Incorrect API key provided: {sent}"}}, 401)

    monkeypatch.setenv("OPENAI_API_KEY", key)
    draw = {"name": "generate_image", "args": {"prompt": "a lighthouse", "path": "light.png"}}
    shown = "failed with HTTP 401: it refused the key in OPENAI_API_KEY"  # not the server's words
    with http_server(refusing) as server:  # the step's model is shown the failure without the key
        monkeypatch.setenv("MASTERPLANNER_IMAGE_BASE_URL", f"{server.url}/v1")
        expected = ["the images API at http://127.0.0.1:", shown]
        final, events = _one_tool_call_run(write_script, tmp_path, draw, expected)
    assert (final.status, final.output, final.error) == ("succeeded", "done", None)
    (result,) = [event.data for event in events if event.kind == "tool_result"]
    assert result["tool"] == "generate_image" and shown in result["error"]
    stored = json.dumps([event.to_json_dict() for event in events])
    assert key not in stored and "0123456789abcdef" not in stored


def test_a_search_servers_error_quoting_its_url_reaches_the_model_and_events_without_the_password(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SearXNG behind basic auth answers 401; httpx's error quotes the whole URL, password and all.

    The step's model, the `tool_result` event and the run keep the user name and the host, not the password.
    """

    with http_server(Reply(401)) as server:
        port = server.port
        monkeypatch.setenv("MASTERPLANNER_WEB_SEARCH_BACKEND", "searxng")
        monkeypatch.setenv("MASTERPLANNER_SEARXNG_URL", f"http://alice:s3cretpass@127.0.0.1:{port}")
        search = {"name": "web_search", "args": {"query": "tides"}}
        shown = (
            f"Client error '401 Unauthorized' for url "
            f"'http://alice:{REMOVED}@127.0.0.1:{port}/search?q=tides&format=json'"
        )
        final, events = _one_tool_call_run(write_script, tmp_path, search, [shown])
    assert (final.status, final.output, final.error) == ("succeeded", "done", None), final.error
    (result,) = [event.data for event in events if event.kind == "tool_result"]
    assert result["tool"] == "web_search" and shown in result["error"]
    stored = json.dumps([event.to_json_dict() for event in events])
    assert "s3cretpass" not in stored


def _one_tool_call_run(
    write_script: Callable[..., Path], tmp_path: Path, call: dict[str, Any], expected: list[str]
) -> tuple[RunRecord, list[Event]]:
    """A run of one step that makes `call` and is then shown `expected` (the scripted `expect`), ended."""
    tool = call["name"]
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step("t", tools=[tool])]}},
            {"purpose": "step:t", "tool_calls": [call]},
            {"purpose": "step:t", "expect": expected, "output": "done"},
            {"purpose": "prompt_creator", "output": "You are a worker.", "repeat": True},
        ]
    )
    options = RunOptions(prompt_rounds=0, auto_approve=True, max_replans=0, tool_policies={tool: "auto"})
    engine = Engine(Settings.load())
    try:
        run = engine.create_run("t", model=f"scripted:{script}", options=options, workspace=tmp_path / "ws")
        final = asyncio.run(engine.execute(run.id))
        return final, engine.store.events(run.id)
    finally:
        engine.close()


@pytest.mark.parametrize("tool", ["read_file", "http_request", "mcp"])
def test_a_tool_s_result_holding_a_secret_reaches_the_model_events_and_database_without_it(
    tool: str,
    isolated: Path,
    write_script: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A file, a page or an MCP tool's answer shows a secret's value, of no key's shape: before, the
    call's result went to the model, and into the run's checkpoint, whole (only its event hid it).

    The key of an environment variable (a file, a page), or one known only to the settings (an MCP
    server's `env`).
    """
    key = "plainvalue0123456789zq"
    with http_server(text_reply(f"the key is {key}.")) as server:
        url = f"{server.url}/debug"
        (tmp_path / "ws").mkdir()
        (tmp_path / "ws" / "notes.txt").write_text(f"the key is {key}.\n")
        if tool == "mcp":
            key = key.upper()  # the server shouts
            servers = {
                "notes": {"command": sys.executable, "args": [NOTES_SERVER], "env": {"NOTES_TOKEN": key}}
            }
            monkeypatch.setenv("MASTERPLANNER_MCP_SERVERS", json.dumps(servers))
            call, shown = {"name": "notes_shout", "args": {"text": "whoami"}}, f"SIGNED IN WITH {REMOVED}"
        else:
            monkeypatch.setenv("OPENAI_API_KEY", key)
            monkeypatch.setenv("MASTERPLANNER_HTTP_ALLOWED_DOMAINS", '["127.0.0.1"]')
            monkeypatch.setenv("MASTERPLANNER_HTTP_ALLOW_LOOPBACK", "true")
            shown = f"the key is {REMOVED}."
            call = (
                {"name": "read_file", "args": {"path": "notes.txt"}}
                if tool == "read_file"
                else {"name": "http_request", "args": {"url": url}}
            )
        # the step's model is shown the result with the key taken out
        final, events = _one_tool_call_run(write_script, tmp_path, call, [shown])
    assert (final.status, final.output, final.error) == ("succeeded", "done", None)
    (result,) = [event.data for event in events if event.kind == "tool_result"]
    assert shown in result["result"]
    stored = json.dumps([event.to_json_dict() for event in events])
    assert key not in stored and "0123456789" not in stored
    # nor the database (the call's result, the model's messages): its files, and the checkpoints
    # in them, which are base64 and never held the key's bytes as written
    database = [path.read_bytes() for path in isolated.rglob("*") if path.is_file()] + _checkpoints(isolated)
    assert [data for data in database if key.encode() in data] == []
    assert any(shown.encode() in data for data in _checkpoints(isolated))  # the call's was read


def test_source_code_a_tool_reads_reaches_the_model_as_code_with_only_the_secret_taken_out(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`api_key = settings.api_key_for_tests` is code: read as a message, the whole line went, and a
    step that wrote the file back put the marker into the person's file in place of the line."""
    key = "plainvalue0123456789zq"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    (tmp_path / "ws").mkdir()
    code = "api_key = settings.api_key_for_tests\npassword = 'hunter2hunter2'\n"
    (tmp_path / "ws" / "client.py").write_text(code + f"token = {key}\n")
    shown = f"api_key = settings.api_key_for_tests\npassword = '{REMOVED}'\ntoken = {REMOVED}"
    final, events = _one_tool_call_run(
        write_script, tmp_path, {"name": "read_file", "args": {"path": "client.py"}}, [shown]
    )
    assert (final.status, final.output, final.error) == ("succeeded", "done", None)
    assert key not in json.dumps([event.to_json_dict() for event in events])


def test_a_dotenv_file_a_tool_reads_reaches_the_model_without_its_credentials(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """`API_KEY=…` and `DB_PASSWORD=…` unquoted, of values no setting knows and of no key's shape
    (a workspace's `.env`): before, the model, the checkpoint and the event were given them whole."""
    (tmp_path / "ws").mkdir()
    dotenv = "API_KEY=live0abc123def456\nDB_PASSWORD=hunter2hunter2\nDB_HOST=db.example.org\n"
    (tmp_path / "ws" / "app.env").write_text(dotenv)
    shown = f"API_KEY={REMOVED}\nDB_PASSWORD={REMOVED}\nDB_HOST=db.example.org"
    final, events = _one_tool_call_run(
        write_script, tmp_path, {"name": "read_file", "args": {"path": "app.env"}}, [shown]
    )
    assert (final.status, final.output, final.error) == ("succeeded", "done", None)
    (result,) = [event.data for event in events if event.kind == "tool_result"]
    assert shown in result["result"]
    stored = [path.read_bytes() for path in isolated.rglob("*") if path.is_file()] + _checkpoints(isolated)
    held = [data for data in stored if b"live0abc123def456" in data or b"hunter2hunter2" in data]
    assert held == []


def test_a_quoted_dotenv_file_and_code_a_tool_reads_reach_the_model_with_only_the_values_taken_out(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """Quoted values under names ending in pass, auth or key reached the model, the event and the
    checkpoint whole; a quoted `DB_PASSWORD` lost its whole line, name and quotes too; and code
    (`this.apiKey = config.apiKey;`) and a path lost their values, which a step writing the file
    back put into the person's file as the marker."""
    (tmp_path / "ws").mkdir()
    read = (
        'DB_PASS="correcthorse123"\n'
        "export AUTH='abc123def456'\n"
        'DB_PASSWORD="xhunter2hunter2"\n'
        "SSH_KEY=~/.ssh/id_ed25519\n"
        "this.apiKey = config.apiKey;\n"
    )
    (tmp_path / "ws" / "app.env").write_text(read)
    shown = (
        f'DB_PASS="{REMOVED}"\nexport AUTH=\'{REMOVED}\'\nDB_PASSWORD="{REMOVED}"\n'
        "SSH_KEY=~/.ssh/id_ed25519\nthis.apiKey = config.apiKey;"
    )
    final, events = _one_tool_call_run(
        write_script, tmp_path, {"name": "read_file", "args": {"path": "app.env"}}, [shown]
    )
    assert (final.status, final.output, final.error) == ("succeeded", "done", None)
    (result,) = [event.data for event in events if event.kind == "tool_result"]
    # the event is redacted as what is shown (`redacted`), where hiding the code line too costs nothing
    assert result["result"].startswith(shown.rsplit("\n", 1)[0] + "\n")
    stored = [path.read_bytes() for path in isolated.rglob("*") if path.is_file()] + _checkpoints(isolated)
    values = (b"correcthorse", b"abc123def", b"hunter2")
    assert [data for data in stored if any(value in data for value in values)] == []


@pytest.mark.parametrize("tool", ["read_file", "http_request"])
def test_json_credentials_a_tool_read_reach_the_model_events_and_database_without_their_values(
    tool: str,
    isolated: Path,
    write_script: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A workspace's `config.json` or an API's JSON reply naming a password and a key, of values no
    setting knows and of no key's shape: before, the model, the event and the checkpoint were
    given them whole. The names and the other members stay, and the JSON stays JSON."""
    held = {"password": "hunter2hunter2", "api_key": "abcd1234efgh", "token_count": 12, "user": "alice"}
    body = json.dumps(held).encode()
    with http_server(Reply(200, body, "application/json")) as server:
        url = f"{server.url}/v1/session"
        monkeypatch.setenv("MASTERPLANNER_HTTP_ALLOWED_DOMAINS", '["127.0.0.1"]')
        monkeypatch.setenv("MASTERPLANNER_HTTP_ALLOW_LOOPBACK", "true")
        (tmp_path / "ws").mkdir()
        (tmp_path / "ws" / "config.json").write_bytes(body)
        shown = f'{{"password": "{REMOVED}", "api_key": "{REMOVED}", "token_count": 12, "user": "alice"}}'
        call = (
            {"name": "read_file", "args": {"path": "config.json"}}
            if tool == "read_file"
            else {"name": "http_request", "args": {"url": url}}
        )
        # the step's model is shown the JSON without the values
        final, events = _one_tool_call_run(write_script, tmp_path, call, [shown])
    assert (final.status, final.output, final.error) == ("succeeded", "done", None), final.error
    (result,) = [event.data for event in events if event.kind == "tool_result"]
    assert shown in result["result"]
    stored = [path.read_bytes() for path in isolated.rglob("*") if path.is_file()] + _checkpoints(isolated)
    assert [data for data in stored if b"hunter2hunter2" in data or b"abcd1234efgh" in data] == []


def _checkpoints(home: Path) -> list[bytes]:
    """The steps' checkpoints (DBOS's recorded step outputs), which the database holds as base64."""
    import base64
    import sqlite3

    with sqlite3.connect(home / "masterplanner.sqlite") as database:
        rows = database.execute("SELECT output FROM operation_outputs WHERE output IS NOT NULL").fetchall()
    return [base64.b64decode(output) for (output,) in rows]


def _long_page(key: str) -> str:
    """A page longer than `http_request` keeps, whose cap falls inside the `key` it shows."""
    from masterplanner.tools.http import HttpPolicy

    line = "." * 79 + "\n"
    cap = HttpPolicy().max_bytes
    filler = line * ((cap - 11) // len(line))
    filler += "." * (cap - 11 - len(filler) - 1) + " "
    return f"{filler}{key} and more after it.\n"  # the cap keeps 11 of the key's 22


def test_a_secret_the_tool_s_output_cap_cuts_keeps_no_part_of_itself(
    isolated: Path,
    write_script: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The body is cut at `http_request`'s cap 11 characters into a held key: before, those 11 were
    neither the key nor of a key's shape, and reached the checkpoint (and a model with room for
    the whole result)."""
    key = "plainvalue0123456789zq"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    monkeypatch.setenv("MASTERPLANNER_HTTP_ALLOWED_DOMAINS", '["127.0.0.1"]')
    monkeypatch.setenv("MASTERPLANNER_HTTP_ALLOW_LOOPBACK", "true")
    (tmp_path / "ws").mkdir()
    with http_server(text_reply(_long_page(key))) as server:
        call = {"name": "http_request", "args": {"url": f"{server.url}/long"}}
        final, _ = _one_tool_call_run(write_script, tmp_path, call, ["HTTP 200 from"])
    assert (final.status, final.output, final.error) == ("succeeded", "done", None), final.error
    part = key[:11].encode()  # what the cap kept of it
    stored = [path.read_bytes() for path in isolated.rglob("*") if path.is_file()] + _checkpoints(isolated)
    (result,) = [data for data in _checkpoints(isolated) if b"HTTP 200 from" in data]
    assert b". \n[\xe2\x80\xa6 truncated]" in result  # the body, cut before the key's start
    assert [data for data in stored if part in data] == []
