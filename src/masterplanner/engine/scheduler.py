"""The DAG scheduler: a step starts the moment all of its dependencies have succeeded.

There is no superstep barrier: each finished step releases exactly the steps waiting for it,
up to `max_parallel` running at once. A step whose dependency failed (or was skipped) is
skipped without running. A failed step does not stop independent branches; an exception out
of `run_step` (a budget overrun, a cancellation) stops everything: running steps are cancelled
and awaited before it propagates.

The plan may change while it runs. A step that failed is offered to `on_failure`, once, before
its dependents are skipped: a revised plan it returns (the step and its dependents replaced by
new steps) is scheduled from there, finished steps kept. The other steps go on meanwhile (a
replan may wait for a person); its dependents wait, and so do `expand` steps. A step marked
`expand` is offered to `on_expand` when it becomes ready: a revised plan (the step replaced by
its sub-plan) is scheduled instead of the step; None runs the step as it is. An error out of
`on_failure` stops everything too; a `PlanError` (a replan with no valid plan) once the failed
step's dependents are skipped: they are not run because it failed, whatever else the error stops.
Any other error (a review cancelled or expired, the database gone) leaves them unfinished: the
replan was stopped, not found wanting. A step that could not be replanned (`on_failure` answered
`NOT_REPLANNED`, or raised the `PlanError`) is named so in its dependents' skip: "dependency 'b'
failed and could not be replanned"; one whose replan a person rejected (`REPLAN_REJECTED`) too:
"dependency 'b' failed and its replan was rejected", as the run's error says.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import PlanError
from ..plan import Plan, Step

__all__ = ["NOT_REPLANNED", "REPLAN_REJECTED", "StepOutcome", "run_dag"]

_log = logging.getLogger("masterplanner.scheduler")


@dataclass(frozen=True)
class StepOutcome:
    """How one step ended."""

    status: Literal["succeeded", "failed", "skipped"]
    output: str | None = None
    error: str | None = None


NOT_REPLANNED = "could not be replanned"
"""What `on_failure` answers for a step it found no plan to replace (its dependents' skip says it)."""
REPLAN_REJECTED = "its replan was rejected"
"""What `on_failure` answers for a step whose replan the person rejected (its dependents' skip says it)."""

Revise = Callable[[Step, StepOutcome], Awaitable[Plan | str | None]]
"""A failed step's revision: the revised plan, None (the step stays failed), or why it could not be
revised (the step stays failed, and its dependents' skip reason says why)."""
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
    not in it). A failed step's revision (`on_failure`, which may wait hours for a person's
    review) runs beside the steps: independent branches go on meanwhile, the failed step's
    dependents wait for it, and `expand` steps wait too (one change of the plan at a time).
    Before, the whole run stood still while a replan waited for its review.
    """
    schedule = _Schedule(plan, run_step, max(1, max_parallel), on_failure, on_expand)
    for step_id, outcome in (finished or {}).items():
        schedule.record(step_id, outcome)
    try:
        while True:
            try:
                schedule.revise()
            except PlanError:
                # the replan found no valid plan, and the run fails with the planner's problems:
                # the failed step's dependents are skipped for it first, not left to be cancelled
                # with the steps the run's failure stops (as if a person had stopped them). Any
                # other error (its review cancelled or expired, the database gone) stops the
                # replan, not its step's chance: the dependents stay for the run's end, or for
                # the redone replan of a run resumed. A skip that cannot be recorded leaves them
                # so too, and the planner's problems stay the error.
                try:
                    blocked = _skip_blocked(schedule.waiting(), schedule.outcomes, schedule.unrevised)
                    await _skip(blocked[1], on_skip)
                except Exception as error:
                    _log.warning("the dependents of a step whose replan failed were not skipped: %s", error)
                raise
            waiting, skipped = _skip_blocked(schedule.waiting(), schedule.outcomes, schedule.unrevised)
            await _skip(skipped, on_skip)
            if await schedule.start(waiting):
                continue  # an `expand` step's sub-plan is in its place: schedule again
            watched = schedule.watched()
            if not watched:
                if waiting:
                    continue
                break
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            schedule.collect(done)
    finally:
        await schedule.stop()
    kept = schedule.plan.ids
    return {step_id: outcome for step_id, outcome in schedule.outcomes.items() if step_id in kept}


async def _skip(
    skipped: list[tuple[Step, str]], on_skip: Callable[[Step, str], Awaitable[None]] | None
) -> None:
    if on_skip is not None:
        for step, reason in skipped:
            await on_skip(step, reason)


class _Schedule:
    """One `run_dag`'s state: the plan as it stands, outcomes, running steps, the revision under way."""

    def __init__(
        self,
        plan: Plan,
        run_step: Callable[[Step], Awaitable[StepOutcome]],
        limit: int,
        on_failure: Revise | None,
        on_expand: Expand | None,
    ) -> None:
        self.plan, self.run_step, self.limit = plan, run_step, limit
        self.on_failure, self.on_expand = on_failure, on_expand
        self.outcomes: dict[str, StepOutcome] = {}
        self.held: dict[str, StepOutcome] = {}
        """Failed steps to offer to `on_failure`, in order; their dependents wait, neither run nor skipped."""
        self.offered: set[str] = set()
        """Failed steps offered to `on_failure`, and `expand` steps offered to `on_expand`."""
        self.running: dict[asyncio.Future[StepOutcome], Step] = {}
        self.revision: tuple[asyncio.Future[Plan | str | None], str] | None = None
        self.unrevised: dict[str, str] = {}
        """Failed steps whose revision found no plan, and why (`NOT_REPLANNED`, `REPLAN_REJECTED`)."""

    def record(self, step_id: str, outcome: StepOutcome) -> None:
        """A step's outcome; a failed one is held for `on_failure` first (once)."""
        if outcome.status == "failed" and self.on_failure is not None and step_id not in self.offered:
            self.offered.add(step_id)
            self.held[step_id] = outcome
        else:
            self.outcomes[step_id] = outcome

    def revise(self) -> None:
        """Take a finished revision (its error stops the run, its step failed), and start the next one."""
        if self.revision is not None and self.revision[0].done():
            task, step_id = self.revision
            self.revision = None
            self.outcomes[step_id] = self.held.pop(step_id)
            try:
                revised = task.result()
            except PlanError:  # no valid plan
                self.unrevised[step_id] = NOT_REPLANNED
                raise
            if isinstance(revised, str):
                self.unrevised[step_id] = revised
            else:
                self.plan = revised or self.plan
        if self.revision is not None or self.on_failure is None:
            return
        for step_id in [step_id for step_id in self.held if step_id not in self.plan.ids]:
            self.outcomes[step_id] = self.held.pop(step_id)  # replaced meanwhile: nothing to revise
        if self.held:
            step_id = next(iter(self.held))
            offer = self.on_failure(self.plan.step(step_id), self.held[step_id])
            self.revision = (asyncio.ensure_future(offer), step_id)

    def waiting(self) -> list[Step]:
        """The steps with no outcome yet that are neither running nor held."""
        busy = {step.id for step in self.running.values()} | set(self.held)
        return [step for step in self.plan.steps if step.id not in self.outcomes and step.id not in busy]

    async def start(self, waiting: list[Step]) -> bool:
        """Start the ready steps, up to the limit; True when an `expand` step's sub-plan replaced it."""
        for step in [step for step in waiting if all(self.outcomes.get(dep) for dep in step.depends_on)]:
            if len(self.running) >= self.limit:
                break
            if step.expand and self.on_expand is not None and step.id not in self.offered:
                if self.revision is not None:
                    continue  # planned once the revision under way has changed the plan
                self.offered.add(step.id)
                expanded = await self.on_expand(step)
                if expanded is not None:
                    self.plan = expanded
                    return True
            self.running[asyncio.ensure_future(self.run_step(step))] = step
        return False

    def watched(self) -> set[asyncio.Future[Any]]:
        """What may finish next: the running steps and the revision."""
        tasks: set[asyncio.Future[Any]] = set(self.running)
        if self.revision is not None:
            tasks.add(self.revision[0])
        return tasks

    def collect(self, done: set[asyncio.Future[Any]]) -> None:
        """Record the steps that finished (a step's error stops the run); `revise` takes a revision."""
        for task in done:
            step = self.running.pop(task, None)
            if step is not None:
                self.record(step.id, task.result())

    async def stop(self) -> None:
        """Cancel what still runs and wait for it."""
        tasks: list[asyncio.Future[Any]] = [*self.running]
        if self.revision is not None:
            tasks.append(self.revision[0])
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def _skip_blocked(
    waiting: list[Step], outcomes: dict[str, StepOutcome], unrevised: Mapping[str, str]
) -> tuple[list[Step], list[tuple[Step, str]]]:
    """Mark skipped every waiting step with a dependency that did not succeed (transitively).

    Returns the steps still waiting, and the skipped ones with the reason: the first such
    dependency, and why it could not be revised when it could not (`unrevised`).
    """
    skipped: list[tuple[Step, str]] = []
    changed = True
    while changed:
        changed = False
        for step in list(waiting):
            bad = [dep for dep in step.depends_on if dep in outcomes and outcomes[dep].status != "succeeded"]
            if bad:
                why = f" and {unrevised[bad[0]]}" if bad[0] in unrevised else ""
                reason = f"dependency {bad[0]!r} {outcomes[bad[0]].status}{why}"
                outcomes[step.id] = StepOutcome("skipped", error=reason)
                waiting.remove(step)
                skipped.append((step, reason))
                changed = True
    return waiting, skipped
