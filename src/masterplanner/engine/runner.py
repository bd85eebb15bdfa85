"""The engine: a run goes planning → awaiting_approval → running → succeeded | failed | cancelled.

Each plan step runs as its own DBOS workflow (id `<run>.<step>`); inside it the step agent's
model requests are DBOS steps (pydantic-ai's `DBOSDurability`) and so is every tool call and
every event it appends. A step workflow that finished is never executed again: calling it
with its id returns the recorded outcome. One that was interrupted re-runs from its last
checkpoint, replaying recorded model responses and tool results instead of repeating them.

The run itself is not one DBOS workflow: the scheduler starts steps in the order their
dependencies finish, which differs from one execution to the next, and a workflow must
make its durable calls in the same order on replay. The scheduler is instead rebuilt from the
stored step states on resume (see docs/architecture.md, "Engine").
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID
from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.exceptions import AgentRunError, ModelHTTPError, UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.usage import UsageLimits

from ..adaptation import adapt_plan
from ..agents import failure_text, retry_settings
from ..clause_planner import uses_clause_plans
from ..errors import (
    BudgetExceededError,
    MasterplannerError,
    ModelError,
    PlanError,
    RunError,
    ToolError,
)
from ..models import resolve_model, with_tool_aids
from ..models.labelled import labelled
from ..plan import Plan, Step, sinks, tool_problems, validate_plan, validate_task
from ..planner import plan as make_plan
from ..prompting import create_prompts, prompts_to_json
from ..purpose import step_purpose
from ..registry import Cohort, open_registry
from ..registry.memory import MemoryStore, episode_text
from ..settings import Settings
from ..tools.workspace import Workspace
from ..working_memory import FittedInput, Summarizer, fit_inputs, trimmer
from .budget import RunLedger
from .catalogs import RunCatalog, run_catalog, tool_context, with_mcp_tools
from .checkpoints import CheckpointedModel
from .records import EventKind, RunOptions, RunRecord, utc_now
from .requests import Request
from .reuse import cohort_hints, remember_run, reusable_agents, reusable_cohort
from .runtime import launch_dbos, shutdown_dbos
from .scheduler import StepOutcome, run_dag
from .step_agent import (
    RUNNABLE_TOOLS,
    BudgetedModel,
    context_budget,
    dependency_context,
    step_brief,
    step_instructions,
    tool_aids,
)
from .step_tools import ToolRunner, step_tools
from .store import RunStore, process_identity
from .tool_calls import ToolCalls, durable_key

__all__ = ["Engine", "run_catalog"]

_EXECUTIONS: dict[str, _Execution] = {}
"""Runs this process is executing, by id (the step workflows find their run here)."""

_AGENT_REQUEST_LIMIT = 12
_AGGREGATOR_INSTRUCTIONS = "Compose the final answer to the task from the results of its steps. Be complete."
_GUARD_INTERVAL_S = 0.2
_HEARTBEAT_S = 3.0


@DBOS.workflow(name="masterplanner.step")
async def _step_workflow(run_id: str, step_id: str) -> dict[str, Any]:
    return await _execution(run_id).step_body(step_id)


@DBOS.workflow(name="masterplanner.aggregate")
async def _aggregate_workflow(run_id: str) -> str:
    return await _execution(run_id).aggregate_body()


def _execution(run_id: str) -> _Execution:
    execution = _EXECUTIONS.get(run_id)
    if execution is None:
        raise RunError(f"run {run_id} is not being executed by this process")
    return execution


def _parse_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


class Engine:
    """Creates, executes, resumes and cancels runs stored in the settings' database."""

    def __init__(self, settings: Settings, *, debug: bool = False) -> None:
        self.settings = settings
        self.debug = debug
        if settings.database_url.startswith("sqlite:///"):
            folder = Path(settings.database_url.removeprefix("sqlite:///")).parent
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise RunError(f"database folder {folder}: cannot create: {exc.strerror}") from None
        self.store = RunStore(settings.database_url)
        self.owner = process_identity()
        self._launched = False

    def close(self) -> None:
        """Stop DBOS in this process (if this engine started it) and release database connections."""
        if self._launched:
            shutdown_dbos()
            self._launched = False
        self.store.close()

    def create_run(
        self,
        task: str,
        *,
        model: str | None = None,
        options: RunOptions | None = None,
        workspace: Path | None = None,
    ) -> RunRecord:
        """Record a new run (status `planning`) after checking the task and model spec."""
        task = validate_task(task)
        spec = model or self.settings.model
        resolve_model(spec, self.settings)
        run_id = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)
        folder = workspace or (self.settings.home / "workspaces" / run_id)
        self.settings.record_workspace(folder)
        options = options or RunOptions()
        growth = options.workspace_max_growth_bytes
        options = replace(
            options,
            workspace_max_growth_bytes=self.settings.workspace_max_growth_bytes if growth is None else growth,
            workspace_start_bytes=Workspace(folder).create().allocated_bytes(),
        )
        self.store.create_run(run_id, task, model=spec, workspace=str(folder.resolve()), options=options)
        self.store.append_event(run_id, "run_created", data={"task": task, "model": spec})
        return self.store.get_run(run_id)

    async def execute(self, run_id: str) -> RunRecord:
        """Drive a run to its end in this process.

        Every pause (the plan review, a tool approval, an agent's question) is a stored request
        that any process may answer (`store.requests`); the run waits for it here. Raises
        `RunError` when another live process is executing the run.
        """
        run = self.store.get_run(run_id)
        if run.finished:
            return run
        if not self.store.claim(run.id, self.owner):
            raise RunError(f"run {run.id} is being executed by another process; it cannot run twice at once")
        try:
            launch_dbos(self.settings.database_url, executor_id=self.owner, debug=self.debug)
            self._launched = True
            execution = _Execution(self, run)
            _EXECUTIONS[run.id] = execution
            work = asyncio.ensure_future(execution.drive())
            guard = asyncio.ensure_future(self._guard(run.id, work, execution))
            try:
                await work
            finally:
                guard.cancel()
                await asyncio.gather(guard, return_exceptions=True)
        finally:
            _EXECUTIONS.pop(run.id, None)
            self.store.release(run.id, self.owner)
        return self.store.get_run(run.id)

    async def _guard(self, run_id: str, work: asyncio.Future[None], execution: _Execution) -> None:
        """Renew the lease and watch for a cancel request while the run executes."""
        last_beat = time.monotonic()
        while not work.done():
            await asyncio.sleep(_GUARD_INTERVAL_S)
            if self.store.cancel_requested(run_id):
                execution.stop_reason = "cancelled"
                work.cancel()
                return
            if time.monotonic() - last_beat >= _HEARTBEAT_S:
                last_beat = time.monotonic()
                if not self.store.heartbeat(run_id, self.owner):
                    execution.stop_reason = "lease lost"
                    work.cancel()
                    return

    def request_cancel(self, run_id: str) -> RunRecord:
        """Ask for a run to stop; a run no live process executes is marked cancelled at once."""
        run = self.store.get_run(run_id)
        if run.finished:
            raise RunError(f"run {run.id} already {run.status}")
        self.store.update_run(run.id, cancel_requested=True)
        if not self.store.owner_alive(run.id) and self.store.claim(run.id, self.owner):
            try:
                _mark_cancelled(self.store, run.id)
            finally:
                self.store.release(run.id, self.owner)
        return self.store.get_run(run.id)

    def report(self, run_id: str) -> dict[str, Any]:
        """The JSON report of a run: id, status, output, error, plan, steps, usage (and its workspace)."""
        run = self.store.get_run(run_id)
        return {
            "run_id": run.id,
            "status": run.status,
            "task": run.task,
            "output": run.output,
            "error": run.error,
            "workspace": run.workspace,
            "created_at": run.created_at,
            "plan": run.plan,
            "steps": [step.to_json_dict() for step in self.store.steps(run.id)],
            "usage": self.store.usage(run.id),
        }


def _review_payload(run: RunRecord, catalog: RunCatalog) -> dict[str, Any]:
    """What a plan-review request carries: the plan, its agents, the run's tool policies and tools.

    The tools travel as plain data, so a front end in another process validates an edit against
    the same catalog the run uses (MCP tools included; `service.catalog_of_review` reads it back).
    """
    return {
        "task": run.task,
        "plan": run.plan,
        "agents": run.agents or {},
        "tool_policies": dict(run.options.tool_policies),
        "tools": [asdict(spec) for spec in catalog],
        "missing_tools": dict(catalog.missing),
        "mcp_servers": list(catalog.mcp_servers),
    }


def _mark_cancelled(store: RunStore, run_id: str, reason: str = "cancelled on request") -> None:
    """Record a run as cancelled: its unfinished steps and its open requests too."""
    now = utc_now()
    for step in store.steps(run_id):
        if step.status in ("pending", "running"):
            store.update_step(
                run_id, step.id, status="cancelled", finished_at=now if step.started_at else None
            )
    store.set_status(run_id, "cancelled", error=reason)
    store.requests.close_run(run_id, "cancelled", keep_remember=False)
    store.append_event(run_id, "run_cancelled", data={"reason": reason})


class _Execution:
    """One process's execution of one run."""

    def __init__(self, engine: Engine, run: RunRecord) -> None:
        self.engine = engine
        self.store = engine.store
        self.settings = engine.settings
        self.run = run
        self.options = run.options
        self.catalog = run_catalog(self.settings)
        growth = run.options.workspace_max_growth_bytes
        self.workspace = Workspace(
            run.workspace, max_bytes=None if growth is None else run.options.workspace_start_bytes + growth
        ).create()
        self.tool_context = tool_context(self.settings)
        self.ledger = RunLedger(self.store, run.id, run.options)
        self.model = BudgetedModel(resolve_model(run.model, self.settings), self.ledger.check)
        self.plan: Plan | None = None
        self.registry = open_registry(self.settings)
        self.memory = MemoryStore(
            self.registry, ttl_days=self.settings.memory_ttl_days, max_items=self.settings.memory_max_items
        )
        self.tool_context = replace(self.tool_context, memory=self.memory, memory_source=run.id)
        self.outputs: dict[str, str] = {}
        self.budget = context_budget(self.options, self.model.wrapped)
        self.inputs: dict[str, list[FittedInput]] = {}
        self.interrupted: set[str] = set()
        self.stop_reason: str | None = None

    async def _load_mcp_tools(self) -> None:
        """Add the configured MCP servers' tools to this run's catalog and step tools."""
        if self.settings.mcp_servers:
            self.catalog, self.tool_context = await with_mcp_tools(self.settings, self.tool_context)

    async def drive(self) -> None:
        try:
            await self._load_mcp_tools()
            if self.run.status == "planning":
                await self._plan_phase()
            if self.run.status == "awaiting_approval":
                await self._review_phase()
            if self.run.status == "running":
                await self._run_phase()
        except asyncio.CancelledError:
            if self.stop_reason == "cancelled":
                await self._cancel_step_workflows()
                _mark_cancelled(self.store, self.run.id)
                return
            raise
        except BudgetExceededError as exc:
            self._fail(str(exc))
        except MasterplannerError as exc:
            self._fail(str(exc))

    async def _cancel_step_workflows(self) -> None:
        """Cancel the DBOS workflows of unfinished steps, so nothing resumes them later."""
        for step in self.store.steps(self.run.id):
            if step.status == "running":
                await DBOS.cancel_workflow_async(f"{self.run.id}.{step.id}")

    def _refresh(self) -> None:
        self.run = self.store.get_run(self.run.id)

    def _fail(self, reason: str) -> None:
        now = utc_now()
        for step in self.store.steps(self.run.id):
            if step.status in ("pending", "running"):
                self.store.update_step(self.run.id, step.id, status="cancelled", finished_at=now)
        self.store.set_status(self.run.id, "failed", error=reason)
        self.store.requests.close_run(self.run.id, "expired", keep_remember=True)
        self.store.append_event(self.run.id, "run_failed", data={"reason": reason})
        self._refresh()

    # ---- planning and review

    async def _plan_phase(self) -> None:
        registry, task = self.registry, self.run.task
        found: list[tuple[Cohort, float]] = []
        team = None
        if registry is not None:
            # the registry may embed the task (a model load, an HTTP call): keep the loop free
            found = await asyncio.to_thread(registry.similar_cohorts, task, 3)
            team = await asyncio.to_thread(
                reusable_cohort, registry, found, self.catalog, self.settings.reuse_threshold
            )
        ready: dict[str, Any] = {}
        plan: Plan | None = None
        if team is not None:
            # a team that solved a task like this one before: its plan fitted to this task, its agents
            try:
                plan, agents, how = await adapt_plan(
                    team.plan,
                    team.agents,
                    team.cohort.task,
                    task,
                    self.catalog,
                    model=self.model,
                    ledger=self.ledger,
                )
                ready = {
                    "reused_cohort": team.cohort.id,
                    "similarity": round(team.similarity, 3),
                    "adaptation": how,
                }
            except (PlanError, ModelError) as error:
                ready = {"reuse_failed": f"cohort {team.cohort.id} could not be adapted: {error}"}
        if plan is None:
            hints = cohort_hints(found)
            plan = await make_plan(
                task, self.catalog, model=self.model, ledger=self.ledger, hints=hints or None
            )
            reused: dict[str, Any] = {}
            if registry is not None:
                reused = await asyncio.to_thread(
                    partial(
                        reusable_agents,
                        registry,
                        plan,
                        self.settings.agent_reuse_threshold,
                        same_instruction=uses_clause_plans(self.model),
                    )
                )
            prompts = await create_prompts(
                plan,
                self.catalog,
                model=self.model,
                ledger=self.ledger,
                rounds=self.options.prompt_rounds,
                only=[step_id for step_id in plan.ids if step_id not in reused],
            )
            written = prompts_to_json(prompts)
            agents = {step_id: reused.get(step_id) or written[step_id] for step_id in plan.ids}
            if hints:
                ready["hints"] = [hint.task for hint in hints]
            if reused:
                ready["reused_agents"] = {step_id: agent["agent_id"] for step_id, agent in reused.items()}
        self.store.set_status(self.run.id, "awaiting_approval", plan=plan.to_json_dict(), agents=agents)
        self.store.append_event(self.run.id, "plan_ready", data={"steps": plan.ids, **ready})
        self._refresh()

    async def _review_phase(self) -> None:
        """Wait for the plan review's answer (any process may give it) and apply it.

        An edit that does not validate against this run's catalog is refused with its problems
        in an `approval_requested` event, and a new review request opens: the plan stays as it was.
        """
        while True:
            if self.options.auto_approve:
                decision, by = {"action": "approve"}, "auto"
            else:
                decision, by = await self._review_answer()
            if decision["action"] == "reject":
                reason = str(decision.get("reason") or "rejected at review")
                self.store.append_event(self.run.id, "rejected", data={"reason": reason, "by": by})
                self.store.set_status(self.run.id, "cancelled", error=f"rejected: {reason}")
                self._refresh()
                return
            try:
                await self._apply_edit(decision)
            except PlanError as error:
                await self._open_review({"refused_edit": "; ".join(error.problems)})
                continue
            break
        self.store.append_event(self.run.id, "approved", data={"by": by})
        self.store.set_status(self.run.id, "running")
        self._refresh()

    async def _reviews(self) -> list[Request]:
        requests = await asyncio.to_thread(self.store.requests.find, self.run.id, state=None)
        return [request for request in requests if request.kind == "plan_review"]

    async def _open_review(self, note: dict[str, Any] | None = None) -> Request:
        """Open a plan-review request (after a refused edit, `note` says why)."""
        count = len(await self._reviews())
        request, new = await asyncio.to_thread(
            self.store.requests.open,
            self.run.id,
            "plan_review",
            _review_payload(self.run, self.catalog) | (note or {}),
            key=f"{self.run.id}#review{count + 1}",
        )
        if new:
            self.store.append_event(
                self.run.id, "approval_requested", data={"request": request.id, **(note or {})}
            )
        return request

    async def _review_answer(self) -> tuple[dict[str, Any], str]:
        """The answer to this run's latest plan-review request, opening one when none is open.

        A review answered before the process that asked died is taken as it is.
        """
        reviews = await self._reviews()
        latest = reviews[-1] if reviews and reviews[-1].state in ("open", "answered") else None
        if latest is None:
            latest = await self._open_review()
        answered = await self.store.requests.wait(latest.id)
        if answered.state != "answered" or answered.answer is None:
            raise RunError(f"the plan review (request {answered.id}) was {answered.state}")
        return answered.answer, answered.answered_by or "person"

    async def _apply_edit(self, decision: dict[str, Any]) -> None:
        if not ("plan" in decision or "agents" in decision or "tool_policies" in decision):
            return
        plan = validate_plan(decision.get("plan", self.run.plan or {}), self.catalog)
        agents = await self._write_missing_prompts(plan, dict(decision.get("agents", self.run.agents) or {}))
        options = replace(
            self.options, tool_policies=dict(decision.get("tool_policies", self.options.tool_policies))
        )
        self.store.update_run(
            self.run.id,
            plan=plan.to_json_dict(),
            agents=agents,
            options=json.dumps(options.to_json_dict()),
        )
        self.options = options
        self.store.append_event(
            self.run.id, "plan_edited", data={"steps": plan.ids, "tool_policies": options.tool_policies}
        )

    async def _write_missing_prompts(self, plan: Plan, agents: dict[str, Any]) -> dict[str, Any]:
        """Have the Prompt Creator write prompts for the steps an edit left without one.

        Those are steps the person added, and steps whose reused agent they swapped for a fresh one.
        """
        missing = [step_id for step_id in plan.ids if not (agents.get(step_id) or {}).get("prompt")]
        if not missing:
            return agents
        written = prompts_to_json(
            await create_prompts(
                plan,
                self.catalog,
                model=self.model,
                ledger=self.ledger,
                rounds=self.options.prompt_rounds,
                only=missing,
            )
        )
        for step_id in missing:
            policies = (agents.get(step_id) or {}).get("tool_policies")
            agents[step_id] = written[step_id] | ({"tool_policies": policies} if policies else {})
        return agents

    # ---- execution

    async def _run_phase(self) -> None:
        plan = Plan.model_validate(self.run.plan)
        self.plan = plan
        stored = self.store.steps(self.run.id)
        self._check_tools(
            plan, {step.id for step in stored if step.status in ("succeeded", "failed", "skipped")}
        )
        resumed = bool(stored)
        if not resumed:
            self.store.init_steps(self.run.id, plan.ids)
            stored = self.store.steps(self.run.id)
        finished = {
            step.id: StepOutcome(step.status, step.output, step.error)
            for step in stored
            if step.status in ("succeeded", "failed", "skipped")
        }
        self.outputs = {step_id: outcome.output or "" for step_id, outcome in finished.items()}
        # A step's workflow is recorded before its `step_started` event, so in a resumed run any
        # unfinished step, not only a "running" one, may have a workflow a crash left pending:
        # starting it again under its id would wait on the dead process for ever.
        self.interrupted = {step.id for step in stored if resumed and step.id not in finished}
        try:
            async with asyncio.timeout(self._wall_time_left()):
                outcomes = await run_dag(
                    plan,
                    self._run_step,
                    max_parallel=self.options.max_parallel,
                    finished=finished,
                    on_skip=self._skip,
                )
                problems = [
                    f"step {step_id} {outcome.status}: {outcome.error}"
                    for step_id, outcome in outcomes.items()
                    if outcome.status != "succeeded"
                ]
                if problems:
                    self._fail("; ".join(problems))
                    await self._remember(succeeded=False)
                    return
                with SetWorkflowID(f"{self.run.id}.aggregate"):
                    output = await _aggregate_workflow(self.run.id)
        except TimeoutError:
            raise BudgetExceededError(
                f"the run used its wall-time budget of {self.options.max_wall_s:g} s"
            ) from None
        self.store.set_status(self.run.id, "succeeded", output=output)
        self.store.requests.close_run(self.run.id, "expired", keep_remember=True)
        self.store.append_event(self.run.id, "run_succeeded", data={"output_chars": len(output)})
        self._refresh()
        await self._remember(succeeded=True)

    def _check_tools(self, plan: Plan, done: set[str]) -> None:
        """Refuse to start when a step still to run names a tool that is not available here.

        The plan was checked when it was made, but settings can change before it runs (it is
        approved or resumed later, or by another process): say which setting enables the tool
        before any step starts, rather than let a step fail on its first call.
        """
        problems = [
            problem
            for step in plan.steps
            if step.id not in done
            for problem in tool_problems(step, self.catalog)
        ]
        if problems:
            raise PlanError(problems, context="the plan cannot run here")

    async def _remember(self, *, succeeded: bool) -> None:
        """Tell the registry how the run went; store a succeeded run's team as `remember_runs` says.

        A failed run only counts against the stored agents it used. With `ask` (and no `--yes`),
        a `remember` request opens and the run ends without waiting: whoever answers it later,
        from any process, stores the team (`RunService.answer`).
        """
        policy = self.settings.remember_runs
        if self.registry is None or self.plan is None or policy == "never":
            return
        await asyncio.to_thread(self._remember_episode)
        store_new = succeeded and (policy == "always" or self.options.auto_approve)
        await asyncio.to_thread(
            remember_run,
            self.registry,
            run_id=self.run.id,
            model=self.run.model,
            plan=self.plan,
            agents=self.run.agents or {},
            succeeded=succeeded,
            store_new=store_new,
        )
        if succeeded and store_new:
            self.store.append_event(self.run.id, "team_stored", data={"cohort": self.run.id})
        elif succeeded:
            request, new = await asyncio.to_thread(
                self.store.requests.open,
                self.run.id,
                "remember",
                {"agents": len(self.plan.steps), "task": self.run.task},
                key=f"{self.run.id}#remember",
            )
            if new:
                self.store.append_event(
                    self.run.id, "request_opened", data={"request": request.id, "kind": "remember"}
                )

    def _remember_episode(self) -> None:
        """Keep an account of the run in episodic memory (not when it holds something secret-looking)."""
        run = self.store.get_run(self.run.id)
        text = episode_text(run.task, run.status, run.output, run.error, run.created_at)
        try:
            self.memory.remember(text, kind="episode", source=run.id)
        except ToolError as error:
            self.store.append_event(run.id, "episode_not_kept", data={"reason": str(error)})

    def _wall_time_left(self) -> float | None:
        if self.options.max_wall_s is None:
            return None
        approved = [event.at for event in self.store.events(self.run.id) if event.kind == "approved"]
        started = _parse_time(approved[0]) if approved else time.time()
        return max(0.0, self.options.max_wall_s - (time.time() - started))

    def _skip(self, step: Step, reason: str) -> None:
        self.store.update_step(self.run.id, step.id, status="skipped", error=reason)

    async def _run_step(self, step: Step) -> StepOutcome:
        workflow_id = f"{self.run.id}.{step.id}"
        status = await DBOS.get_workflow_status_async(workflow_id) if step.id in self.interrupted else None
        if status is None or status.status == "SUCCESS":
            # A new step runs here; a finished one returns its recorded outcome without running.
            with SetWorkflowID(workflow_id):
                result = await _step_workflow(self.run.id, step.id)
        else:
            # Interrupted in an earlier process: DBOS re-runs it from its last checkpoint.
            handle = await DBOS.resume_workflow_async(workflow_id)
            result = await handle.get_result()
        outcome = StepOutcome(result["status"], result.get("output"), result.get("error"))
        if outcome.status == "succeeded":
            self.outputs[step.id] = outcome.output or ""
        return outcome

    async def _record(self, action: Callable[[], Any], name: str) -> Any:
        """Run a store write as a DBOS step, so a replayed workflow does not write it twice."""
        return await DBOS.run_step_async({"name": name}, action)

    async def step_body(self, step_id: str) -> dict[str, Any]:
        """The body of one step's workflow: attempts of the step agent, with retries and events."""
        assert self.plan is not None
        step = self.plan.step(step_id)
        tools = [name for name in step.tools if name in RUNNABLE_TOOLS or name in self.tool_context.mcp_specs]
        run_id = self.run.id
        attempts = self.options.step_attempts

        # Plain writes, not DBOS steps: a workflow that runs again after a crash really starts
        # again, and a finished one is never run again (its outcome is stored before it returns).
        self.store.step_event(
            run_id,
            step_id,
            "step_started",
            {"tools": tools},
            status="running",
            started_at=utc_now(),
            attempts=1,
        )
        error = ""
        for attempt in range(1, attempts + 1):
            try:
                async with asyncio.timeout(self.options.step_timeout_s):
                    output = await self._agent_attempt(step, tools, attempt)
            except TimeoutError:
                error = f"timed out after {self.options.step_timeout_s:g} s"
                break
            except BudgetExceededError:
                raise
            except (ModelError, UnexpectedModelBehavior, ModelHTTPError) as exc:
                error = _describe(exc)
                if attempt == attempts:
                    error += f"; the step gave up after {attempts} attempts" if attempts > 1 else ""
                    break
                delay = min(self.options.retry_backoff_s * 2 ** (attempt - 1), 30.0)

                def retried(attempt: int = attempt, error: str = error, delay: float = delay) -> None:
                    data = {"attempt": attempt + 1, "error": error, "delay_s": delay}
                    self.store.step_event(run_id, step_id, "step_retried", data, attempts=attempt + 1)

                await self._record(retried, "step_retried")
                await DBOS.sleep_async(delay)
                continue
            except (MasterplannerError, UsageLimitExceeded, AgentRunError) as exc:
                error = _describe(exc)
                break
            except Exception as exc:  # a tool or provider bug must fail the step, not the engine
                error = f"{type(exc).__name__}: {exc}"
                break

            self.store.step_event(
                run_id,
                step_id,
                "step_succeeded",
                {"output_chars": len(output)},
                status="succeeded",
                output=output,
                finished_at=utc_now(),
            )
            return {"status": "succeeded", "output": output}

        self.store.step_event(
            run_id,
            step_id,
            "step_failed",
            {"error": error},
            status="failed",
            error=error,
            finished_at=utc_now(),
        )
        return {"status": "failed", "error": error}

    async def _agent_attempt(self, step: Step, tools: list[str], attempt: int) -> str:
        """One try of the step agent; a retry samples (`retry_settings`)."""
        assert self.plan is not None
        prompt = (self.run.agents or {}).get(step.id, {}).get("prompt")
        agent: Agent[None, str] = Agent(
            CheckpointedModel(labelled(self._step_model(step, tools), step_purpose(step.id), self.ledger)),
            instructions=step_instructions(step, prompt),
            tools=step_tools(
                self.workspace,
                replace(self.tool_context, ask_person=partial(self._ask_person, step.id)),
                tools,
                self._tool_runner(step),
            ),
            retries=2,
            capabilities=[ProcessHistory(trimmer(self.budget.history_chars))],
        )
        brief = step_brief(self.plan, step, await self._step_inputs(step, step.id), tools=tools)
        result = await agent.run(
            brief,
            model_settings={} if attempt == 1 else retry_settings(attempt),
            usage_limits=UsageLimits(request_limit=_AGENT_REQUEST_LIMIT),
        )
        return result.output

    async def _step_inputs(self, step: Step, event_step: str | None) -> list[FittedInput]:
        """The step's dependencies' outputs fitted to the run's budget (once per step, not per attempt).

        `event_step` is the plan step the events name (None for the aggregator's reading).
        """
        key = event_step or ""
        fitted = self.inputs.get(key)
        if fitted is None:
            summarizer = Summarizer(
                CheckpointedModel(labelled(self.model, "summarizer", self.ledger)),
                chunk_chars=self.budget.history_chars // 2,
            )
            fitted = await fit_inputs(step, self.outputs, self.budget.inputs_chars, summarizer)
            for item in fitted:
                if item.how == "whole":
                    continue
                data: dict[str, Any] = {
                    "dependency": item.step_id,
                    "chars": item.original_chars,
                    "shown_chars": len(item.text),
                } | ({"reason": item.reason} if item.reason else {})

                def note(item: FittedInput = item, data: dict[str, Any] = data) -> None:
                    kind: EventKind = "input_summarized" if item.how == "summarized" else "input_cut"
                    self.store.step_event(self.run.id, event_step, kind, data)

                await self._record(note, "input_fitted")
            self.inputs[key] = fitted
        return fitted

    def _step_model(self, step: Step, tools: list[str]) -> Any:
        """The run's model, with tool-use aids when its kind takes them (the embedded local model)."""
        if not tools:
            return self.model
        assert self.plan is not None
        aids = tool_aids(self.plan, step, tools, self.workspace)
        aided = None if aids is None else with_tool_aids(self.model.wrapped, aids)
        return self.model if aided is None else BudgetedModel(aided, self.ledger.check)

    async def _ask_person(self, step_id: str, question: str) -> str:
        """An agent's `ask_user` question as a stored request; waits until any process answers it."""
        answered = await self.store.requests.pause(
            self.run.id,
            "ask_user",
            {"question": question},
            key=durable_key(),
            step_id=step_id,
            announce=lambda request: self.store.append_event(
                self.run.id, "request_opened", step_id, {"request": request.id, "kind": "ask_user"}
            ),
        )
        if answered.state != "answered" or answered.answer is None:
            raise ToolError(f"the question was not answered (request {answered.id} is {answered.state})")
        return str(answered.answer["text"])

    def _tool_runner(self, step: Step) -> ToolRunner:
        return ToolCalls(
            store=self.store,
            run_id=self.run.id,
            step_id=step.id,
            policy=lambda name: self.options.policy(
                name,
                self.catalog[name].approval if name in self.catalog else "ask",
                ((self.run.agents or {}).get(step.id) or {}).get("tool_policies"),
            ),
        ).run

    async def aggregate_body(self) -> str:
        """The answer: the final step's output, the only sink's, or an aggregator call over the sinks."""
        assert self.plan is not None
        plan = self.plan
        if plan.final_step:
            return self.outputs.get(plan.final_step, "")
        ends = sinks(plan.steps)
        if len(ends) == 1:
            return self.outputs.get(ends[0], "")
        # The answer is written from every sink's output: they share the working-memory budget
        # as a step's inputs do (summarised when too long), as if one more step read them all.
        reader = Step(
            id="answer",
            title="Compose the final answer",
            instruction=f"Compose the final answer to the task: {plan.task}"[:4000],
            agent_role="aggregator",
            depends_on=ends,
            expected_output="the answer to the task",
        )
        sections = dependency_context(await self._step_inputs(reader, None))
        agent: Agent[None, str] = Agent(
            CheckpointedModel(labelled(self.model, "aggregator", self.ledger)),
            instructions=_AGGREGATOR_INSTRUCTIONS,
        )
        result = await agent.run(f"Task: {plan.task}\n\nResults of the steps:\n\n{sections}")
        return result.output


def _describe(exc: BaseException) -> str:
    """A step attempt's failure in our words: a library's advice and links never reach the person."""
    if isinstance(exc, UsageLimitExceeded):
        return f"the step agent used more than {_AGENT_REQUEST_LIMIT} model requests"
    if isinstance(exc, AgentRunError):
        return failure_text(exc)
    return str(exc) or type(exc).__name__
