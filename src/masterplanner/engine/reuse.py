"""Reuse before planning, remembering after running: the registry in a run's flow."""

from __future__ import annotations

from typing import Any

from ..errors import PlanError, RunError
from ..plan import Plan, validate_plan
from ..registry import AgentSpec, Cohort, RegistryStore
from ..tools import Catalog
from ..tools.selection import words

__all__ = ["lessons_prompt", "remember_run", "reusable_cohort"]


def lessons_prompt(agent: AgentSpec) -> str:
    """The agent's prompt with its lessons from feedback appended."""
    if not agent.lessons:
        return agent.system_prompt
    lessons = "\n".join(f"- {lesson}" for lesson in agent.lessons)
    return f"{agent.system_prompt}\n\nLessons from earlier runs:\n{lessons}"


def reusable_cohort(
    registry: RegistryStore, task: str, catalog: Catalog, threshold: float
) -> tuple[Plan, dict[str, Any], Cohort, float] | None:
    """A succeeded cohort similar enough to `task` to run again: its plan for `task` and its agents."""
    for cohort, similarity in registry.similar_cohorts(task, 3):
        if similarity < threshold or cohort.outcome != "succeeded":
            continue
        try:
            plan = validate_plan({**cohort.plan, "task": task}, catalog)
            agents = {step_id: registry.get_agent(agent_id) for step_id, agent_id in cohort.agents.items()}
        except (PlanError, RunError):
            continue  # a tool is not available now, or an agent was removed: plan afresh
        if set(agents) != set(plan.ids):
            continue
        prompts = {
            step_id: {
                "prompt": lessons_prompt(agent),
                "agent_id": agent.id,
                "reused_from": cohort.run_id,
            }
            for step_id, agent in agents.items()
        }
        return plan, prompts, cohort, similarity
    return None


def remember_run(
    registry: RegistryStore,
    *,
    run_id: str,
    model: str,
    plan: Plan,
    agents: dict[str, Any],
    succeeded: bool,
) -> None:
    """After a run: count every agent's outcome; a succeeded run also stores its new agents and its cohort."""
    agent_ids: dict[str, str] = {}
    for step in plan.steps:
        agent = agents.get(step.id) or {}
        agent_id = agent.get("agent_id")
        if agent_id is None:
            if not succeeded:
                continue
            agent_id = f"{run_id}.{step.id}"
            registry.put_agent(
                AgentSpec.model_validate(
                    {
                        "id": agent_id,
                        "name": step.title[:200],
                        "role": step.agent_role,
                        "description": step.instruction,
                        "system_prompt": agent.get("prompt") or step.instruction,
                        "tools": list(step.tools),
                        "model": model,
                        "keywords": sorted(set(words(plan.task)))[:20],
                        "origin": {"run_id": run_id, "step_id": step.id},
                    }
                )
            )
        registry.record_outcome(agent_id, succeeded=succeeded)
        agent_ids[step.id] = agent_id
    if succeeded:
        shape = plan.model_dump(mode="json", exclude_none=True)
        registry.put_cohort(
            Cohort.model_validate(
                {"id": run_id, "task": plan.task, "plan": shape, "agents": agent_ids, "run_id": run_id}
            )
        )
