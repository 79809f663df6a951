"""The message slot: one row of a Run's mailbox, its states and invariants.

A slot holds a message, a receive, or both. A sender's message that no receive took yet
is ``sent``; a hop's receive that no message reached yet is ``pending``; a slot holding
both is ``received`` (the message delivered to that receive, once); a receive whose
timeout passed first is ``timed_out``; a pending receive of a Run that reached terminal
truth is ``cancelled``. A slot's message (its ID within the Run, its JSON text, its
sequence among the Run's messages of the topic, when it was sent) is set once, as is its
receive (the key the receiving hop names it by, its deadline). Instants are integer
microseconds on the database clock.
"""

from __future__ import annotations

import dataclasses
import enum

from tenure.model import MessageStatus, bounds
from tenure.model.runs import MAX_MESSAGE_ID_CHARS, MAX_RUN_TEXT_CHARS, MAX_TOPIC_CHARS

__all__ = [
    "MessageRow",
    "MessageStep",
    "step_of",
    "record_violations",
    "receive_answered",
    "holds_message",
    "answer_complete",
    "MAX_RECEIVE_TIMEOUT_US",
    "MESSAGE_STATUSES",
    "RECEIVE_STATUSES",
]

MAX_RECEIVE_TIMEOUT_US = 366 * 86_400 * 1_000_000
"""The longest timeout a receive may wait with: 366 days (as a durable timer's delay)."""


class MessageStep(enum.Enum):
    ABSENT = "absent"
    SENT = "sent"
    PENDING = "pending"
    RECEIVED = "received"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"


MESSAGE_STATUSES = frozenset({MessageStatus.SENT, MessageStatus.RECEIVED})
"""The statuses of a slot that holds a message (its ID, text, sequence and send time)."""

RECEIVE_STATUSES = frozenset({MessageStatus.PENDING, MessageStatus.RECEIVED, MessageStatus.TIMED_OUT,
                              MessageStatus.CANCELLED})
"""The statuses of a slot a receive holds (its key)."""

_DECIDED = frozenset({MessageStatus.RECEIVED, MessageStatus.TIMED_OUT, MessageStatus.CANCELLED})
_DECIDED_WITHOUT_MESSAGE = frozenset({MessageStatus.TIMED_OUT, MessageStatus.CANCELLED})


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MessageRow:
    """One message slot. ``slot_id`` names it (the owner ID a Run waiting on its receive
    parks on); ``run_id`` and ``topic`` are whose and what about. The message:
    ``message_id`` (unique within the Run), ``message_json`` (canonical JSON),
    ``sequence`` (1, 2, ... per Run and topic, in sending order), ``sent_at_us``. The
    receive: ``receive_key`` (unique within the Run), ``expires_at_us`` (its deadline, or
    None). ``decided_at_us``: when the receive got its answer or was cancelled;
    ``decided_by``: who decided a receive that got no message (the deadline owner, the
    Run's sweep)."""

    slot_id: str
    run_id: str
    topic: str
    status: MessageStatus
    message_id: str | None
    message_json: str | None
    sequence: int | None
    sent_at_us: int | None
    receive_key: str | None
    expires_at_us: int | None
    created_at_us: int
    decided_at_us: int | None
    decided_by: str | None


_STEP_OF_STATUS = {status: MessageStep(status.value) for status in MessageStatus}


def step_of(record: MessageRow | None) -> MessageStep:
    return MessageStep.ABSENT if record is None else _STEP_OF_STATUS[record.status]


def receive_answered(record: MessageRow) -> bool:
    """Whether a receive holding this slot has its answer (a message, or its timeout):
    what a replayed receive returns at once instead of waiting."""
    return record.status in (MessageStatus.RECEIVED, MessageStatus.TIMED_OUT)


def answer_complete(record: MessageRow) -> bool:
    """Whether a receive's decision has its parts: its time, and the message it received
    (the ``complete`` of the owner evidence a Run's resume reads)."""
    return record.decided_at_us is not None and (
        record.status is not MessageStatus.RECEIVED or (record.message_json is not None and record.sequence is not None))


def holds_message(record: MessageRow) -> bool:
    """Whether the slot holds a message (sent, or received)."""
    return record.status in MESSAGE_STATUSES


def _text(value: object, max_chars: int = MAX_RUN_TEXT_CHARS) -> bool:
    return bounds.is_bounded_text(value, max_chars)


def _optional_instant(value: object) -> bool:
    return value is None or bounds.is_instant(value)


def _types(record: MessageRow) -> list[str]:
    checks = {
        "slot_id": _text(record.slot_id, 36),
        "run_id": _text(record.run_id, 36),
        "topic": _text(record.topic, MAX_TOPIC_CHARS),
        "status": type(record.status) is MessageStatus,
        "message_id": record.message_id is None or _text(record.message_id, MAX_MESSAGE_ID_CHARS),
        "message_json": record.message_json is None or type(record.message_json) is str,
        "sequence": record.sequence is None or (bounds.is_strict_int(record.sequence)
                                                and 1 <= record.sequence <= bounds.INT32_MAX),
        "receive_key": record.receive_key is None or _text(record.receive_key),
        "decided_by": record.decided_by is None or _text(record.decided_by, bounds.MAX_IDENTITY_CHARS),
        "instants": bounds.is_instant(record.created_at_us) and _optional_instant(record.sent_at_us)
        and _optional_instant(record.expires_at_us) and _optional_instant(record.decided_at_us),
    }
    return [f"INV-M1.{name}" for name, ok in checks.items() if not ok]


def record_violations(record: MessageRow) -> list[str]:
    """The invariants (``INV-M1`` ... ``INV-M5`` in specs/messages.md) this row breaks."""
    broken = _types(record)
    if broken:
        return broken
    status = record.status
    message = (record.message_id, record.message_json, record.sequence, record.sent_at_us)
    rules = {
        # INV-M2: a message's parts are set together, exactly while the slot holds one.
        "INV-M2": all(part is not None for part in message) if status in MESSAGE_STATUSES
        else all(part is None for part in message),
        # INV-M3: a receive's key is set exactly while a receive holds the slot; a message
        # alone has no deadline.
        "INV-M3": (record.receive_key is not None) == (status in RECEIVE_STATUSES)
        and (status is not MessageStatus.SENT or record.expires_at_us is None),
        # INV-M4: a decided receive has its time, never before the slot existed; exactly a
        # receive decided without a message names who decided it.
        "INV-M4": (record.decided_at_us is not None) == (status in _DECIDED)
        and (record.decided_at_us is None or record.decided_at_us >= record.created_at_us)
        and (record.decided_by is not None) == (status in _DECIDED_WITHOUT_MESSAGE),
        # INV-M5: a message is never sent before its slot existed, nor delivered before it was sent.
        "INV-M5": record.sent_at_us is None or (record.sent_at_us >= record.created_at_us and (
            record.decided_at_us is None or record.decided_at_us >= record.sent_at_us)),
    }
    return [name for name, ok in rules.items() if not ok]
