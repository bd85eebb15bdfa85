"""One tool call as the engine runs it: approval policy, checkpoint, events, and what the agent sees."""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from dbos import DBOS
from dbos._error import DBOSWorkflowCancelledError, DBOSWorkflowConflictIDError
from opentelemetry.trace import Status, StatusCode

from .. import telemetry
from ..errors import MasterplannerError, ToolError
from ..redaction import REMOVED, redacted, redacted_content, shortened
from ..tools.results import TOOL_FAILED, TOOL_OUTPUT
from .records import EventKind
from .requests import Request, RequestKind, RunEnded
from .store import RunStore

__all__ = ["ToolCalls", "durable_key", "step_pause"]

_log = logging.getLogger("masterplanner.tool_calls")

_FAILURE_CHARS = 500
"""Longest description of a tool's unexpected failure that the agent sees."""
_INLINE_REDACTION = 65_536
"""A tool's result longer than this is redacted on a thread (a megabyte takes most of a second)."""
APPROVAL_CHARS = 200_000
"""Most characters of arguments a call put to a person for approval may have, all together.

The person is shown every character they approve; a longer call is refused before anyone is
asked (the agent is told to make it smaller), never shown cut."""
_LIBRARY_ADVICE = re.compile(r"^(for (more|further) information|(see|visit) https?://)", re.IGNORECASE)
"""A line of an exception's message that sends the reader to a library's documentation."""


def _step_place() -> str | None:
    """`workflow id#step number` of the current DBOS step (the same when a replay runs it again), if any."""
    workflow, step = DBOS.workflow_id, DBOS.step_id
    return f"{workflow}#{step}" if workflow is not None and step is not None else None


def durable_key() -> str:
    """Where the current DBOS step is: its workflow id and its position in the workflow.

    A request opened under this key is found again when the step runs again after a crash.
    Outside a DBOS step (a tool called directly) each pause gets a key of its own.
    """
    return _step_place() or f"direct#{uuid.uuid4().hex}"


async def step_pause(
    store: RunStore,
    run_id: str,
    step_id: str,
    kind: RequestKind,
    payload: dict[str, Any],
    event: tuple[EventKind, dict[str, Any]],
) -> Request:
    """A step's pause for a person (a tool approval, an agent's question): `Requests.pause` at `durable_key`.

    A run that has ended (a cancel that landed as the step was about to ask; the step may run
    on a worker) gets no request (`RunEnded`): the step stops as a workflow that sees its own
    cancellation stops, with DBOS's `DBOSWorkflowCancelledError` (a `BaseException`: no tool
    call, step attempt or DBOS step records it), so no failure and no event is written on the
    ended run. Not every end cancels the step's workflow first (`request_cancel` on a run whose
    holder's lease lapsed ends it directly; so does a run that fails with `cancel_steps=False`),
    and DBOS takes that exception from a workflow still PENDING as lost ownership: it waits for
    an outcome nobody records, and recovery runs the step again. So the step records its own
    workflow CANCELLED first (on one cancelled already, DBOS stops it with the same exception
    itself), and DBOS keeps that outcome. The step stops even when that record fails (logged).
    """
    try:
        return await store.requests.pause(
            run_id, kind, payload, key=durable_key(), step_id=step_id, event=event
        )
    except RunEnded as ended:
        await _cancel_own_workflow()
        raise DBOSWorkflowCancelledError(str(ended)) from None


async def _cancel_own_workflow() -> None:
    """Record the current DBOS workflow CANCELLED, if there is one (a tool called directly has none).

    DBOS cancels it, then fails to checkpoint the cancel as a step of the workflow: the cancel
    took the workflow from this execution (`DBOSWorkflowConflictIDError`), which stops at once.
    """
    own = DBOS.workflow_id
    if own is None:
        return
    try:
        await DBOS.cancel_workflow_async(own)
    except DBOSWorkflowConflictIDError:
        return  # cancelled: the workflow is no longer this execution's to checkpoint
    except Exception as error:  # the step stops all the same: a failure here is no tool's result
        _log.warning("the workflow %s of a step on an ended run was not recorded cancelled: %s", own, error)


def _printable(text: str) -> str:
    """`text` with lone surrogates escaped: no model API, database or terminal accepts them."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _shorten(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        value = _printable(value)
    text = str(value)
    return value if len(text) <= limit else f"{text[:limit]}…"


_CREDENTIAL_HEADER = re.compile(
    r"(?i)^(?:authorization|proxy-authorization|cookie|set-cookie)$|key|token|secret|pass(?:word|wd)?|auth|credential"
)
"""Headers whose values are credentials (`Authorization`, `X-Api-Key`, …): masked in events."""


def _shown_in_events(arguments: dict[str, Any]) -> dict[str, Any]:
    """Arguments as the run's events record them: no secret, each value cut at 200 characters.

    Credentials are taken out as `runs audit` takes them out, and credential headers' values
    masked; the tool itself is given the arguments as they were.
    """
    return {key: _shorten(_without_secrets(key, value), 200) for key, value in arguments.items()}


def _without_secrets(key: str, value: Any) -> Any:
    if isinstance(value, str):  # only what the event keeps (200 characters) and a little after it,
        # cut where no secret is cut short of its shape (`shortened`)
        return redacted(shortened(value, 400)) + ("…" if len(value) > 400 else "")
    if isinstance(value, dict):
        return {
            name: REMOVED
            if key == "headers" and _CREDENTIAL_HEADER.search(str(name))
            else _without_secrets(str(name), inner)
            for name, inner in value.items()
        }
    if isinstance(value, list):
        return [_without_secrets(key, inner) for inner in value]
    return value


def _approval_size(arguments: dict[str, Any]) -> int:
    """How many characters the arguments take when shown for approval."""
    return sum(
        len(key) + len(value if isinstance(value, str) else str(value)) for key, value in arguments.items()
    )


def _without_advice(message: str) -> list[str]:
    """The lines of a message, less those that send the reader to a library's docs."""
    return [line for line in message.splitlines() if not _LIBRARY_ADVICE.match(line.strip())]


def _failure(tool: str, exc: Exception) -> str:
    """A tool's unexpected exception in our words: one line, cut, without the library's advice or a key."""
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not hide the failure
        message = ""
    detail = "; ".join(line.strip() for line in _without_advice(message) if line.strip()) or "no details"
    # no key of it, taken out before the cut so that none is cut short of its shape
    text = redacted(_printable(f"{tool} failed: {type(exc).__name__}: {detail}"))
    return text if len(text) <= _FAILURE_CHARS else f"{text[: _FAILURE_CHARS - 1]}…"


@dataclass
class ToolCalls:
    """Runs the tool calls of one step.

    Policy first (`deny` refuses; `ask` opens a stored `tool_approval` request and waits until
    any process answers it; the decision is a DBOS step, so a resumed step does not ask again,
    and one interrupted while waiting finds its request again), then the call itself as a DBOS step with its
    `tool_called` / `tool_result` events, so a replayed step returns the recorded result
    instead of repeating the side effect.

    What a failing call becomes:

    - a `ToolError` goes back to the agent to correct, in the tool's own words (a line quoting
      a library's "for more information" advice is dropped);
    - any other `Exception` (a bug, an `OSError`, a library's error) is the tool's failure,
      not the step's: the agent is told `"{tool} failed: {ExceptionType}: {message}"` (one
      line, at most 500 characters, without the library's "for more information" advice) and
      goes on; the `tool_result` event records the same text as its error;
    - masterplanner's other errors are meant for the engine and still fail the step, since the
      agent can do nothing about them: `BudgetExceededError` (the run's budget is spent: the
      run stops), `ModelError` (a model call made by the tool failed: the step's attempts
      retry it with backoff), `ConfigError` such as `SandboxError` (the person must change a
      setting; the step's error says which), and likewise a `RunError` or `PlanError`;
    - `BaseException`s that are not `Exception`s (`asyncio.CancelledError` when a run is
      cancelled or a step times out, `KeyboardInterrupt`) propagate untouched.

    Text the agent or the person sees (results, errors, arguments shown for approval) has lone
    surrogates escaped, so a tool's odd output cannot break the model API call or the terminal.
    A result or an error the agent sees has every credential-shaped part and every value of a
    secret variable here taken out (`redaction.redacted`), before the call's checkpoint and its
    event keep it: a server's error may echo the key it was sent (an images API answering 401
    with `Incorrect API key provided: …`), a page, a file, an MCP tool or a program may show one,
    and the key went into the model's prompt and the call's checkpoint.
    """

    store: RunStore
    run_id: str
    step_id: str
    policy: Callable[[str], str]
    fence: Callable[[], None] | None = None
    """Called (on a worker thread) before each call is made: raises to stop this execution of
    the step instead (`runtime.keep_lease`: this process no longer holds its workflows)."""
    repeatable: Callable[[str], bool] | None = None
    """Whether a call to the tool cut off by a stop is made again on resume (`ToolSpec.repeatable`);
    None: every tool's is."""

    async def run(
        self,
        name: str,
        arguments: dict[str, Any],
        call: Callable[[], str | Awaitable[str]],
        check: Callable[[], None] | None = None,
    ) -> str:
        """Run one call; returns what the agent sees (see `ToolRunner` for `check`)."""
        policy = self.policy(name)
        if policy == "ask" and check is not None:
            try:
                check()  # depends only on the arguments and the run's settings: the same on a replay
            except ToolError as exc:
                refusal = exc

                def refuse() -> str:
                    raise refusal

                async def refused() -> tuple[bool, str]:
                    return await self._call(name, arguments, refuse)

                _, text = await DBOS.run_step_async({"name": f"tool:{name}"}, refused)
                return f"{TOOL_FAILED}\n{text}"
        if policy == "ask" and _approval_size(arguments) > APPROVAL_CHARS:
            size = _approval_size(arguments)

            def too_long() -> str:
                raise ToolError(
                    f"this call's arguments are {size:,} characters long, too long to be shown to the "
                    f"person who approves {name} calls (at most {APPROVAL_CHARS:,}): make the call "
                    "smaller, for example by splitting it into several calls"
                )

            async def refused_long() -> tuple[bool, str]:
                return await self._call(name, arguments, too_long)

            _, text = await DBOS.run_step_async({"name": f"tool:{name}"}, refused_long)
            return f"{TOOL_FAILED}\n{text}"
        if policy != "auto":
            # whole: the person approves what they see, every character of it
            shown = {
                key: _printable(value) if isinstance(value, str) else value
                for key, value in arguments.items()
            }

            async def decide() -> bool:
                return await self._decide(name, shown, policy)

            if not await DBOS.run_step_async({"name": f"approval:{name}"}, decide):
                return f"[the call to {name} was not approved; go on without it]"

        async def checkpointed() -> tuple[bool, str]:
            return await self._call(name, arguments, call)

        ok, text = await DBOS.run_step_async({"name": f"tool:{name}"}, checkpointed)
        return f"{TOOL_OUTPUT if ok else TOOL_FAILED}\n{text}"

    async def _call(
        self, name: str, arguments: dict[str, Any], call: Callable[[], str | Awaitable[str]]
    ) -> tuple[bool, str]:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
        with telemetry.span(f"execute_tool {name}", attributes) as span:
            ok, text = await self._run_call(name, arguments, call)
            if not ok:
                span.set_status(Status(StatusCode.ERROR, "the tool failed"))
            return ok, text

    async def _run_call(
        self, name: str, arguments: dict[str, Any], call: Callable[[], str | Awaitable[str]]
    ) -> tuple[bool, str]:
        if self.fence is not None:
            await asyncio.to_thread(self.fence)
        call_id = _step_place()  # a replay that makes this call again finds it under the same id
        marked = {} if call_id is None else {"call": call_id}
        if (
            call_id is not None
            and self.repeatable is not None
            and not self.repeatable(name)
            and await asyncio.to_thread(self.store.call_started, self.run_id, self.step_id, call_id)
        ):
            message = (
                f"{name}: an earlier try of this call was cut off when its process stopped; it may "
                "have taken effect, so it was not made again. Check its effect before calling it again."
            )
            await self._outcome(name, "error", message)
            return False, message
        await self._event("tool_called", {"tool": name, "arguments": _shown_in_events(arguments)} | marked)
        try:
            result = call()
            if inspect.isawaitable(result):
                result = await result
        except ToolError as exc:
            # what the agent reads (and the checkpoint keeps): a server's error may echo the key
            # it was sent (an images API answering 401), which would go into the model's prompt
            message = redacted(_printable("\n".join(_without_advice(str(exc))).strip())) or f"{name} failed"
            await self._outcome(name, "error", message)
            return False, message
        except MasterplannerError as exc:
            await self._outcome(name, "error", _printable(f"{type(exc).__name__}: {exc}"))
            raise
        except Exception as exc:
            message = _failure(name, exc)
            await self._outcome(name, "error", message)
            return False, message
        # what the agent reads, the checkpoint keeps and the event shows: a page that echoes a
        # key, a file or a program's output holding a secret's value here went to the model whole.
        # Read as content, not as a message: code stays code (`redacted_content`)
        text = _printable(result if isinstance(result, str) else str(result))
        if len(text) <= _INLINE_REDACTION:
            text = redacted_content(text)
        else:
            text = await asyncio.to_thread(redacted_content, text)
        await self._outcome(name, "result", text)
        return True, text

    async def _decide(self, tool: str, arguments: dict[str, Any], policy: str) -> bool:
        if policy == "deny":
            await self._event("tool_denied", {"tool": tool, "by": "policy"})
            return False
        answered = await step_pause(
            self.store,
            self.run_id,
            self.step_id,
            "tool_approval",
            {"tool": tool, "arguments": arguments},
            # the log's copy is cut as tool_called's is; the request holds them whole
            ("tool_approval_requested", {"tool": tool, "arguments": _shown_in_events(arguments)}),
        )
        approved = answered.state == "answered" and bool((answered.answer or {}).get("approved"))
        data = {"tool": tool, "by": answered.answered_by or answered.state, "request": answered.id}
        reason = (answered.answer or {}).get("reason")
        await self._event(
            "tool_approved" if approved else "tool_denied",
            data | ({"reason": redacted(str(reason))} if reason else {}),
        )
        return approved

    async def _event(self, kind: EventKind, data: dict[str, Any]) -> None:
        await asyncio.to_thread(self.store.append_event, self.run_id, kind, self.step_id, data)

    async def _outcome(self, name: str, key: Literal["result", "error"], text: str) -> None:
        """The `tool_result` event: what the tool gave or why it failed, with no key in it.

        A result is kept to 500 characters, taken out of what it read before it is cut so that
        no key is cut short of its shape; and what it is taken out of is cut where no secret
        is cut (`shortened`).
        """
        shown = redacted(shortened(text, 1000))[:500] if key == "result" else redacted(text)
        await self._event("tool_result", {"tool": name, key: shown})
