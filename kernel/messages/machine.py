"""The message machine: every transition of one message slot of a Run, as one table.

Theory of operation
-------------------
A Run's mailbox is a set of slots, each holding a message, a receive, or both. Anyone
may send a message to a Run that exists and is not finished (terminal or being
cancelled): the message goes to the Run's oldest receive of its topic that is waiting
(``pending``), which it decides ``received``, and the Run waiting on that receive
resumes; with no receive waiting it is stored ``sent``, numbered after the Run's earlier
messages of the topic. The hop holding a Run receives through a key that names the
receive within the Run (the replay layer's journal position): a receive meets the first
``sent`` message of its topic and takes it at once (``received``, no wait), or, with none,
waits ``pending`` and the hop parks the Run on it. The same message ID, or the same
receive key, answers the stored slot again (a replay), so neither is ever done twice;
changed content under the same identity is refused. A pending receive ends with a
message, with its timeout (the deadline owner, tenure's relays, sends ``time_out`` once
the database clock reached the deadline: ``timed_out``) or with its Run's terminal
truth (``cancelled``, in the Run's own transaction; a cancelled receive never resumes a
Run). A decided slot never changes. Every command that finds the slot it meets (the
send and the receive) locks the Run's row first, so the choice of slot, the sequence and
the Run's status are read under one lock: two sends, or a send and a receive, of one
Run decide one after the other. Actors: any sender (send), the hop holding the Run
(receive), the deadline owner (time_out), the Run ledger (cancel_pending). Invariants:
:mod:`tenure.kernel.messages.record` and :func:`transition_violations`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from tenure.model import TERMINAL_RUN_STATUSES, ErrorCode, MessageStatus, RunStatus

from ..core import SAME, Applied, Decision, Machine, Refused, Row, replaced
from .commands import (
    Ack,
    CancelPending,
    Delivered,
    MessageCommand,
    MessageCommandType,
    Queued,
    ReceiveMessage,
    Replayed,
    SendMessage,
    Taken,
    TimeOut,
    Waiting,
)
from .record import MESSAGE_STATUSES, RECEIVE_STATUSES, MessageRow, MessageStep, record_violations, step_of

__all__ = ["MessageRefusal", "OUTCOMES", "GUARDS", "EFFECTS", "ROWS", "MESSAGES", "transition_violations",
           "DEADLINE_OWNER", "CLOSED_RUN_STATUSES"]

DEADLINE_OWNER = "tenure:deadline"
"""``decided_by`` of a receive the relays timed out (the same owner as consent deadlines)."""

CLOSED_RUN_STATUSES = frozenset(TERMINAL_RUN_STATUSES | {RunStatus.CANCELLING})
"""A Run in these statuses takes no new message: it finished, or a cancellation froze it."""


class MessageRefusal(enum.Enum):
    NOT_FOUND = "not_found"
    RUN_NOT_FOUND = "run_not_found"
    RUN_FINISHED = "run_finished"
    MESSAGE_CHANGED = "message_changed"
    RECEIVE_CHANGED = "receive_changed"
    HOP_LOST = "hop_lost"
    OTHER_SLOT = "other_slot"
    NOT_WAITING = "not_waiting"
    NOT_DUE = "not_due"
    ALREADY_DECIDED = "already_decided"


R = MessageRefusal
OUTCOMES: dict[MessageRefusal, ErrorCode | None] = {
    reason: {
        R.RUN_NOT_FOUND: ErrorCode.RUN_MESSAGE_REFUSED,
        R.RUN_FINISHED: ErrorCode.RUN_MESSAGE_REFUSED,
        R.MESSAGE_CHANGED: ErrorCode.RUN_MESSAGE_CONFLICT,
        R.RECEIVE_CHANGED: ErrorCode.RUN_MESSAGE_CONFLICT,
        R.HOP_LOST: ErrorCode.RUN_OWNER_MISMATCH,
    }.get(reason)
    for reason in MessageRefusal
}
"""What each refusal means to a caller: the error code it raises, or None for a known
negative answer."""


GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda record, command, now_us: True,
    "run_missing": lambda record, command, now_us: command.run_status is None,
    "run_finished": lambda record, command, now_us: command.run_status in CLOSED_RUN_STATUSES,
    # a slot the command was not looking for: another Run's, or another topic's
    "other_slot": lambda record, command, now_us: (record.run_id, record.topic) != (
        command.row.run_id, command.row.topic),
    "message_differs": lambda record, command, now_us: (
        record.run_id, record.topic, record.message_id, record.message_json) != (
        command.row.run_id, command.row.topic, command.row.message_id, command.row.message_json),
    "receive_differs": lambda record, command, now_us: (record.run_id, record.topic, record.receive_key) != (
        command.row.run_id, command.row.topic, command.row.receive_key),
    "hop_lost": lambda record, command, now_us: not command.hop_holds,
    # a receive times out at its deadline (the database clock), never a microsecond before
    "not_due": lambda record, command, now_us: record.expires_at_us is None or now_us < record.expires_at_us,
}


def _at_least(now_us: int, *floors: int | None) -> int:
    # A slot's times never run backwards (INV-M4, INV-M5), whatever time a caller passes.
    return max(now_us, *(floor for floor in floors if floor is not None))


def _queue(record: Any, command: Any, now_us: int) -> Applied[MessageRow]:
    # Only the message's identity comes from the sender: where it stands is the kernel's.
    row = replaced(command.row, {
        "status": MessageStatus.SENT, "sequence": command.sequence, "sent_at_us": now_us, "receive_key": None,
        "expires_at_us": None, "created_at_us": now_us, "decided_at_us": None, "decided_by": None,
    })
    return Applied(row, Queued())


def _deliver(record: MessageRow, command: Any, now_us: int) -> Applied[MessageRow]:
    at = _at_least(now_us, record.created_at_us)
    row = replaced(record, {
        "status": MessageStatus.RECEIVED, "message_id": command.row.message_id,
        "message_json": command.row.message_json, "sequence": command.sequence, "sent_at_us": at, "decided_at_us": at,
    })
    return Applied(row, Delivered())


def _wait(record: Any, command: Any, now_us: int) -> Applied[MessageRow]:
    deadline = None if command.expires_in_us is None else now_us + command.expires_in_us
    row = replaced(command.row, {
        "status": MessageStatus.PENDING, "message_id": None, "message_json": None, "sequence": None,
        "sent_at_us": None, "expires_at_us": deadline, "created_at_us": now_us, "decided_at_us": None,
        "decided_by": None,
    })
    return Applied(row, Waiting())


def _take(record: MessageRow, command: Any, now_us: int) -> Applied[MessageRow]:
    row = replaced(record, {
        "status": MessageStatus.RECEIVED, "receive_key": command.row.receive_key,
        "decided_at_us": _at_least(now_us, record.created_at_us, record.sent_at_us),
    })
    return Applied(row, Taken())


def _end(status: MessageStatus, by: str | None) -> Callable[[Any, Any, int], Applied[MessageRow]]:
    def effect(record: MessageRow, command: Any, now_us: int) -> Applied[MessageRow]:
        decided_by = by if by is not None else command.decided_by
        return Applied(replaced(record, {"status": status, "decided_at_us": _at_least(now_us, record.created_at_us),
                                         "decided_by": decided_by}), Ack())

    return effect


EFFECTS: dict[str, Callable[[Any, Any, int], Applied[MessageRow]]] = {
    "queue": _queue,
    "deliver": _deliver,
    "wait": _wait,
    "take": _take,
    "replay": lambda record, command, now_us: Applied(record, Replayed()),
    "time_out": _end(MessageStatus.TIMED_OUT, DEADLINE_OWNER),
    "cancel": _end(MessageStatus.CANCELLED, None),
}

S = MessageStep
C = MessageCommandType
_DECIDED = (S.RECEIVED, S.TIMED_OUT, S.CANCELLED)

ROWS: tuple[Row, ...] = (
    # One row per spec row of specs/messages.md, in its order.
    Row((S.ABSENT,), C.SEND, "run_missing", SAME, R.RUN_NOT_FOUND),
    Row((S.ABSENT,), C.SEND, "run_finished", SAME, R.RUN_FINISHED),
    Row((S.ABSENT,), C.SEND, "always", S.SENT, "queue"),
    Row((S.PENDING,), C.SEND, "other_slot", SAME, R.OTHER_SLOT),
    Row((S.PENDING,), C.SEND, "run_missing", SAME, R.RUN_NOT_FOUND),
    Row((S.PENDING,), C.SEND, "run_finished", SAME, R.RUN_FINISHED),
    Row((S.PENDING,), C.SEND, "always", S.RECEIVED, "deliver"),
    Row((S.SENT, S.RECEIVED), C.SEND, "message_differs", SAME, R.MESSAGE_CHANGED),
    Row((S.SENT, S.RECEIVED), C.SEND, "always", SAME, "replay"),
    Row((S.TIMED_OUT, S.CANCELLED), C.SEND, "always", SAME, R.NOT_WAITING),

    Row((S.ABSENT,), C.RECEIVE, "hop_lost", SAME, R.HOP_LOST),
    Row((S.ABSENT,), C.RECEIVE, "always", S.PENDING, "wait"),
    Row((S.SENT,), C.RECEIVE, "other_slot", SAME, R.OTHER_SLOT),
    Row((S.SENT,), C.RECEIVE, "hop_lost", SAME, R.HOP_LOST),
    Row((S.SENT,), C.RECEIVE, "always", S.RECEIVED, "take"),
    Row((S.PENDING, *_DECIDED), C.RECEIVE, "receive_differs", SAME, R.RECEIVE_CHANGED),
    Row((S.PENDING,), C.RECEIVE, "hop_lost", SAME, R.HOP_LOST),
    Row((S.PENDING, S.RECEIVED, S.TIMED_OUT), C.RECEIVE, "always", SAME, "replay"),
    Row((S.CANCELLED,), C.RECEIVE, "always", SAME, R.HOP_LOST),

    Row((S.ABSENT,), C.TIME_OUT, "always", SAME, R.NOT_FOUND),
    Row((S.PENDING,), C.TIME_OUT, "not_due", SAME, R.NOT_DUE),
    Row((S.PENDING,), C.TIME_OUT, "always", S.TIMED_OUT, "time_out"),
    Row((S.SENT,), C.TIME_OUT, "always", SAME, R.NOT_WAITING),
    Row(_DECIDED, C.TIME_OUT, "always", SAME, R.ALREADY_DECIDED),

    Row((S.ABSENT,), C.CANCEL_PENDING, "always", SAME, R.NOT_FOUND),
    Row((S.PENDING,), C.CANCEL_PENDING, "always", S.CANCELLED, "cancel"),
    Row((S.SENT,), C.CANCEL_PENDING, "always", SAME, R.NOT_WAITING),
    Row(_DECIDED, C.CANCEL_PENDING, "always", SAME, R.ALREADY_DECIDED),
)


# --- transition rules (checked by the contracts and by the tests) -----------------------

_MESSAGE_FIELDS = ("message_id", "message_json", "sequence", "sent_at_us")
_RECEIVE_FIELDS = ("receive_key", "expires_at_us")
_IDENTITY = ("slot_id", "run_id", "topic", "created_at_us")


def _run_open(command: Any) -> bool:
    # Written independently of the guards: a Run that exists and neither finished nor
    # is being cancelled.
    status = getattr(command, "run_status", None)
    return status is not None and status not in (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED,
                                                 RunStatus.CANCELLING)


def _holding_hop(command: Any) -> bool:
    return isinstance(command, ReceiveMessage) and command.hop_holds is True


def _born(new: MessageRow | None, command: Any) -> list[str]:
    if new is None:
        return ["TR-M1"]
    if isinstance(command, SendMessage) and _run_open(command) and new.status is MessageStatus.SENT:
        return []
    if _holding_hop(command) and new.status is MessageStatus.PENDING:
        return []
    return ["TR-M1"]  # a slot is born from a send to an open Run, or a receive of the holding hop


def _same(record: MessageRow, new: MessageRow, fields: tuple[str, ...]) -> bool:
    return all(getattr(record, name) == getattr(new, name) for name in fields)


def _entered(record: MessageRow, new: MessageRow, command: Any) -> list[str]:
    """TR-M4: what a message or a receive entering an existing slot must keep."""
    broken = []
    if record.status not in MESSAGE_STATUSES and new.status in MESSAGE_STATUSES and not (
        isinstance(command, SendMessage) and _run_open(command) and record.status is MessageStatus.PENDING
        and (command.row.run_id, command.row.topic) == (record.run_id, record.topic)
        and new.message_id == command.row.message_id
    ):
        broken.append("TR-M4")  # a message enters only a pending receive of its own Run and topic, of an open Run
    if record.status not in RECEIVE_STATUSES and new.status in RECEIVE_STATUSES and not (
        _holding_hop(command) and record.status is MessageStatus.SENT
        and (command.row.run_id, command.row.topic) == (record.run_id, record.topic)
        and new.receive_key == command.row.receive_key
    ):
        broken.append("TR-M4")  # a receive takes only a message of its own Run and topic, from the holding hop
    return broken


def transition_violations(record: MessageRow | None, command: MessageCommand, now_us: int,
                          decision: Decision) -> list[str]:
    """The transition rules (TR-M1 ... TR-M5 in specs/messages.md) a decision breaks."""
    if isinstance(decision, Refused):
        return []
    new = decision.new_record
    if record is None:
        return _born(new, command)
    if new is None or not _same(record, new, _IDENTITY):
        return ["TR-M1"]  # a slot's identity never changes; slots are never deleted
    broken = []
    if (record.status in MESSAGE_STATUSES and not _same(record, new, _MESSAGE_FIELDS)) or (
            record.status in RECEIVE_STATUSES and not _same(record, new, _RECEIVE_FIELDS)):
        broken.append("TR-M2")  # a message, and a receive, once in a slot never change
    if record.status in (MessageStatus.RECEIVED, MessageStatus.TIMED_OUT, MessageStatus.CANCELLED) and new != record:
        broken.append("TR-M3")  # a decided slot never changes: a message is delivered once
    broken += _entered(record, new, command)
    if new.status is MessageStatus.TIMED_OUT and record.status is not MessageStatus.TIMED_OUT and not (
        isinstance(command, TimeOut) and record.expires_at_us is not None and now_us >= record.expires_at_us
    ):
        broken.append("TR-M5")  # only the deadline owner times a receive out, once its deadline came
    if new.status is MessageStatus.CANCELLED and record.status is not MessageStatus.CANCELLED \
            and not isinstance(command, CancelPending):
        broken.append("TR-M5")  # only the Run's terminal truth cancels a receive
    return broken


MESSAGES = Machine.define(
    name="messages",
    states=MessageStep,
    commands=MessageCommandType,
    rows=ROWS,
    guards=GUARDS,
    effects=EFFECTS,
    outcomes=OUTCOMES,
    state_of=step_of,
    record_violations=record_violations,
    transition_violations=transition_violations,
    initial=MessageStep.ABSENT,
)
"""The message machine: ``MESSAGES.decide(record, command, now_us)``."""
