"""Adapting a stored team's plan to a new task like the one it solved.

Three ways, cheapest first:

- the same task (the same words, parameters and all): the plan is used as it is;
- the same words with different parameters (file names, numbers, URLs, quoted text): the old
  parameters are replaced by the new ones in every step and prompt, with no model call. Only when
  each old parameter that changes is in a step's instruction (quoted text with or without its
  quotes): a plan that wrote it in other words ("the top five products" for "top 5") would keep
  the old task, so it takes the next way;
- otherwise one model call (purpose `adapter`) rewrites each step's title, instruction and
  expected output for the new task. Step ids, tools and dependencies never change, so the
  stored agents still fit their steps.

Small models (whose plans come from the task's clauses, `clause_planner`) get only the first two:
asked to rewrite a stored haiku-about-the-sea plan for a poem about autumn leaves, the embedded
model keeps the sea, and the stored agents' prompts, which it wrote for the old task, name the
old subject too. For them a task the first two do not fit is planned afresh (one short call), so
nothing of an earlier task reaches a new one.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
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


def _replacer(olds: Iterable[str]) -> re.Pattern[str] | None:
    alternatives = sorted(olds, key=len, reverse=True)
    if not alternatives:
        return None
    # a whole token: not inside a word, a file name or a number (`report` in `report.md`, `5` in `5.5`)
    return re.compile("|".join(rf"(?<![\w.]){re.escape(old)}(?![\w]|\.\w)" for old in alternatives))


def _swap(text: str, pattern: re.Pattern[str], mapping: dict[str, str]) -> str:
    return pattern.sub(lambda match: mapping[match.group(0)], text)


def _unquoted(parameter: str) -> str | None:
    """Quoted text without its quotes.

    None for a parameter that is not quoted, or too short to be told apart from the plan's other
    words without them (`"a"`, `"to"`).
    """
    if len(parameter) > 4 and parameter[0] == parameter[-1] and parameter[0] in "\"'":
        return parameter[1:-1]
    return None


def _consistent(pairs: Iterable[tuple[str, str]]) -> dict[str, str] | None:
    """Each old text with its new one; None when one old text would become two different ones."""
    mapping: dict[str, str] = {}
    if all(mapping.setdefault(old, new) == new for old, new in pairs):
        return mapping
    return None


def _parameter_swaps(plan: Plan, old_task: str, new_task: str) -> dict[str, str] | None:
    """What to replace in the plan for `new_task`, when it is `old_task` with other parameters.

    None when the tasks differ in more than their parameters, or when an old parameter that
    changes is in no step's instruction: the plan wrote it in other words ("five" for 5), and
    swapping it where it is written as in the task would leave the old task in the instruction.
    Quoted text is also swapped without its quotes, as plans often write it.
    """
    old_shape, old_parameters = task_parameters(old_task)
    new_shape, new_parameters = task_parameters(new_task)
    if old_shape != new_shape or len(old_parameters) != len(new_parameters):
        return None
    mapping = _consistent(zip(old_parameters, new_parameters, strict=True))
    if mapping is None:
        return None
    changed = {old: new for old, new in mapping.items() if old != new}
    bare = [(inner, _unquoted(new) or new) for old, new in changed.items() if (inner := _unquoted(old))]
    swaps = _consistent([*changed.items(), *bare])
    instructions = [step.instruction for step in plan.steps]
    for old in changed:
        pattern = _replacer([old, _unquoted(old) or old])
        if pattern is None or not any(pattern.search(text) for text in instructions):
            return None
    return swaps


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
    swaps = _parameter_swaps(plan, old_task, new_task)
    if swaps is not None:
        data, new_agents = _with_parameters(plan, agents, new_task, swaps)
        return validate_plan(data, catalog), new_agents, "parameters" if swaps else "same"
    if uses_clause_plans(model):
        raise PlanError(
            [
                "a small model reuses a stored team only for the same task, or one that differs only in "
                "file names, numbers, URLs or quoted text: it plans a reworded task afresh rather than "
                "rewrite another task's plan"
            ],
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
