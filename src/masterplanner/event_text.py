"""What a run's event says beyond its kind and step, in words, for every front end.

`event_detail(kind, data)` gives the detail as parts of plain text, each with a tone (`good`,
`bad`, `warn` or none). The terminal turns the tones into colours (`cli/live.py`), the run page
into classes (`web/templates/_run_body.html`); the words are the same in both. Every value in an
event's data may come from a model, a tool or a person: the front end escapes it as it shows it.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, Literal

__all__ = [
    "Part",
    "Tone",
    "budget_wait",
    "clock",
    "event_detail",
    "planning_stage",
    "retry_wait",
    "status_word",
    "team_reused",
]

_STATUS_WORDS = {"pending": "waiting", "awaiting_approval": "awaiting approval"}


def status_word(status: str) -> str:
    """A run's or step's status in the README's words: a step not started is `waiting`, not `pending`."""
    return _STATUS_WORDS.get(status, status)


def clock(at: str) -> str:
    """A stored time (ISO, UTC) as this machine's local `HH:MM:SS`; the text itself if it is not one."""
    try:
        return datetime.fromisoformat(at.replace("Z", "+00:00")).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return at


Tone = Literal["good", "bad", "warn"] | None
Part = tuple[str, Tone]
"""A piece of an event's detail: its text and its tone (None: plain)."""


def retry_wait(data: dict[str, Any]) -> str:
    """A `model_retried` event: what the model server did, and when the next try comes."""
    delay = data.get("delay_s")
    wait = f"{delay:g} s" if isinstance(delay, int | float) else "a moment"
    return f"{data.get('error', '')}; try {data.get('attempt', '')} of {data.get('attempts', '')} in {wait}"


def budget_wait(data: dict[str, Any]) -> str:
    """A `model_waiting` event: which request waits, for room in which budget, behind how many in flight."""
    budget = "money" if data.get("budget") == "max_cost_usd" else "token"
    count = data.get("in_flight", 0)
    requests = f"{count} model request{'' if count == 1 else 's'}"
    purpose = data.get("purpose", "")
    return f"{purpose} waits for room in the {budget} budget: {requests} in flight to be counted"


_STAGES = {
    "similar_teams": "finding similar teams",
    "adapting": "adapting a stored team",
    "steps": "planning the steps",
}


def planning_stage(data: dict[str, Any]) -> str:
    """A `planning_progress` event: which part of planning is under way, in words."""
    stage = data.get("stage")
    if stage == "prompts":
        return f"writing prompts ({data.get('draft', '')} of {data.get('of', '')})"
    if stage == "review":
        return f"reviewing prompts (round {data.get('round', '')})"
    where = f" in {data['process']}" if data.get("process") else ""  # the process that took it over
    if stage == "resumed":
        prompts = data.get("prompts", 0)
        made = "" if not prompts else f" and {prompts} of its prompts"
        rewritten = data.get("rewritten", 0)
        again = (
            ""
            if not rewritten
            else f"; {rewritten} prompt{' written' if rewritten == 1 else 's written'} under other "
            f"critique rounds {'is' if rewritten == 1 else 'are'} written again"
        )
        return f"resuming planning{where} (its plan{made} {'were' if made else 'was'} made before{again})"
    if stage == "planned_again":
        return (
            f"planning again{where}: the plan made before the stop names a tool not offered now "
            f"({data.get('why', '')})"
        )
    return _STAGES.get(str(stage), str(stage or ""))


def _by(data: dict[str, Any]) -> str:
    return f" (by {data['by']})" if "by" in data else ""


def _joined(values: Any) -> str:
    return ", ".join(str(value) for value in values) if isinstance(values, list) else str(values or "")


def _tool(data: dict[str, Any]) -> list[Part]:
    parts: list[Part] = [(f" {data.get('tool')}", None)]
    return parts + ([(f" {data['error']}", "bad")] if "error" in data else [])


def _approval(data: dict[str, Any]) -> list[Part]:
    return [(f" {data.get('tool')}{_by(data)}", None)]


def _step_error(data: dict[str, Any]) -> list[Part]:
    return [(f" {data.get('error', '')}", "bad")]


def _reason(data: dict[str, Any]) -> list[Part]:
    return [(f" {data.get('reason', '')}", None)]


def _not_kept(data: dict[str, Any]) -> list[Part]:
    return [(f" {data['reason']}", "warn")] if "reason" in data else []


def _run_retried(data: dict[str, Any]) -> list[Part]:
    steps = _joined(data.get("steps", []))
    return [(f" retry {data.get('retry', '')}" + (f": {steps}" if steps else "") + _by(data), None)]


def _run_refused(data: dict[str, Any]) -> list[Part]:  # a worker that cannot coordinate it with its settings
    return [(f" by {data.get('process', '')}: ", None), (str(data.get("reason", "")), "bad")]


def _request(data: dict[str, Any]) -> list[Part]:
    if "request" not in data:
        return []
    text = f" request {data['request']}" + (f" {data['kind']}" if "kind" in data else "") + _by(data)
    parts: list[Part] = [(text, None)]
    return parts + ([(f" edit refused: {data['refused_edit']}", "bad")] if "refused_edit" in data else [])


def team_reused(data: dict[str, Any]) -> str:
    """A `plan_ready` event's stored team reused: `reusing the team of run R (similarity S, adapted: HOW)`."""
    return (
        f"reusing the team of run {data.get('reused_cohort')} (similarity {data.get('similarity')}, "
        f"adapted: {data.get('adaptation')})"
    )


def _plan_ready(data: dict[str, Any]) -> list[Part]:
    if data.get("cautions"):
        return [(f" caution: {caution}", "warn") for caution in data["cautions"]]
    if "reused_cohort" in data:
        return [(f" {team_reused(data)}", None)]
    if "reuse_failed" in data:
        return [(f" {data['reuse_failed']}", "warn"), ("; planned afresh", None)]
    return []


def _message_sent(data: dict[str, Any]) -> list[Part]:
    what = "question" if data.get("kind") == "question" else data.get("kind", "message")
    return [(f" {what} to {_joined(data.get('to', []))}: {data.get('content', '')}", None)]


def _output_checked(data: dict[str, Any]) -> list[Part]:
    verdict: Part = ("meets", "good") if data.get("meets") else ("falls short", "bad")
    return [(" ", None), verdict, (f": {data.get('reason', '')}", None)]


def _revised(data: dict[str, Any]) -> list[Part]:
    return [(f" into {_joined(data.get('steps', []))} (by {data.get('by', '')})", None)]


def _revision_failed(data: dict[str, Any]) -> list[Part]:
    why = data.get("problems") or data.get("error") or data.get("rejected") or ""
    return [(f" {'; '.join(str(w) for w in why) if isinstance(why, list) else why}", "bad")]


_DETAILS: dict[str, Callable[[dict[str, Any]], list[Part]]] = {
    "tool_called": _tool,
    "tool_result": _tool,
    "tool_approval_requested": _approval,
    "tool_approved": _approval,
    "tool_denied": _approval,
    "step_failed": _step_error,
    "step_retried": _step_error,
    "model_retried": lambda data: [(f" {retry_wait(data)}", "warn")],
    "model_waiting": lambda data: [(f" {budget_wait(data)}", "warn")],
    "run_failed": _reason,
    "run_cancelled": _reason,
    "rejected": _reason,
    "team_not_stored": _not_kept,
    "episode_not_kept": _not_kept,
    "run_retried": _run_retried,
    "run_refused": _run_refused,
    "approval_requested": _request,
    "request_opened": _request,
    "request_answered": _request,
    "planning_progress": lambda data: [(f" {planning_stage(data)}", None)],
    "plan_ready": _plan_ready,
    # a process that stopped had started the step
    "step_resumed": lambda data: [(f" in {data.get('process', '')}", None)],
    "message_sent": _message_sent,
    "message_delivered": lambda data: [(f" #{data.get('id')} from {data.get('from')}", None)],
    "question_answered": lambda data: [(f" #{data.get('id')} for {data.get('from')}{_by(data)}", None)],
    "question_closed": lambda data: [(f" #{data.get('id')}", None), (f" {data.get('reason', '')}", "warn")],
    "note_set": lambda data: [(f" {data.get('key')} = {data.get('value', '')}", None)],
    "output_checked": _output_checked,
    "replan_requested": lambda data: [(f" replan {data.get('n')} after: {data.get('error', '')}", "warn")],
    "replanned": _revised,
    "step_expanded": _revised,
    "replan_failed": _revision_failed,
    "expand_failed": _revision_failed,
}


def event_detail(kind: str, data: dict[str, Any]) -> list[Part]:
    """What an event of `kind` with `data` says after its kind and step (empty: nothing more)."""
    detail = _DETAILS.get(kind)
    return detail(data) if detail is not None else []
