"""What the REST API answers with: the models its OpenAPI document states for each success.

The routes return the engine's JSON forms (`to_json_dict`, `RunEngine.report`) as they are; these
models only describe them, so a client can generate types from `/openapi.json`. They are kept
true by the schema test (schemathesis checks every response against them) and by the API tests,
which validate the answers of whole runs with them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..engine.messages import MessageKind, MessageState
from ..engine.records import AgentBrief, EventKind, RunStatus, StepStatus
from ..engine.requests import RequestKind, RequestState
from ..plan import Plan
from ..registry import AgentSpec
from ..registry.memory import MemoryKind

__all__ = [
    "AgentOut",
    "AnsweredRequestOut",
    "EventOut",
    "FeedbackOut",
    "HealthOut",
    "ListedAgentOut",
    "ListedRunOut",
    "MemoryOut",
    "MessageOut",
    "NoteOut",
    "PurposeUsageOut",
    "RememberedOut",
    "RequestOut",
    "RunOut",
    "RunReportOut",
    "StepOut",
    "StoredAgentOut",
    "UsageOut",
    "success",
]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class HealthOut(_Out):
    """The server answers."""

    status: Literal["ok"]


class RunOut(_Out):
    """A run in brief: what every route about one run answers with."""

    id: str
    task: str
    status: RunStatus
    model: str
    """The model spec the run uses (`scripted:FILE`, `openai:NAME`, `local` …)."""
    workspace: str
    """The folder the run's file tools work in."""
    created_at: str
    updated_at: str
    output: str | None
    """The run's answer, once it succeeded."""
    error: str | None
    """Why the run failed or was cancelled."""
    retries: int = Field(ge=0)
    """How many times the run was retried after it failed."""


class ListedRunOut(RunOut):
    """A run as `GET /runs` lists it."""

    idle: Literal["queued", "stopped"] | None
    """An unfinished run no process executes: `queued` for workers, or `stopped` (resume it)."""


class StepOut(_Out):
    """A step's state within a run."""

    id: str
    status: StepStatus
    output: str | None
    error: str | None
    started_at: str | None
    finished_at: str | None
    attempts: int = Field(ge=0)
    sub_steps: list[StepOut] = []
    """An expanded step's sub-steps (present only on such a step)."""


class PurposeUsageOut(_Out):
    """Model usage for one purpose (`planner`, `step:<id>` …)."""

    calls: int
    input_tokens: int
    output_tokens: int
    seconds: float
    cost_usd: float
    unpriced_calls: int
    """Calls to a model with no price in the table (their cost is not in `cost_usd`)."""
    failed_calls: int
    """Calls among `calls` that were made and failed (no answer): no tokens or cost counted for them."""


class UsageOut(_Out):
    """A run's model usage, in all and by purpose."""

    llm_calls: int
    input_tokens: int
    output_tokens: int
    cost_usd: float
    unpriced_calls: int
    failed_calls: int
    by_purpose: dict[str, PurposeUsageOut]


class MessageOut(_Out):
    """A message from one step to another (a broadcast is one per recipient)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True, use_attribute_docstrings=True)

    id: int
    sender: str = Field(alias="from")
    recipient: str = Field(alias="to")
    kind: MessageKind
    content: str
    state: MessageState
    answer: str | None
    answered_by: str | None
    created_at: str
    delivered_at: str | None
    answered_at: str | None
    handed_from: str | None
    """The step this was first sent to, when a replan or a sub-plan put `to` in its place."""


class NoteOut(_Out):
    """An entry of the run's shared notes."""

    key: str
    value: str
    step: str
    updated_at: str


class RunReportOut(RunOut):
    """A run's report: the brief, its plan, agents, steps, usage, messages and notes."""

    run_id: str
    """The same as `id`."""
    plan: Plan | None
    """The plan (None until the run is planned); `final_step` and `expand` appear only when set."""
    agents: dict[str, AgentBrief]
    """Each step's agent, by step id; fields left at their defaults are left out."""
    steps: list[StepOut]
    usage: UsageOut
    messages: list[MessageOut]
    notes: list[NoteOut]
    waiting: str | None
    """For a run queued for workers that no running worker can take: what it waits for."""


class EventOut(_Out):
    """One entry of a run's event log."""

    seq: int
    at: str
    kind: EventKind
    step: str | None
    data: dict[str, Any]


class RequestOut(_Out):
    """A pause of a run: a plan review, tool approval, question, replan or memory to keep."""

    id: str
    run_id: str
    step_id: str | None
    kind: RequestKind
    payload: dict[str, Any]
    """What is asked (the plan under review, the tool call to approve, the question …)."""
    state: RequestState
    answer: dict[str, Any] | None
    answered_by: str | None
    created_at: str
    answered_at: str | None
    summary: str
    """One line saying what the request asks."""


class AnsweredRequestOut(RequestOut):
    """A request as an answer to it left it."""

    taken_before: bool
    """The answer was this request's answer already, from this server's answers (sent again by a
    client that lost the reply, say): it was taken once, and nothing was stored again."""
    follow_up_failed: str | None
    """What failed after the answer was stored (its event in the run's log, storing the run's
    team), in words; the answer stands and the run goes on. null when nothing failed."""


class FeedbackOut(_Out):
    """What a rating changed."""

    rated_agents: list[str]
    cohort_rated: bool
    """Whether the run's stored team was rated too."""
    lessons: dict[str, list[str]]
    """Lessons written for next time, by agent id (a rating of 2 or less)."""


class RememberedOut(_Out):
    """A run's team, stored."""

    cohort: str
    """The stored team's id (the run's): `GET /teams/{cohort}` shows it."""


class AgentOut(AgentSpec):
    """A stored agent with its track record in two figures."""

    success_rate: float | None
    """Successful runs of all its uses; None before its first use."""
    mean_rating: float | None


class ListedAgentOut(AgentOut):
    """An agent as `GET /agents` lists it; with a search, its score."""

    score: float | None = None


class StoredAgentOut(AgentOut):
    """One agent with the versions stored of it."""

    versions: list[int]
    """Oldest first; `?version=N` reads one."""


class MemoryOut(_Out):
    """A memory agents keep between runs: a fact, or the account of a past run."""

    id: str
    kind: MemoryKind
    text: str
    source: str
    """Who or what it came from (a run, `remember`)."""
    created_at: str
    last_used_at: str
    expires_at: str


def success(model: Any, description: str, status: int = 200) -> dict[str, Any]:
    """A route's arguments documenting its success as `model` (a model, or a list of one).

    The route returns plain JSON; `response_model=None` keeps FastAPI from re-reading it.
    """
    return {"response_model": None, "responses": {status: {"model": model, "description": description}}}
