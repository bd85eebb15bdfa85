"""Plan-building helpers shared by the unit tests."""

from typing import Any


def step(step_id: str, *deps: str, tools: list[str] | None = None) -> dict[str, Any]:
    """A valid step in the public JSON form."""
    return {
        "id": step_id,
        "title": f"do {step_id}",
        "instruction": f"Do {step_id}.",
        "agent_role": "worker",
        "tools": tools if tools is not None else ["read_file"],
        "depends_on": list(deps),
        "expected_output": f"{step_id} done",
    }
