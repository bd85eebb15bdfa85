"""Feedback on a finished run: ratings for its agents and cohort, and lessons after a poor rating."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.models import Model

from .agents import run_agent
from .errors import ConfigError, RunError
from .models.labelled import labelled
from .plan import Plan
from .registry import RegistryStore
from .usage import UsageLedger

__all__ = ["LOW_RATING", "FeedbackResult", "give_feedback"]

LOW_RATING = 2
"""At or below this rating a failure analysis writes lessons onto the agents involved."""


class _Lesson(BaseModel):
    step: str = Field(description="the id of the step whose agent should learn this")
    lesson: str = Field(
        min_length=1, max_length=300, description="one short, concrete instruction for next time"
    )


class _Analysis(BaseModel):
    lessons: list[_Lesson] = Field(max_length=12)


@dataclass
class FeedbackResult:
    """What the feedback changed."""

    rated_agents: list[str] = field(default_factory=list)
    cohort_rated: bool = False
    lessons: dict[str, list[str]] = field(default_factory=dict)
    """Agent id -> lessons added."""


def involved_agents(
    registry: RegistryStore, run_id: str, plan: Plan, agents: dict[str, Any]
) -> dict[str, str]:
    """Step id -> registry agent id, for the steps of the run whose agent is in the registry."""
    candidates = {
        step.id: (agents.get(step.id) or {}).get("agent_id") or f"{run_id}.{step.id}" for step in plan.steps
    }
    known = registry.known_agents(list(candidates.values()))
    return {step_id: agent_id for step_id, agent_id in candidates.items() if agent_id in known}


async def give_feedback(
    registry: RegistryStore,
    *,
    run_id: str,
    plan: Plan,
    agents: dict[str, Any],
    outputs: dict[str, str],
    rating: int,
    comment: str = "",
    model: Model | None = None,
    ledger: UsageLedger | None = None,
) -> FeedbackResult:
    """Rate the run's agents and cohort; at `LOW_RATING` or below, ask `model` for lessons and store them."""
    if not 1 <= rating <= 5:
        raise ConfigError(f"--rating must be between 1 and 5, got {rating}")
    result = FeedbackResult()
    involved = involved_agents(registry, run_id, plan, agents)
    if not involved:
        raise RunError(f"run {run_id} has no agents in the registry to rate (was it approved and finished?)")
    for agent_id in involved.values():
        registry.rate(agent_id, rating)
        result.rated_agents.append(agent_id)
    result.cohort_rated = registry.rate_cohort(run_id, rating)
    if rating > LOW_RATING or model is None:
        return result
    analysis = await _analyse(plan, outputs, comment, model, ledger or UsageLedger())
    for item in analysis.lessons:
        target = involved.get(item.step)
        if target is not None:
            registry.add_lesson(target, item.lesson)
            result.lessons.setdefault(target, []).append(item.lesson)
    return result


async def _analyse(
    plan: Plan, outputs: dict[str, str], comment: str, model: Model, ledger: UsageLedger
) -> _Analysis:
    steps = "\n".join(
        f"- {step.id} ({step.agent_role}): {step.instruction}\n  output: {outputs.get(step.id, '')[:600]}"
        for step in plan.steps
    )
    agent: Agent[None, _Analysis] = Agent(
        labelled(model, "feedback", ledger),
        output_type=_Analysis,
        instructions=(
            "A person rated this run poorly. Work out what went wrong and write, for the steps at fault, "
            "one short concrete lesson each that the step's agent should follow next time."
        ),
    )
    said = comment or "(none)"
    prompt = f"Task: {plan.task}\n\nSteps and their outputs:\n{steps}\n\nThe person's comment: {said}"
    result: _Analysis = await run_agent(agent, prompt)
    return result
