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


APPROVED_AS_SHOWN = ["run_created", "plan_ready", "approval_requested", "request_answered", "approved"]
"""A run's events to the approval of a review answered as it was shown (no `plan_edited`)."""


def to_approval(kinds: list[str]) -> tuple[list[str], bool]:
    """A run's event kinds to its approval, and whether a `plan_edited` is among them all.

    The `planning_progress` events (which part of planning is under way) are left out.
    """
    shown = [kind for kind in kinds if kind != "planning_progress"]
    return shown[: shown.index("approved") + 1], "plan_edited" in kinds
