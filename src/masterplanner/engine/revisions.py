"""A plan that changes while its run runs: a failed step replanned, a step expanded into a sub-plan.

Both are proposed by a durable workflow (`<run>._replan-<n>`, `<run>._expand-<step>`) whose model
calls are checkpointed, so a process that takes the run over after a crash gets the same
proposal instead of planning again. A replan is shown to the person as a stored `replan`
request (approve, edit, reject) unless the run approves everything (`--yes`); a sub-plan was
approved at review, when its step was marked `expand`. The revised plan, its new steps' agents,
the retired steps' statuses (`replaced`, `expanded`) and the event saying so are stored in one
transaction, only by the process holding the run's lease (`RunStore.record_revision`); steps
that finished are kept and never run again, and new step ids never reuse a recorded one.

The tool policies the person set at review for the steps a revision retires hold for the steps
that take their place: each new step's agent gets, tool by tool, the strictest of its own policy
and the retired steps' (`deny` over `ask` over `auto`), so the planner's proposal cannot loosen
what was denied at review; an answer to the replan request that sets one looser is refused
(`_loosened`) and asked again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Awaitable, Iterable, Mapping
from functools import partial
from typing import Any, Literal

from dbos import DBOS, SetWorkflowID
from pydantic import ValidationError

from ..errors import MasterplannerError, PlanError, RunError
from ..plan import Plan, Step, validate_plan
from ..planner import expand, replan
from ..prompting import create_prompts, prompts_to_json
from .checkpoints import checkpointed_and_counted
from .planning import kept_marks, review_payload
from .records import AgentBrief, EventKind, PlanChange, RunRecord, briefs
from .requests import LeaseLost, PlanDecision, RunEnded
from .resources import RunResources, resources_of
from .runtime import launched_host, own_workflow
from .scheduler import NOT_REPLANNED, REPLAN_REJECTED, StepOutcome

__all__ = ["PlanRevisions", "RevisionLost", "expand_workflow", "replan_workflow"]


class RevisionLost(Exception):
    """A revision's write found the run no longer this execution's: another process took it over.

    Nothing of the revision was recorded; the execution stops, and the holder makes the revision.
    So when the run has ended meanwhile (a cancel): its end stands, and nobody makes the revision.
    Also raised by the execution when one of its steps asked on a run that had ended (`step_pause`):
    it stops, and starts no other step on the ended run.
    """


_Policy = Literal["auto", "ask", "deny"]
_STRICTNESS: dict[str, int] = {"auto": 0, "ask": 1, "deny": 2}


def _strictest(policies: Iterable[Mapping[str, _Policy]]) -> dict[str, _Policy]:
    """Each tool's strictest policy among the maps given (`deny` over `ask` over `auto`)."""
    merged: dict[str, _Policy] = {}
    for given in policies:
        for tool, policy in given.items():
            if tool not in merged or _STRICTNESS[policy] > _STRICTNESS[merged[tool]]:
                merged[tool] = policy
    return merged


def _inheriting(run: RunRecord, revised: Plan, agents: Mapping[str, AgentBrief]) -> dict[str, AgentBrief]:
    """`agents`, those of `revised`'s new steps holding the review policies of the steps it retires.

    A new step cannot be told apart by the work it took over, so each keeps those of all the
    retired steps: a tool denied for one of them stays denied in every step in their place.
    """
    assert run.plan is not None
    retired = [step_id for step_id in run.plan.ids if step_id not in revised.ids]
    inherited = _strictest(run.agents[step_id].tool_policies for step_id in retired if step_id in run.agents)
    if not inherited:
        return dict(agents)
    return {
        step_id: brief
        if step_id in run.plan.ids
        else brief.model_copy(update={"tool_policies": _strictest([brief.tool_policies, inherited])})
        for step_id, brief in agents.items()
    }


def _loosened(run: RunRecord, revised: Plan, agents: Mapping[str, AgentBrief]) -> list[str]:
    """Each policy an edit of a replan sets looser than the review set for the steps it replaces.

    Not taken silently: the edit is refused saying which, and the person is asked again (a
    policy the edit leaves out is the inherited one, `_inheriting`).
    """
    assert run.plan is not None
    retired = [step_id for step_id in run.plan.ids if step_id not in revised.ids]
    inherited = _strictest(run.agents[step_id].tool_policies for step_id in retired if step_id in run.agents)
    return [
        f"step {step_id!r}: {tool} is {inherited[tool]!r} for the steps it replaces (set at review), "
        f"so it cannot be {policy!r} here"
        for step_id, brief in agents.items()
        if step_id not in run.plan.ids
        for tool, policy in brief.tool_policies.items()
        if tool in inherited and _STRICTNESS[policy] < _STRICTNESS[inherited[tool]]
    ]


def _shown(run: RunRecord, revised: Plan, agents: Mapping[str, AgentBrief]) -> dict[str, AgentBrief]:
    """The agents a replan's request shows: the proposal's, and the run's for the steps it keeps.

    A retired step's is left out: it made every answer that sent them back (the run page's
    Approve) name a step the plan does not have.
    """
    merged = {**run.agents, **agents}
    return {step_id: agent for step_id, agent in merged.items() if step_id in revised.ids}


async def _proposal_resources(run_id: str) -> tuple[RunResources, RunRecord, dict[str, str]]:
    settings, store = launched_host()
    resources = await resources_of(run_id, settings, store)
    run = await asyncio.to_thread(store.get_run, run_id)
    steps = await asyncio.to_thread(store.steps, run_id)
    outputs = {step.id: step.output or "" for step in steps if step.status == "succeeded"}
    return resources, run, outputs


async def _with_prompts(
    resources: RunResources, run: RunRecord, revised: Plan, new_ids: list[str]
) -> dict[str, Any]:
    """The proposal as a workflow returns it: the plan, and agents (prompts) for its new steps."""
    written = prompts_to_json(
        await create_prompts(
            revised,
            resources.catalog,
            model=checkpointed_and_counted(resources.model, resources.ledger),
            rounds=run.options.prompt_rounds,
            only=new_ids,
        )
    )
    return {"plan": revised.to_json_dict(), "agents": {step_id: written[step_id] for step_id in new_ids}}


_REPLAN_WORKFLOW = "masterplanner.replan"
_EXPAND_WORKFLOW = "masterplanner.expand"


@DBOS.workflow(name=_REPLAN_WORKFLOW)
async def replan_workflow(run_id: str, step_id: str, error: str) -> dict[str, Any]:
    """New steps in place of failed `step_id` and its dependents, or the planner's problems."""
    resources, run, outputs = await _proposal_resources(run_id)
    if run.plan is None:
        raise RunError(f"run {run_id} has no plan to replan")
    recorded = [step.id for step in await asyncio.to_thread(resources.store.steps, run_id)]
    return await _proposed(
        resources,
        run,
        replan(
            run.plan,
            step_id,
            error,
            {key: value for key, value in outputs.items() if key in run.plan.ids},
            resources.catalog,
            model=checkpointed_and_counted(resources.model, resources.ledger),
            taken=recorded,
        ),
    )


@DBOS.workflow(name=_EXPAND_WORKFLOW)
async def expand_workflow(run_id: str, step_id: str) -> dict[str, Any]:
    """`step_id` planned as a sub-plan, with its dependencies' outputs in view, or the problems."""
    resources, run, outputs = await _proposal_resources(run_id)
    if run.plan is None:
        raise RunError(f"run {run_id} has no plan to expand")
    model = checkpointed_and_counted(resources.model, resources.ledger)
    return await _proposed(
        resources, run, expand(run.plan, step_id, resources.catalog, model=model, inputs=outputs)
    )


async def _proposed(resources: RunResources, run: RunRecord, planning: Awaitable[Plan]) -> dict[str, Any]:
    """What a proposal workflow returns: the revised plan with its new steps' prompts, or why not."""
    assert run.plan is not None
    try:
        revised = await planning
    except PlanError as problem:
        return {"problems": problem.problems}
    except MasterplannerError as problem:  # the model could not be asked (a budget, a provider error)
        return {"error": str(problem)}
    new_ids = [step.id for step in revised.steps if step.id not in run.plan.ids]
    return await _with_prompts(resources, run, revised, new_ids)


async def _proposal(workflow_id: str, workflow: Any, *args: Any) -> dict[str, Any]:
    """A proposal workflow's result: recorded, resumed where a crash cut it, or made now."""
    status = await DBOS.get_workflow_status_async(workflow_id)
    if status is not None and status.status == "PENDING":
        handle = await DBOS.resume_workflow_async(workflow_id)
        result: dict[str, Any] = await handle.get_result()
        return result
    with SetWorkflowID(workflow_id):
        result = await workflow(*args)
    return result


class PlanRevisions:
    """What the scheduler calls when a step fails for good, or an `expand` step becomes ready."""

    def __init__(self, resources: RunResources, *, owner: str) -> None:
        self.resources = resources
        self.store = resources.store
        self.run_id = resources.run_id
        self.owner = owner
        """The name the execution holds the run's lease under: only it records a revision."""

    async def _record(
        self, kind: EventKind, step_id: str, data: dict[str, Any], change: PlanChange | None = None
    ) -> None:
        """Record a revision's event (and its change of the plan) in one write, or stop (`RevisionLost`).

        Only while this execution holds the run's lease (`RunStore.record_revision`). Before, a
        process that had stalled past its lease applied the replan's answer under the new
        holder's: it stored the revised plan and ran the new steps itself, or recorded the
        rejection, and the holder recorded it again.
        """
        recorded = partial(self.store.record_revision, self.run_id, kind, step_id, data, owner=self.owner)
        if not await asyncio.to_thread(recorded, change=change):
            raise RevisionLost

    async def _run(self) -> RunRecord:
        return await asyncio.to_thread(self.store.get_run, self.run_id)

    async def on_failure(self, step: Step, outcome: StepOutcome) -> Plan | str | None:
        """Replan a failed step (and its dependents), within the run's replan budget.

        None when the budget is spent: the step stays failed. `REPLAN_REJECTED` when the person
        rejects the new steps, and `NOT_REPLANNED` when the replanner could not be asked (its
        model call failed): the step stays failed, and its dependents' skip says why. A replan
        with no valid plan after its repairs fails the run with the planner's problems (`PlanError`).
        A step whose replan failed in an earlier execution of the run answers as that failure
        was recorded (`NOT_REPLANNED`, or `REPLAN_REJECTED`), without asking again.
        """
        run = await self._run()
        events = await asyncio.to_thread(self.store.events, self.run_id)
        number = 1 + sum(1 for event in events if event.kind in ("replanned", "replan_failed"))
        # a retried run gets its replan budget again: what counts is what happened since the retry
        retried = max((event.seq for event in events if event.kind == "run_retried"), default=0)
        events = [event for event in events if event.seq > retried]
        done = sum(1 for event in events if event.kind in ("replanned", "replan_failed"))
        if run.plan is None or step.id not in run.plan.ids:
            return None
        ended = [event.data for event in events if event.kind == "replan_failed" and event.step == step.id]
        if ended:  # its replan was rejected (or failed) before this process took the run over
            return REPLAN_REJECTED if "rejected" in ended[-1] else NOT_REPLANNED
        if done >= run.options.max_replans:
            return None
        error = outcome.error or "failed"
        if not any(event.kind == "replan_requested" and event.data.get("n") == number for event in events):
            await self._record("replan_requested", step.id, {"n": number, "error": error})
        # each retry of the run its own (as its steps'): a retry after a replan whose review
        # expired, or whose edit could not be applied, found that answer again and failed again
        proposal = await _proposal(
            await own_workflow(self.run_id, f"replan-{number}", run.retries, _REPLAN_WORKFLOW),
            replan_workflow,
            self.run_id,
            step.id,
            error,
        )
        if "error" in proposal:  # the step stays failed, and so does the run
            await self._failed(step.id, number, {"error": proposal["error"]})
            return NOT_REPLANNED
        if "problems" in proposal:
            await self._failed(step.id, number, {"problems": proposal["problems"]})
            raise PlanError(
                proposal["problems"],
                context=f"step {step.id} failed ({error}) and replanning it found no valid plan",
            )
        revised = Plan.model_validate(proposal["plan"])
        agents = _inheriting(run, revised, briefs(proposal["agents"]))  # shown so at review
        by = "auto"
        if not run.options.auto_approve:
            refused: str | None = None
            for asked in itertools.count():  # an edit that cannot be applied is asked about again
                decision, by = await self._review(run, step, error, revised, agents, (number, asked), refused)
                # what the answer gives back as it was proposed is no edit (front ends send it all)
                held = run.options.tool_policies
                shown = _shown(run, revised, agents)
                decision = decision.changes(revised, shown, held, self.resources.catalog.names)
                if decision.action == "reject":
                    await self._failed(step.id, number, {"rejected": decision.why, "by": by})
                    return REPLAN_REJECTED
                if not decision.edits:
                    break
                try:
                    revised, agents = await self._edited(run, revised, agents, decision)
                    break
                except PlanError as problem:
                    refused = "; ".join(problem.problems)
            agents = _inheriting(run, revised, agents)  # what an edit left out is inherited
        return await self._store(
            run, revised, agents, {step.id: "replaced"}, "replanned", step.id, number, by
        )

    async def on_expand(self, step: Step) -> Plan | None:
        """Plan an `expand` step as a sub-plan; None (it runs as one step) when that fails."""
        run = await self._run()
        if run.plan is None or step.id not in run.plan.ids:
            return None
        expand_id = await own_workflow(self.run_id, f"expand-{step.id}", run.retries, _EXPAND_WORKFLOW)
        proposal = await _proposal(expand_id, expand_workflow, self.run_id, step.id)
        if "problems" in proposal or "error" in proposal:
            why: dict[str, Any] = {key: proposal[key] for key in ("problems", "error") if key in proposal}
            await self._record("expand_failed", step.id, why)
            return None
        revised = Plan.model_validate(proposal["plan"])
        # the policies the person set for the step at review hold for the steps it became
        agents = _inheriting(run, revised, briefs(proposal["agents"]))
        return await self._store(
            run,
            revised,
            agents,
            {step.id: "expanded"},
            "step_expanded",
            step.id,
            None,
            "auto",
        )

    async def _failed(self, step_id: str, number: int, data: dict[str, Any]) -> None:
        await self._record("replan_failed", step_id, {"n": number, **data})

    async def _review(
        self,
        run: RunRecord,
        step: Step,
        error: str,
        revised: Plan,
        agents: dict[str, AgentBrief],
        which: tuple[int, int],
        refused: str | None,
    ) -> tuple[PlanDecision, str]:
        """The person's answer to the replan (a stored request any process may answer).

        `which`: the replan's number and how many of its edits were refused before (each asked in
        a request of its own); `refused`: why the last one was.
        """
        assert run.plan is not None
        new = [step_id for step_id in revised.ids if step_id not in run.plan.ids]
        replaced = [step_id for step_id in run.plan.ids if step_id not in revised.ids]
        shown = dataclasses.replace(run, plan=revised, agents=_shown(run, revised, agents))
        notes = await asyncio.to_thread(self.store.messages.notes, self.run_id)
        payload = review_payload(shown, self.resources.catalog) | {
            "error": error,
            "new_steps": new,
            "replaced_steps": replaced,
            "notes": [note.to_json_dict() for note in notes],
        }
        if refused is not None:
            payload["refused_edit"] = refused
        number, asked = which
        retry = f"@{run.retries}" if run.retries else ""
        store = self.store
        try:
            answered = await store.requests.pause(
                self.run_id,
                "replan",
                payload,
                key=f"{self.run_id}#replan-{number}{retry}" + (f".{asked}" if asked else ""),
                step_id=step.id,
                event=("request_opened", {"kind": "replan"} | ({"refused_edit": refused} if refused else {})),
                owner=self.owner,
            )
        except (LeaseLost, RunEnded):  # another process holds the run (it asks), or the run has ended
            raise RevisionLost from None
        if answered.state != "answered" or answered.answer is None:
            raise RunError(f"the replan of step {step.id} (request {answered.id}) was {answered.state}")
        try:
            decision = PlanDecision.model_validate(answered.answer)
        except ValidationError as exc:
            raise RunError(f"the answer to request {answered.id} cannot be applied: {exc}") from None
        return decision, answered.answered_by or "person"

    async def _edited(
        self, run: RunRecord, revised: Plan, agents: dict[str, AgentBrief], decision: PlanDecision
    ) -> tuple[Plan, dict[str, AgentBrief]]:
        """The person's edit of a replan, checked: finished steps must stay as they were."""
        assert run.plan is not None
        proposed = decision.plan if decision.plan is not None else revised
        edited = validate_plan(proposed, self.resources.catalog, task=run.plan.task)
        records = await asyncio.to_thread(self.store.steps, self.run_id)
        finished = {record.id for record in records if record.status != "pending"}
        before = {step.id: step for step in run.plan.steps}
        changed = [
            step.id
            for step in edited.steps
            if step.id in finished and (step.id not in before or before[step.id] != step)
        ]
        # the failed step (and what else the proposal replaces) goes as the proposal has it go:
        # counted as "has run", it made every edit of a replan fail the run
        gone = [
            step_id
            for step_id in finished
            if step_id in before and step_id not in edited.ids and step_id in revised.ids
        ]
        problems = [f"step {step_id!r}: it has run, so it cannot change" for step_id in changed]
        problems += [f"step {step_id!r}: it has run, so it cannot be removed" for step_id in gone]
        if decision.tool_policies is not None:  # they were dropped without a word
            problems.append(
                "the run's tool policies cannot change when a step is replanned; "
                "set a policy in a new step's agent instead"
            )
        if problems:
            raise PlanError(problems, context="the edited replan cannot be applied")
        # the steps the answer leaves out keep their agents as proposed; the marks of a stored
        # agent are the run's (`planning.kept_marks`)
        shown = _shown(run, revised, agents)
        merged = {**agents, **kept_marks(shown, decision.agents or {})}
        kept = {step_id: merged[step_id] for step_id in edited.ids if step_id in merged}
        missing = [step_id for step_id in edited.ids if step_id not in before and step_id not in kept]
        if missing:
            written = prompts_to_json(
                await create_prompts(
                    edited,
                    self.resources.catalog,
                    model=self.resources.model,
                    ledger=self.resources.ledger,
                    rounds=run.options.prompt_rounds,
                    only=missing,
                )
            )
            kept |= briefs({step_id: written[step_id] for step_id in missing})
        loosened = _loosened(run, edited, kept)
        if loosened:
            raise PlanError(loosened, context="the edited replan cannot be applied")
        return edited, kept

    async def _store(
        self,
        run: RunRecord,
        revised: Plan,
        agents: dict[str, AgentBrief],
        retired: dict[str, str],
        kind: EventKind,
        step_id: str,
        number: int | None,
        by: str,
    ) -> Plan:
        """Store the revised plan: new steps pending, retired ones marked, one event saying what changed.

        One write, made only while this execution holds the run's lease (`_record`).
        """
        assert run.plan is not None
        new = [step.id for step in revised.steps if step.id not in run.plan.ids]
        dropped = [step.id for step in run.plan.steps if step.id not in revised.ids]
        retire = {sid: retired.get(sid, "replaced") for sid in dropped}
        all_agents = {sid: brief for sid, brief in {**run.agents, **agents}.items() if sid in revised.ids}
        data: dict[str, Any] = {"retired": dropped, "steps": new, "by": by}
        if number is not None:
            data["n"] = number
        await self._record(
            kind, step_id, data, PlanChange(revised, all_agents, added=tuple(new), retired=retire)
        )
        return revised
