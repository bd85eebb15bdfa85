"""`masterplanner serve` as a process: it stops promptly when told to, live streams and all."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from _serve import serving
from masterplanner.telemetry import EXPORT_TIMEOUT_S


def _stream(url: str, path: str) -> http.client.HTTPResponse:
    """A live event stream, opened: its headers and first event read."""
    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname or "", where.port, timeout=60)
    connection.request("GET", path, headers={"Accept": "text/event-stream"})
    response = connection.getresponse()
    assert response.status == 200
    assert response.readline().startswith(b"event: ")
    return response


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_the_server_stops_at_once_with_live_streams_of_a_run_that_is_not_over(
    isolated: Path, write_script: Callable[..., Path], signum: int
) -> None:
    step = {"id": "a", "title": "a", "instruction": "Do a.", "agent_role": "worker", "tools": []}
    planner = {"purpose": "planner", "output": {"steps": [step]}}
    script = write_script([planner, {"purpose": "*", "repeat": True}])
    with serving(isolated / "serve.log") as url:
        options = {"prompt_rounds": 0}
        body = json.dumps({"task": "one step", "model": f"scripted:{script}", "options": options})
        request = urllib.request.Request(
            f"{url}/api/v1/runs", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            run_id = json.loads(response.read())["id"]
        deadline = time.monotonic() + 60
        while json.loads(urllib.request.urlopen(f"{url}/api/v1/runs/{run_id}").read())["status"] != (
            "awaiting_approval"
        ):  # the run waits for its review: it is not over, and its streams stay open
            assert time.monotonic() < deadline, "the run did not come to its review"
            time.sleep(0.2)
        api = _stream(url, f"/api/v1/runs/{run_id}/events/stream")
        page = _stream(url, f"/runs/{run_id}/changes")
        started = time.monotonic()
        url.process.send_signal(signum)
        url.process.wait(timeout=30)
        took = time.monotonic() - started
        assert took < 5, f"the server took {took:.1f} s to stop"
        assert b"event: over" not in page.read()  # ended, not over: the page reconnects to the next server
        api.read()  # the stream has ended
    log = (isolated / "serve.log").read_text()
    assert "graceful shutdown" not in log and "Cancel" not in log, log


def test_serve_with_json_logs_writes_only_json_lines(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    """Before, `serving on …`, `terminated (SIGTERM)` and the trace exporter's retries were text."""
    step = {"id": "a", "title": "a", "instruction": "Do a.", "agent_role": "worker", "tools": []}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step]}},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "*", "repeat": True},
        ]
    )
    with socket.socket() as probe:  # a trace receiver that is down
        probe.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{probe.getsockname()[1]}"
    env = {
        **os.environ,
        "MASTERPLANNER_LOG_FORMAT": "json",
        "MASTERPLANNER_OTEL_ENDPOINT": down,
        "MASTERPLANNER_EMBEDDER": "none",
    }
    with serving(isolated / "serve.log", env=env) as url:
        body = json.dumps(
            {"task": "one step", "model": f"scripted:{script}", "options": {"auto_approve": True}}
        )
        request = urllib.request.Request(
            f"{url}/api/v1/runs", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            run_id = json.loads(response.read())["id"]
        deadline = time.monotonic() + 60
        while (
            json.loads(urllib.request.urlopen(f"{url}/api/v1/runs/{run_id}").read())["status"] != "succeeded"
        ):
            assert time.monotonic() < deadline, "the run did not succeed"
            time.sleep(0.2)
        time.sleep(2 * EXPORT_TIMEOUT_S)  # the run's spans were sent, and failed
    lines = (isolated / "serve.log").read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    # where to open the pages (it said only the API's address), and where the API is
    assert (entries[0]["url"], entries[0]["api"]) == (f"{url}/", f"{url}/api/v1")
    assert [(entry["logger"], entry["message"]) for entry in entries] == [
        (
            "masterplanner.serve",
            f"serving the web app on {url}/ (open it in a browser), its REST API on {url}/api/v1 "
            "(Ctrl-C stops)",
        ),
        ("masterplanner.telemetry", f"traces could not be sent to {down}/v1/traces: connection refused"),
        ("masterplanner.cli", "terminated (SIGTERM)"),
    ]
