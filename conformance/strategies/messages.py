"""Hypothesis strategies for message slots and their commands (see attempts.py).

Records keep INV-M1 ... INV-M5: a sent slot holds a message and no receive, a pending one
a receive and no message, a received one both (decided no earlier than it was sent), a
timed-out or cancelled one a receive decided without a message; any receive may carry a
deadline (before or after its creation). Commands are aimed at the slot they meet most
of the time (its Run and topic, its message ID and text, its receive key) and miss it
otherwise: another Run, another topic, changed content; a send names every Run status
and a missing Run, a receive a hop that holds its Run or not; the time is often at a
slot's creation or at its deadline.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tenure.kernel.messages.commands import CancelPending, MessageCommandType, ReceiveMessage, SendMessage, TimeOut
from tenure.kernel.messages.machine import DEADLINE_OWNER
from tenure.kernel.messages.record import MAX_RECEIVE_TIMEOUT_US, MessageRow, MessageStep
from tenure.kernel.runs.machine import CANCELLED_BY, SETTLED_BY
from tenure.model import MessageStatus, RunStatus

from .pools import BOOLEANS, integers, optional, sampled

__all__ = ["NOW", "message_row", "message_records", "message_commands", "message_situations"]

NOW = 1_800_000_000_000_000
RUNS = ["run-1", "run-2"]
TOPICS = ["go", "stop"]
MESSAGE_IDS = ["m-1", "m-2"]
MESSAGES = ['{"n":1}', '{"n":2}']
KEYS = ["@1", "@2"]

instants = st.integers(NOW - 3, NOW + 3) | st.integers(NOW - 10**12, NOW + 10**12)
_RUN_STATUSES = st.none() | sampled(RunStatus)


def message_row(**changes: Any) -> MessageRow:
    """A sent message of run-1 on topic ``go``, with ``changes`` applied."""
    fields: dict[str, Any] = dict(
        slot_id="slot-1", run_id="run-1", topic="go", status=MessageStatus.SENT, message_id="m-1",
        message_json='{"n":1}', sequence=1, sent_at_us=NOW - 100, receive_key=None, expires_at_us=None,
        created_at_us=NOW - 100, decided_at_us=None, decided_by=None,
    )
    fields.update(changes)
    return MessageRow(**fields)


_NO_MESSAGE: dict[str, Any] = dict(message_id=None, message_json=None, sequence=None, sent_at_us=None)


@st.composite
def message_records(draw: st.DrawFn, step: MessageStep | None = None) -> MessageRow | None:
    """A slot keeping every invariant (INV-M1 ... INV-M5), or None for ``absent``."""
    if step is None:
        step = draw(sampled(MessageStep))
    if step is MessageStep.ABSENT:
        return None
    status = MessageStatus(step.value)
    created = draw(instants)
    identity = dict(run_id=draw(sampled(RUNS)), topic=draw(sampled(TOPICS)), created_at_us=created)
    message = dict(message_id=draw(sampled(MESSAGE_IDS)), message_json=draw(sampled(MESSAGES)),
                   sequence=draw(integers(1, 3)))
    if status is MessageStatus.SENT:
        return message_row(**identity, **message, sent_at_us=created)
    receive = dict(receive_key=draw(sampled(KEYS)),
                   expires_at_us=draw(st.none() | st.integers(-3, 3).map(lambda offset: created + offset) | instants))
    if status is MessageStatus.PENDING:
        return message_row(**identity, **_NO_MESSAGE, **receive, status=status)
    decided = created + draw(integers(0, 10))
    if status is MessageStatus.RECEIVED:
        # Sent at its creation (a message then taken), or at its decision (filling a receive).
        sent = draw(sampled([created, decided]))
        if sent == created and draw(BOOLEANS):
            receive["expires_at_us"] = None  # a taken message's receive keeps no deadline
        return message_row(**identity, **message, **receive, status=status, sent_at_us=sent, decided_at_us=decided)
    decided_by = DEADLINE_OWNER if status is MessageStatus.TIMED_OUT else draw(sampled([SETTLED_BY, CANCELLED_BY]))
    return message_row(**identity, **_NO_MESSAGE, **receive, status=status, decided_at_us=decided,
                       decided_by=decided_by)


def _aimed(draw: st.DrawFn, record: MessageRow | None, field: str, pool: list[Any]) -> Any:
    """The record's own value of ``field`` four times in five (when it has one), else any from ``pool``."""
    own = None if record is None else getattr(record, field)
    if own is not None and draw(integers(0, 4)):
        return own
    return draw(sampled(pool))


@st.composite
def message_commands(draw: st.DrawFn, kind: MessageCommandType, record: MessageRow | None) -> object:
    run_id = _aimed(draw, record, "run_id", RUNS)
    topic = _aimed(draw, record, "topic", TOPICS)
    if kind is MessageCommandType.SEND:
        row = message_row(slot_id="slot-new", run_id=run_id, topic=topic, created_at_us=0, sent_at_us=None,
                          sequence=None, message_id=_aimed(draw, record, "message_id", MESSAGE_IDS),
                          message_json=_aimed(draw, record, "message_json", MESSAGES))
        return SendMessage(row=row, run_status=draw(_RUN_STATUSES), sequence=draw(integers(1, 4)))
    if kind is MessageCommandType.RECEIVE:
        row = message_row(slot_id="slot-new", run_id=run_id, topic=topic, status=MessageStatus.PENDING,
                          created_at_us=0, receive_key=_aimed(draw, record, "receive_key", KEYS), **_NO_MESSAGE)
        return ReceiveMessage(row=row, hop_holds=draw(BOOLEANS),
                              expires_in_us=draw(optional(integers(1, MAX_RECEIVE_TIMEOUT_US))))
    if kind is MessageCommandType.TIME_OUT:
        return TimeOut()
    return CancelPending(decided_by=draw(sampled([SETTLED_BY, CANCELLED_BY])))


@st.composite
def message_situations(
    draw: st.DrawFn, step: MessageStep | None = None, kind: MessageCommandType | None = None
) -> tuple[MessageRow | None, object, int]:
    record = draw(message_records(step))
    command = draw(message_commands(kind or draw(sampled(MessageCommandType)), record))
    edge = draw(integers(0, 2))
    if record is not None and edge == 0:
        now = record.created_at_us + draw(integers(-1, 1))  # a decision is never dated before the slot
    elif record is not None and record.expires_at_us is not None and edge == 1:
        now = record.expires_at_us + draw(integers(-1, 1))  # a timeout is due only from its deadline
    else:
        now = draw(instants)
    return record, command, now
