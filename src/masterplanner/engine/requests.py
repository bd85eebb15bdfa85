"""Stored requests: every pause of a run is a row any process can answer.

A run pauses for a person in five places: the plan review, a tool call under policy `ask`,
an agent's `ask_user` question, the new steps a replan proposes for a failed step, and (after
it succeeds, with `remember_runs = ask`) whether to store its team.

Each pause opens a request row (`mp_requests`): id, run, step, kind, payload,
state (`open` → `answered` | `expired` | `cancelled`), answer, who answered and when.

The waiting side polls the row, so the answer may come from any process — the terminal that
started the run, `masterplanner runs answer` in another shell, later a browser — also after
the process that asked has died: a resumed step opens the same request again (its `key` is
the step's durable position, so it finds the existing row) and takes the answer that is there.
The row and the event that announces the pause in the run's log are one write (`Requests.open`'s
`event`): a request is never left unannounced by a crash or a store error between the two.

Answering is one conditional update (`… WHERE state = 'open'`): of two processes answering at
once exactly one succeeds; the other is told the request's state and who answered it. An answer
sent again (a browser that lost the server's reply, a script run twice) is no conflict: the same
answer from the same answerer (`same_answerer`) to a request it answered is taken once, and the
second send is told so (`Request.taken_before`) instead of being refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import re
import secrets
from collections.abc import Collection, Iterator, Mapping
from contextvars import ContextVar
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from sqlalchemy.engine import Connection

from ..database import names_nothing, reconnecting, reconnecting_methods, repeats_itself
from ..errors import (
    NUL_PROBLEM,
    RequestClosedError,
    RequestError,
    json_kind,
    nul_field,
    quoted_id,
    validation_problems,
)
from ..plan import Plan
from ..redaction import REMOVED, secret_parts, secret_refusal
from ..remedies import Remedy
from ..usage import counted
from .records import AgentBrief, EventKind, utc_now

if TYPE_CHECKING:
    from .store import RunStore

__all__ = [
    "ANSWER_TEXT_CHARS",
    "NO_REASON",
    "LeaseLost",
    "PlanDecision",
    "Request",
    "RequestKind",
    "RequestState",
    "Requests",
    "RunEnded",
    "StepClock",
    "add_answer_call",
    "closed_text",
    "create_requests_table",
    "request_of_row",
    "same_answerer",
    "secret_in_answer",
    "typed_secrets_removed",
]

RequestKind = Literal["plan_review", "tool_approval", "ask_user", "remember", "replan"]
RequestState = Literal["open", "answered", "expired", "cancelled"]

_POLL_S = 0.2
"""How often a waiting step looks at its request (a read of one row by primary key)."""
ANSWER_TEXT_CHARS = 20_000
"""Longest text answer (an `ask_user` reply, a reason for a refusal or a rejection) taken, from
any front end: the HTTP API's fields (`web.api_bodies.AnswerIn`) take the same, so a reason is not
refused at 4,000 characters in one form of answer and at 20,000 in another."""
NO_REASON = "no reason given"
"""What a rejection of a plan or a replan given with no reason says (`PlanDecision.why`), from every
front end alike: it was "rejected" from `runs answer --deny` and "rejected at review" elsewhere."""


class LeaseLost(Exception):
    """A request was to be opened only while its opener held the run's lease, and another process holds it.

    Nothing was written; the opener stops, as when another lease-bound write finds the lease lost.
    """


class RunEnded(Exception):
    """A request was to be opened for a run that has ended (cancelled, failed or succeeded).

    Nothing was written: no request stays open on an ended run, whose end closed the open ones
    (`close_open_requests`). A step that asks as a cancel ends the run (a tool approval, an
    agent's question, on a worker too) stops instead, recording nothing. The `remember` question
    is the exception: the end of a succeeded run opens it.
    """

    def __init__(self, run_id: str, status: str, kind: RequestKind) -> None:
        super().__init__(f"run {run_id} has ended ({status}): its {kind} request was not opened")


class PlanDecision(BaseModel):
    """The answer to a plan review: approve (perhaps with edits) or reject (with a reason)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    action: Literal["approve", "reject"]
    reason: str | None = Field(default=None, max_length=ANSWER_TEXT_CHARS)
    plan: dict[str, Any] | None = None
    """An edited plan (public form); validated against the run's catalog when it is applied."""
    agents: dict[str, AgentBrief] | None = None
    """Edited agents by step id (prompts, per-agent tool policies); a step left out keeps its agent."""
    tool_policies: dict[str, Literal["auto", "ask", "deny"]] | None = None
    """The run's tool policies as edited."""

    @field_validator("reason")
    @classmethod
    def _no_blank_reason(cls, reason: str | None) -> str | None:
        """The reason without the blanks around it; one of blanks alone is none (`NO_REASON`).

        Spaces alone (`runs answer --deny --reason '   '`, the API's) went past `NO_REASON`:
        the run said "rejected:    ", and so did the audit.
        """
        return (reason.strip() or None) if reason is not None else None

    @property
    def why(self) -> str:
        """A rejection's reason as the run keeps it: the one given, else `NO_REASON`."""
        return (self.reason or "").strip() or NO_REASON

    @property
    def edits(self) -> bool:
        """Whether the answer changes the plan, the agents or the tool policies."""
        return self.plan is not None or self.agents is not None or self.tool_policies is not None

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON form, without fields that were not given."""
        return self.model_dump(mode="json", exclude_none=True)

    def changes(
        self,
        plan: Plan | None,
        agents: Mapping[str, AgentBrief],
        tool_policies: Mapping[str, str],
        shown: Collection[str] | None = None,
    ) -> PlanDecision:
        """This answer without what it gives back as the run holds it: what it changes.

        A front end may send the whole review back: the web form always does, the terminal after
        any edit, an API client as it likes. The plan, the agents map or the tool policies equal
        to the run's are left out, so an answer that changes nothing is a plain approval: no
        `plan_edited`, and no agent marked `edited` (which would switch off the step aids'
        shortcuts). A step's prompt that differs only in the whitespace around it (an editor's
        final line break, a browser's) is the run's, with the run's marks.

        `shown` names the tools the review shows (its catalog; None: all). A policy the run holds
        for a tool outside them (configured but not available here: `web_search` without a
        backend, the tools of an MCP server that would not start) is no answer's to drop: a
        front end cannot show it, so the web form never sends it back. It is kept as the run
        holds it unless the answer names that tool itself.
        """
        if self.action != "approve" or not self.edits:
            return self
        update: dict[str, Any] = {}
        if self.plan is not None and plan is not None:
            try:
                if Plan.model_validate(self.plan) == plan:
                    update["plan"] = None
            except ValidationError:  # not a plan: refused, with its problems, when it is applied
                pass
        if self.agents is not None:  # the steps it leaves out keep their agents (`planning._edit_of`)
            given = {step_id: _as_held(brief, agents.get(step_id)) for step_id, brief in self.agents.items()}
            update["agents"] = (
                None if all(agents.get(step_id) == brief for step_id, brief in given.items()) else given
            )
        if self.tool_policies is not None:
            unshown = {} if shown is None else {t: p for t, p in tool_policies.items() if t not in shown}
            policies = {**unshown, **self.tool_policies}
            update["tool_policies"] = None if policies == dict(tool_policies) else policies
        return self.model_copy(update=update)


def _as_held(brief: AgentBrief, held: AgentBrief | None) -> AgentBrief:
    """`brief` with the run's prompt and marks when its prompt is the run's but for surrounding whitespace.

    The marks are the run's to keep: `edited` says the person changed the prompt, and
    `prompt_by_person` is the stored agent's (`planning.kept_marks`).
    """
    if held is None or brief.prompt.strip() != held.prompt.strip():
        return brief
    update: dict[str, Any] = {"prompt": held.prompt, "edited": held.edited}
    if brief.agent_id == held.agent_id:
        update["prompt_by_person"] = held.prompt_by_person
    return brief.model_copy(update=update)


metadata = sa.MetaData()

requests_table = sa.Table(
    "mp_requests",
    metadata,
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("key", sa.String(300), nullable=False, unique=True),
    sa.Column("run_id", sa.String(64), nullable=False, index=True),
    sa.Column("step_id", sa.String(100)),
    sa.Column("kind", sa.String(24), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("answer", sa.Text),
    sa.Column("answered_by", sa.String(200)),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("answered_at", sa.String(32)),
    sa.Column("answer_call", sa.String(32)),
)


def create_requests_table(connection: Connection) -> None:
    """Migration `0002_requests`: the requests table, and no review decision kept on the run."""
    requests_table.create(connection, checkfirst=True)
    columns = {column["name"] for column in sa.inspect(connection).get_columns("mp_runs")}
    if "decision" in columns:
        connection.execute(sa.text("ALTER TABLE mp_runs DROP COLUMN decision"))


def add_answer_call(connection: Connection) -> None:
    """Migration `0015_request_answer_call`: the token of the `Requests.answer` call that stored the answer.

    A try of that call made again (`reconnecting`) after its COMMIT reached the server finds its
    own token there: the answer is this call's, not one sent before.
    """
    if "answer_call" not in {column["name"] for column in sa.inspect(connection).get_columns("mp_requests")}:
        connection.execute(sa.text("ALTER TABLE mp_requests ADD COLUMN answer_call VARCHAR(32)"))


@dataclasses.dataclass(frozen=True)
class Request:
    """One pause of a run, waiting for (or holding) a person's answer.

    `taken_before` and `follow_up_failed` say how an answer just given went; they are not stored
    (a request read from the database has neither).
    """

    id: str
    run_id: str
    step_id: str | None
    kind: RequestKind
    payload: dict[str, Any]
    state: RequestState
    answer: dict[str, Any] | None
    answered_by: str | None
    created_at: str
    answered_at: str | None
    taken_before: bool = dataclasses.field(default=False, compare=False)
    """The answer just given was this request's answer already, from the same answerer (sent
    again): nothing was stored again, and the run was not told twice."""
    follow_up_failed: str | None = dataclasses.field(default=None, compare=False)
    """What failed after the answer just given was stored (its event, storing the run's team), in
    words; the answer stands (`RunService.answer`)."""

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON form (the stored request: without `taken_before` and `follow_up_failed`)."""
        return {
            "id": self.id,
            "run_id": self.run_id,
            "step_id": self.step_id,
            "kind": self.kind,
            "payload": self.payload,
            "state": self.state,
            "answer": self.answer,
            "answered_by": self.answered_by,
            "created_at": self.created_at,
            "answered_at": self.answered_at,
        }

    def summary(self) -> str:
        """One line saying what the request asks."""
        where = f" (step {self.step_id})" if self.step_id else ""
        if self.kind == "plan_review":
            steps = len((self.payload.get("plan") or {}).get("steps", []))
            return f"review the plan of {counted(steps, 'step')}: approve, reject or edit"
        if self.kind == "tool_approval":
            called = _call_line(str(self.payload.get("tool")), self.payload.get("arguments") or {})
            return f"allow {called}{where}?"
        if self.kind == "ask_user":
            return f"an agent asks{where}: {self.payload.get('question', '')}"
        if self.kind == "replan":
            new = ", ".join(self.payload.get("new_steps", []))
            return f"step {self.step_id} failed: run new steps {new} in its place? approve, reject or edit"
        return f"store this run's team ({self.payload.get('agents', 0)} agents) in the registry?"


def _call_line(tool: str, arguments: dict[str, Any]) -> str:
    """A tool call on one line, `write_file(path="a.txt", content="…")`: each value cut at 60 characters.

    The request's payload holds the arguments whole, for the approval itself.
    """
    shown = []
    for key, value in arguments.items():
        text = json.dumps(value, ensure_ascii=False)
        shown.append(f"{key}={text if len(text) <= 60 else text[:59] + '…'}")
    return f"{tool}({', '.join(shown)})"


def _problems(error: ValidationError, model: type[BaseModel]) -> str:
    """A validation error's problems in our words: where, what is wrong there, the fields known there."""
    return "; ".join(validation_problems(error.errors(), whole="answer", model=model))


def _texts(value: object, where: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Each text in a JSON value with where it is (a step named by its id, not its place)."""
    if isinstance(value, str):
        yield where, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _texts(item, (*where, str(key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            name = item.get("id") if isinstance(item, dict) else None
            yield from _texts(item, (*where, f"step {name!r}" if isinstance(name, str) else str(index + 1)))


def _edited_part(where: tuple[str, ...]) -> str:
    """Where in a plan review's answer a text is, as a person reads it."""
    if where[:1] == ("plan",):
        inner = [part for part in where[1:] if part != "steps"]
        return f"the edited plan ({', '.join(inner) or 'plan'})"
    if where[:1] == ("agents",) and len(where) >= 2:
        field = ".".join(where[2:]) or "agent"
        return f"the edited agent of step {where[1]!r} ({field})"
    return f"the answer's {'.'.join(where)}"


def secret_in_answer(request: Request, answer: dict[str, Any]) -> str | None:
    """Why `answer` is refused because the person typed what looks like a secret into it, or None.

    Every text of an answer is stored with the request, and goes into the run's prompts (an
    agent's question's answer, an edited plan or prompt). Only what the person wrote is judged:
    a text of a plan review's answer is refused when it holds a secret-shaped part that is not
    one the reviewed plan and prompts (the request's payload) held already (`_shown_parts`).
    """
    shown = _shown_parts(request)
    for where, text in _texts(answer):
        if any(part not in shown for part in secret_parts(text)):
            if where == ("text",):
                what = "the answer"
            elif where == ("reason",):
                what = "the reason"
            else:
                what = _edited_part(where)
            return secret_refusal(what, not_in="an answer")
    return None


def _shown_parts(request: Request) -> set[str]:
    """The secret-shaped parts of the request's texts, each as the detector cuts it.

    Parts are compared whole: a key the person typed that only begins a longer key the plan
    shows is the person's own (a text holding it was once taken), while the plan's own text sent
    back as it is (the web form sends all of it) is always taken.
    """
    return {part for _, text in _texts(request.payload) for part in secret_parts(text)}


def typed_secrets_removed(request: Request, answer: Any) -> Any:
    """`answer` with each secret-shaped part the person typed into it replaced by `[secret removed]`.

    For showing a refused answer back to the person (the web's review form as they left it)
    without sending their secret back over the wire: the parts `secret_in_answer` refuses go,
    the rest of each text stays (the parts the plan showed too), so they see where it was.
    """
    shown = _shown_parts(request)

    def removed(value: Any) -> Any:
        if isinstance(value, str):
            for _ in range(10):  # again: a part taken out may have held or split another
                typed = [part for part in secret_parts(value) if part not in shown]
                if not typed:
                    break
                value = _replaced(value, typed, keep=shown)
            else:  # still one after that many rounds: none of the text is shown
                value = REMOVED
            return value
        if isinstance(value, dict):
            return {key: removed(item) for key, item in value.items()}
        if isinstance(value, list):
            return [removed(item) for item in value]
        return value

    return removed(answer)


def _replaced(text: str, parts: list[str], *, keep: set[str]) -> str:
    """`text` with `parts` replaced by `[secret removed]`, the `keep` parts in it left whole."""
    kept = sorted((part for part in keep if part in text), key=len, reverse=True)
    marks = {f"\x00{index}\x00": part for index, part in enumerate(kept)}
    for mark, part in marks.items():
        text = text.replace(part, mark)
    for part in parts:
        text = text.replace(part, REMOVED)
    for mark, part in marks.items():
        text = text.replace(mark, part)
    return text


def _checked_answer(request: Request, answer: dict[str, Any]) -> dict[str, Any]:
    """`answer` in the shape `request`'s kind takes, or `RequestError` naming what is wrong.

    Also refused: an answer holding what looks like a secret the person typed (`secret_in_answer`).
    """
    shaped = _shaped_answer(request, answer)
    problem = nul_field(shaped)  # Postgres refuses it (after the run had taken the answer)
    if problem is not None:
        raise RequestError(
            f"request {request.id}: {problem}; nothing was stored, and the request is still open"
        )
    refusal = secret_in_answer(request, shaped)
    if refusal is not None:
        raise RequestError(
            f"request {request.id}: {refusal}; nothing was stored, and the request is still open"
        )
    return shaped


def _shaped_answer(request: Request, answer: dict[str, Any]) -> dict[str, Any]:
    """`answer` in the shape `request`'s kind takes, or `RequestError` naming what is wrong.

    - plan review and a replan's review: `{"action": "approve" | "reject", "reason"?, "plan"?,
      "agents"?, "tool_policies"?}` (an edited plan is validated again when the run applies it);
    - tool approval and the remember question: `{"approved": bool, "reason"?: str}`;
    - `ask_user`: `{"text": str}`.
    """
    if not isinstance(answer, dict):
        got = "null" if answer is None else type(answer).__name__
        raise RequestError(f"request {request.id}: an answer is an object, got {got}")
    reason = answer.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise RequestError(f"request {request.id}: the reason should be text, got {json_kind(reason)}")
    if reason is not None and len(reason) > ANSWER_TEXT_CHARS:
        raise RequestError(
            f"request {request.id}: the reason is {len(reason):,} characters; "
            f"the limit is {ANSWER_TEXT_CHARS:,}"
        )
    # kept without the blanks around it; blanks alone are no reason (an agent's question takes none)
    if reason is not None and request.kind != "ask_user":
        reason = reason.strip() or None
        answer = {key: value for key, value in answer.items() if key != "reason"}
        answer |= {"reason": reason} if reason else {}
    if request.kind in ("plan_review", "replan"):
        what = "a plan review" if request.kind == "plan_review" else "a replan's review"
        action = answer.get("action")
        if action not in ("approve", "reject"):
            got = f"action {json.dumps(action, default=str)[:80]}" if "action" in answer else "no action"
            raise RequestError(
                f'request {request.id} is {what}: its answer is {{"action": "approve"}} or '
                f'{{"action": "reject", "reason": …}}, got {got}'
            )
        try:
            return PlanDecision.model_validate(answer).to_json_dict()
        except ValidationError as exc:
            raise RequestError(
                f"request {request.id}: the answer does not fit {what}: {_problems(exc, PlanDecision)}"
            ) from None
    if request.kind == "ask_user":
        text = answer.get("text")
        if not isinstance(text, str) or set(answer) != {"text"}:
            raise RequestError(
                f'request {request.id} is a question: its answer is {{"text": …}} and nothing else'
            )
        if len(text) > ANSWER_TEXT_CHARS:
            raise RequestError(
                f"request {request.id}: the answer is {len(text):,} characters; "
                f"the limit is {ANSWER_TEXT_CHARS:,}"
            )
        if not text.strip():  # the agent asked for something: nothing is no answer
            raise RequestError(f"request {request.id}: the answer is empty; write what the agent asked for")
        return {"text": text}
    approved = answer.get("approved")
    if not isinstance(approved, bool) or set(answer) - {"approved", "reason"}:
        raise RequestError(
            f'request {request.id} asks yes or no: its answer is {{"approved": true}} or '
            '{"approved": false, "reason": …}'
        )
    return {"approved": approved} | ({"reason": reason} if reason else {})


def close_open_requests(
    connection: Connection, run_id: str, state: Literal["expired", "cancelled"], *, keep_remember: bool
) -> int:
    """Close a run's open requests in the caller's transaction (`remember` ones kept if asked); how many."""
    query = requests_table.update().where(requests_table.c.run_id == run_id, requests_table.c.state == "open")
    if keep_remember:
        query = query.where(requests_table.c.kind != "remember")
    return int(connection.execute(query.values(state=state, answered_at=utc_now())).rowcount)


@reconnecting_methods
class Requests:
    """The requests of the runs in one run store's database."""

    def __init__(self, store: RunStore) -> None:
        self._store = store

    @repeats_itself
    def open(
        self,
        run_id: str,
        kind: RequestKind,
        payload: dict[str, Any],
        *,
        key: str,
        step_id: str | None = None,
        event: tuple[EventKind, dict[str, Any]] | None = None,
        owner: str | None = None,
    ) -> tuple[Request, bool]:
        """Open a request; returns it and True, or the one already opened under `key` and False.

        The key names the pause's durable place (a step's workflow and position in it), so a
        step that runs again after a crash finds its earlier request, in whatever state it is.

        `event` (its kind and data) announces the request in the run's events: it is appended in
        the same transaction, naming the request's step and, in its data, the request (`request`).
        A request found under `key` writes nothing more (its event was written with it; one found
        open without it, from an older version, gets it then: `RunStore.open_request`).

        With `owner`, only while `owner` holds the run's lease: `LeaseLost`, and nothing written,
        when another process holds it. On a run that has ended, only a `remember` request opens:
        `RunEnded` otherwise, and nothing written (one found under `key` is returned as it is).
        An `event` of a kind that is not an `EventKind` is refused (`ValueError`). (Made again
        while the database is unavailable by `RunStore.open_request` itself, a keyed write: a try
        that committed is found by the next.)
        """
        opened = self._store.open_request(
            run_id, kind, payload, key=key, step_id=step_id, event=event, owner=owner
        )
        if opened is None:
            raise LeaseLost(f"run {run_id} is held by another process: its {kind} request was not opened")
        return opened

    def get(self, request_id: str) -> Request:
        """The request with this id (a unique prefix of at least 4 characters also works)."""
        if names_nothing(request_id):
            raise RequestError(f"no request {quoted_id(request_id)}", remedy=Remedy("open_requests"))
        with self._store.begin("read a request") as connection:
            row = (
                connection.execute(sa.select(requests_table).where(requests_table.c.id == request_id))
                .mappings()
                .first()
            )
            if row is None and len(request_id) >= 4:
                rows = (
                    connection.execute(
                        sa.select(requests_table)
                        .where(requests_table.c.id.startswith(request_id, autoescape=True))
                        .limit(2)
                    )
                    .mappings()
                    .all()
                )
                row = rows[0] if len(rows) == 1 else None
        if row is None:
            raise RequestError(f"no request {quoted_id(request_id)}", remedy=Remedy("open_requests"))
        return request_of_row(row)

    def find(self, run_id: str | None = None, *, state: RequestState | None = "open") -> list[Request]:
        """Requests of one run (or of all runs) in the order they were opened; only open ones by default."""
        query = sa.select(requests_table).order_by(requests_table.c.created_at, requests_table.c.id)
        if run_id is not None:
            query = query.where(requests_table.c.run_id == run_id)
        if state is not None:
            query = query.where(requests_table.c.state == state)
        with self._store.begin("list requests") as connection:
            rows = connection.execute(query).mappings().all()
        return [request_of_row(row) for row in rows]

    @repeats_itself
    def answer(self, request_id: str, answer: dict[str, Any], *, by: str) -> Request:
        """Answer an open request; exactly one of several racing answers is taken.

        `RequestError` (nothing changes) when there is no such request, the answer does not fit
        its kind, or the request is not open any more (`RequestClosedError`): unless it was
        answered with this very answer by the same answerer (`same_answerer`), which is this
        answer sent again; then the request as it is, `taken_before`, and nothing stored again.

        The call is made again while the database is unavailable (`reconnecting`), under a token
        of its own stored with the answer (`answer_call`): a try whose COMMIT reached the server
        before the connection dropped is found by the next try as this call's answer, not as
        one sent before (which was `taken_before`, and its run never told).
        """
        return reconnecting(self._answer)(request_id, answer, by=by, call=secrets.token_hex(16))

    def _answer(self, request_id: str, answer: dict[str, Any], *, by: str, call: str) -> Request:
        """One try of `answer`, under its call's token."""
        request = self.get(request_id)
        if "\x00" in by:  # stored as it is (Postgres refuses it)
            raise RequestError(f"request {request.id}: who answers ({by!r}) {NUL_PROBLEM}")
        if request.state != "open":
            return self._closed(request, answer, by, call)
        answer = _checked_answer(request, answer)
        with self._store.begin("answer a request") as connection:
            updated = connection.execute(
                requests_table.update()
                .where(requests_table.c.id == request.id, requests_table.c.state == "open")
                .values(
                    state="answered",
                    answer=json.dumps(answer),
                    answered_by=by[:200],
                    answered_at=utc_now(),
                    answer_call=call,
                )
            )
        if updated.rowcount != 1:  # answered meanwhile: by another, or this answer sent twice at once
            return self._closed(self.get(request.id), answer, by, call)
        return self.get(request.id)

    def _closed(self, request: Request, answer: dict[str, Any], by: str, call: str) -> Request:
        """`request`, not open: as it is if an earlier try of this call answered it, else `_taken_before`."""
        if request.state == "answered":
            with self._store.begin("read a request") as connection:
                stored_call = connection.scalar(
                    sa.select(requests_table.c.answer_call).where(requests_table.c.id == request.id)
                )
            if stored_call == call:
                return request
        return _taken_before(request, answer, by)

    def close_run(self, run_id: str, state: Literal["expired", "cancelled"], *, keep_remember: bool) -> int:
        """Close a run's open requests (when it is cancelled or ends); returns how many."""
        with self._store.begin("close requests") as connection:
            return close_open_requests(connection, run_id, state, keep_remember=keep_remember)

    async def pause(
        self,
        run_id: str,
        kind: RequestKind,
        payload: dict[str, Any],
        *,
        key: str,
        step_id: str | None = None,
        event: tuple[EventKind, dict[str, Any]],
        owner: str | None = None,
    ) -> Request:
        """Open a request with its `event` (or find the one opened under `key`), then wait until it is closed.

        `Requests.open` opens it (with `owner`, only while `owner` holds the run's lease, else `LeaseLost`).
        """
        request, _new = await asyncio.to_thread(
            partial(self.open, run_id, kind, payload, key=key, step_id=step_id, event=event, owner=owner)
        )
        clock = _step_clock.get()
        if clock is None:
            return await self.wait(request.id)
        with clock.stopped():  # a person's time is not the step's: its timeout waits too
            return await self.wait(request.id)

    async def wait(self, request_id: str) -> Request:
        """Block until the request is no longer open, polling its row off the event loop."""
        while True:
            request = await asyncio.to_thread(self.get, request_id)
            if request.state != "open":
                return request
            await asyncio.sleep(_POLL_S)


class StepClock:
    """A step attempt's timeout, stopped while the step waits for a person (`Requests.pause`).

    Before, a tool approval or an `ask_user` question left unanswered for `step_timeout_s` (600 s
    by default) failed the step, "timed out", although nothing of the step was running.
    """

    def __init__(self, timeout: asyncio.Timeout) -> None:
        self.timeout = timeout
        self.waits = 0
        self.left: float | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[StepClock]:
        """This clock as the one `Requests.pause` stops, in this task and the tasks it starts."""
        token = _step_clock.set(self)
        try:
            yield self
        finally:
            _step_clock.reset(token)

    @contextlib.contextmanager
    def stopped(self) -> Iterator[None]:
        """The timeout stopped meanwhile (several waits at once stop it once), then going on."""
        loop = asyncio.get_running_loop()
        if self.waits == 0:
            when = self.timeout.when()
            self.left = None if when is None else max(0.0, when - loop.time())
            self.timeout.reschedule(None)
        self.waits += 1
        try:
            yield
        finally:
            self.waits -= 1
            if self.waits == 0 and self.left is not None and not self.timeout.expired():
                self.timeout.reschedule(loop.time() + self.left)


_step_clock: ContextVar[StepClock | None] = ContextVar("masterplanner_step_clock", default=None)


_PID = re.compile(r"^(.+@.+):\d+$")
"""An answerer's name as `service.answerer_name` makes it, `front end@host:pid`, up to its pid."""


def same_answerer(one: str, other: str) -> bool:
    """Whether two answerers' names (`Request.answered_by`, `by`) name the same answerer.

    The same front end on the same host is the same answerer, whatever its process: a server
    restarted between an answer and its resend has another pid, and the pid names no person.
    (The web's answerer is the server: its one login, the token, is shared by whoever holds it,
    so no browser, or person, is told from another.) Other names are compared whole (each is
    cut at 200 characters, as stored).
    """

    def who(name: str) -> str:
        name = name[:200]
        found = _PID.match(name)
        return found[1] if found else name

    return who(one) == who(other)


def _taken_before(request: Request, answer: dict[str, Any], by: str) -> Request:
    """`request` (closed), `taken_before` when its answer is `answer` from `by`; else `RequestClosedError`."""
    if (
        request.state == "answered"
        and request.answered_by is not None
        and same_answerer(request.answered_by, by)
    ):
        try:
            same = json.loads(json.dumps(_checked_answer(request, answer))) == request.answer
        except RequestError:  # not even an answer it takes: not the one it has
            same = False
        if same:
            return dataclasses.replace(request, taken_before=True)
    raise RequestClosedError(closed_text(request))


def closed_text(request: Request) -> str:
    """Why a request that is no longer open cannot be answered."""
    if request.state == "answered":
        return f"request {request.id} is already answered (by {request.answered_by} at {request.answered_at})"
    if request.state == "cancelled":
        return f"request {request.id} is cancelled: its run {request.run_id} was cancelled"
    return f"request {request.id} is {request.state}: its run {request.run_id} no longer waits for it"


def request_of_row(row: Any) -> Request:
    """The request a row of `mp_requests` holds."""
    return Request(
        id=row["id"],
        run_id=row["run_id"],
        step_id=row["step_id"],
        kind=row["kind"],
        payload=json.loads(row["payload"]),
        state=row["state"],
        answer=json.loads(row["answer"]) if row["answer"] else None,
        answered_by=row["answered_by"],
        created_at=row["created_at"],
        answered_at=row["answered_at"],
    )
