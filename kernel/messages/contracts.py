"""Typed entry points to the message kernel's ``decide``, one per command, carrying its
contract (checked by CrossHair: ``.ci/crosshair_kernel.py check --analysis_kind=PEP316
--per_condition_timeout=...``; see :mod:`tenure.kernel.queue.contracts` for why one per
command).

The shared postcondition is the list of transition rules (TR-M1 ... TR-M5 in
``specs/messages.md``); each command adds the guarantee it is for: a send stores or
delivers a message only for an open Run, and a replay changes nothing; a receive writes
only for the hop that holds its Run and never takes a second message; a timeout applies
only to a pending receive whose deadline came; a sweep cancels only a pending receive.
"""

from __future__ import annotations

# Names used only inside the pre/post lines below: CrossHair evaluates those lines in
# this module's namespace (tests/kernel/test_contracts.py fails if one goes missing).
from tenure.model import MessageStatus, RunStatus  # noqa: F401
from tenure.model.bounds import MIN_INSTANT_US  # noqa: F401

from ..core import Decision, Refused  # noqa: F401
from ..queue.commands import MAX_NOW_US  # noqa: F401
from .commands import CancelPending, ReceiveMessage, SendMessage, TimeOut  # noqa: F401
from .machine import CLOSED_RUN_STATUSES, MESSAGES, transition_violations  # noqa: F401
from .record import MAX_RECEIVE_TIMEOUT_US, MessageRow  # noqa: F401

__all__ = ["decide_send", "decide_receive", "decide_time_out", "decide_cancel_pending"]


def decide_send(record: MessageRow | None, command: SendMessage, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: 1 <= command.sequence
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or __return__.new_record == record or (command.run_status is not None and command.run_status not in CLOSED_RUN_STATUSES)
    post: isinstance(__return__, Refused) or __return__.new_record.message_id == command.row.message_id
    """
    return MESSAGES.decide(record, command, now_us)


def decide_receive(record: MessageRow | None, command: ReceiveMessage, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: command.expires_in_us is None or 1 <= command.expires_in_us <= MAX_RECEIVE_TIMEOUT_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or __return__.new_record == record or command.hop_holds
    post: isinstance(__return__, Refused) or record is None or record.status is not MessageStatus.RECEIVED or __return__.new_record == record
    """
    return MESSAGES.decide(record, command, now_us)


def decide_time_out(record: MessageRow | None, command: TimeOut, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (record.status is MessageStatus.PENDING and record.expires_at_us is not None and now_us >= record.expires_at_us and __return__.new_record.status is MessageStatus.TIMED_OUT)
    """
    return MESSAGES.decide(record, command, now_us)


def decide_cancel_pending(record: MessageRow | None, command: CancelPending, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (record.status is MessageStatus.PENDING and __return__.new_record.decided_by == command.decided_by)
    """
    return MESSAGES.decide(record, command, now_us)
