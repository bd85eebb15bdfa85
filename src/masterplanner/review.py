"""Review: the plan and prompts as a person edits them (YAML), and turning an edit back into a plan.

Front ends (the CLI now, the web UI later) show the plan, let the person edit it, and submit a
decision; this module holds what they share. An edit is parsed and validated as a whole: any
problem is reported with what and where (YAML line, step and field), and nothing is applied.
"""

from __future__ import annotations

from typing import Any

import yaml

from .errors import PlanError
from .plan import Plan, validate_plan
from .tools import Catalog

__all__ = ["ERROR_MARK", "parse_review_yaml", "render_review_yaml", "with_errors_on_top"]

ERROR_MARK = "# ERROR: "
"""How validation errors are written at the top of a reopened edit (YAML comments, so ignored)."""

_HEADER = (
    "# Edit the plan and each step's prompt, then save and close the editor.\n"
    "# Remove a step by deleting it; dependencies name step ids. Lines starting with # are ignored.\n"
)
_STEP_KEYS = ("id", "title", "agent_role", "tools", "depends_on", "instruction", "expected_output")


class _Dumper(yaml.SafeDumper):
    """Writes multi-line strings as literal blocks, so prompts stay readable and editable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render_review_yaml(plan: Plan, agents: dict[str, Any] | None = None) -> str:
    """The YAML a person edits: the task, the final step, and every step with its prompt."""
    steps = []
    for step in plan.steps:
        data = step.model_dump(mode="json")
        entry = {key: data[key] for key in _STEP_KEYS}
        prompt = ((agents or {}).get(step.id) or {}).get("prompt")
        if prompt:
            entry["prompt"] = prompt.rstrip() + "\n" if "\n" in prompt else prompt
        steps.append(entry)
    document: dict[str, Any] = {"task": plan.task}
    if plan.final_step:
        document["final_step"] = plan.final_step
    document["steps"] = steps
    body = yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)
    return _HEADER + body


def with_errors_on_top(text: str, error: PlanError) -> str:
    """`text` with earlier error lines removed and `error`'s problems written at the top."""
    kept = [line for line in text.splitlines() if not line.startswith(ERROR_MARK)]
    marks = [f"{ERROR_MARK}{problem}" for problem in error.problems]
    return "\n".join([*marks, *kept]) + "\n"


def parse_review_yaml(
    text: str, catalog: Catalog, agents: dict[str, Any] | None = None
) -> tuple[Plan, dict[str, Any]]:
    """Read an edited review back: the validated plan and the agents map with edited prompts.

    Raises `PlanError` naming each problem; the plan and prompts given are never changed.
    """
    try:
        document = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"
        raise PlanError(
            [f"the edit is not valid YAML at {where}: {exc.problem}"], context="invalid edit"
        ) from None
    except yaml.YAMLError as exc:
        raise PlanError([f"the edit is not valid YAML: {exc}"], context="invalid edit") from None
    if not isinstance(document, dict):
        raise PlanError(["the edit must be a mapping with 'task' and 'steps'"], context="invalid edit")
    raw_steps = document.get("steps")
    prompts: dict[str, str] = {}
    if isinstance(raw_steps, list):
        cleaned = []
        for step in raw_steps:
            if isinstance(step, dict) and "prompt" in step:
                step = dict(step)
                prompt = step.pop("prompt")
                if isinstance(step.get("id"), str):
                    if not isinstance(prompt, str) or not prompt.strip():
                        raise PlanError(
                            [f"step {step['id']}: prompt must be non-empty text"], context="invalid edit"
                        )
                    prompts[step["id"]] = prompt
            cleaned.append(step)
        document = {**document, "steps": cleaned}
    plan = validate_plan(document, catalog)
    new_agents: dict[str, Any] = {}
    for step in plan.steps:
        before = dict((agents or {}).get(step.id) or {})
        if step.id in prompts and prompts[step.id].strip() != str(before.get("prompt", "")).strip():
            before = {**before, "prompt": prompts[step.id], "edited": True}
        if before:
            new_agents[step.id] = before
    return plan, new_agents
