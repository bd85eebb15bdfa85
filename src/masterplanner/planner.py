"""The Master Planner: a task becomes a validated plan; a step can be expanded or replanned.

Every proposal is checked with `validate_plan`. An invalid one is sent back to the model with its
problems, at most `repairs` times (default 2); after that the planner raises `PlanError` with the
last problems. It never falls back to a plan nobody validated.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic_ai import RunContext
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.settings import ModelSettings

from .agents import retry_settings, run_agent
from .clause_planner import clause_plan, uses_clause_plans
from .errors import ModelError, PlanError
from .plan import (
    _LIMITS,
    DEFAULT_MAX_STEPS,
    Plan,
    Step,
    dependents_of,
    plan_output_schema,
    sinks,
    steps_from_output,
    steps_to_output,
    validate_plan,
    validate_task,
)
from .prompts import load_examples, render
from .tools.catalog import Catalog
from .tools.selection import best_tools
from .usage import UsageLedger, noun_for

if TYPE_CHECKING:
    from pydantic_ai import Agent
    from pydantic_ai.models import Model

__all__ = [
    "DEFAULT_REPAIRS",
    "MAX_EXPANSION_DEPTH",
    "STEP_TOOL_CHOICES",
    "PlanExample",
    "expand",
    "plan",
    "replan",
]

DEFAULT_REPAIRS = 2
MAX_EXPANSION_DEPTH = 2
STEP_TOOL_CHOICES = 5
"""How many tools, best matches of its action first, a step may choose from when steps are
asked for one action at a time."""


@dataclass(frozen=True)
class PlanExample:
    """A task with a plan that worked for it: shown to the planner as an example."""

    task: str
    steps: list[dict[str, Any]]


def _examples(catalog: Catalog, hints: Sequence[PlanExample] | None) -> list[PlanExample]:
    if hints:
        return list(hints)
    shipped = [PlanExample(item["task"], item["steps"]) for item in load_examples("planner_examples.json")]
    return [
        example
        for example in shipped
        if all(tool in catalog for step in example.steps for tool in step["tools"])
    ]


@dataclass
class _VaryOnRepair(AbstractCapability[Any]):
    """Greedy on the first try; each repair samples, seeded so runs stay reproducible.

    A greedy model given its own invalid plan and the problems tends to repeat it word for word
    (seen with the embedded model), so a repair must be allowed to come out differently.
    """

    def get_model_settings(self) -> Callable[[RunContext[Any]], ModelSettings]:
        return lambda ctx: {} if ctx.run_step <= 1 else retry_settings(ctx.run_step)


def _system(catalog: Catalog, max_steps: int, hints: Sequence[PlanExample] | None) -> str:
    return render(
        "planner_system.j2",
        max_steps=max_steps,
        tools=list(catalog),
        examples=_examples(catalog, hints),
        to_output=steps_to_output,
    )


@dataclass(frozen=True)
class _Proposer:
    """What stays the same across the model calls of one planning operation."""

    purpose: str
    model: Model
    ledger: UsageLedger
    system: str
    catalog: Catalog
    max_steps: int
    repairs: int
    accept: Callable[[object], Plan]

    async def ask(
        self, prompt: str, step_tools: Sequence[Sequence[str]] | None = None
    ) -> tuple[Plan, list[str]]:
        """Ask for steps until `accept(steps)` returns a valid plan, sending problems back for repair.

        With `step_tools`, exactly one step per list is asked for, each choosing its tools from
        its own list. A reply cut off at the model's output limit (the embedded model can repeat
        one step until it runs out) is asked for again, sampled and told to be shorter, at most
        `repairs` times; each such ask has its own `repairs` for invalid plans.
        Returns the plan and the actions the model listed before its steps (if it did).
        """
        from pydantic_ai.exceptions import OutputTokenLimitExceeded, UnexpectedModelBehavior

        from .models import labelled

        agent = _planner_agent(
            tuple(self.catalog.names),
            self.max_steps,
            None if step_tools is None else tuple(tuple(names) for names in step_tools),
            bool(self.model.profile.get("supports_json_schema_output", False)),
            self.repairs,
        )
        proposal = _Proposal(self.accept)
        options: dict[str, Any] = {
            "model": labelled(self.model, self.purpose, self.ledger),
            "instructions": self.system,
            "deps": proposal,
        }
        for attempt in range(self.repairs + 1):
            try:
                if attempt == 0:
                    await run_agent(agent, prompt, **options)
                else:
                    too_long = render("planner_too_long.j2", fixed_count=step_tools is not None)
                    await run_agent(
                        agent, f"{prompt}\n\n{too_long}", model_settings=retry_settings(attempt), **options
                    )
                break
            except ModelError as error:
                if proposal.problems and isinstance(error.__cause__, UnexpectedModelBehavior):
                    raise PlanError(
                        proposal.problems, context=f"no valid plan after {self.repairs} repairs"
                    ) from None
                if not isinstance(error.__cause__, OutputTokenLimitExceeded) or attempt == self.repairs:
                    raise
        return proposal.accepted[-1], proposal.actions


@dataclass
class _Proposal:
    """What one ask of the planner collects while its proposals are checked (the agent's deps)."""

    accept: Callable[[object], Plan]
    accepted: list[Plan] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    """The actions the model listed before its steps (if it did)."""
    problems: list[str] = field(default_factory=list)
    """The last invalid proposal's problems."""


def _check_proposal(ctx: RunContext[_Proposal], output: dict[str, Any]) -> dict[str, Any]:
    """Accept a proposal that makes a valid plan; send an invalid one back with its problems."""
    from pydantic_ai import ModelRetry

    proposal = ctx.deps
    listed = output.get("actions")
    listed = listed if isinstance(listed, list) else []
    proposal.actions[:] = [item for item in listed if isinstance(item, str)]
    try:
        proposal.accepted.append(proposal.accept(steps_from_output(output.get("steps"))))
    except PlanError as error:
        proposal.problems[:] = error.problems
        raise ModelRetry(render("planner_repair.j2", problems=error.problems)) from None
    return output


@functools.lru_cache(maxsize=32)
def _planner_agent(
    tool_names: tuple[str, ...],
    max_steps: int,
    step_tools: tuple[tuple[str, ...], ...] | None,
    native: bool,
    repairs: int,
) -> Agent[_Proposal, dict[str, Any]]:
    """The planner's agent for one output schema; the model, instructions and deps come per run.

    Built once per schema: the output schema's JSON-schema walk and the agent's output processor
    cost more than a scripted model request, and every run plans.
    """
    from pydantic_ai import Agent, NativeOutput, StructuredDict

    schema = plan_output_schema(tool_names, max_steps=max_steps, step_tools=step_tools)
    output: Any = StructuredDict(schema, name="plan", description="the steps of the plan")
    if native:
        output = NativeOutput(output)  # grammar-enforced on local models and compatible servers
    agent: Agent[_Proposal, dict[str, Any]] = Agent(
        deps_type=_Proposal,
        output_type=output,
        retries=repairs,
        capabilities=[_VaryOnRepair()],
    )
    agent.output_validator(_check_proposal)
    return agent


_FILE = r"[\w./-]*\w\.[A-Za-z][A-Za-z0-9]{0,7}\b"
_IMPLIED_TOOLS = (
    (
        "write_file",
        re.compile(rf"\b(write|save|store|create|export|produce)\b[^.\n]*?{_FILE}", re.IGNORECASE),
    ),
    ("read_file", re.compile(rf"\b(read|load|open|parse)\b[^.\n]*?{_FILE}", re.IGNORECASE)),
)


_INSTRUCTION_LIMIT = _LIMITS["instruction"]
_DELIVERABLE = re.compile(
    rf"\b(?:write|save|store|create|export|produce|put)\b[^.\n]*?\b(?:to|in|into|as)\s+({_FILE})",
    re.IGNORECASE,
)


def with_task_deliverables(task: str, steps: object, catalog: Catalog) -> object:
    """Make the last step save the files the task asks for ("… to haiku.txt") if no step mentions them.

    The embedded model sometimes plans the work and forgets the file the task names (seen with a
    portable llama.cpp build: four steps, none writing haiku.txt). The last step that nothing
    depends on is told to save its result there; the person sees it at review.
    """
    if not isinstance(steps, list) or not steps or "write_file" not in catalog:
        return steps
    wanted = list(dict.fromkeys(match.group(1) for match in _DELIVERABLE.finditer(task)))
    text = " ".join(
        f"{step.get('instruction', '')} {step.get('expected_output', '')}"
        for step in steps
        if isinstance(step, dict)
    )
    missing = [name for name in wanted if name not in text]
    needed = {dep for step in steps if isinstance(step, dict) for dep in step.get("depends_on") or []}
    last = next(
        (
            n
            for n in range(len(steps) - 1, -1, -1)
            if isinstance(steps[n], dict) and steps[n].get("id") not in needed
        ),
        None,
    )
    if not missing or last is None or not isinstance(steps[last].get("instruction"), str):
        return steps
    step = dict(steps[last])
    note = f" Save the result to {', '.join(missing)} with write_file."
    step["instruction"] = step["instruction"][: max(0, _INSTRUCTION_LIMIT - len(note))].rstrip() + note
    listed = step.get("tools")
    tools: list[Any] = list(listed) if isinstance(listed, list) else []
    step["tools"] = tools if "write_file" in tools else [*tools, "write_file"]
    return [*steps[:last], step, *steps[last + 1 :]]


def with_implied_tools(steps: object, catalog: Catalog) -> object:
    """Add the file tool a step's instruction plainly needs ("write … to haiku.txt") but does not list.

    The embedded model often names the right file and the wrong tools; a step that must write a
    file cannot do it without `write_file`. The addition is part of the plan the person reviews.
    """
    if not isinstance(steps, list):
        return steps
    grounded = []
    for step in steps:
        if (
            isinstance(step, dict)
            and isinstance(step.get("instruction"), str)
            and isinstance(step.get("tools"), list)
        ):
            tools = list(step["tools"])
            for tool, pattern in _IMPLIED_TOOLS:
                if tool in catalog and tool not in tools and pattern.search(step["instruction"]):
                    tools.append(tool)
            step = {**step, "tools": tools}
        grounded.append(step)
    return grounded


async def plan(
    task: str,
    catalog: Catalog,
    *,
    model: Model,
    ledger: UsageLedger | None = None,
    hints: Sequence[PlanExample] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    repairs: int = DEFAULT_REPAIRS,
) -> Plan:
    """Plan `task` with the tools of `catalog`; `hints` are example plans of similar tasks."""
    task = validate_task(task)

    def accept(steps: object) -> Plan:
        return validate_plan(
            {
                "task": task,
                "steps": with_implied_tools(with_task_deliverables(task, steps, catalog), catalog),
            },
            catalog,
            max_steps=max_steps,
        )

    if uses_clause_plans(model):
        # Small models fill in a plan whose structure comes from the task's clauses; they need
        # no examples for that, so stored teams (hints) cannot leak into the plan.
        return await clause_plan(
            task, catalog, model=model, accept=accept, ledger=ledger, max_steps=max_steps, repairs=repairs
        )
    system = _system(catalog, max_steps, hints)
    proposer = _Proposer(
        "planner", model, ledger or UsageLedger(), system, catalog, max_steps, repairs, accept
    )
    proposal, actions = await proposer.ask(render("planner_user.j2", task=task))
    if len(proposal.steps) < len(actions) <= max_steps:
        # The model listed more actions than it wrote steps (the embedded model closes the list
        # after one step): ask once more for exactly one step per action, now that their number
        # is known and the grammar can hold the model to it. Each step chooses among the tools
        # that best match its own action: small models pick the first tools offered, whatever
        # the step (the embedded model scored node F1 0.01 on TMDB choosing from all of them).
        choices = [best_tools(action, catalog, STEP_TOOL_CHOICES) for action in actions]
        prompt = render("planner_steps.j2", task=task, actions=list(zip(actions, choices, strict=True)))
        proposal, _ = await proposer.ask(prompt, step_tools=choices)
    return proposal


def _depth(step_id: str) -> int:
    return step_id.count("--")


def _splice(
    original: Plan, removed: Sequence[str], new_steps: list[Step], entry_deps: list[str]
) -> list[Step]:
    """Replace the `removed` steps with `new_steps`.

    New steps with no dependencies inherit `entry_deps`; steps that depended on a removed step
    depend on the new steps' sinks instead.
    """
    gone = set(removed)
    exits = sinks(new_steps)
    rewired = [step.model_copy(update={"depends_on": step.depends_on or entry_deps}) for step in new_steps]
    kept: list[Step] = []
    for step in original.steps:
        if step.id in gone:
            continue
        if gone & set(step.depends_on):
            deps = [d for d in step.depends_on if d not in gone] + [
                e for e in exits if e not in step.depends_on
            ]
            step = step.model_copy(update={"depends_on": deps})
        kept.append(step)
    position = min(original.ids.index(step_id) for step_id in removed)
    before = [step for step in kept if original.ids.index(step.id) < position]
    after = [step for step in kept if original.ids.index(step.id) > position]
    return [*before, *rewired, *after]


def _outside_tools(steps: object, target: Step) -> tuple[list[str], object]:
    """The problems of proposed sub-steps naming tools `target` was not approved with.

    Also the steps without those tools, so the rest of the proposal is checked once, not told twice.
    """
    if not isinstance(steps, list):
        return [], steps
    allowed = ", ".join(target.tools) or "none"
    problems: list[str] = []
    kept: list[object] = []
    for proposed in steps:
        tools = proposed.get("tools") if isinstance(proposed, dict) else None
        if not isinstance(proposed, dict) or not isinstance(tools, list):
            kept.append(proposed)
            continue
        problems += [
            f"step {proposed.get('id')!r}: tool {tool!r} is not one of the tools step {target.id!r} was"
            f" approved with (a sub-step may use only those: {allowed})"
            for tool in tools
            if tool not in target.tools
        ]
        kept.append({**proposed, "tools": [tool for tool in tools if tool in target.tools]})
    return problems, kept


async def expand(
    original: Plan,
    step_id: str,
    catalog: Catalog,
    *,
    model: Model,
    ledger: UsageLedger | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    repairs: int = DEFAULT_REPAIRS,
    inputs: Mapping[str, str] | None = None,
) -> Plan:
    """Hierarchical planning: replace one step by a sub-plan spliced into the graph.

    Sub-step ids are `<step-id>--<sub-id>`; expansion nests at most `MAX_EXPANSION_DEPTH` levels.
    `inputs` (the outputs of the step's dependencies, by step id) are shown to the planner.
    """
    target = original.step(step_id)
    if _depth(step_id) >= MAX_EXPANSION_DEPTH:
        raise PlanError([f"step {step_id!r}: already expanded {MAX_EXPANSION_DEPTH} levels deep"])
    # the sub-plan is not reviewed: its steps may use only the tools its step was approved with
    approved = Catalog(tool for tool in catalog if tool.name in target.tools)
    system = _system(approved, max_steps, None)
    shown = [(dep, (inputs or {}).get(dep, "")[:1500]) for dep in target.depends_on if dep in (inputs or {})]
    prompt = render("planner_expand.j2", task=original.task, step=target, inputs=shown)

    def accept(steps: object) -> Plan:
        outside, steps = _outside_tools(steps, target)
        try:
            sub = validate_plan({"task": target.instruction, "steps": steps}, approved, max_steps=max_steps)
        except PlanError as error:
            raise PlanError([*outside, *error.problems]) from None
        if outside:
            raise PlanError(outside)
        prefixed = [
            sub_step.model_copy(
                update={
                    "id": f"{step_id}--{sub_step.id}"[:40],
                    "depends_on": [f"{step_id}--{d}"[:40] for d in sub_step.depends_on],
                    # a sub-step may be expanded again, down to the deepest level allowed
                    "expand": sub_step.expand and _depth(step_id) + 1 < MAX_EXPANSION_DEPTH,
                }
            )
            for sub_step in sub.steps
        ]
        spliced = _splice(original, [step_id], prefixed, list(target.depends_on))
        final = original.final_step
        if final == step_id:
            final = sinks(prefixed)[-1]
        total = len(original.steps) - 1 + len(prefixed)
        return validate_plan(
            {"task": original.task, "steps": [s.model_dump() for s in spliced], "final_step": final},
            catalog,
            max_steps=max(max_steps, total),
        )

    proposer = _Proposer(
        "planner", model, ledger or UsageLedger(), system, approved, max_steps, repairs, accept
    )
    expanded, _ = await proposer.ask(prompt)
    return expanded


def _with_fresh_ids(steps: list[object], used: set[str]) -> list[object]:
    """`steps` with each id an earlier step of the run had renamed `<id>-2` (or -3, …), references too.

    A replanner that names a new step after the one it replaces (small models do, however often
    they are told not to) means the new step: no kept step depends on a replaced one, so the
    proposed steps' own references to the id are to it. The run's records keep each id for one step.
    """
    proposed = {s["id"] for s in steps if isinstance(s, dict) and isinstance(s.get("id"), str)}
    taken = used | proposed
    renamed: dict[str, str] = {}
    for old in sorted(proposed & used):
        number = 2
        while (new := f"{old[: 40 - len(str(number)) - 1]}-{number}") in taken:
            number += 1
        renamed[old] = new
        taken.add(new)
    if not renamed:
        return steps
    fresh: list[object] = []
    for item in steps:
        if isinstance(item, dict):
            if item.get("id") in renamed:
                item = {**item, "id": renamed[item["id"]]}
            if isinstance(item.get("depends_on"), list):
                deps = item["depends_on"]
                item = {**item, "depends_on": [renamed.get(d, d) if isinstance(d, str) else d for d in deps]}
        fresh.append(item)
    return fresh


async def replan(
    original: Plan,
    failed_step_id: str,
    error: str,
    completed_outputs: Mapping[str, str],
    catalog: Catalog,
    *,
    model: Model,
    ledger: UsageLedger | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    repairs: int = DEFAULT_REPAIRS,
    taken: Collection[str] = (),
) -> Plan:
    """A new sub-graph for the failed step and its dependents; completed steps stay exactly as they were.

    New steps never reuse a step id of the plan or one in `taken` (the ids a run has recorded,
    replaced steps' included).
    """
    failed = original.step(failed_step_id)
    replaced = [failed_step_id, *dependents_of(original, failed_step_id)]
    completed = [step_id for step_id in original.ids if step_id in completed_outputs]
    if set(completed) & set(replaced):
        clash = sorted(set(completed) & set(replaced))
        they = "they" if len(clash) > 1 else "it"
        raise PlanError(
            [f"{noun_for(len(clash), 'step')} {', '.join(clash)}: completed, so {they} cannot be replanned"]
        )
    system = _system(catalog, max_steps, None)
    prompt = render(
        "replanner.j2",
        task=original.task,
        failed=failed,
        error=error,
        replaced=[original.step(step_id) for step_id in replaced],
        completed=[(original.step(step_id), completed_outputs[step_id]) for step_id in completed],
        used=sorted(set(replaced) | set(taken)),
    )
    kept_ids = set(original.ids) - set(replaced)
    used_ids = (set(replaced) | set(taken)) - kept_ids

    def accept(steps: object) -> Plan:
        if not isinstance(steps, list):
            raise PlanError(["plan: 'steps' must be a list"])
        clashes = [s.get("id") for s in steps if isinstance(s, dict) and s.get("id") in kept_ids]
        if clashes:
            raise PlanError(
                [f"step {c!r}: that id belongs to a step that is kept; choose a new id" for c in clashes]
            )
        steps = _with_fresh_ids(steps, used_ids | kept_ids)
        # New steps may depend on kept steps, so validate them together with those.
        kept_steps = [s.model_dump() for s in original.steps if s.id in kept_ids]
        candidate = validate_plan(
            {"task": original.task, "steps": [*kept_steps, *steps]},
            catalog,
            max_steps=max_steps + len(kept_ids),
        )
        new_steps = [s for s in candidate.steps if s.id not in kept_ids]
        entry = list(failed.depends_on)
        spliced = _splice(original, replaced, new_steps, entry)
        final = original.final_step if original.final_step in kept_ids else None
        return validate_plan(
            {"task": original.task, "steps": [s.model_dump() for s in spliced], "final_step": final},
            catalog,
            max_steps=max(max_steps, len(spliced)),
        )

    proposer = _Proposer(
        "replanner", model, ledger or UsageLedger(), system, catalog, max_steps, repairs, accept
    )
    replanned, _ = await proposer.ask(prompt)
    return replanned
