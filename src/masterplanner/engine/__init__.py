"""The durable execution engine (the only package that imports `dbos`).

Runs go planning → awaiting_approval → running → succeeded | failed | cancelled; each step
runs as a DBOS workflow whose model requests and tool calls are checkpointed.

Names are imported on first use (`_lazy.py`): the records, the store and the requests need
neither DBOS nor the models, and a command that only reads or cancels runs imports just those
(`Engine` and the scheduler import DBOS, pydantic-ai and the models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_names

if TYPE_CHECKING:
    from .records import EVENT_KINDS, AgentBrief, Event, RunOptions, RunRecord, StepRecord
    from .requests import PlanDecision, Request, RequestKind, RequestState
    from .runner import Engine, run_catalog
    from .scheduler import StepOutcome, run_dag
    from .store import RunStore

_HOMES = {
    ".records": ("EVENT_KINDS", "AgentBrief", "Event", "RunOptions", "RunRecord", "StepRecord"),
    ".requests": ("PlanDecision", "Request", "RequestKind", "RequestState"),
    ".runner": ("Engine", "run_catalog"),
    ".scheduler": ("StepOutcome", "run_dag"),
    ".store": ("RunStore",),
}

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

__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
