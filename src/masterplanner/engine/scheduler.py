"""The DAG scheduler: a step starts the moment all of its dependencies have succeeded.

There is no superstep barrier: each finished step releases exactly the steps waiting for it,
up to `max_parallel` running at once. A step whose dependency failed (or was skipped) is
skipped without running. A failed step does not stop independent branches; an exception out
of `run_step` (a budget overrun, a cancellation) stops everything: running steps are cancelled
and awaited before it propagates.

The plan may change while it runs. A step that failed is offered to `on_failure`, once, before
its dependents are skipped: a revised plan it returns (the step and its dependents replaced by
new steps) is scheduled from there, finished steps kept. A step marked `expand` is offered to
`on_expand` when it becomes ready: a revised plan (the step replaced by its sub-plan) is
scheduled instead of the step; None runs the step as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from ..plan import Plan, Step

__all__ = ["StepOutcome", "run_dag"]


@dataclass(frozen=True)
class StepOutcome:
    """How one step ended."""

    status: Literal["succeeded", "failed", "skipped"]
    output: str | None = None
    error: str | None = None


Revise = Callable[[Step, StepOutcome], Awaitable[Plan | None]]
Expand = Callable[[Step], Awaitable[Plan | None]]


async def run_dag(
    plan: Plan,
    run_step: Callable[[Step], Awaitable[StepOutcome]],
    *,
    max_parallel: int = 4,
    finished: Mapping[str, StepOutcome] | None = None,
    on_skip: Callable[[Step, str], Awaitable[None]] | None = None,
    on_failure: Revise | None = None,
    on_expand: Expand | None = None,
) -> dict[str, StepOutcome]:
    """Run every step of `plan` not already in `finished`; return every step's outcome.

    The outcomes are those of the plan as it stands at the end (steps a revision removed are
    not in it).
    """
    outcomes: dict[str, StepOutcome] = dict(finished or {})
    running: dict[asyncio.Task[StepOutcome], Step] = {}
    offered: set[str] = set()
    """Failed steps offered to `on_failure`, and `expand` steps offered to `on_expand`."""
    limit = max(1, max_parallel)
    try:
        while True:
            if on_failure is not None:
                plan = await _revise_failures(plan, outcomes, offered, on_failure)
            busy = {step.id for step in running.values()}
            waiting = [step for step in plan.steps if step.id not in outcomes and step.id not in busy]
            waiting, skipped = _skip_blocked(waiting, outcomes)
            if on_skip is not None:
                for step, reason in skipped:
                    await on_skip(step, reason)
            revised = None
            for step in [step for step in waiting if all(outcomes.get(dep) for dep in step.depends_on)]:
                if len(running) >= limit:
                    break
                if step.expand and on_expand is not None and step.id not in offered:
                    offered.add(step.id)
                    revised = await on_expand(step)
                    if revised is not None:
                        break  # schedule the sub-plan in the step's place
                running[asyncio.ensure_future(run_step(step))] = step
            if revised is not None:
                plan = revised
                continue
            if not running:
                if waiting:
                    continue
                break
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                step = running.pop(task)
                outcomes[step.id] = task.result()
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    return {step_id: outcome for step_id, outcome in outcomes.items() if step_id in plan.ids}


async def _revise_failures(
    plan: Plan, outcomes: dict[str, StepOutcome], offered: set[str], on_failure: Revise
) -> Plan:
    """Offer each failed step not yet offered to `on_failure`; the plan as they leave it."""
    for step_id, outcome in list(outcomes.items()):
        if outcome.status != "failed" or step_id in offered or step_id not in plan.ids:
            continue
        offered.add(step_id)
        revised = await on_failure(plan.step(step_id), outcome)
        if revised is not None:
            plan = revised
    return plan


def _skip_blocked(
    waiting: list[Step], outcomes: dict[str, StepOutcome]
) -> tuple[list[Step], list[tuple[Step, str]]]:
    """Mark skipped every waiting step with a dependency that did not succeed (transitively).

    Returns the steps still waiting, and the skipped ones with the reason.
    """
    skipped: list[tuple[Step, str]] = []
    changed = True
    while changed:
        changed = False
        for step in list(waiting):
            bad = [dep for dep in step.depends_on if dep in outcomes and outcomes[dep].status != "succeeded"]
            if bad:
                reason = f"dependency {bad[0]!r} {outcomes[bad[0]].status}"
                outcomes[step.id] = StepOutcome("skipped", error=reason)
                waiting.remove(step)
                skipped.append((step, reason))
                changed = True
    return waiting, skipped
