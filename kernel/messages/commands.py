"""Message commands and replies: what a caller may ask of a message slot, and what an
applied command answers.

A command carries the caller's inputs (the slot as a new one would be stored) and what
the ledger observed under the Run's lock in the same transaction: the Run's status for a
send, whether the receiving hop still holds its Run for a receive, and the next sequence
of the Run's messages of the topic. Which slot a command meets is the ledger's finders'
(:mod:`tenure.kernel.messages.finders`): a send meets the slot holding its message ID
(a replay), else the Run's oldest pending receive of the topic, else none; a receive
meets the slot holding its key (a replay), else the Run's first undelivered message of
the topic, else none.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar

from tenure.model import RunStatus

from .record import MessageRow

__all__ = [
    "MessageCommandType",
    "SendMessage",
    "ReceiveMessage",
    "TimeOut",
    "CancelPending",
    "MessageCommand",
    "Queued",
    "Delivered",
    "Waiting",
    "Taken",
    "Replayed",
    "Ack",
    "MessageReply",
]


class MessageCommandType(enum.Enum):
    SEND = "send"
    RECEIVE = "receive"
    TIME_OUT = "time_out"
    CANCEL_PENDING = "cancel_pending"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SendMessage:
    """A sender's message for a Run (any process)."""

    kind: ClassVar[MessageCommandType] = MessageCommandType.SEND
    row: MessageRow
    """The slot a new message is stored as: a fresh ``slot_id``, the Run, the topic, the
    message ID and text (its status, sequence and times are the kernel's)."""
    run_status: RunStatus | None
    """The Run's status, read under its lock (None: no such Run)."""
    sequence: int
    """The next sequence of the Run's messages of this topic (1 + the highest stored),
    counted under the Run's lock."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReceiveMessage:
    """The receiving hop's receive of a message of one topic."""

    kind: ClassVar[MessageCommandType] = MessageCommandType.RECEIVE
    row: MessageRow
    """The slot a new receive is stored as: a fresh ``slot_id``, the Run, the topic and
    the receive's key (its status, deadline and times are the kernel's)."""
    hop_holds: bool
    """Observed under the Run's lock: the receiving hop still holds its Run (RUNNING or
    AWAITING_HARDWARE at that hop's sequence)."""
    expires_in_us: int | None = None
    """The receive's timeout, counted from the time it starts waiting (1 ..
    MAX_RECEIVE_TIMEOUT_US), or None: no timeout."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class TimeOut:
    """The deadline owner (tenure's relays, ``tenure:deadline``) ends a pending receive
    whose deadline came: the only sender of this command."""

    kind: ClassVar[MessageCommandType] = MessageCommandType.TIME_OUT


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CancelPending:
    """The Run reached terminal truth (sent in the Run's own transaction)."""

    kind: ClassVar[MessageCommandType] = MessageCommandType.CANCEL_PENDING
    decided_by: str


MessageCommand = SendMessage | ReceiveMessage | TimeOut | CancelPending


@dataclasses.dataclass(frozen=True, slots=True)
class Queued:
    """The message is stored; no receive was waiting for it."""


@dataclasses.dataclass(frozen=True, slots=True)
class Delivered:
    """The message went to the receive that was waiting for it: resume the Run waiting
    on that receive (after commit)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Waiting:
    """The receive waits for a message (park the Run on it)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Taken:
    """The receive took an undelivered message at once (no wait)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Replayed:
    """The same message or receive again: the stored slot answers."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """The exact change applied."""


MessageReply = Queued | Delivered | Waiting | Taken | Replayed | Ack
