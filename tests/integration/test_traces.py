"""A run's trace reaches a real OTLP/HTTP receiver as one span tree: run → step → model request → tool."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _otlp import ReceivedSpan, otlp_receiver
from masterplanner.telemetry import EXPORT_TIMEOUT_S


def plan_step(step_id: str, *deps: str, tools: list[str]) -> dict[str, Any]:
    return {
        "id": step_id,
        "title": step_id,
        "instruction": f"Do {step_id}.",
        "agent_role": f"{step_id} worker",
        "tools": tools,
        "depends_on": list(deps),
        "expected_output": "",
    }


def test_a_run_is_one_trace_of_run_steps_requests_and_tool_calls(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    write = {"name": "write_file", "args": {"path": "a.txt", "content": "from a"}}
    steps = [plan_step("a", tools=["write_file"]), plan_step("b", "a", tools=[])]
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": steps}},
            {"purpose": "step:a", "turn": 1, "tool_calls": [write]},
            {"purpose": "step:a", "turn": 2, "output": "wrote a.txt"},
            {"purpose": "step:b", "output": "B"},
            {"purpose": "*", "repeat": True},
        ]
    )
    with otlp_receiver() as (url, spans):
        env = {**os.environ, "MASTERPLANNER_OTEL_ENDPOINT": url, "MASTERPLANNER_EMBEDDER": "none"}
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "masterplanner",
                "run",
                "a then b",
                "-m",
                f"scripted:{script}",
                "--yes",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        run_id = json.loads(done.stdout)["run_id"]
        received = list(spans)  # the process flushed its spans before it ended
    assert {span.trace_id for span in received} == {received[0].trace_id}  # one trace
    (run,) = [span for span in received if span.name == "invoke_workflow masterplanner"]
    assert run.parent_id == ""
    assert run.attributes["gen_ai.operation.name"] == "invoke_workflow"
    assert (run.attributes["masterplanner.run.id"], run.attributes["masterplanner.run.status"]) == (
        run_id,
        "succeeded",
    )
    by_id = {span.span_id: span for span in received}

    def under(parent: ReceivedSpan) -> list[str]:
        return sorted(span.name for span in received if span.parent_id == parent.span_id)

    agents = [span for span in received if span.name.startswith("invoke_agent ")]
    by_step = {span.attributes["gen_ai.agent.id"]: span for span in agents}
    assert sorted(by_step) == ["a", "b"] and len(agents) == 2
    assert {by_step["a"].name, by_step["b"].name} == {"invoke_agent a worker", "invoke_agent b worker"}
    assert all(span.parent_id == run.span_id for span in agents)
    chat = f"chat {script}"
    # step a: a request that calls the tool, the tool, the request that answers; step b: one request
    assert under(by_step["a"]) == [chat, chat, "execute_tool write_file"]
    assert under(by_step["b"]) == [chat]
    (tool,) = [span for span in received if span.name == "execute_tool write_file"]
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "write_file"
    requests = [span for span in received if span.name == chat]
    assert {by_id[span.parent_id].name for span in requests} >= {
        run.name,
        by_step["a"].name,
        by_step["b"].name,
    }
    planner = [span for span in requests if span.attributes["masterplanner.purpose"] == "planner"]
    assert planner and all(span.parent_id == run.span_id for span in planner)  # planning is under the run
    for request in requests:
        assert request.attributes["gen_ai.operation.name"] == "chat"
        assert request.attributes["gen_ai.provider.name"] == "scripted"
        assert request.attributes["gen_ai.usage.input_tokens"] > 0
        assert request.attributes["masterplanner.cost_usd"] == 0.0
    # nothing of the content: no prompt, output or tool argument in any attribute
    texts = json.dumps([span.attributes for span in received])
    assert "from a" not in texts and "Do a." not in texts and "wrote a.txt" not in texts


def _one_step_script(write_script: Callable[..., Path]) -> Path:
    steps = [plan_step("a", tools=[])]
    return write_script(
        [
            {"purpose": "planner", "output": {"steps": steps}},
            {"purpose": "step:a", "output": "A"},
            {"purpose": "*", "repeat": True},
        ]
    )


def _run_timed(
    script: Path, endpoint: str, variable: str = "MASTERPLANNER_OTEL_ENDPOINT"
) -> tuple[int, list[str], float, float]:
    """Run one task with traces sent to `endpoint`: exit code, stderr lines, summary's seconds, exit wait."""
    env = {**os.environ, variable: endpoint, "MASTERPLANNER_EMBEDDER": "none"}
    command = [sys.executable, "-m", "masterplanner", "run", "do a", "-m", f"scripted:{script}", "--yes"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    assert process.stderr is not None
    lines: list[str] = []
    summary_at = None
    for line in process.stderr:
        lines.append(line.rstrip("\n"))
        if " succeeded · " in line:
            summary_at = time.monotonic()
    code = process.wait(timeout=120)
    assert summary_at is not None, lines
    (summary,) = [line for line in lines if " succeeded · " in line]
    seconds = float(summary.split(" · ")[1].removesuffix(" s"))
    return code, lines, seconds, time.monotonic() - summary_at


def _nobody_listening() -> str:
    """An http URL on 127.0.0.1 at a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def _said(lines: list[str]) -> list[str]:
    """The lines of stderr about traces or their export."""
    return [line for line in lines if "trace" in line.lower() or "export" in line.lower()]


def test_a_receiver_that_does_not_answer_holds_the_run_up_for_moments_and_is_said_once(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    """Before, the run's summary counted a 5 s flush, the exit waited ~30 s of retries, and the
    exporter's own lines (`Transient error HTTPConnectionPool(…)`) went to stderr."""
    script = _one_step_script(write_script)
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        code, lines, seconds, exit_wait = _run_timed(script, url)
    assert code == 0, lines
    # before: a summary of 21.5 s and an exit ~30 s late; the bounds leave a loaded machine room
    assert seconds < 12 and exit_wait < 2 * EXPORT_TIMEOUT_S + 5, (seconds, exit_wait)
    assert _said(lines) == [f"traces could not be sent to {url}/v1/traces: no answer in time"]


def test_a_receiver_that_is_down_is_said_once_in_our_words(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    script = _one_step_script(write_script)
    down = _nobody_listening()
    code, lines, _seconds, exit_wait = _run_timed(script, down)
    assert code == 0, lines
    assert exit_wait < 2 * EXPORT_TIMEOUT_S + 5
    assert _said(lines) == [f"traces could not be sent to {down}/v1/traces: connection refused"]


def test_a_receiver_s_url_is_said_without_its_password_or_token(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    """Before, the line named the endpoint as configured, password and `?token=` value included."""
    script = _one_step_script(write_script)
    down = _nobody_listening()
    host = down.removeprefix("http://")
    endpoint = f"http://alice:Pw9sEcret@{host}/v1/traces?token=Tk81secret"
    code, lines, _seconds, _exit_wait = _run_timed(script, endpoint, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    assert code == 0, lines
    assert _said(lines) == [
        f"traces could not be sent to http://alice:[secret removed]@{host}/v1/traces?token=[secret removed]: "
        "connection refused"
    ]
    assert not [line for line in lines if "Pw9sEcret" in line or "Tk81secret" in line]


def test_the_standard_endpoint_variable_is_a_base_url_as_the_setting_is(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    script = _one_step_script(write_script)
    with otlp_receiver() as (url, spans):
        code, lines, _seconds, _exit_wait = _run_timed(script, url + "/", "OTEL_EXPORTER_OTLP_ENDPOINT")
        assert code == 0, lines
        assert "invoke_workflow masterplanner" in {span.name for span in spans}
    down = _nobody_listening()  # the message names the URL used
    code, lines, _seconds, _exit_wait = _run_timed(script, down, "OTEL_EXPORTER_OTLP_ENDPOINT")
    assert (code, _said(lines)) == (0, [f"traces could not be sent to {down}/v1/traces: connection refused"])


def test_each_end_of_a_retried_run_is_a_run_span_of_its_own_in_the_run_s_trace(
    isolated: Path, write_script: Callable[..., Path]
) -> None:
    """Before, the failed end and the retry's end were two spans with the same trace AND span id."""
    write = {"name": "write_file", "args": {"path": "a.txt", "content": "A"}}
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [plan_step("a", tools=["write_file"])]}},
            {"purpose": "step:a", "turn": 1, "tool_calls": [write]},  # the second turn is over the budget
            {"purpose": "*", "repeat": True},
        ]
    )
    mp = [sys.executable, "-m", "masterplanner"]
    with otlp_receiver() as (url, spans):
        env = {**os.environ, "MASTERPLANNER_OTEL_ENDPOINT": url, "MASTERPLANNER_EMBEDDER": "none"}
        first = subprocess.run(
            [
                *mp,
                "run",
                "a",
                "-m",
                f"scripted:{script}",
                "--yes",
                "--rounds",
                "0",
                "--max-calls",
                "2",
                "--json",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        run_id = json.loads(first.stdout)["run_id"]
        assert json.loads(first.stdout)["status"] == "failed", first.stderr
        again = subprocess.run(
            [*mp, "runs", "retry", run_id, "--max-calls", "20"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert again.returncode == 0, again.stderr
        received = list(spans)
    runs = [span for span in received if span.name == "invoke_workflow masterplanner"]
    assert len(runs) == 2 and runs[0].span_id != runs[1].span_id
    assert [
        (span.attributes["masterplanner.run.status"], span.attributes["masterplanner.run.retries"])
        for span in runs
    ] == [
        ("failed", 0),
        ("succeeded", 1),
    ]
    assert {span.trace_id for span in received} == {runs[0].trace_id}  # one trace
    assert runs[0].span_id != runs[1].span_id and runs[0].parent_id == runs[1].parent_id == ""
    agents = [span for span in received if span.name.startswith("invoke_agent ")]
    assert [span.parent_id for span in agents] == [runs[0].span_id, runs[1].span_id]  # each run's own step
