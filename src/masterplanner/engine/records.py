"""What the engine stores about a run, as plain serializable data: statuses, events, run and step records."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

from ..database import utc_now
from ..plan import Plan
from ..prompting import MAX_ROUNDS

__all__ = [
    "BUDGET_LIMITS",
    "EVENT_KINDS",
    "FINISHED_RUN_STATUSES",
    "SECONDS_OPTION_LIMITS",
    "WHOLE_OPTION_LIMITS",
    "AgentBrief",
    "Event",
    "EventKind",
    "PlanChange",
    "RunOptions",
    "RunRecord",
    "RunStatus",
    "StepRecord",
    "StepStatus",
    "briefs",
    "briefs_json",
    "budget_problem",
    "flat_steps",
    "nested_steps",
    "options_problem",
    "own_workflow_id",
    "utc_now",
    "workflow_id",
]

RunStatus = Literal["planning", "awaiting_approval", "running", "succeeded", "failed", "cancelled"]
FINISHED_RUN_STATUSES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled"})
StepStatus = Literal[
    "pending", "running", "succeeded", "failed", "skipped", "cancelled", "replaced", "expanded"
]
"""`replaced`: a failed step (or one depending on it) that a replan put new steps in place of;
`expanded`: a step that ran as a sub-plan (its sub-steps are `<step>--<sub>`)."""

EventKind = Literal[
    "run_created",
    "planning_progress",
    "plan_ready",
    "approval_requested",
    "approved",
    "rejected",
    "plan_edited",
    "step_started",
    "step_recovered",
    "step_resumed",
    "step_succeeded",
    "step_failed",
    "step_retried",
    "model_retried",
    "model_waiting",
    "tool_called",
    "tool_result",
    "tool_approval_requested",
    "tool_approved",
    "tool_denied",
    "run_succeeded",
    "run_failed",
    "run_cancelled",
    "run_refused",
    "run_retried",
    "run_rated",
    "cancel_requested",
    "team_stored",
    "team_not_stored",
    "episode_not_kept",
    "input_summarized",
    "input_cut",
    "request_opened",
    "request_answered",
    "message_sent",
    "message_delivered",
    "question_answered",
    "question_closed",
    "note_set",
    "output_checked",
    "replan_requested",
    "replanned",
    "replan_failed",
    "step_expanded",
    "expand_failed",
]
EVENT_KINDS: frozenset[str] = frozenset(get_args(EventKind))


@dataclass(frozen=True)
class Event:
    """One entry of a run's append-only event log."""

    seq: int
    at: str
    kind: EventKind
    step: str | None
    data: dict[str, Any]

    def to_json_dict(self) -> dict[str, Any]:
        """`{"seq", "at", "kind", "step", "data"}`."""
        return {"seq": self.seq, "at": self.at, "kind": self.kind, "step": self.step, "data": self.data}


BUDGET_LIMITS: dict[str, float] = {
    "max_model_calls": 1_000_000,
    "max_tokens": 10**10,
    "max_wall_s": 7 * 86_400,
    "max_cost_usd": 1_000_000,
}
"""The largest budget a run may be given (`run`, `runs retry`, the API all refuse more)."""


WHOLE_OPTION_LIMITS: dict[str, tuple[int, int]] = {
    "max_parallel": (1, 64),
    "prompt_rounds": (0, MAX_ROUNDS),
    "step_attempts": (1, 10),
    "max_replans": (0, 10),
    "context_chars": (1, 10**7),
    "history_chars": (1, 10**7),
    "messages_per_step": (0, 10_000),
    "messages_per_run": (0, 100_000),
    "message_chars": (1, 100_000),
}
"""The lowest and highest value of each whole-number option (`run`, the API and the pages refuse others)."""
SECONDS_OPTION_LIMITS: dict[str, float] = {
    "step_timeout_s": 86_400,
    "ask_timeout_s": 86_400,
    "retry_backoff_s": 3600,
}
"""The most seconds of each duration option (more than 0; `retry_backoff_s` may be 0)."""


def budget_problem(key: str, value: object) -> str | None:
    """What is wrong with `value` as the budget `key` (`BUDGET_LIMITS`), or None."""
    limit = BUDGET_LIMITS[key]
    if key in ("max_model_calls", "max_tokens"):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            return f"{key} must be a whole number from 1 to {int(limit):,}, got {value!r}"
        return None
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= limit:  # NaN too
        return f"{key} must be more than 0 and at most {int(limit):,}, got {value!r}"
    return None


def options_problem(options: RunOptions) -> str | None:
    """What is wrong with a new run's options (a program's, not checked by a CLI or API), or None."""
    for key in BUDGET_LIMITS:
        value = getattr(options, key)
        if value is not None and (problem := budget_problem(key, value)) is not None:
            return problem
    for key, (low, high) in WHOLE_OPTION_LIMITS.items():
        value = getattr(options, key)
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            return f"{key} must be a whole number from {low:,} to {high:,}, got {value!r}"
    for key, most in SECONDS_OPTION_LIMITS.items():
        value = getattr(options, key)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        low_ok = number and (value >= 0 if key == "retry_backoff_s" else value > 0)
        if not (low_ok and value <= most):  # NaN too
            return f"{key} must be a number of seconds from 0 to {most:,g}, got {value!r}"
    for key in ("auto_approve", "check_outputs"):
        if not isinstance(getattr(options, key), bool):
            return f"{key} must be true or false, got {getattr(options, key)!r}"
    if options.team_tools is not None and not isinstance(options.team_tools, bool):
        return f"team_tools must be true, false or None, got {options.team_tools!r}"
    if not isinstance(options.tool_policies, dict):
        return f"tool_policies must map tool names to auto, ask or deny, got {options.tool_policies!r}"
    for tool, policy in options.tool_policies.items():
        if policy not in ("auto", "ask", "deny"):
            return f"tool_policies gives {tool!r} the policy {policy!r}: a policy is auto, ask or deny"
    return None


@dataclass(frozen=True)
class RunOptions:
    """How a run executes; fixed when the run is created and stored with it."""

    max_parallel: int = 4
    auto_approve: bool = False
    step_timeout_s: float = 600.0
    step_attempts: int = 3
    retry_backoff_s: float = 0.5
    """Wait before a step's second attempt; doubles for each later one."""
    prompt_rounds: int = 1
    max_model_calls: int | None = 200
    max_tokens: int | None = 2_000_000
    max_wall_s: float | None = 3600.0
    max_cost_usd: float | None = None
    """Most US dollars the run's model calls may cost (calls of unknown price count as nothing)."""
    context_chars: int = 12_000
    """Most characters of its dependencies' outputs a step sees, all together; longer ones are
    summarised for it (cut, marked, only when summarising fails). Clamped to a local model's window."""
    history_chars: int = 48_000
    """Most characters of a step agent's conversation; the oldest tool results are dropped past it."""
    tool_policies: dict[str, str] = field(default_factory=dict)
    """Approval policy overrides by tool name (`auto`, `ask`, `deny`); the catalog gives the rest."""
    workspace_max_growth_bytes: int | None = None
    """How many bytes the workspace may grow by in this run (None: the setting, when the run is created)."""
    workspace_start_bytes: int = 0
    """What the workspace held when the run was created (its growth is counted from there)."""
    team_tools: bool | None = None
    """Whether step agents get the team tools (messages, questions, notes) when the run has
    more than one step. None: decided when the run is created, on unless the model is a small
    local one (seven more tool schemas crowd its window and its choice of tools)."""
    messages_per_step: int = 20
    """Most sends (messages, questions, broadcasts) one step makes."""
    messages_per_run: int = 200
    """Most sends all of the run's steps make together."""
    message_chars: int = 4000
    """Longest message, question, answer or note."""
    ask_timeout_s: float = 120.0
    """Longest a step waits for another step's answer."""
    max_replans: int = 2
    """How many times a failed step (and its dependents) may be replanned in one run."""
    check_outputs: bool = False
    """Whether a checker model call compares each step's output with its expected output; one
    that falls short counts as failed (and is replanned)."""

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {**self.__dict__, "tool_policies": dict(self.tool_policies)}

    def policy(self, tool: str, default: str, agent: Mapping[str, str] | None = None) -> str:
        """The effective approval policy of `tool`: the agent's override, the run's, or `default`.

        With `--yes` (`auto_approve`), `ask` becomes `auto`.
        """
        policy = (agent or {}).get(tool) or self.tool_policies.get(tool, default)
        return "auto" if policy == "ask" and self.auto_approve else policy

    @classmethod
    def from_json_dict(cls, data: dict[str, Any]) -> RunOptions:
        """Read the JSON form back (unknown keys are ignored, so old runs stay readable)."""
        known = {key: value for key, value in data.items() if key in cls.__dataclass_fields__}
        return cls(**known)


class AgentBrief(BaseModel):
    """A plan step's agent as a run holds it: its prompt and where the prompt came from.

    Written by the Prompt Creator (`draft`, `critique`, `rounds`), taken from a stored agent
    (`agent_id`, `reused_from`, `prompt_by_person`), or edited at review (`edited`, `fresh`,
    `tool_policies`). Whether a person wrote the prompt (`persons_prompt`) and whether the agent
    is a new one (`edited`, or no `agent_id`) are kept apart: a reused agent whose stored prompt
    a person wrote is worked under as an edited prompt is, and still counts as the reused agent.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt: str = ""
    """The instructions the step agent gets (empty: the Prompt Creator writes them before the run)."""
    draft: str | None = None
    critique: dict[str, Any] | None = None
    """The Prompt Creator's last critique: of the text its last revision replaced (the draft, after
    one round), not of `prompt`."""
    rounds: list[dict[str, Any]] = []
    """Each critique-and-revision round of the Prompt Creator."""
    agent_id: str | None = None
    """The stored agent this one is (a reused agent)."""
    reused_from: str | None = None
    """The run the reused agent was stored from ("" when unknown)."""
    prompt_by_person: bool = False
    """The reused agent's stored prompt is a person's (`AgentSpec.prompt_by_person`)."""
    edited: bool = False
    """The person edited the prompt at review (a reused agent then becomes a new one)."""
    fresh: bool = False
    """The person asked for a freshly written prompt at review."""
    tool_policies: dict[str, Literal["auto", "ask", "deny"]] = {}
    """Approval policies for this agent's tools, overriding the run's."""

    @property
    def persons_prompt(self) -> str:
        """The prompt when a person wrote it (edited at review, or a reused agent's), else empty.

        The step aids put it before the model instead of taking a shortcut that skips it.
        """
        return self.prompt if self.edited or self.prompt_by_person else ""

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form, without fields left at their defaults."""
        return self.model_dump(mode="json", exclude_defaults=True)


def briefs(agents: Mapping[str, Any] | None, *, stored: bool = False) -> dict[str, AgentBrief]:
    """An `agents` map (step id -> JSON form or `AgentBrief`) as typed briefs.

    `stored`: the map was read from the database, where an earlier version may have kept fields
    this one does not know; those are left out instead of refused.
    """
    known = AgentBrief.model_fields
    return {
        step_id: agent
        if isinstance(agent, AgentBrief)
        else AgentBrief.model_validate(
            {key: value for key, value in (agent or {}).items() if key in known} if stored else agent or {}
        )
        for step_id, agent in (agents or {}).items()
    }


def briefs_json(agents: Mapping[str, AgentBrief]) -> dict[str, dict[str, Any]]:
    """The JSON form of an `agents` map (what the review, the registry and reports take)."""
    return {step_id: agent.to_json_dict() for step_id, agent in agents.items()}


@dataclass(frozen=True)
class StepRecord:
    """The state of one plan step within a run."""

    id: str
    status: StepStatus = "pending"
    output: str | None = None
    error: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    attempts: int = 0

    def to_json_dict(self) -> dict[str, Any]:
        """`{"id", "status", "output", "error", "started_at", "finished_at", "attempts"}`."""
        return dict(self.__dict__)


@dataclass(frozen=True)
class RunRecord:
    """A run as stored: task, status, plan, prompts, outcome, and its options."""

    id: str
    task: str
    status: RunStatus
    model: str
    workspace: str
    created_at: str
    updated_at: str
    options: RunOptions = field(default_factory=RunOptions)
    plan: Plan | None = None
    agents: dict[str, AgentBrief] = field(default_factory=dict)
    """Each plan step's agent, by step id (empty until the run is planned)."""
    output: str | None = None
    error: str | None = None
    for_workers: bool = False
    """Queued for workers (`run --detach`): whichever worker claims it executes it."""
    retries: int = 0
    """How many times the run was retried after it failed (`runs retry`); the workflows of each
    retry have ids of their own (`workflow_id`)."""

    @property
    def finished(self) -> bool:
        """Whether the run reached succeeded, failed or cancelled."""
        return self.status in FINISHED_RUN_STATUSES


@dataclass(frozen=True)
class PlanChange:
    """A change of a run's plan as one write stores it: an edit at review, or a revision (a replan).

    The plan and its agents replace the run's; `options`, when given (an edit of the tool
    policies), replace the run's options; the `added` steps are recorded pending after the
    steps there are, and each `retired` step takes its new status (`replaced`, `expanded`).
    """

    plan: Plan
    agents: Mapping[str, AgentBrief]
    options: RunOptions | None = None
    added: tuple[str, ...] = ()
    retired: Mapping[str, str] = field(default_factory=dict)


def workflow_id(run_id: str, name: str, retries: int = 0) -> str:
    """The DBOS workflow id of a run's step (`name` is its id); `own_workflow_id` for the run's own.

    `<run>.<name>` until the run is retried, `<run>.retry<n>.<name>` after its n-th retry: a
    retried step runs afresh instead of returning the outcome its failed workflow recorded.
    """
    return f"{run_id}.{name}" if retries == 0 else f"{run_id}.retry{retries}.{name}"


OWN_WORKFLOW_MARK = "_"
"""What starts the name of a run's own workflow in its id (`<run>._end`): never a step id's first
character (`plan.SLUG`), so no step, whatever the planner names it, shares its workflow's id."""


def own_workflow_id(run_id: str, name: str, retries: int = 0) -> str:
    """The DBOS workflow id of a run's own workflow: `end`, `aggregate`, `replan-<n>`, `expand-<step>`.

    `<run>._<name>` (`<run>.retry<n>._<name>` after a retry). They were `<run>.<name>`, the form
    of a step's: a step named `end`, `aggregate`, `replan-1` or `expand-x` took its id, and the
    run failed with DBOS's conflicting-workflow error. A run's workflows recorded before keep
    their ids (`runtime.own_workflow`).
    """
    return workflow_id(run_id, f"{OWN_WORKFLOW_MARK}{name}", retries)


SUB_STEP = "--"
"""What joins an expanded step's id and its sub-step's (`research--sources`)."""


def nested_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Steps in JSON form with each sub-step under the step it was expanded from (`sub_steps`)."""
    by_id: dict[str, dict[str, Any]] = {}
    top: list[dict[str, Any]] = []
    for step in steps:
        entry = dict(step)
        by_id[entry["id"]] = entry
        parent = entry["id"].rpartition(SUB_STEP)[0]
        if parent and parent in by_id:
            by_id[parent].setdefault("sub_steps", []).append(entry)
        else:
            top.append(entry)
    return top


def flat_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`nested_steps` undone: every step, sub-steps after their parent, without `sub_steps`."""
    flat: list[dict[str, Any]] = []
    for step in steps:
        flat.append({key: value for key, value in step.items() if key != "sub_steps"})
        flat.extend(flat_steps(step.get("sub_steps", [])))
    return flat
