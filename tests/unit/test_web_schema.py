"""schemathesis against the served OpenAPI document: no 5xx, and every response as the schema says."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A real `masterplanner serve` with a home of its own; its runs use a scripted model."""
    folder = tmp_path_factory.mktemp("schema")
    script = folder / "script.json"
    script.write_text(json.dumps({"calls": [{"purpose": "*", "repeat": True}]}))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {key: value for key, value in os.environ.items() if not key.startswith("MASTERPLANNER_")}
    env |= {"MASTERPLANNER_HOME": str(folder / "home"), "MASTERPLANNER_MODEL": f"scripted:{script}"}
    env["MASTERPLANNER_EMBEDDER"] = "none"  # agent search by text alone: no model to load per query
    log = folder / "serve.log"  # a file, not a pipe: nobody reads a pipe while the tests run
    with log.open("w") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "masterplanner", "serve", "--port", str(port)],
            env=env,
            cwd=folder,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/api/v1/health", timeout=2):
                break
        except OSError:
            time.sleep(0.2)
    else:
        process.kill()
        raise AssertionError(f"the server did not start: {log.read_text()}")
    yield url, f"scripted:{script}"
    process.terminate()
    process.wait(timeout=30)
    assert "Traceback" not in log.read_text(), log.read_text()  # no request made the server fail


@pytest.fixture
def api_schema(served: tuple[str, str]) -> Any:
    return schemathesis.openapi.from_url(f"{served[0]}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_keeps_to_its_schema(case: Any, served: tuple[str, str]) -> None:
    if case.path == "/api/v1/runs" and case.method.upper() == "POST" and isinstance(case.body, dict):
        # Runs start for real: keep them in the server's own home, on its scripted model. A field
        # that is valid is replaced by another valid value, so a case meant to be invalid stays so.
        for field, safe, longest in (("workspace", "workspace", 4_096), ("model", served[1], 2_000)):
            value = case.body.get(field)
            if value is None or (isinstance(value, str) and len(value) <= longest):
                case.body[field] = safe
    case.call_and_validate(base_url=served[0], timeout=20)
