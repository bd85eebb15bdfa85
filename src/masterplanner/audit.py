"""Who did what to a run, when, from which front end (`runs audit RUN`).

Made from what the run already stores: every answered request (a plan review and its edits, a
replan, a tool approval, an agent's question, whether to keep the team) with who answered it and
when, and every request to cancel the run. What a person typed is shown with anything shaped like
a credential removed (`redaction.redacted`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .engine import Event, Request
from .redaction import redacted

__all__ = ["AuditEntry", "audit_entries"]


@dataclass(frozen=True)
class AuditEntry:
    """One thing a person (or a program) did to a run."""

    at: str
    by: str
    """Who, as the front end recorded it: `front end@host:pid` (`cli@…`, `web@…`, `terminal@…`)."""
    action: str
    request: str | None = None
    step: str | None = None

    @property
    def front_end(self) -> str:
        """The front end it came from: `cli`, `terminal`, `web`, or what a library caller named."""
        return self.by.split("@", 1)[0]

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {
            "at": self.at,
            "by": self.by,
            "front_end": self.front_end,
            "action": self.action,
            "request": self.request,
            "step": self.step,
        }


def _edits(answer: dict[str, Any]) -> str:
    changed = []
    if answer.get("plan") is not None:
        changed.append("the plan")
    if answer.get("agents"):
        changed.append("the prompts of " + ", ".join(sorted(answer["agents"])))
    if answer.get("tool_policies"):
        changed.append("the tool policies")
    return f" with edits to {' and '.join(changed)}" if changed else ""


def _reason(answer: dict[str, Any]) -> str:
    reason = answer.get("reason")
    return f": {redacted(str(reason))}" if reason else ""


def _action(request: Request) -> str:
    answer = request.answer or {}
    if request.kind in ("plan_review", "replan"):
        what = "the plan" if request.kind == "plan_review" else f"the replan of step {request.step_id}"
        if answer.get("action") == "approve":
            return f"approved {what}{_edits(answer)}"
        return f"rejected {what}{_reason(answer)}"
    if request.kind == "tool_approval":
        tool = request.payload.get("tool")
        verdict = "approved" if answer.get("approved") else "denied"
        return f"{verdict} a call to {tool}{_reason(answer)}"
    if request.kind == "ask_user":
        return f"answered the question {redacted(str(request.payload.get('question', '')))!r}: " + repr(
            redacted(str(answer.get("text", "")))
        )
    verdict = "kept" if answer.get("approved") else "did not keep"
    return f"{verdict} the run's team in the registry"


def audit_entries(requests: list[Request], events: list[Event]) -> list[AuditEntry]:
    """The run's audit log, oldest first: answered requests and cancel requests."""
    entries = [
        AuditEntry(
            at=request.answered_at or request.created_at,
            by=request.answered_by or "unknown",
            action=_action(request),
            request=request.id,
            step=request.step_id,
        )
        for request in requests
        if request.state == "answered"
    ]
    entries += [
        AuditEntry(at=event.at, by=str(event.data.get("by") or "unknown"), action="asked to cancel the run")
        for event in events
        if event.kind == "cancel_requested"
    ]
    return sorted(entries, key=lambda entry: entry.at)
