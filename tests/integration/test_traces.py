"""A run's trace reaches a real OTLP/HTTP receiver as one span tree: run → step → model request → tool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _otlp import ReceivedSpan, otlp_receiver


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
