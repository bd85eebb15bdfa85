"""The run's durable workflows: one per plan step, the answer, and the run's end.

Each takes only ids. A step's workflow (`<run>.<step>`) reads the plan, its agent, the run's
options and policies and its dependencies' outputs from the database, and gets the rest from
`resources_of` (built from the run's row in whatever process runs it). Inside it every model
request is a DBOS step (`CheckpointedModel`) and so is every tool call, so a workflow that runs
again after a crash replays their recorded results instead of repeating them. A finished one is
never executed again: calling it with its id returns its recorded outcome.

The end of a run (`<run>._end`) records how it ended and tells the registry, as two DBOS steps:
a process that dies between them leaves the workflow pending, and the next one to take the run
finishes it (`Engine.execute`), so a succeeded run's team is stored exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import Any, Literal

import pydantic_ai
import sqlalchemy as sa
from dbos import DBOS
from opentelemetry.trace import Status, StatusCode
from pydantic import BaseModel, Field
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.exceptions import AgentRunError, ModelHTTPError, UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelRequest, UserPromptPart
from pydantic_ai.models import Model
from pydantic_ai.usage import UsageLimits

from .. import telemetry
from ..agents import failure_text, retry_settings
from ..database import database_failure
from ..errors import (
    BudgetExceededError,
    MasterplannerError,
    ModelError,
    ModelRetriesExhaustedError,
    RunError,
    ToolError,
    nul_replaced,
)
from ..models import takes_tool_aids, with_tool_aids
from ..models.labelled import labelled
from ..plan import Plan, Step, sinks
from ..purpose import step_purpose
from ..redaction import redacted
from ..registry.memory import episode_text
from ..tools.catalog import Catalog
from ..tools.context import StepDeps, ToolRunner
from ..tools.results import TOOL_FAILED, failed
from ..tools.team import team_tool
from ..working_memory import FittedInput, HistoryProcessor, Summarizer, fit_inputs, history_processor, trimmer
from .checkpoints import CheckpointedModel
from .collaboration import StepTeam, delivered_text, team_brief
from .records import AgentBrief, EventKind, RunRecord, StepRecord, briefs_json, utc_now, workflow_id
from .requests import StepClock
from .resources import RunResources, resources_of
from .reuse import remember_run, secret_in_team
from .runtime import executor_id, keep_lease, launched_host
from .step_agent import (
    BudgetedModel,
    PaidToolCalls,
    dependency_context,
    step_brief,
    step_instructions,
    tool_aids,
    written_tool_call,
)
from .step_tools import runnable_tools, step_tools, team_tools
from .tool_calls import ToolCalls, step_pause

__all__ = [
    "AGENT_REQUEST_LIMIT",
    "AGGREGATE_WORKFLOW",
    "END_WORKFLOW",
    "after_step_threads",
    "aggregate_workflow",
    "end_workflow",
    "plain_answer",
    "step_workflow",
]

# Step agents run inside our workflows and their output is ours to show: pydantic-ai's first-run
# console banner would land in a live view or a program's output (the CLI also sets
# PYDANTIC_AI_NO_BANNER; this covers masterplanner used as a library).
pydantic_ai.BANNER_ENABLED = False

AGENT_REQUEST_LIMIT = 12
"""Most model requests one attempt of a step agent makes."""
_CHECKER_INSTRUCTIONS = (
    "Decide whether a step's output meets its expected output. Judge only what the output says, "
    "against what was expected; give the reason in one sentence."
)


class OutputCheck(BaseModel):
    """The checker's verdict on one step's output."""

    meets: bool
    reason: str = Field(max_length=500)


_AGGREGATOR_INSTRUCTIONS = "Compose the final answer to the task from the results of its steps. Be complete."


async def _resources(run_id: str) -> RunResources:
    settings, store = launched_host()
    return await resources_of(run_id, settings, store)


async def _db(action: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """A database call off the event loop."""
    return await asyncio.to_thread(action, *args, **kwargs)


async def _recorded(action: Callable[[], Any], name: str) -> Any:
    """A store write as a DBOS step, so a replayed workflow does not write it twice."""
    workflow = DBOS.workflow_id

    async def write() -> Any:
        return await _step_thread(workflow, action)

    return await DBOS.run_step_async({"name": name}, write)


_threads_lock = threading.Lock()
_step_threads: dict[str, int] = {}
"""How many threads of each workflow's steps (`_recorded`) run now, by workflow id."""
_after_threads: dict[str, list[Callable[[], None]]] = {}


async def _step_thread(workflow: str | None, action: Callable[[], Any]) -> Any:
    """`action` on a thread, counted as the workflow's while it runs (`after_step_threads`).

    A workflow cancelled while its step's thread runs leaves that thread running: the step's
    call (telling the registry) goes on after the workflow's task stopped.
    """
    if workflow is None:
        return await asyncio.to_thread(action)
    with _threads_lock:
        _step_threads[workflow] = _step_threads.get(workflow, 0) + 1
    started, dropped = threading.Event(), threading.Event()

    def run() -> Any:
        with _threads_lock:
            if dropped.is_set():
                return None  # cancelled before it began: it never runs
            started.set()
        try:
            return action()
        finally:
            _thread_returned(workflow)

    try:
        return await asyncio.to_thread(run)
    except BaseException:  # cancelled, or never given a thread (its pool shut down)
        with _threads_lock:
            never = not started.is_set()
            if never:
                dropped.set()  # and if a thread takes it now, it does nothing
        if never:
            _thread_returned(workflow)
        raise


def _thread_returned(workflow: str) -> None:
    with _threads_lock:
        left = _step_threads[workflow] - 1
        if left:
            _step_threads[workflow] = left
            return
        del _step_threads[workflow]
        then = _after_threads.pop(workflow, [])
    for each in then:
        each()


def after_step_threads(workflow: str, then: Callable[[], None]) -> bool:
    """Whether no thread of the workflow's steps runs in this process now.

    If one does (its task was cancelled, the thread goes on), False, and `then` is called, on
    that thread, once the last of them returns.
    """
    with _threads_lock:
        if workflow not in _step_threads:
            return True
        _after_threads.setdefault(workflow, []).append(then)
        return False


async def _run_and_steps(resources: RunResources, run_id: str) -> tuple[RunRecord, list[StepRecord]]:
    """The run and its steps as stored."""
    return await _db(resources.store.get_run, run_id), await _db(resources.store.steps, run_id)


def _outputs(steps: list[StepRecord]) -> dict[str, str]:
    """The outputs of the steps that succeeded, by step id."""
    return {step.id: step.output or "" for step in steps if step.status == "succeeded"}


@DBOS.workflow(name="masterplanner.step")
async def step_workflow(run_id: str, step_id: str) -> dict[str, Any]:
    """Run one plan step: attempts of its agent, with retries; returns its status and output or error."""
    settings, store = launched_host()
    run, steps = await _db(store.get_run, run_id), await _db(store.steps, run_id)
    if DBOS.workflow_id != workflow_id(run_id, step_id, run.retries):
        # a workflow of the run before it was retried, taken from a queue late: the step is the
        # retry's now, and this one leaves it alone
        return {"status": "failed", "error": "the run was retried: this execution of the step was dropped"}
    resources = await resources_of(run_id, settings, store, retries=run.retries)
    # "running" already: an execution in a process that stopped started it, and this one resumes it
    resumed = any(step.id == step_id and step.status == "running" for step in steps)
    step_run = _StepRun(resources, run, step_id, _outputs(steps))
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": step_run.step.agent_role,
        "gen_ai.agent.id": step_id,
        "masterplanner.run.id": run_id,
        "masterplanner.process": executor_id() or "",
    }
    context = telemetry.run_context(run_id, run.retries)
    with telemetry.span(f"invoke_agent {step_run.step.agent_role}", attributes, context=context) as span:
        outcome = await step_run.run(resumed=resumed)
        span.set_attribute("masterplanner.step.status", outcome["status"])
        if outcome["status"] != "succeeded":
            span.set_status(Status(StatusCode.ERROR, "the step failed"))
        return outcome


def plain_answer(plan: Plan, outputs: dict[str, str]) -> str | None:
    """The run's answer when no model composes it: its final step's output, or its only sink's.

    None when the plan has several sinks and no final step: then `aggregate_workflow` composes it.
    """
    if plan.final_step:
        return outputs.get(plan.final_step, "")
    ends = sinks(plan.steps)
    return outputs.get(ends[0], "") if len(ends) == 1 else None


AGGREGATE_WORKFLOW = "masterplanner.aggregate"
"""The DBOS function name of the run's answer (`aggregate_workflow`), as DBOS records it."""


@DBOS.workflow(name=AGGREGATE_WORKFLOW)
async def aggregate_workflow(run_id: str) -> str:
    """The run's answer: the final step's output, the only sink's, or an aggregator call over the sinks."""
    resources = await _resources(run_id)
    run, steps = await _run_and_steps(resources, run_id)
    plan, outputs = _plan_of(run), _outputs(steps)
    answer = plain_answer(plan, outputs)
    if answer is not None:
        return answer
    ends = sinks(plan.steps)
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
    sections = dependency_context(await _fitted_inputs(resources, reader, outputs, None))
    agent: Agent[None, str] = Agent(
        CheckpointedModel(labelled(resources.model, "aggregator", resources.ledger)),
        instructions=_AGGREGATOR_INSTRUCTIONS,
    )
    result = await agent.run(f"Task: {plan.task}\n\nResults of the steps:\n\n{sections}")
    return nul_replaced(result.output)


END_WORKFLOW = "masterplanner.end"
"""The DBOS function name of the run's end (`end_workflow`), as DBOS records it."""


@DBOS.workflow(name=END_WORKFLOW)
async def end_workflow(
    run_id: str, status: Literal["succeeded", "failed"], text: str, tell_registry: bool
) -> None:
    """Record how the run ended (`text`: its output or its error), then tell the registry.

    The run's resources are built only to tell the registry: a run that failed because they
    could not be built (an MCP server that does not start) still ends, failed, saying why.
    """
    settings, store = launched_host()

    def record() -> bool:
        """Whether the run ended so: a cancel recorded meanwhile stands, and nothing else is said."""
        # one transaction: the status, its steps, its requests and its end event (`end_run`)
        if status == "succeeded":
            ended = store.end_run(
                run_id,
                "succeeded",
                "run_succeeded",
                {"output_chars": len(text)},
                requests="expired",
                keep_remember=True,
                unstarted_finished=True,
                output=text,
            )
        else:
            reason = redacted(text)  # a model server's error may echo the key it was sent
            # `outcome_counted`: the registry is told this failure (a retry that succeeds corrects it)
            ended = store.end_run(
                run_id,
                "failed",
                "run_failed",
                {"reason": reason, "outcome_counted": tell_registry},
                requests="expired",
                keep_remember=True,
                unstarted_finished=True,
                error=reason,
            )
        if not ended:
            return False
        if telemetry.exporting():
            run = store.get_run(run_id)
            telemetry.record_run(
                run_id, retries=run.retries, status=status, created_at=run.created_at, model=run.model
            )
        return True

    ended = await _recorded(record, "run_ended")
    if tell_registry and ended is not False:  # (None: recorded by a version that returned nothing)
        resources = await resources_of(run_id, settings, store)

        def tell() -> None:
            try:
                _tell_registry(resources, succeeded=status == "succeeded")
            except MasterplannerError as error:  # the run's outcome stands; say what was not stored
                store.append_event(run_id, "team_not_stored", data={"reason": str(error)})

        await _recorded(tell, "registry_told")


def _tell_registry(resources: RunResources, *, succeeded: bool) -> None:
    """Keep an episode of the run; count its agents' outcome; store a succeeded run's team.

    With `remember_runs = ask` (and no `--yes`) a `remember` request opens and the run ends
    without waiting: whoever answers it later, from any process, stores the team. A team
    holding text that looks like a secret is neither stored nor asked about: a
    `team_not_stored` event says where the secret is (`secret_in_team`).
    """
    registry, memory, store = resources.registry, resources.memory, resources.store
    policy = resources.settings.remember_runs
    run = store.get_run(resources.run_id)
    if registry is None or run.plan is None or policy == "never":
        return
    if memory is not None:
        try:
            memory.remember(
                episode_text(run.task, run.status, run.output, run.error, run.created_at),
                kind="episode",
                source=run.id,
            )
        except ToolError as error:
            store.append_event(run.id, "episode_not_kept", data={"reason": str(error)})
    plan, agents = run.plan, briefs_json(run.agents)
    secret = secret_in_team(plan, agents) if succeeded else None
    store_new = succeeded and secret is None and (policy == "always" or run.options.auto_approve)
    events = store.events(run.id)
    retried = max((event.seq for event in events if event.kind == "run_retried"), default=0)
    failure_counted = any(
        event.kind == "run_failed" and event.data.get("outcome_counted") and event.seq < retried
        for event in events
    )
    stored = remember_run(
        registry,
        run_id=run.id,
        model=run.model,
        plan=plan,
        agents=agents,
        succeeded=succeeded,
        store_new=store_new,
        failure_counted=failure_counted,
        counting=f"{run.id}#{run.retries}",  # once per end: a resume that tells it again counts nothing
    )
    if secret is not None:
        store.append_event(run.id, "team_not_stored", data={"reason": secret})
    elif succeeded and store_new:
        # once: an end told again (a resume) or a `remember` at once finds the team stored, and
        # writes the event only when none says so (one past what was read before, when stored now)
        latest = events[-1].seq if stored and events else 0
        store.append_event_once(run.id, "team_stored", {"cohort": run.id}, after=latest)
    elif succeeded:
        store.requests.open(
            run.id,
            "remember",
            {"agents": len(plan.steps), "task": run.task},
            key=f"{run.id}#remember",
            event=("request_opened", {"kind": "remember"}),
        )


async def _fitted_inputs(
    resources: RunResources, step: Step, outputs: dict[str, str], event_step: str | None
) -> list[FittedInput]:
    """The step's dependencies' outputs fitted to the run's budget, with an event for each one changed.

    `event_step` is the plan step the events name (None for the aggregator's reading).
    """
    summarizer = Summarizer(
        CheckpointedModel(labelled(resources.model, "summarizer", resources.ledger)),
        chunk_chars=resources.budget.history_chars // 2,
    )
    fitted = await fit_inputs(step, outputs, resources.budget.inputs_chars, summarizer)
    for item in fitted:
        if item.how == "whole":
            continue
        kind: EventKind = "input_summarized" if item.how == "summarized" else "input_cut"
        data: dict[str, Any] = {
            "dependency": item.step_id,
            "chars": item.original_chars,
            "shown_chars": len(item.text),
        } | ({"reason": item.reason} if item.reason else {})

        def note(kind: EventKind = kind, data: dict[str, Any] = data) -> None:
            resources.store.step_event(resources.run_id, event_step, kind, data)

        await _recorded(note, "input_fitted")
    return fitted


class _StepRun:
    """One execution of one step's workflow."""

    def __init__(
        self, resources: RunResources, run: RunRecord, step_id: str, outputs: dict[str, str]
    ) -> None:
        self.resources = resources
        self.store = resources.store
        self.record = run
        self.plan = _plan_of(run)
        self.step = self.plan.step(step_id)
        self.outputs = outputs
        self.tools = runnable_tools(self.step.tools, resources.tools)
        self.workflow_id = workflow_id(run.id, step_id, run.retries)
        self.team = (
            StepTeam(resources, step_id, run.options)
            if run.options.team_tools and len(self.plan.steps) > 1
            else None
        )
        self.last_tool_result: str | None = None
        """What the agent was given by its latest tool call (a replayed call's recorded result too)."""

    async def run(self, *, resumed: bool) -> dict[str, Any]:
        """Attempts of the step agent until one succeeds, the attempts run out or an error ends it.

        `resumed`: an execution in a process that stopped started the step (its workflow replays
        from its checkpoints here); the step is not started again, it is resumed in this process.
        """
        run_id, step_id, options = self.record.id, self.step.id, self.record.options
        # Plain writes, not DBOS steps: a workflow that runs again after a crash really starts
        # again, and a finished one is never run again (its outcome is stored before it returns).
        if resumed:
            await _db(self.store.append_event, run_id, "step_resumed", step_id, {"process": executor_id()})
        else:
            await _db(
                self.store.step_event,
                run_id,
                step_id,
                "step_started",
                {"tools": self.tools, "process": executor_id()},
                status="running",
                started_at=utc_now(),
                attempts=1,
            )
        inputs = await _fitted_inputs(self.resources, self.step, self.outputs, step_id)
        attempts, error = options.step_attempts, ""
        for attempt in range(1, attempts + 1):
            try:
                async with asyncio.timeout(options.step_timeout_s) as deadline:
                    with StepClock(deadline).running():  # stopped while a person is asked
                        output = nul_replaced(await self._attempt(inputs, attempt))
            except TimeoutError:
                error = f"timed out after {options.step_timeout_s:g} s"
                break
            except BudgetExceededError:
                raise
            except ModelRetriesExhaustedError as exc:  # its tries were the model layer's (`model_retried`)
                error = _describe(exc)
                break
            except (ModelError, UnexpectedModelBehavior, ModelHTTPError) as exc:
                error = _describe(exc)
                if attempt == attempts:
                    error += f"; the step gave up after {attempts} attempts" if attempts > 1 else ""
                    break
                delay = min(options.retry_backoff_s * 2 ** (attempt - 1), 30.0)

                def retried(attempt: int = attempt, error: str = error, delay: float = delay) -> None:
                    data = {"attempt": attempt + 1, "error": error, "delay_s": delay}
                    self.store.step_event(run_id, step_id, "step_retried", data, attempts=attempt + 1)

                await _recorded(retried, "step_retried")
                await DBOS.sleep_async(delay)
                continue
            except (MasterplannerError, UsageLimitExceeded, AgentRunError) as exc:
                error = _describe(exc)
                if isinstance(exc, UsageLimitExceeded) and failed(self.last_tool_result):
                    # a model that kept calling a failing tool: say what kept failing
                    # as the agent saw it, which may quote a key the call was given (a path, a URL)
                    problem = redacted(str(self.last_tool_result).removeprefix(TOOL_FAILED).strip())
                    error += f" (its last tool call failed: {problem})"
                break
            except sa.exc.DBAPIError as exc:  # DBOS's own writes (a full disk); our stores raise RunError
                error = database_failure(exc, self.resources.settings.database_url)
                break
            except Exception as exc:  # a tool or provider bug must fail the step, not the engine
                error = redacted(f"{type(exc).__name__}: {exc}")
                break
            shortfall = await self._check(output) if options.check_outputs else None
            if shortfall is not None:
                error = shortfall
                break
            await _db(
                self.store.step_event,
                run_id,
                step_id,
                "step_succeeded",
                {"output_chars": len(output)},
                status="succeeded",
                output=output,
                finished_at=utc_now(),
            )
            return {"status": "succeeded", "output": output}
        error = nul_replaced(error)  # a model's words may be in it (a checker's reason)
        await _db(
            self.store.step_event,
            run_id,
            step_id,
            "step_failed",
            {"error": error},
            status="failed",
            error=error,
            finished_at=utc_now(),
        )
        return {"status": "failed", "error": error}

    async def _attempt(self, inputs: list[FittedInput], attempt: int) -> str:
        """One try of the step agent; a retry samples (`retry_settings`)."""
        resources, step, team = self.resources, self.step, self.team
        paid = PaidToolCalls(resources.ledger, step_purpose(step.id))
        context = replace(resources.tools, ask_person=self._ask_person, team=team, spending=paid)
        tools = step_tools(self.tools, context)
        capabilities: list[Any] = [ProcessHistory(trimmer(resources.budget.history_chars))]
        brief = ""
        if team is not None:
            tools += team_tools()
            # messages that waited for the step (a retry sees again those shown to earlier attempts)
            earlier = (
                [] if attempt == 1 else await _db(self.store.messages.delivered_to, self.record.id, step.id)
            )
            waiting = await team.deliver(f"{self.workflow_id}#brief{attempt}")
            shown = {message.id: message for message in [*earlier, *waiting]}
            brief = team_brief(self.plan, step.id, list(shown.values()))
            capabilities.append(ProcessHistory(self._deliveries(attempt)))
        agent: Agent[StepDeps, str] = Agent(
            CheckpointedModel(labelled(self._model(), step_purpose(step.id), resources.ledger)),
            deps_type=StepDeps,
            instructions=step_instructions(step, self._agent().prompt or None),
            tools=tools,
            retries=2,
            capabilities=capabilities,
        )
        names = [tool.name for tool in tools]

        @agent.output_validator
        def answered_in_words(output: str) -> str:
            called = written_tool_call(output, names)
            if called is not None:
                raise ModelRetry(
                    f"your answer is a call of {called} written as text: make the call as a tool call, "
                    "or answer in words"
                )
            return output

        result = await agent.run(
            step_brief(self.plan, step, inputs, tools=self.tools, team=brief),
            deps=StepDeps(resources.workspace, context, self._tool_runner()),
            model_settings={} if attempt == 1 else retry_settings(attempt),
            usage_limits=UsageLimits(request_limit=AGENT_REQUEST_LIMIT),
        )
        return result.output

    def _agent(self) -> AgentBrief:
        return self.record.agents.get(self.step.id) or AgentBrief()

    async def _check(self, output: str) -> str | None:
        """Whether the output meets the step's expected output (`check_outputs`): None, or why not."""
        step, resources = self.step, self.resources
        if not step.expected_output:
            return None
        checker: Agent[None, OutputCheck] = Agent(
            CheckpointedModel(labelled(resources.model, "checker", resources.ledger)),
            output_type=OutputCheck,
            instructions=_CHECKER_INSTRUCTIONS,
        )
        budget = resources.budget.inputs_chars
        shown = output if len(output) <= budget else output[:budget] + "\n[… cut]"
        result = await checker.run(
            f"Step: {step.title}\nInstruction: {step.instruction}\n"
            f"Expected output: {step.expected_output}\n\nThe step's output:\n{shown}"
        )
        verdict = result.output
        data = {"meets": verdict.meets, "reason": verdict.reason}
        await _db(self.store.step_event, self.record.id, step.id, "output_checked", data)
        if verdict.meets:
            return None
        return f"its output does not meet the expected output ({step.expected_output}): {verdict.reason}"

    def _deliveries(self, attempt: int) -> HistoryProcessor:
        """Before each model request: the messages that arrived since, added to the conversation.

        Each delivery's key is its place in the workflow (attempt, request), so a replay after a
        crash shows the same messages at the same request, and none twice.
        """
        team, requests = self.team, itertools.count(1)
        assert team is not None

        async def deliver(messages: list[ModelMessage]) -> list[ModelMessage]:
            taken = await team.deliver(f"{self.workflow_id}#a{attempt}r{next(requests)}")
            if not taken or not messages or not isinstance(messages[-1], ModelRequest):
                return messages
            last = messages[-1]
            added = UserPromptPart(delivered_text(taken))
            return [*messages[:-1], replace(last, parts=[*last.parts, added])]

        return history_processor(deliver)

    def _model(self) -> Model:
        """The run's model, with tool-use aids when its kind takes them (the embedded local model)."""
        model = self.resources.model
        if not self.tools or not takes_tool_aids(model.wrapped):
            return model  # the aids read the workspace (a CSV file's rows): only for a model that takes them
        # a prompt a person wrote (at review, or a reused agent's) must reach the model on the draft path too
        prompt = self._agent().persons_prompt
        aids = tool_aids(self.plan, self.step, self.tools, self.resources.workspace, prompt=prompt)
        aided = None if aids is None else with_tool_aids(model.wrapped, aids)
        if aided is None:
            return model
        ledger = self.resources.ledger
        return BudgetedModel(aided, ledger)

    async def _ask_person(self, question: str) -> str:
        """An agent's `ask_user` question as a stored request; waits until any process answers it."""
        run_id, step_id, store = self.record.id, self.step.id, self.store
        asked: tuple[EventKind, dict[str, Any]] = ("request_opened", {"kind": "ask_user"})
        # a run that ended meanwhile gets no question: the step stops, recording nothing
        answered = await step_pause(store, run_id, step_id, "ask_user", {"question": question}, asked)
        if answered.state != "answered" or answered.answer is None:
            raise ToolError(f"the question was not answered (request {answered.id} is {answered.state})")
        return str(answered.answer["text"])

    def _tool_runner(self) -> ToolRunner:
        catalog, options = self.resources.catalog, self.record.options
        policies = self._agent().tool_policies or None
        calls = ToolCalls(
            store=self.store,
            run_id=self.record.id,
            step_id=self.step.id,
            policy=lambda name: options.policy(name, _default_approval(name, catalog), policies),
            fence=partial(keep_lease, self.record.id),
            repeatable=lambda name: name in catalog and catalog[name].repeatable,
        )

        async def run(
            name: str,
            arguments: dict[str, Any],
            call: Callable[[], str | Awaitable[str]],
            check: Callable[[], None] | None = None,
        ) -> str:
            self.last_tool_result = await calls.run(name, arguments, call, check)
            return self.last_tool_result

        return run


def _default_approval(name: str, catalog: Catalog) -> str:
    """A tool's approval policy when neither the agent nor the run sets one."""
    if name in catalog:
        return catalog[name].approval
    team = team_tool(name)
    return team.approval if team is not None else "ask"


def _plan_of(run: RunRecord) -> Plan:
    if run.plan is None:
        raise RunError(f"run {run.id} has no plan to run")
    return run.plan


def _describe(exc: BaseException) -> str:
    """A step attempt's failure in our words: a library's advice and links never reach the person."""
    if isinstance(exc, UsageLimitExceeded):
        return f"the step agent used more than {AGENT_REQUEST_LIMIT} model requests"
    if isinstance(exc, AgentRunError):  # its last problem may quote a tool's failure, key and all
        return redacted(failure_text(exc))
    # a model server's error body may echo the key it was sent
    return redacted(str(exc)) or type(exc).__name__
