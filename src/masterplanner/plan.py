"""Plans: a task broken into steps that form a dependency graph. Plain data, no I/O.

The JSON form is a public contract (export, import, edits, the scripted model, the web UI):

```json
{"task": "…",
 "steps": [{"id": "load-data", "title": "…", "instruction": "…", "agent_role": "data analyst",
            "tools": ["read_file", "code_execution"], "depends_on": [], "expected_output": "…",
            "expand": false}],
 "final_step": "write-report"}
```

`validate_plan` checks everything a plan must satisfy and raises one `PlanError` listing every
problem, each naming its step (for a cycle: the cycle itself).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import PlanError, json_kind, known_fields, no_nul, nul_field, problem_in_our_words
from .redaction import secret_parts, secret_refusal
from .tools.catalog import Catalog

__all__ = [
    "DEFAULT_MAX_STEPS",
    "MAX_TASK_CHARS",
    "Plan",
    "Step",
    "dependents_of",
    "find_cycle",
    "plan_output_schema",
    "sinks",
    "steps_from_output",
    "steps_to_output",
    "tool_problems",
    "topological_order",
    "validate_plan",
    "validate_task",
]

DEFAULT_MAX_STEPS = 12
MAX_TASK_CHARS = 20_000
SLUG = re.compile(r"[a-z0-9][a-z0-9-]{0,39}")

# Bounds for what a model writes: they also keep grammar-constrained generation finite.
_LIMITS = {"title": 80, "instruction": 400, "agent_role": 40, "expected_output": 160}


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    return value


class Step(BaseModel):
    """One step of a plan: what an agent with `agent_role` must do, with which tools, after which steps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=40, description="short slug: lowercase letters, digits, hyphens")
    title: str = Field(min_length=1, max_length=200)
    instruction: str = Field(min_length=1, max_length=4000)
    agent_role: str = Field(min_length=1, max_length=100)
    tools: list[str] = Field(default_factory=list, max_length=12)
    depends_on: list[str] = Field(default_factory=list, max_length=64)
    expected_output: str = Field("", max_length=2000)
    expand: bool = False
    """Plan this step as a sub-plan when it becomes ready (its sub-steps are `<id>--<sub-id>`)."""

    @field_validator("id")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not SLUG.fullmatch(value):
            raise ValueError("must be a short slug of lowercase letters, digits and hyphens, e.g. load-data")
        return value

    @field_validator("title", "instruction", "agent_role")
    @classmethod
    def _filled(cls, value: str) -> str:
        return _not_blank(value)


class Plan(BaseModel):
    """A task and the steps that accomplish it; `final_step` (optional) gives the answer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS)
    steps: list[Step] = Field(min_length=1)
    final_step: str | None = None

    @field_validator("task")
    @classmethod
    def _a_task(cls, value: str) -> str:
        return _not_blank(no_nul(value))  # as `validate_task` refuses it

    def step(self, step_id: str) -> Step:
        """The step with this id (`KeyError` if there is none)."""
        for step in self.steps:
            if step.id == step_id:
                return step
        raise KeyError(step_id)

    @property
    def ids(self) -> list[str]:
        """Step ids in plan order."""
        return [step.id for step in self.steps]

    def to_json_dict(self) -> dict[str, Any]:
        """The public JSON form (without `final_step` when it is not set, nor `expand` when false)."""
        data = self.model_dump(mode="json", exclude_none=True)
        for step in data["steps"]:
            if not step["expand"]:
                del step["expand"]
        return data


def validate_task(task: str) -> str:
    """Return the task stripped, or raise `PlanError` if it is empty or too long, or not text.

    A task holding what looks like a secret is refused too: it would go into every planning and
    step prompt and be stored with the run (the check every front end's task passes through).
    """
    if not isinstance(task, str):
        raise PlanError([f"the task should be text, got {json_kind(task)}"], context="invalid task")
    text = task.strip()
    if not text:
        raise PlanError(["the task is empty"], context="invalid task")
    if len(text) > MAX_TASK_CHARS:
        raise PlanError(
            [f"the task is {len(text):,} characters; the limit is {MAX_TASK_CHARS:,}"], context="invalid task"
        )
    if "\x00" in text:  # text is never meant to hold it; searches stopped at it
        raise PlanError(["the task holds a NUL character"], context="invalid task")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate (text decoded with errors="surrogateescape")
            raise PlanError(
                ["the task holds a character that is not text (a lone surrogate)"], context="invalid task"
            ) from None
    if secret_parts(text):
        raise PlanError([secret_refusal("the task", not_in="the task")], context="invalid task")
    return text


def _shape_problems(error: ValidationError, raw: Mapping[str, Any]) -> list[str]:
    raw_steps = raw.get("steps")
    steps: list[Any] = raw_steps if isinstance(raw_steps, list) else []
    problems = []
    for item in error.errors():
        location = list(item["loc"])
        where = "plan"
        if len(location) >= 2 and location[0] == "steps" and isinstance(location[1], int):
            index = location[1]
            entry = steps[index] if index < len(steps) else None
            name = entry.get("id") if isinstance(entry, dict) else None
            where = f"step {name!r}" if isinstance(name, str) and name else f"step #{index + 1}"
            location = location[2:]
        field = ".".join(str(part) for part in location)
        message = problem_in_our_words(item, what=None if location else "a step")
        known = known_fields(Plan, item["loc"][:-1]) if item["type"] == "extra_forbidden" else None
        if known:  # before, only "colour: unknown field"
            message += f"; known: {', '.join(known)}"
        problems.append(f"{where}: {field + ': ' if field else ''}{message}")
    return problems


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A dependency cycle as a path `[a, b, …, a]` (each depends on the next), or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for neighbour in edges.get(node, ()):
            if neighbour not in edges:
                continue
            if state.get(neighbour) == 1:
                return [*path[path.index(neighbour) :], neighbour]
            if neighbour not in state and (cycle := visit(neighbour)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in edges:
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@runtime_checkable
class _ExplainsMissingTools(Protocol):
    """A catalog that can say why a tool is missing from it here (a run's catalog can)."""

    def why_missing(self, name: str) -> str | None:
        """What would make `name` available here, or None when nothing would."""
        ...


def tool_problems(step: Step, catalog: Catalog) -> list[str]:
    """What is wrong with the tools `step` names, given the tools `catalog` offers (one line each).

    A built-in tool the catalog leaves out "is not available here", with what enables it when
    the catalog knows (the run catalog, `engine/catalogs.py`: a setting, a key, the sandbox);
    any other name is an unknown tool.
    """
    missing = [tool for tool in step.tools if tool not in catalog]
    if not missing:
        return []
    from .tools.names import BUILTIN_TOOL_NAMES

    explain = catalog.why_missing if isinstance(catalog, _ExplainsMissingTools) else None
    where, available = f"step {step.id!r}", ", ".join(catalog.names) or "none"
    unknown: list[str] = []
    problems: list[str] = []
    for tool in missing:
        reason = explain(tool) if explain is not None else None
        if tool in BUILTIN_TOOL_NAMES:
            how = f": {reason}" if reason else f"; available: {available}"
            problems.append(f"{where}: tool {tool!r} is not available here{how}")
        elif reason:
            problems.append(f"{where}: unknown tool {tool!r}: {reason}; available: {available}")
        else:
            unknown.append(tool)
    if unknown:
        names = ", ".join(repr(tool) for tool in unknown)
        problems.insert(0, f"{where}: unknown tool {names}; available: {available}")
    return problems


def _graph_problems(plan: Plan, catalog: Catalog | None, max_steps: int) -> list[str]:
    problems: list[str] = []
    if len(plan.steps) > max_steps:
        problems.append(f"plan: {len(plan.steps)} steps; at most {max_steps} are allowed")
    seen: set[str] = set()
    for step in plan.steps:
        if step.id in seen:
            problems.append(f"step {step.id!r}: the id is used by more than one step")
        seen.add(step.id)
    for step in plan.steps:
        for dependency in step.depends_on:
            if dependency == step.id:
                problems.append(f"step {step.id!r}: depends on itself")
            elif dependency not in seen:
                problems.append(f"step {step.id!r}: depends on unknown step {dependency!r}")
        if len(set(step.depends_on)) != len(step.depends_on):
            problems.append(f"step {step.id!r}: lists a dependency twice")
        if len(set(step.tools)) != len(step.tools):
            problems.append(f"step {step.id!r}: lists a tool twice")
        if catalog is not None:
            problems.extend(tool_problems(step, catalog))
    edges = {step.id: [d for d in step.depends_on if d != step.id] for step in plan.steps}
    cycle = find_cycle(edges)
    if cycle:
        problems.append(f"steps form a cycle: {' -> '.join(cycle)} (each depends on the next)")
    if plan.final_step is not None and plan.final_step not in seen:
        problems.append(f"plan: final_step {plan.final_step!r} is not a step")
    return problems


def _nul_problems(plan: Plan) -> list[str]:
    """A step's text holding a NUL, for each step that has one.

    Checked here, where every plan coming in passes (a model's, an edit, an import), not in
    `Plan`: a stored plan is read as it is.
    """
    found = ((step.id, nul_field(step.model_dump(mode="json"))) for step in plan.steps)
    return [f"step {step_id!r}: {problem}" for step_id, problem in found if problem is not None]


def validate_plan(
    plan: Plan | Mapping[str, Any],
    catalog: Catalog | None = None,
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    task: str | None = None,
) -> Plan:
    """Return `plan` as a valid `Plan`, or raise `PlanError` listing every problem found.

    `task`: the task the plan must keep (an edit at review changes how, not what: a team stored
    under an edited task was reused, with no planning, for a task it never did).
    """
    if isinstance(plan, Plan):
        parsed = plan
    else:
        if not isinstance(plan, Mapping):
            raise PlanError([f"plan: should be a JSON object, got {json_kind(plan)}"])
        try:
            parsed = Plan.model_validate(plan)
        except ValidationError as exc:
            raise PlanError(_shape_problems(exc, plan)) from None
    problems = _nul_problems(parsed) + _graph_problems(parsed, catalog, max_steps)
    if task is not None and parsed.task != task:
        problems.insert(0, "task: is the run's task and cannot be edited; start a new run for another task")
    if problems:
        raise PlanError(problems)
    return parsed


def topological_order(plan: Plan) -> list[str]:
    """Step ids with every step after its dependencies (ties keep plan order). Assumes a valid plan."""
    remaining = {step.id: set(step.depends_on) for step in plan.steps}
    order: list[str] = []
    while remaining:
        ready = [step_id for step_id, deps in remaining.items() if not deps]
        if not ready:
            raise PlanError([f"steps form a cycle among {', '.join(sorted(remaining))}"])
        for step_id in ready:
            order.append(step_id)
            del remaining[step_id]
        for deps in remaining.values():
            deps.difference_update(ready)
    return order


def dependents_of(plan: Plan, step_id: str) -> list[str]:
    """Every step that depends on `step_id`, directly or through others, in plan order."""
    found: set[str] = set()
    frontier = {step_id}
    while frontier:
        frontier = {s.id for s in plan.steps if frontier & set(s.depends_on)} - found
        found |= frontier
    return [step.id for step in plan.steps if step.id in found]


def sinks(steps: Iterable[Step]) -> list[str]:
    """Ids of the steps nothing (among `steps`) depends on, in order."""
    listed = list(steps)
    depended = {dependency for step in listed for dependency in step.depends_on}
    return [step.id for step in listed if step.id not in depended]


def _tools_schema(names: list[str]) -> dict[str, Any]:
    """A step's `tools` in the plan schema: up to 4 of `names`.

    An empty list when there are none (a sub-plan of a step approved without tools): an empty
    enum is no grammar rule a local model could follow.
    """
    if not names:
        return {"type": "array", "maxItems": 0}
    return {"type": "array", "items": {"enum": names}, "maxItems": 4}


def plan_output_schema(
    tool_names: Sequence[str],
    *,
    max_steps: int = DEFAULT_MAX_STEPS,
    step_tools: Sequence[Sequence[str]] | None = None,
) -> dict[str, Any]:
    """The JSON schema a model fills in to propose a plan.

    This is the model-facing form, not the public one, over the catalog's `tool_names`. Without
    `step_tools` it starts with `actions`, the separate actions the task asks for, and offers
    every tool to every step. With `step_tools` (one list of catalog names per action listed
    before) it asks for exactly one step per list, each choosing its `tools` from its own list.
    Instead of `depends_on` ids, step k lists in `after` the numbers (1-based) of earlier steps
    whose output it needs. The schema allows only smaller numbers, so a grammar-constrained model
    cannot name a missing step or make a cycle (the embedded model did both, and repeated them
    when asked to repair).
    `steps_from_output` turns the answer into the public form.
    """
    step_count = len(step_tools) if step_tools is not None else None
    text = {"type": "string", "minLength": 1}
    definitions: dict[str, Any] = {}
    for number in range(1, (step_count or max_steps) + 1):
        after: dict[str, Any] = {"type": "array", "maxItems": number - 1}
        after["items"] = {"enum": list(range(1, number))} if number > 1 else {"type": "integer"}
        definitions[f"step{number}"] = {
            "type": "object",
            "properties": {
                "id": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,39}$", "description": "short slug"},
                "title": text | {"maxLength": _LIMITS["title"]},
                "instruction": text | {"maxLength": _LIMITS["instruction"]},
                "agent_role": text | {"maxLength": _LIMITS["agent_role"]},
                "tools": _tools_schema(list(step_tools[number - 1]) if step_tools else list(tool_names)),
                "after": after,
                "expected_output": {"type": "string", "maxLength": _LIMITS["expected_output"]},
            }
            | ({} if step_tools else {"expand": {"type": "boolean"}}),
            "required": ["id", "title", "instruction", "agent_role", "tools", "after", "expected_output"],
            "additionalProperties": False,
        }
    lengths = [
        {
            "type": "array",
            "prefixItems": [{"$ref": f"#/$defs/step{n}"} for n in range(1, count + 1)],
            "minItems": count,
            "maxItems": count,
        }
        for count in ([step_count] if step_count else range(1, max_steps + 1))
    ]
    if step_count:
        return {
            "type": "object",
            "title": "Plan",
            "properties": {"steps": lengths[0]},
            "required": ["steps"],
            "additionalProperties": False,
            "$defs": definitions,
        }
    actions = {
        "type": "array",
        "items": {"type": "string", "minLength": 1, "maxLength": 80},
        "minItems": 1,
        "maxItems": max_steps,
        "description": "the separate actions the task asks for, in order, before writing the steps",
    }
    return {
        "type": "object",
        "title": "Plan",
        "properties": {"actions": actions, "steps": {"anyOf": lengths}},
        "required": ["actions", "steps"],
        "additionalProperties": False,
        "$defs": definitions,
    }


def steps_from_output(raw: object) -> object:
    """A model's steps in the public form: `after` numbers become `depends_on` ids.

    Steps already in the public form (`depends_on`, as scripted and hand-written plans are) are
    kept. Numbers that name no step stay numbers, and anything malformed is passed through
    unchanged, for `validate_plan` to report.
    """
    if not isinstance(raw, list):
        return raw
    ids = [step.get("id") if isinstance(step, dict) else None for step in raw]
    if all(isinstance(step, dict) and isinstance(step.get("after"), list) for step in raw):
        # Dependencies are step numbers here, so ids are only labels: a repeated one (the
        # embedded model repeats them) is made unique instead of failing the plan.
        ids = _unique_ids(ids)
        raw = [{**step, "id": new} if new is not None else step for step, new in zip(raw, ids, strict=True)]
    converted: list[object] = []
    for step in raw:
        if not isinstance(step, dict) or "after" not in step or not isinstance(step["after"], list):
            converted.append(step)
            continue
        depends_on = [
            ids[item - 1] if isinstance(item, int) and 1 <= item <= len(ids) and ids[item - 1] else item
            for item in step["after"]
        ]
        public = {key: value for key, value in step.items() if key != "after"}
        converted.append(public | {"depends_on": [*public.get("depends_on", []), *depends_on]})
    return converted


def _unique_ids(ids: list[Any]) -> list[Any]:
    """`ids` with later repeats of a string id suffixed `-2`, `-3`, … (kept within 40 characters)."""
    taken = {item for item in ids if isinstance(item, str)}
    seen: set[str] = set()
    unique: list[Any] = []
    for item in ids:
        if isinstance(item, str) and item in seen:
            number = 2
            while (candidate := f"{item[: 40 - len(str(number)) - 1]}-{number}") in taken:
                number += 1
            taken.add(candidate)
            item = candidate
        if isinstance(item, str):
            seen.add(item)
        unique.append(item)
    return unique


def steps_to_output(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Public-form steps (`depends_on` ids) in the model-facing form (`after` numbers)."""
    numbers = {step["id"]: number for number, step in enumerate(steps, start=1)}
    return [
        {key: value for key, value in step.items() if key != "depends_on"}
        | {"after": [numbers[dep] for dep in step.get("depends_on", []) if dep in numbers]}
        for step in steps
    ]
