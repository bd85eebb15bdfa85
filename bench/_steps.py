"""What the engine benchmarks share: a plan step in its public JSON form, and event times."""

from __future__ import annotations

from datetime import datetime
from typing import Any


def step(step_id: str, *deps: str) -> dict[str, Any]:
    """A step with no tools, titled by its id."""
    return {
        "id": step_id,
        "title": step_id,
        "instruction": f"Do {step_id}.",
        "agent_role": "worker",
        "tools": [],
        "depends_on": list(deps),
        "expected_output": "",
    }


def seconds(text: str) -> float:
    """A stored UTC time (`…Z`) as seconds since the epoch."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
