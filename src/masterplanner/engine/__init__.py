"""The durable execution engine (the only package that imports `dbos`).

Runs go planning → awaiting_approval → running → succeeded | failed | cancelled; each step
runs as a DBOS workflow whose model requests and tool calls are checkpointed.
"""

from .records import EVENT_KINDS, AgentBrief, Event, RunOptions, RunRecord, StepRecord
from .requests import PlanDecision, Request, RequestKind, RequestState
from .runner import Engine, run_catalog
from .scheduler import StepOutcome, run_dag
from .store import RunStore

__all__ = [
    "EVENT_KINDS",
    "AgentBrief",
    "Engine",
    "Event",
    "PlanDecision",
    "Request",
    "RequestKind",
    "RequestState",
    "RunOptions",
    "RunRecord",
    "RunStore",
    "StepOutcome",
    "StepRecord",
    "run_catalog",
    "run_dag",
]
