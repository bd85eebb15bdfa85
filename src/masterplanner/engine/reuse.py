"""The registry in a run's flow: reuse before planning, remember after running.

Before planning, the stored teams (cohorts) most like the task are looked up. The best one that
succeeded and clears `reuse_threshold` is adapted to the task (see `adaptation`) and its agents
are reused: no planner or Prompt Creator calls. Otherwise the planner plans, with the similar
teams' plans as its examples, and each step whose role and instruction match a stored agent
above `agent_reuse_threshold` reuses that agent's prompt instead of having one written.

A team is stored only when none of its texts (task, plan, prompts) looks like a credential: a
stored team is shown to later, different tasks and listed and exported (`secret_in_team`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import NotFoundError, PlanError, RunError
from ..plan import Plan, Step, validate_plan
from ..planner import PlanExample
from ..redaction import secret_parts
from ..registry import AgentSpec, Cohort, RegistryStore
from ..registry.specs import MAX_KEYWORD_CHARS
from ..tools import Catalog
from ..tools.selection import words

__all__ = [
    "HINT_FLOOR",
    "REUSE_CANDIDATES",
    "StoredTeam",
    "cohort_hints",
    "lessons_prompt",
    "remember_run",
    "reusable_agents",
    "reusable_cohort",
    "secret_in_team",
]

HINT_FLOOR = 0.3
"""Similarity below which a stored team is not worth showing the planner as an example."""
_MAX_HINTS = 2
REUSE_CANDIDATES = 10
"""How many of the stored teams most like a task are looked through for one to reuse.

Teams stop working (an agent removed, a tool not available now), and each run that reuses a team
stores it again, so the few most similar may all be copies of one broken team: the search looks
past them, and `similar_cohorts` puts equal ones newest first (see docs/architecture.md).
"""


def lessons_prompt(agent: AgentSpec) -> str:
    """The agent's prompt with its lessons from feedback appended."""
    if not agent.lessons:
        return agent.system_prompt
    lessons = "\n".join(f"- {lesson}" for lesson in agent.lessons)
    return f"{agent.system_prompt}\n\nLessons from earlier runs:\n{lessons}"


def _reused(agent: AgentSpec, run_id: str) -> dict[str, Any]:
    """The run's entry for a stored agent it reuses; a person's prompt stays marked as one."""
    reused = {"prompt": lessons_prompt(agent), "agent_id": agent.id, "reused_from": run_id}
    return reused | {"prompt_by_person": True} if agent.prompt_by_person else reused


@dataclass(frozen=True)
class StoredTeam:
    """A stored team that fits a new task: its cohort, how similar the tasks are, its plan and agents."""

    cohort: Cohort
    similarity: float
    plan: Plan
    """The plan as it was approved, for the cohort's own task."""
    agents: dict[str, Any]


def reusable_cohort(
    registry: RegistryStore,
    found: Sequence[tuple[Cohort, float]],
    catalog: Catalog,
    threshold: float,
) -> StoredTeam | None:
    """The first of `found` (from `similar_cohorts`) that succeeded, clears `threshold` and can run now."""
    for cohort, similarity in found:
        if similarity < threshold or cohort.outcome != "succeeded":
            continue
        try:
            plan = validate_plan(cohort.plan, catalog)
            agents = {step_id: registry.get_agent(agent_id) for step_id, agent_id in cohort.agents.items()}
        except (PlanError, NotFoundError, RunError):
            continue  # a tool is not available now, or an agent was removed: plan afresh
        if set(agents) != set(plan.ids):
            continue
        prompts = {step_id: _reused(agent, cohort.run_id) for step_id, agent in agents.items()}
        return StoredTeam(cohort, similarity, plan, prompts)
    return None


def cohort_hints(found: Sequence[tuple[Cohort, float]]) -> list[PlanExample]:
    """The plans of similar teams that succeeded, as examples for the planner (best first).

    One per task: a task solved again and again would otherwise fill every example with itself.
    """
    hints: dict[str, PlanExample] = {}
    for cohort, similarity in found:
        steps = list(cohort.plan.get("steps", []))
        if cohort.outcome == "succeeded" and similarity >= HINT_FLOOR and steps:
            hints.setdefault(cohort.task, PlanExample(cohort.task, steps))
    return list(hints.values())[:_MAX_HINTS]


def _step_text(step: Step) -> str:
    return f"{step.agent_role}. {step.title}. {step.instruction}"


def reusable_agents(
    registry: RegistryStore, plan: Plan, threshold: float, *, same_instruction: bool = False
) -> dict[str, dict[str, Any]]:
    """Step id -> a stored agent for the steps that match one above `threshold` and whose tools it has.

    With `same_instruction` (small models), only an agent stored for the very same instruction is
    reused: the prompts a small model writes name their step's subject, so the poet of "a haiku
    about the sea" (similarity 0.89 to "a haiku about autumn leaves") would write about the sea.
    """
    chosen: dict[str, dict[str, Any]] = {}
    for step in plan.steps:
        for agent, similarity in registry.similar_agents(_step_text(step), 3):
            if same_instruction and agent.description != step.instruction:
                continue
            if similarity >= threshold and set(step.tools) <= set(agent.tools):
                chosen[step.id] = _reused(agent, agent.origin.get("run_id", ""))
                break
    return chosen


def _team_texts(plan: Plan, agents: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """Where each text a stored team would keep is, and the text."""
    yield "the task", plan.task
    for step in plan.steps:
        for text in (step.title, step.agent_role, step.instruction, step.expected_output):
            yield f"step {step.id} of the plan", text
        yield f"the prompt of step {step.id}", str((agents.get(step.id) or {}).get("prompt") or "")


def secret_in_team(plan: Plan, agents: dict[str, Any]) -> str | None:
    """Why the run's team is not to be stored: which of its texts looks like a credential (None: none does).

    A stored team's task, plan and agents' prompts are shown to later, different tasks (as
    their prompts and the planner's examples), and listed and exported: a key typed in one
    task would reach them all. The reason names where the secret is, not the secret.
    """
    where = next((where for where, text in _team_texts(plan, agents) if secret_parts(text)), None)
    if where is None:
        return None
    return (
        f"{where} holds what looks like a secret (a key, token or password); a team with a secret "
        "is not stored, as its texts would reach later tasks' prompts"
    )


def remember_run(
    registry: RegistryStore,
    *,
    run_id: str,
    model: str,
    plan: Plan,
    agents: dict[str, Any],
    succeeded: bool,
    store_new: bool = True,
    count_reused: bool = True,
    failure_counted: bool = False,
    counting: str | None = None,
) -> bool:
    """After a run: count every stored agent's outcome; False when its team was stored already.

    A succeeded run (when `store_new`) also stores its new agents and its cohort. With
    `count_reused=False` (the team is stored later, on a `remember` request's answer, after
    the outcome was counted when the run ended) the reused agents are not counted again. With
    `failure_counted` (the run was retried after an end that counted it failed) each run counts
    once: a success turns that failure into a success, another failure counts nothing.
    `counting` names this count (the run and its retry): asked again under
    that name, the outcome is not counted again.

    All of it is one transaction (`RegistryStore.record_team`): storing that fails half way
    stores nothing, so it can be made again; and a team stored already (the cohort of the run's
    id is there) is stored and counted once, whatever asks again.
    """
    agent_ids: dict[str, str] = {}
    new_agents: list[AgentSpec] = []
    counted: list[str] = []
    corrected: list[str] = []
    store = succeeded and store_new
    for step in plan.steps:
        agent = agents.get(step.id) or {}
        # a reused agent whose prompt the person edited at review is a new agent (one whose stored
        # prompt a person wrote, `prompt_by_person`, is still the reused one)
        agent_id = None if agent.get("edited") else agent.get("agent_id")
        if agent_id is not None and not count_reused:
            agent_ids[step.id] = agent_id
            continue
        if agent_id is None:
            if not store:
                continue
            agent_id = f"{run_id}.{step.id}"
            new_agents.append(
                AgentSpec.model_validate(
                    {
                        "id": agent_id,
                        "name": step.title[:200],
                        "role": step.agent_role,
                        "description": step.instruction,
                        "system_prompt": agent.get("prompt") or step.instruction,
                        "tools": list(step.tools),
                        "model": model,
                        # a longer "word" (a long name, an unspaced line of Japanese) is none:
                        # an edit of the agent's own form would be refused for it
                        "keywords": sorted(
                            {word for word in words(plan.task) if len(word) <= MAX_KEYWORD_CHARS}
                        )[:20],
                        "origin": {"run_id": run_id, "step_id": step.id},
                        # edited at review: runs that reuse it work under the person's prompt too
                        "prompt_by_person": bool(agent.get("edited") or agent.get("prompt_by_person")),
                        # its one use so far, this run's success, stored with it
                        "stats": {"uses": 1, "successes": 1},
                    }
                )
            )
        elif failure_counted:  # a stored agent, whose earlier failure was counted
            if succeeded:
                corrected.append(agent_id)
        else:
            counted.append(agent_id)
        agent_ids[step.id] = agent_id
    cohort = None
    if store:
        shape = plan.model_dump(mode="json", exclude_none=True)
        cohort = Cohort.model_validate(
            {"id": run_id, "task": plan.task, "plan": shape, "agents": agent_ids, "run_id": run_id}
        )
    return registry.record_team(
        succeeded=succeeded,
        new_agents=new_agents,
        counted=counted,
        corrected=corrected,
        cohort=cohort,
        counting=counting,
    )
