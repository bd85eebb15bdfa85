"""A run's first two phases: its plan (a stored team's, or the planner's and prompts), then its review.

Both read the run from the database and write what they decide back to it, so the process that
plans need not be the one that waits for the review, nor the one that runs the steps.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from ..adaptation import adapt_plan
from ..clause_planner import language_caution, uses_clause_plans
from ..errors import ModelError, PlanError, RunError
from ..event_text import team_reused
from ..plan import Plan, tool_problems, validate_plan
from ..planner import plan as make_plan
from ..prompting import AgentPrompt, Progress, create_prompts, prompts_to_json
from ..registry import Cohort
from .catalogs import RunCatalog, unoffered_policy_tools
from .records import AgentBrief, PlanChange, RunRecord, briefs, briefs_json
from .requests import LeaseLost, PlanDecision, Request, RunEnded
from .resources import RunResources
from .reuse import REUSE_CANDIDATES, cohort_hints, reusable_agents, reusable_cohort

if TYPE_CHECKING:
    from .store import RunStore

__all__ = ["PlanningWork", "kept_marks", "model_cautions", "plan_run", "review_payload", "review_run"]


_Adapted = tuple[Plan, dict[str, AgentBrief], dict[str, Any]]
"""A stored team's plan adapted to a run, its agents and what `plan_ready` says of the adaptation."""


@dataclass
class PlanningWork:
    """The planner's work on a run, kept (`mp_runs.planning`) as it is done.

    A run stopped while planning (a kill, Ctrl-C, a lapsed lease) goes on from it when resumed:
    the plan is not asked of the planner again, nor a finished prompt of the Prompt Creator.
    """

    plan: Plan
    ready: dict[str, Any]
    """What the `plan_ready` event will say of how the plan was made (hints, a stored team not reused)."""
    reused: dict[str, AgentBrief] | None = None
    """The stored agents reused for steps (None: not looked for yet)."""
    prompts: dict[str, AgentBrief] = field(default_factory=dict)
    """The steps' prompts the Prompt Creator has finished."""

    def drop_prompts_not_of(self, rounds: int) -> int:
        """Leave out the prompts written under other critique rounds than `rounds`; how many went.

        A prompt holds each of its rounds (`AgentBrief.rounds`), so it says the rounds it was
        written under: a retry that changed them (`runs retry --rounds`) has those written again.
        """
        other = [step_id for step_id, prompt in self.prompts.items() if len(prompt.rounds) != rounds]
        for step_id in other:
            del self.prompts[step_id]
        return len(other)

    def to_json_dict(self) -> dict[str, Any]:
        """`{"plan", "ready", "reused", "prompts"}`, as stored."""
        return {
            "plan": self.plan.to_json_dict(),
            "ready": self.ready,
            "reused": None if self.reused is None else briefs_json(self.reused),
            "prompts": briefs_json(self.prompts),
        }

    @classmethod
    def from_json_dict(cls, run_id: str, data: Mapping[str, Any]) -> PlanningWork:
        """Read back what `to_json_dict` stored; `RunError` naming the run when it cannot be."""
        try:
            reused = data.get("reused")
            return cls(
                plan=Plan.model_validate(data.get("plan")),
                ready=dict(data.get("ready") or {}),
                reused=None if reused is None else briefs(reused, stored=True),
                prompts=briefs(data.get("prompts"), stored=True),
            )
        except (ValidationError, TypeError, ValueError) as exc:
            raise RunError(f"run {run_id}: its planning work cannot be read: {exc}") from None


class _Lost(Exception):
    """A planning write found the run no longer this execution's: its lease lost, or the run cancelled."""


async def _keep(store: RunStore, run_id: str, work: PlanningWork, owner: str) -> None:
    """Keep the planning work done so far (`RunStore.keep_planning`), or stop planning (`_Lost`)."""
    if not await asyncio.to_thread(partial(store.keep_planning, run_id, work.to_json_dict(), owner=owner)):
        raise _Lost


async def plan_run(resources: RunResources, run: RunRecord, *, owner: str, process: str) -> RunRecord | None:
    """Plan the run and write its agents' prompts; it then awaits approval.

    A stored team that solved a task like this one is adapted when there is one; otherwise the
    planner plans (with similar teams as examples) and each step reuses a stored agent that fits
    it, or gets a prompt from the Prompt Creator. The planner's work is kept as it is done
    (`PlanningWork`), while `owner` holds the run's lease: a run resumed while planning goes on
    from its plan and finished prompts, and the event that says so names `process` (this one).
    A kept plan naming a tool this run's catalog no longer offers (a setting changed while the
    run was stopped) is not reused: the run is planned again, and the event says why.

    None when a write of the planning (its kept work, its plan) finds that `owner` no longer
    holds the run's lease, or that the run was cancelled: this execution stops planning, with
    nothing more recorded, and whoever holds the run goes on with it. Before, only the kept
    work's writes checked the lease: a process that had stalled past it still recorded its plan
    over the new holder's, with a second `plan_ready`, and went on to review and run it too.
    """
    try:
        return await _planned(resources, run, owner=owner, process=process)
    except _Lost:
        return None


async def _planned(resources: RunResources, run: RunRecord, *, owner: str, process: str) -> RunRecord:
    """`plan_run`, raising `_Lost` at the first write that finds the run no longer this execution's."""
    store = resources.store

    async def progress(data: dict[str, Any]) -> None:
        """Record which part of planning is under way (the live view's header says it)."""
        await asyncio.to_thread(store.append_event, run.id, "planning_progress", None, data)

    kept = await asyncio.to_thread(store.kept_planning, run.id)
    made: PlanningWork | _Adapted
    work = None if kept is None else PlanningWork.from_json_dict(run.id, kept)
    unoffered = (
        []
        if work is None
        else [p for step in work.plan.steps for p in tool_problems(step, resources.catalog)]
    )
    if work is not None and not unoffered:
        rewritten = work.drop_prompts_not_of(run.options.prompt_rounds)
        said = {"rewritten": rewritten} if rewritten else {}
        await progress({"stage": "resumed", "prompts": len(work.prompts), **said, "process": process})
        made = work
    else:
        if unoffered:
            await progress({"stage": "planned_again", "why": "; ".join(unoffered), "process": process})
        made = await _new_plan(resources, run, progress, owner)
    if isinstance(made, PlanningWork):
        plan, agents, ready = (
            made.plan,
            await _agents(resources, run, made, progress, owner),
            dict(made.ready),
        )
        if made.reused:
            ready["reused_agents"] = {step_id: agent.agent_id for step_id, agent in made.reused.items()}
    else:
        plan, agents, ready = made

    cautions = model_cautions(resources, run)
    if cautions:
        ready["cautions"] = cautions

    def record() -> RunRecord:
        written = store.set_status(
            run.id, "awaiting_approval", owner=owner, plan=plan, agents=agents, planning=None
        )
        if not written:  # cancelled meanwhile, or another process holds the run now
            raise _Lost
        store.append_event(run.id, "plan_ready", data={"steps": plan.ids, **ready})
        return store.get_run(run.id)

    return await asyncio.to_thread(record)


async def _new_plan(
    resources: RunResources, run: RunRecord, progress: Progress, owner: str
) -> PlanningWork | _Adapted:
    """A stored team's plan adapted to the run, or else the planner's.

    The planner's plan is kept (`PlanningWork`) as soon as it is made.
    """
    registry, task, catalog = resources.registry, run.task, resources.catalog
    model, ledger = resources.model, resources.ledger
    found: list[tuple[Cohort, float]] = []
    team = None
    if registry is not None:
        await progress({"stage": "similar_teams"})
        # the registry may embed the task (a model load, an HTTP call): keep the loop free
        found = await asyncio.to_thread(registry.similar_cohorts, task, REUSE_CANDIDATES)
        team = await asyncio.to_thread(
            reusable_cohort, registry, found, catalog, resources.settings.reuse_threshold
        )
    ready: dict[str, Any] = {}
    if team is not None:
        # a team that solved a task like this one before: its plan fitted to this task, its agents
        await progress({"stage": "adapting"})
        try:
            plan, adapted, how = await adapt_plan(
                team.plan, team.agents, team.cohort.task, task, catalog, model=model, ledger=ledger
            )
            ready = {
                "reused_cohort": team.cohort.id,
                "similarity": round(team.similarity, 3),
                "adaptation": how,
            }
            return plan, briefs(adapted), ready
        except (PlanError, ModelError) as error:
            why = "; ".join(error.problems) if isinstance(error, PlanError) else str(error)
            ready = {"reuse_failed": f"cohort {team.cohort.id} could not be adapted: {why}"}
    hints = cohort_hints(found)
    await progress({"stage": "steps"})
    plan = await make_plan(task, catalog, model=model, ledger=ledger, hints=hints or None)
    if hints:
        ready["hints"] = [hint.task for hint in hints]
    work = PlanningWork(plan, ready)
    await _keep(resources.store, run.id, work, owner)
    return work


async def _agents(
    resources: RunResources, run: RunRecord, work: PlanningWork, progress: Progress, owner: str
) -> dict[str, AgentBrief]:
    """Each step's agent: a stored one that fits it, or a prompt from the Prompt Creator.

    Those `work` holds already are taken as they are; each one found or written is kept in it.
    """
    store, plan, registry = resources.store, work.plan, resources.registry
    keeping = asyncio.Lock()  # one write at a time: a later write holds all an earlier one did

    async def keep() -> None:
        async with keeping:
            await _keep(store, run.id, work, owner)

    if work.reused is None:
        reused: dict[str, Any] = {}
        if registry is not None:
            reused = await asyncio.to_thread(
                partial(
                    reusable_agents,
                    registry,
                    plan,
                    resources.settings.agent_reuse_threshold,
                    same_instruction=uses_clause_plans(resources.model),
                )
            )
        work.reused = briefs(reused)
        await keep()
    reused_agents = work.reused

    async def written(prompt: AgentPrompt) -> None:
        work.prompts[prompt.step_id] = AgentBrief.model_validate(prompt.to_json_dict())
        await keep()

    to_write = [
        step_id for step_id in plan.ids if step_id not in reused_agents and step_id not in work.prompts
    ]
    if to_write:
        await create_prompts(
            plan,
            resources.catalog,
            model=resources.model,
            ledger=resources.ledger,
            rounds=run.options.prompt_rounds,
            only=to_write,
            progress=progress,
            written=written,
            drafted_before=len(work.prompts),
        )
    return {step_id: reused_agents.get(step_id) or work.prompts[step_id] for step_id in plan.ids}


def model_cautions(resources: RunResources, run: RunRecord) -> list[str]:
    """What the person should know before trusting this model with this task (shown at review)."""
    if not uses_clause_plans(resources.model):
        return []
    caution = language_caution(run.task)
    return [] if caution is None else [caution]


def review_payload(run: RunRecord, catalog: RunCatalog) -> dict[str, Any]:
    """What a plan-review request carries: the plan, its agents, the run's tool policies and tools.

    The tools travel as plain data, so a front end in another process validates an edit against
    the same catalog the run uses (MCP tools included; `service.catalog_of_review` reads it back).
    """
    return {
        "task": run.task,
        "plan": None if run.plan is None else run.plan.to_json_dict(),
        "agents": briefs_json(run.agents),
        "tool_policies": dict(run.options.tool_policies),
        "tools": [asdict(spec) for spec in catalog],
        "missing_tools": dict(catalog.missing),
        "mcp_servers": list(catalog.mcp_servers),
    }


async def review_run(resources: RunResources, run: RunRecord, *, owner: str) -> RunRecord | None:
    """Wait for the plan review's answer (any process may give it) and apply it.

    Approved, the run is `running`; rejected, `cancelled`: the decision's event and the run's
    move are one write (`RunStore.decide_review`), made only while `owner` holds the run's lease.
    An edit that does not validate against this run's catalog is refused with its problems in
    an `approval_requested` event, and a new review request opens: the plan stays as it was.

    None when the decision's write finds that `owner` no longer holds the run's lease: this
    execution stops, with nothing recorded, and whoever holds the run applies the answer. Before,
    a process that had stalled past its lease recorded the decision under the new holder's, and,
    approved, ran the steps itself. So when a review request is to open (the first, or the next
    after a refused edit): it opens, with its `approval_requested`, only while `owner` holds the
    lease (`Requests.open`). Before, the stalled process opened a second review beside the
    holder's. A run cancelled meanwhile is returned as it is: the cancel stands, and the decision
    is not recorded.
    """
    store = resources.store
    try:
        while True:
            if run.options.auto_approve:
                decision, by = PlanDecision(action="approve"), "auto"
            else:
                decision, by = await _review_answer(resources, run, owner)
            if decision.action == "reject":
                return await asyncio.to_thread(
                    _decided, store, run.id, "rejected", {"reason": decision.why, "by": by}, owner
                )
            try:
                edit = await _edit_of(resources, run, decision)
            except PlanError as error:
                await _open_review(resources, run, owner, {"refused_edit": "; ".join(error.problems)})
                continue
            break
    except LeaseLost:  # a review request was to open, and another process holds the run: it asks
        return None
    except RunEnded:  # a review request was to open, and the run has ended (a cancel): nothing to ask
        return None
    return await asyncio.to_thread(_decided, store, run.id, "approved", {"by": by}, owner, edit)


def _decided(
    store: RunStore,
    run_id: str,
    decision: Literal["approved", "rejected"],
    data: dict[str, Any],
    owner: str,
    edit: PlanChange | None = None,
) -> RunRecord | None:
    """Record the review's decision (an approval with its edit); the run then, or None if `owner` lost it."""
    written = store.decide_review(run_id, decision, data, owner=owner, edit=edit)
    run = store.get_run(run_id)
    if written or run.finished:  # a rejection made again, or a cancel recorded meanwhile, stands
        return run
    return None


async def _reviews(resources: RunResources, run: RunRecord) -> list[Request]:
    requests = await asyncio.to_thread(resources.store.requests.find, run.id, state=None)
    return [request for request in requests if request.kind == "plan_review"]


async def _open_review(
    resources: RunResources, run: RunRecord, owner: str, note: dict[str, Any] | None = None
) -> Request:
    """Open a plan-review request with its `approval_requested` event (after a refused edit, `note` says why).

    One write, made only while `owner` holds the run's lease (`LeaseLost` otherwise). Before, the
    request and its event were two: a crash or a store error between them left the review with
    no `approval_requested` for good (found again on resume, it was not new), so the run's events,
    its page's live view and its audit never said the plan was put to a person.
    """
    store = resources.store
    count = len(await _reviews(resources, run))
    payload = review_payload(run, resources.catalog) | {"cautions": model_cautions(resources, run)}
    payload |= await asyncio.to_thread(_team_reuse, store, run.id)
    request, _new = await asyncio.to_thread(
        partial(
            store.requests.open,
            run.id,
            "plan_review",
            payload | (note or {}),
            key=f"{run.id}#review{count + 1}",
            event=("approval_requested", dict(note or {})),
            owner=owner,
        )
    )
    return request


def _team_reuse(store: RunStore, run_id: str) -> dict[str, str]:
    """`reused_team`: the stored team the plan reuses, or `not_reused`: why one found was not; or nothing.

    The review says it: a person who solved a task like this one before expects its team back, and
    one whose plan came from another run should know before approving it (before, only the
    `plan_ready` event said so, and the review marked the agents alone).
    """
    ready = [event.data for event in store.events(run_id) if event.kind == "plan_ready"]
    last = ready[-1] if ready else {}
    if "reused_cohort" in last:
        return {"reused_team": team_reused(last)}
    why = last.get("reuse_failed")
    return {"not_reused": why} if isinstance(why, str) else {}


async def _review_answer(resources: RunResources, run: RunRecord, owner: str) -> tuple[PlanDecision, str]:
    """The answer to this run's latest plan-review request, opening one (as `owner`) when none is open.

    A review answered before the process that asked died is taken as it is.
    """
    reviews = await _reviews(resources, run)
    latest = reviews[-1] if reviews and reviews[-1].state in ("open", "answered") else None
    if latest is None:
        latest = await _open_review(resources, run, owner)
    answered = await resources.store.requests.wait(latest.id)
    if answered.state != "answered" or answered.answer is None:
        raise RunError(f"the plan review (request {answered.id}) was {answered.state}")
    try:
        decision = PlanDecision.model_validate(answered.answer)
    except ValidationError as exc:  # stored by an earlier version that checked less
        raise RunError(f"the plan review's answer (request {answered.id}) cannot be applied: {exc}") from None
    return decision, answered.answered_by or "person"


async def _edit_of(resources: RunResources, run: RunRecord, decision: PlanDecision) -> PlanChange | None:
    """An approved edit of the plan, the prompts or the tool policies, validated, as the approval stores it.

    What the answer gives back as the run holds it is no edit (`PlanDecision.changes`): an
    answer that changes nothing (None) records no `plan_edited` and marks no prompt `edited`.
    The edit is written with the approval, in one transaction (`RunStore.decide_review`).
    """
    decision = decision.changes(run.plan, run.agents, run.options.tool_policies, resources.catalog.names)
    if not decision.edits:
        return None
    plan = validate_plan(
        decision.plan if decision.plan is not None else (run.plan or {}),
        resources.catalog,
        task=run.plan.task if run.plan is not None else None,
    )
    # an answer's agents are those it edits: a step it leaves out keeps its agent (an API client
    # that sent one step's brief had every other step's reused agent and policies dropped and its
    # prompt written anew); a step the edited plan no longer has has none
    given = {**run.agents, **decision.agents} if decision.agents is not None else dict(run.agents)
    edited_agents = kept_marks(
        run.agents, {step_id: given[step_id] for step_id in plan.ids if step_id in given}
    )
    held = run.options.tool_policies
    problems = unoffered_policy_tools(  # a policy the run holds as it was is not the edit's to refuse
        [tool for tool, policy in (decision.tool_policies or {}).items() if held.get(tool) != policy],
        {step_id: agent.tool_policies for step_id, agent in (decision.agents or {}).items()},
        resources.catalog,
    )
    if problems:
        raise PlanError(problems, context="invalid edit")
    agents = await _write_missing_prompts(resources, run, plan, edited_agents)
    options = replace(
        run.options,
        tool_policies=dict(
            decision.tool_policies if decision.tool_policies is not None else run.options.tool_policies
        ),
    )
    return PlanChange(plan, agents, options=options)


def kept_marks(before: Mapping[str, AgentBrief], after: Mapping[str, AgentBrief]) -> dict[str, AgentBrief]:
    """`after` with each reused agent's `prompt_by_person` as the run held it.

    The mark is the stored agent's, not the answer's to give: an API client's answer that sends
    a reused agent's brief back without it would have the step aids skip a person's prompt.
    """
    kept = dict(after)
    for step_id, brief in after.items():
        held = before.get(step_id)
        if held is not None and held.prompt_by_person and brief.agent_id == held.agent_id:
            kept[step_id] = brief.model_copy(update={"prompt_by_person": True})
    return kept


async def _write_missing_prompts(
    resources: RunResources, run: RunRecord, plan: Plan, agents: dict[str, AgentBrief]
) -> dict[str, AgentBrief]:
    """Have the Prompt Creator write prompts for the steps an edit left without one.

    Those are steps the person added, steps whose reused agent they swapped for a fresh one, and
    steps whose prompt they left blank (spaces alone ran the step with no instructions, and were
    stored as its agent's prompt).
    """
    missing = [step_id for step_id in plan.ids if step_id not in agents or not agents[step_id].prompt.strip()]
    if not missing:
        return agents
    written = prompts_to_json(
        await create_prompts(
            plan,
            resources.catalog,
            model=resources.model,
            ledger=resources.ledger,
            rounds=run.options.prompt_rounds,
            only=missing,
        )
    )
    for step_id in missing:
        policies = agents[step_id].tool_policies if step_id in agents else {}
        agents[step_id] = AgentBrief.model_validate(written[step_id] | {"tool_policies": policies})
    return agents
