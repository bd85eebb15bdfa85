"""Stored messages between the step agents of a run, and the run's blackboard of notes.

A message is a row (`mp_messages`) from one step to another: a `message`, a `broadcast` (one
row per recipient) or a `question`. It is written once per sending tool call: its `send_key`
is the call's durable position, so a call replayed after a crash finds its rows instead of
sending again. A recipient takes its pending messages in one transaction that marks them
delivered under a `delivery` key (the durable position of the model request or brief that
shows them): a delivery repeated after a crash gets exactly the rows it took before (and any
that arrived since), so every message is delivered once.

A question stays open until it is answered (by the recipient's `reply`, or by consulting a
finished recipient) or closed with a reason (the two sides would wait on each other, no
answer in time, the recipient ended). Notes are a run's key-value blackboard (`mp_notes`).

When a replan or a sub-plan retires steps, the messages and broadcasts sent to them are handed on
to the steps the revision adds (`hand_on`, in the revision's own transaction): a copy to each,
marked with the step it was first sent to (`handed_from`). A retired step's pending message is
closed saying where it went, so nothing sent is left waiting for a step that will never run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from ..database import reconnecting_methods
from ..usage import noun_for
from .records import utc_now

if TYPE_CHECKING:
    from .store import RunStore

__all__ = [
    "Message",
    "MessageKind",
    "Messages",
    "Note",
    "add_message_hand_on",
    "create_message_tables",
    "hand_on",
]

MessageKind = Literal["message", "broadcast", "question"]
MessageState = Literal["pending", "delivered", "answered", "closed"]

metadata = sa.MetaData()

messages_table = sa.Table(
    "mp_messages",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("run_id", sa.String(64), nullable=False, index=True),
    sa.Column("send_key", sa.String(300), nullable=False),
    sa.Column("sender", sa.String(100), nullable=False),
    sa.Column("recipient", sa.String(100), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("content", sa.Text, nullable=False),
    sa.Column("state", sa.String(16), nullable=False),
    sa.Column("answer", sa.Text),
    sa.Column("answered_by", sa.String(16)),
    sa.Column("delivery", sa.String(300)),
    sa.Column("created_at", sa.String(32), nullable=False),
    sa.Column("delivered_at", sa.String(32)),
    sa.Column("answered_at", sa.String(32)),
    sa.Column("handed_from", sa.String(100)),
    sa.UniqueConstraint("send_key", "recipient", name="uq_mp_messages_send"),
)
notes_table = sa.Table(
    "mp_notes",
    metadata,
    sa.Column("run_id", sa.String(64), primary_key=True),
    sa.Column("key", sa.String(100), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
    sa.Column("step", sa.String(100), nullable=False),
    sa.Column("updated_at", sa.String(32), nullable=False),
)


def create_message_tables(connection: Connection) -> None:
    """Migration `0004_messages_notes`: messages between steps and the run's notes."""
    messages_table.create(connection, checkfirst=True)
    notes_table.create(connection, checkfirst=True)


def add_message_hand_on(connection: Connection) -> None:
    """Migration `0009_message_hand_on`: the step a handed-on message was first sent to."""
    if "handed_from" not in {column["name"] for column in sa.inspect(connection).get_columns("mp_messages")}:
        connection.execute(sa.text("ALTER TABLE mp_messages ADD COLUMN handed_from VARCHAR(100)"))


@dataclass(frozen=True)
class Message:
    """One message from a step to another (a broadcast is one per recipient)."""

    id: int
    run_id: str
    sender: str
    recipient: str
    kind: MessageKind
    content: str
    state: MessageState
    answer: str | None
    answered_by: str | None
    """`reply` (the recipient answered at its turn), `consult` (it had finished) or `engine`
    (closed with the reason in `answer`)."""
    created_at: str
    delivered_at: str | None
    answered_at: str | None
    handed_from: str | None = None
    """The step this was first sent to, when a replan or a sub-plan put `recipient` in its place."""
    handed_to: tuple[str, ...] = ()
    """With `handed_from`: every step the revision handed it on to (each has a copy), `recipient`
    among them; a step retired in turn, whose copy went on, is not."""

    @property
    def open_question(self) -> bool:
        """A question still waiting for its answer."""
        return self.kind == "question" and self.state in ("pending", "delivered")

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {
            "id": self.id,
            "from": self.sender,
            "to": self.recipient,
            "kind": self.kind,
            "content": self.content,
            "state": self.state,
            "answer": self.answer,
            "answered_by": self.answered_by,
            "created_at": self.created_at,
            "delivered_at": self.delivered_at,
            "answered_at": self.answered_at,
            "handed_from": self.handed_from,
        }


@dataclass(frozen=True)
class Note:
    """One entry of a run's blackboard."""

    key: str
    value: str
    step: str
    updated_at: str

    def to_json_dict(self) -> dict[str, Any]:
        """Plain JSON form."""
        return {"key": self.key, "value": self.value, "step": self.step, "updated_at": self.updated_at}


def _messages(connection: Connection, rows: Sequence[Any]) -> list[Message]:
    """The messages of `rows`, each handed-on one with the steps that have a copy of it too.

    The copies of one message are the rows under its send key handed on from the same step,
    in the order they were made; a copy closed since (its step was retired, and it went on) is
    not one. Before, a step was told "(sent to step c, whose place your step took)" when
    several steps had taken c's place, each with its copy.
    """
    keys = {row["send_key"] for row in rows if row["handed_from"] is not None}
    copies: dict[tuple[str, str, str], list[str]] = {}
    if keys:
        found = connection.execute(
            sa.select(
                messages_table.c.run_id,
                messages_table.c.send_key,
                messages_table.c.handed_from,
                messages_table.c.recipient,
            )
            .where(
                messages_table.c.run_id.in_({row["run_id"] for row in rows}),
                messages_table.c.send_key.in_(keys),
                messages_table.c.handed_from.is_not(None),
                messages_table.c.state != "closed",
            )
            .order_by(messages_table.c.id)
        )
        for run_id, key, source, recipient in found:
            copies.setdefault((run_id, key, source), []).append(recipient)
    return [
        _message(row, tuple(copies.get((row["run_id"], row["send_key"], row["handed_from"]), ())))
        for row in rows
    ]


def _message(row: Any, handed_to: tuple[str, ...] = ()) -> Message:
    return Message(
        id=row["id"],
        run_id=row["run_id"],
        sender=row["sender"],
        recipient=row["recipient"],
        kind=row["kind"],
        content=row["content"],
        state=row["state"],
        answer=row["answer"],
        answered_by=row["answered_by"],
        created_at=row["created_at"],
        delivered_at=row["delivered_at"],
        answered_at=row["answered_at"],
        handed_from=row["handed_from"],
        handed_to=handed_to if row["handed_from"] is not None else (),
    )


def hand_on(connection: Connection, run_id: str, retired: list[str], added: list[str]) -> None:
    """Hand the messages sent to `retired` steps on to the `added` steps that take their place.

    Called in the transaction that stores the revised plan. Each message or broadcast a retired
    step was sent (shown to it or not: a replacement starts afresh) gets one copy per added step
    that does not have it yet, under the same send key, so a send replayed after a crash still
    finds its rows. A retired step's pending ones are closed, saying where they went. Questions
    are not handed on: their askers are told the step ended.
    """
    if not retired or not added:
        return
    rows = (
        connection.execute(
            sa.select(messages_table)
            .where(
                messages_table.c.run_id == run_id,
                messages_table.c.recipient.in_(retired),
                messages_table.c.kind.in_(("message", "broadcast")),
                messages_table.c.state.in_(("pending", "delivered")),
            )
            .order_by(messages_table.c.id)
        )
        .mappings()
        .all()
    )
    keys = {row["send_key"] for row in rows}
    have = {
        (key, recipient)
        for key, recipient in connection.execute(
            sa.select(messages_table.c.send_key, messages_table.c.recipient).where(
                messages_table.c.send_key.in_(keys)
            )
        )
    }
    now = utc_now()
    copies: list[dict[str, Any]] = []
    for row in rows:
        for recipient in added:
            if (row["send_key"], recipient) in have:
                continue
            have.add((row["send_key"], recipient))
            copies.append(
                {
                    "run_id": run_id,
                    "send_key": row["send_key"],
                    "sender": row["sender"],
                    "recipient": recipient,
                    "kind": row["kind"],
                    "content": row["content"],
                    "state": "pending",
                    "created_at": row["created_at"],
                    "handed_from": row["handed_from"] or row["recipient"],
                }
            )
    if copies:
        connection.execute(messages_table.insert(), copies)
    pending = [row["id"] for row in rows if row["state"] == "pending"]
    if pending:
        connection.execute(
            messages_table.update()
            .where(messages_table.c.id.in_(pending), messages_table.c.state == "pending")
            .values(
                state="closed",
                answer=f"handed on to {noun_for(len(added), 'step')} {', '.join(added)}, "
                "which took its recipient's place",
                answered_by="engine",
                answered_at=now,
            )
        )


@reconnecting_methods
class Messages:
    """The messages and notes of the runs in one run store's database."""

    def __init__(self, store: RunStore) -> None:
        self._store = store

    # ---- sending

    def send(
        self,
        run_id: str,
        sender: str,
        recipients: list[str],
        kind: MessageKind,
        content: str,
        *,
        key: str,
    ) -> tuple[list[Message], bool]:
        """Store one send to `recipients`; returns its rows and whether they are new.

        Sent again under the same `key` (a replayed tool call), nothing is written: the rows
        stored the first time are returned.
        """
        now = utc_now()
        try:
            with self._store.begin("send a message") as connection:
                if connection.scalar(sa.select(sa.func.count()).where(messages_table.c.send_key == key)):
                    new = False
                else:
                    connection.execute(
                        messages_table.insert(),
                        [
                            {
                                "run_id": run_id,
                                "send_key": key,
                                "sender": sender,
                                "recipient": recipient,
                                "kind": kind,
                                "content": content,
                                "state": "pending",
                                "created_at": now,
                            }
                            for recipient in recipients
                        ],
                    )
                    new = True
        except sa.exc.IntegrityError:  # the same call replayed at the same moment elsewhere
            new = False
        return self._select(messages_table.c.send_key == key), new

    def sends_by(self, run_id: str, sender: str) -> int:
        """How many sends (a broadcast counts once) a step has made."""
        with self._store.begin("count messages") as connection:
            return int(
                connection.scalar(
                    sa.select(sa.func.count(sa.distinct(messages_table.c.send_key))).where(
                        messages_table.c.run_id == run_id, messages_table.c.sender == sender
                    )
                )
                or 0
            )

    def sends_in(self, run_id: str) -> int:
        """How many sends the run's steps have made."""
        with self._store.begin("count messages") as connection:
            return int(
                connection.scalar(
                    sa.select(sa.func.count(sa.distinct(messages_table.c.send_key))).where(
                        messages_table.c.run_id == run_id
                    )
                )
                or 0
            )

    def already_sent(self, run_id: str, sender: str, recipient: str, content: str) -> bool:
        """Whether `sender` already sent exactly this to `recipient`."""
        with self._store.begin("read messages") as connection:
            return (
                connection.scalar(
                    sa.select(messages_table.c.id)
                    .where(
                        messages_table.c.run_id == run_id,
                        messages_table.c.sender == sender,
                        messages_table.c.recipient == recipient,
                        messages_table.c.content == content,
                    )
                    .limit(1)
                )
                is not None
            )

    # ---- delivery

    def deliver(self, run_id: str, recipient: str, *, delivery: str) -> tuple[list[Message], set[int]]:
        """The recipient's messages for the delivery `delivery`, and the ids of those new to it.

        Pending messages are marked delivered under `delivery` in the same transaction, so a
        message goes to exactly one delivery; the same delivery repeated (a replay after a crash)
        gets the rows it took before, and any that arrived since.
        """
        mine = sa.and_(messages_table.c.run_id == run_id, messages_table.c.recipient == recipient)
        with self._store.begin("deliver messages") as connection:
            # one read in the usual case, nothing waiting: no write
            rows = (
                connection.execute(
                    sa.select(messages_table)
                    .where(
                        mine,
                        sa.or_(messages_table.c.state == "pending", messages_table.c.delivery == delivery),
                    )
                    .order_by(messages_table.c.id)
                )
                .mappings()
                .all()
            )
            fresh = {row["id"] for row in rows if row["state"] == "pending"}
            if fresh:
                connection.execute(
                    messages_table.update()
                    .where(messages_table.c.id.in_(fresh), messages_table.c.state == "pending")
                    .values(state="delivered", delivery=delivery, delivered_at=utc_now())
                )
                taken = sa.select(messages_table).where(mine, messages_table.c.delivery == delivery)
                rows = connection.execute(taken.order_by(messages_table.c.id)).mappings().all()
            return _messages(connection, rows), fresh

    def delivered_to(self, run_id: str, recipient: str) -> list[Message]:
        """Every message a step has been shown, in the order they were sent."""
        return self._select(
            messages_table.c.run_id == run_id,
            messages_table.c.recipient == recipient,
            messages_table.c.delivery.is_not(None),
        )

    # ---- questions

    def get(self, message_id: int) -> Message | None:
        """One message by id."""
        found = self._select(messages_table.c.id == message_id)
        return found[0] if found else None

    def answer(self, message_id: int, text: str, *, by: str) -> bool:
        """Answer an open question; False when it was not open any more."""
        return self._close(message_id, text, by=by, state="answered")

    def close(self, message_id: int, reason: str) -> bool:
        """Close an open question with a reason (its asker is told); False when it was not open."""
        return self._close(message_id, reason, by="engine", state="closed")

    def _close(self, message_id: int, text: str, *, by: str, state: MessageState) -> bool:
        with self._store.begin("answer a question") as connection:
            updated = connection.execute(
                messages_table.update()
                .where(
                    messages_table.c.id == message_id,
                    messages_table.c.kind == "question",
                    messages_table.c.state.in_(("pending", "delivered")),
                )
                .values(state=state, answer=text, answered_by=by, answered_at=utc_now())
            )
        return updated.rowcount == 1

    def open_questions(self, run_id: str) -> list[Message]:
        """The run's questions still waiting for an answer."""
        return self._select(
            messages_table.c.run_id == run_id,
            messages_table.c.kind == "question",
            messages_table.c.state.in_(("pending", "delivered")),
        )

    # ---- reading

    def of_run(self, run_id: str) -> list[Message]:
        """Every message of the run, in the order sent."""
        return self._select(messages_table.c.run_id == run_id)

    def _select(self, *where: Any) -> list[Message]:
        with self._store.begin("read messages") as connection:
            rows = (
                connection.execute(sa.select(messages_table).where(*where).order_by(messages_table.c.id))
                .mappings()
                .all()
            )
            return _messages(connection, rows)

    # ---- notes

    def set_note(self, run_id: str, key: str, value: str, *, step: str) -> None:
        """Write (or overwrite) a note on the run's blackboard."""
        values = {"value": value, "step": step, "updated_at": utc_now()}
        with self._store.begin("write a note") as connection:
            updated = connection.execute(
                notes_table.update()
                .where(notes_table.c.run_id == run_id, notes_table.c.key == key)
                .values(**values)
            )
            if updated.rowcount == 0:
                connection.execute(notes_table.insert().values(run_id=run_id, key=key, **values))

    def note(self, run_id: str, key: str) -> Note | None:
        """One note, or None."""
        found = [note for note in self.notes(run_id) if note.key == key]
        return found[0] if found else None

    def notes(self, run_id: str) -> list[Note]:
        """The run's notes by key."""
        with self._store.begin("read notes") as connection:
            rows = (
                connection.execute(
                    sa.select(notes_table).where(notes_table.c.run_id == run_id).order_by(notes_table.c.key)
                )
                .mappings()
                .all()
            )
        return [Note(row["key"], row["value"], row["step"], row["updated_at"]) for row in rows]
