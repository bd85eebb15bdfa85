"""The DAG scheduler: a step starts the moment all of its dependencies have succeeded.

There is no superstep barrier: each finished step releases exactly the steps waiting for it,
up to `max_parallel` running at once. A step whose dependency failed (or was skipped) is
skipped without running. A failed step does not stop independent branches; an exception out
of `run_step` (a budget overrun, a cancellation) stops everything: running steps are cancelled
and awaited before it propagates.
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


async def run_dag(
    plan: Plan,
    run_step: Callable[[Step], Awaitable[StepOutcome]],
    *,
    max_parallel: int = 4,
    finished: Mapping[str, StepOutcome] | None = None,
    on_skip: Callable[[Step, str], Awaitable[None]] | None = None,
) -> dict[str, StepOutcome]:
    """Run every step of `plan` not already in `finished`; return every step's outcome."""
    outcomes: dict[str, StepOutcome] = dict(finished or {})
    waiting = [step for step in plan.steps if step.id not in outcomes]
    running: dict[asyncio.Task[StepOutcome], Step] = {}
    limit = max(1, max_parallel)
    try:
        while waiting or running:
            waiting, skipped = _skip_blocked(waiting, outcomes)
            if on_skip is not None:
                for step, reason in skipped:
                    await on_skip(step, reason)
            for step in [step for step in waiting if all(outcomes.get(dep) for dep in step.depends_on)]:
                if len(running) >= limit:
                    break
                waiting.remove(step)
                running[asyncio.ensure_future(run_step(step))] = step
            if not running:
                continue
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                step = running.pop(task)
                outcomes[step.id] = task.result()
    finally:
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
    return outcomes


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
