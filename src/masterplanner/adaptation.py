"""Adapting a stored team's plan to a new task like the one it solved.

Three ways, cheapest first:

- the same task (the same words, parameters and all): the plan is used as it is;
- the same words with different parameters (file names, numbers, URLs, quoted text): the old
  parameters are replaced by the new ones in every step and prompt, with no model call;
- otherwise one model call (purpose `adapter`) rewrites each step's title, instruction and
  expected output for the new task. Step ids, tools and dependencies never change, so the
  stored agents still fit their steps.

Small models (whose plans come from the task's clauses, `clause_planner`) get only the first two:
asked to rewrite a stored haiku-about-the-sea plan for a poem about autumn leaves, the embedded
model keeps the sea, and the stored agents' prompts, which it wrote for the old task, name the
old subject too. For them a reworded task is planned afresh (one short call), so nothing of an
earlier task reaches a new one.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Literal

from .clause_planner import uses_clause_plans
from .errors import PlanError
from .plan import _LIMITS, Plan, validate_plan, validate_task
from .prompts import render
from .tools.catalog import Catalog
from .usage import UsageLedger

if TYPE_CHECKING:
    from pydantic_ai.models import Model

__all__ = ["Adaptation", "adapt_plan", "task_parameters"]

Adaptation = Literal["same", "parameters", "model"]

_PARAMETER = re.compile(
    r"https?://\S+[\w/]"  # URLs
    r"|\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'"  # quoted text
    r"|[\w./-]*\w\.[A-Za-z][A-Za-z0-9]{0,7}\b"  # file names
    r"|(?<![\w.])\d+(?:[.,:/-]\d+)*%?"  # numbers, dates, times
)
_TEXT_FIELDS = ("title", "instruction", "expected_output")


def task_parameters(task: str) -> tuple[str, list[str]]:
    """The task with its parameters blanked out (lower case, spaces normalised), and the parameters."""
    found = [match.group(0) for match in _PARAMETER.finditer(task)]
    shape = " ".join(_PARAMETER.sub("\x00", task).lower().split())
    return shape, found


def _replacer(mapping: dict[str, str]) -> re.Pattern[str] | None:
    if not mapping:
        return None
    alternatives = sorted(mapping, key=len, reverse=True)
    return re.compile("|".join(rf"(?<![\w.]){re.escape(old)}(?![\w])" for old in alternatives))


def _swap(text: str, pattern: re.Pattern[str], mapping: dict[str, str]) -> str:
    return pattern.sub(lambda match: mapping[match.group(0)], text)


def _with_parameters(
    plan: Plan, agents: dict[str, Any], task: str, mapping: dict[str, str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    pattern = _replacer(mapping)
    steps = []
    for step in plan.steps:
        data = step.model_dump(mode="json")
        if pattern is not None:
            for name in _TEXT_FIELDS:
                if isinstance(data.get(name), str):
                    data[name] = _swap(data[name], pattern, mapping)
        steps.append(data)
    new_agents = {}
    for step_id, agent in agents.items():
        agent = dict(agent)
        if pattern is not None and isinstance(agent.get("prompt"), str):
            agent["prompt"] = _swap(agent["prompt"], pattern, mapping)
        new_agents[step_id] = agent
    return {**plan.to_json_dict(), "task": task, "steps": steps}, new_agents


async def adapt_plan(
    plan: Plan,
    agents: dict[str, Any],
    old_task: str,
    new_task: str,
    catalog: Catalog,
    *,
    model: Model,
    ledger: UsageLedger | None = None,
) -> tuple[Plan, dict[str, Any], Adaptation]:
    """`plan` (made for `old_task`) and its agents' prompts, fitted to `new_task`.

    Raises `PlanError` or `ModelError` when the model's rewrite is unusable; the caller then
    plans afresh.
    """
    new_task = validate_task(new_task)
    old_shape, old_parameters = task_parameters(old_task)
    new_shape, new_parameters = task_parameters(new_task)
    if old_shape == new_shape and len(old_parameters) == len(new_parameters):
        mapping: dict[str, str] = {}
        consistent = all(
            mapping.setdefault(old, new) == new
            for old, new in zip(old_parameters, new_parameters, strict=True)
        )
        if consistent:
            changed = {old: new for old, new in mapping.items() if old != new}
            data, new_agents = _with_parameters(plan, agents, new_task, changed)
            return validate_plan(data, catalog), new_agents, "parameters" if changed else "same"
    if uses_clause_plans(model):
        raise PlanError(
            ["a small model plans a reworded task afresh rather than rewrite another task's plan"],
            context="adaptation",
        )
    rewritten = await _rewrite_steps(plan, old_task, new_task, model, ledger or UsageLedger())
    steps = [
        {**step.model_dump(mode="json"), **fields} for step, fields in zip(plan.steps, rewritten, strict=True)
    ]
    return validate_plan({**plan.to_json_dict(), "task": new_task, "steps": steps}, catalog), agents, "model"


async def _rewrite_steps(
    plan: Plan, old_task: str, new_task: str, model: Model, ledger: UsageLedger
) -> list[dict[str, str]]:
    from pydantic_ai import Agent, NativeOutput, StructuredDict

    from .agents import run_agent
    from .models import labelled

    text = {"type": "string", "minLength": 1}
    step_schema = {
        "type": "object",
        "properties": {name: text | {"maxLength": _LIMITS[name]} for name in _TEXT_FIELDS},
        "required": list(_TEXT_FIELDS),
        "additionalProperties": False,
    }
    count = len(plan.steps)
    schema = {
        "type": "object",
        "title": "AdaptedSteps",
        "properties": {
            "steps": {"type": "array", "items": step_schema, "minItems": count, "maxItems": count}
        },
        "required": ["steps"],
        "additionalProperties": False,
    }
    output: Any = StructuredDict(schema, name="adapted_steps", description="the steps, rewritten")
    if model.profile.get("supports_json_schema_output", False):
        output = NativeOutput(output)
    agent: Agent[None, dict[str, Any]] = Agent(
        labelled(model, "adapter", ledger),
        output_type=output,
        instructions="You adapt a plan that worked for one task to a similar task. Reply with JSON only.",
        retries=1,
    )
    prompt = render("adapter.j2", old_task=old_task, new_task=new_task, steps=plan.steps)
    result = await run_agent(agent, prompt)
    steps = result.get("steps") if isinstance(result, dict) else None
    if not isinstance(steps, list) or len(steps) != count:
        got = len(steps) if isinstance(steps, list) else "no"
        raise PlanError(
            [f"the adapted plan has {got} steps; the stored one has {count}"], context="adaptation"
        )
    rewritten = []
    for number, step in enumerate(steps, start=1):
        if not isinstance(step, dict) or not all(isinstance(step.get(name), str) for name in _TEXT_FIELDS):
            raise PlanError(
                [f"adapted step {number}: needs title, instruction and expected_output"], context="adaptation"
            )
        rewritten.append({name: step[name].strip() for name in _TEXT_FIELDS})
    return rewritten
