"""Who did what to a run, when, from which front end (`runs audit RUN`).

Made from what the run already stores: who created the run; every answered request (a plan
review and its edits, a replan, a tool approval, an agent's question, whether to keep the team)
with who answered it and when; the plans and replans approved with no review because the run was
created so (`--yes`), in the name of who created it; every request to cancel the run; and every
retry of it after it failed. What a
person typed is shown with anything shaped like a credential removed (`redaction.redacted`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .engine import Event, PlanDecision, Request
from .engine.records import briefs
from .plan import Plan
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


def _edits(request: Request) -> str:
    answer = request.answer or {}
    changed = []
    reviewed = _review_changes(request)
    if reviewed is not None:  # what the answer changed of what the review showed
        decision, prompts, policies = reviewed
        if decision.plan is not None:
            changed.append("the plan")
        if prompts:
            changed.append("the prompts of " + ", ".join(prompts))
        if policies:
            changed.append("the tool policies of " + ", ".join(policies))
        if decision.tool_policies is not None:
            changed.append("the tool policies")
    else:  # an answer that cannot be read against its request's payload: as it was sent
        if answer.get("plan") is not None:
            changed.append("the plan")
        if answer.get("agents"):
            changed.append("the prompts of " + ", ".join(sorted(answer["agents"])))
        if answer.get("tool_policies"):
            changed.append("the tool policies")
    return f" with edits to {' and '.join(changed)}" if changed else ""


def _review_changes(request: Request) -> tuple[PlanDecision, list[str], list[str]] | None:
    """What a review's answer (a plan's or a replan's) changed (`PlanDecision.changes`), and whose agents.

    The steps come as two lists: those whose prompt or agent changed, those whose agent's tool
    policies alone changed.

    An answer that gives the review back as it was shown (the web form always sends the whole
    plan) is a plain approval, not one "with edits". None when the answer or the payload cannot
    be read (stored by an earlier version).
    """
    payload = request.payload
    try:
        decision = PlanDecision.model_validate(request.answer or {})
        plan = Plan.model_validate(payload["plan"]) if payload.get("plan") else None
        held = briefs(payload.get("agents"), stored=True)
        policies = dict(payload.get("tool_policies") or {})
        tools = payload.get("tools")
        shown = None if tools is None else {str(tool["name"]) for tool in tools}
    except (ValidationError, TypeError, ValueError, AttributeError, KeyError):
        return None
    changes = decision.changes(plan, held, policies, shown)
    changed = {
        step_id: brief for step_id, brief in (changes.agents or {}).items() if brief != held.get(step_id)
    }
    policies_alone = sorted(
        step_id
        for step_id, brief in changed.items()
        if step_id in held
        and brief.model_copy(update={"tool_policies": held[step_id].tool_policies}) == held[step_id]
    )
    return changes, sorted(set(changed) - set(policies_alone)), policies_alone


def _reason(answer: dict[str, Any]) -> str:
    reason = answer.get("reason")
    return f": {redacted(str(reason))}" if reason else ""


def _action(request: Request) -> str:
    answer = request.answer or {}
    if request.kind in ("plan_review", "replan"):
        what = "the plan" if request.kind == "plan_review" else f"the replan of step {request.step_id}"
        if answer.get("action") == "approve":
            return f"approved {what}{_edits(request)}"
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


_WITHOUT_REVIEW = "with no review (the run was created to be approved so)"


def _by_itself(event: Event, creator: str) -> AuditEntry | None:
    """The entry for a plan or replan the engine approved by itself, in the creator's name."""
    if event.data.get("by") != "auto":
        return None
    if event.kind == "approved":
        return AuditEntry(at=event.at, by=creator, action=f"approved the plan {_WITHOUT_REVIEW}")
    if event.kind == "replanned":
        action = f"approved the replan of step {event.step} {_WITHOUT_REVIEW}"
        return AuditEntry(at=event.at, by=creator, action=action, step=event.step)
    return None


_BUDGETS = {
    "max_model_calls": "model-call budget",
    "max_tokens": "token budget",
    "max_wall_s": "wall-time budget (seconds)",
    "max_cost_usd": "money budget (US dollars)",
}


def _retried(event: Event) -> str:
    """What a `run_retried` event says was done: which steps run again, which budgets and rounds changed."""
    steps = [str(step) for step in event.data.get("steps", [])]
    status = event.data.get("status")
    if status == "planning":
        # a run retried before planning was kept (or that kept nothing) plans again from the start
        kept = event.data.get("planning_kept")
        again = "its planning goes on from what it had made" if kept else "planned again"
    elif status == "awaiting_approval":
        again = "its plan reviewed again"
    elif len(steps) > 1:
        again = f"steps {', '.join(steps)} run again"
    else:
        again = f"step {steps[0]} runs again" if steps else "no step to run again"
    budgets = event.data.get("budgets") or {}
    changed = "".join(f"; {_BUDGETS.get(key, key)} set to {value:g}" for key, value in budgets.items())
    if "prompt_rounds" in event.data:
        changed += f"; critique rounds per prompt set to {event.data['prompt_rounds']}"
    return f"retried the run after it failed ({again}{changed})"


def audit_entries(requests: list[Request], events: list[Event]) -> list[AuditEntry]:
    """The run's audit log, oldest first: creation, approvals, answered requests, cancels, retries, rating.

    A run created before creators were recorded shows `unknown` as its creator.
    """
    created = next((event for event in events if event.kind == "run_created"), None)
    creator = "unknown" if created is None else str(created.data.get("by") or "unknown")
    entries = [] if created is None else [AuditEntry(at=created.at, by=creator, action="created the run")]
    entries += [entry for event in events if (entry := _by_itself(event, creator)) is not None]
    entries += [
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
    entries += [
        AuditEntry(at=event.at, by=str(event.data.get("by") or "unknown"), action=_retried(event))
        for event in events
        if event.kind == "run_retried"
    ]
    entries += [
        AuditEntry(at=event.at, by=str(event.data.get("by") or "unknown"), action=f"rated the run {rating}/5")
        for event in events
        if event.kind == "run_rated" and (rating := event.data.get("rating")) is not None
    ]
    return sorted(entries, key=lambda entry: entry.at)
