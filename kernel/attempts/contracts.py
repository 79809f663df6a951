"""Typed entry points to the attempt kernel's ``decide``, one per command, carrying its
contract (checked by CrossHair: ``.ci/crosshair_kernel.py check --analysis_kind=PEP316
--per_condition_timeout=...``; see :mod:`tenure.kernel.queue.contracts` for why one per
command).

The shared postcondition is the list of transition rules (TR-A1 ... TR-A10 in
``specs/attempts.md``); a few commands add their own: a transmission grows by at most one,
an ambiguous outcome or an ended submit lease is never FAILED, an identity once recorded
is kept, a reservation is never released while INDETERMINATE.
"""

from __future__ import annotations

# Names used only inside the pre/post lines below: CrossHair evaluates those lines in
# this module's namespace (tests/kernel/test_contracts.py fails if one goes missing).
from tenure.model import AttemptState  # noqa: F401

from ..core import Decision, Refused  # noqa: F401
from ..queue.commands import MAX_LEASE_US, MAX_NOW_US  # noqa: F401
from tenure.model.bounds import MIN_INSTANT_US  # noqa: F401
from .commands import (
    Prepare,
    BeginSubmit,
    RecordAccepted,
    RecordRunning,
    RecordProgress,
    RecordSucceeded,
    RecordFailed,
    RecordAmbiguous,
    RequestCancel,
    RecordCancelled,
    Reconcile,
    ExpireSubmitLease,
    ReleaseReservation,
)
from .machine import ATTEMPTS, transition_violations  # noqa: F401
from .record import AttemptRow

__all__ = [
    "decide_prepare",
    "decide_begin_submit",
    "decide_record_accepted",
    "decide_record_running",
    "decide_record_progress",
    "decide_record_succeeded",
    "decide_record_failed",
    "decide_record_ambiguous",
    "decide_request_cancel",
    "decide_record_cancelled",
    "decide_reconcile",
    "decide_expire_submit_lease",
    "decide_release_reservation",
]


def decide_prepare(record: AttemptRow | None, command: Prepare, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_begin_submit(record: AttemptRow | None, command: BeginSubmit, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: 1 <= command.lease_us <= MAX_LEASE_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or record is None or __return__.new_record is None or __return__.new_record.transmissions <= record.transmissions + 1
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_record_accepted(record: AttemptRow | None, command: RecordAccepted, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or record is None or record.provider_job_id is None or __return__.new_record is None or __return__.new_record.provider_job_id == record.provider_job_id
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_record_running(record: AttemptRow | None, command: RecordRunning, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_record_progress(record: AttemptRow | None, command: RecordProgress, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_record_succeeded(record: AttemptRow | None, command: RecordSucceeded, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_record_failed(record: AttemptRow | None, command: RecordFailed, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_record_ambiguous(record: AttemptRow | None, command: RecordAmbiguous, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or __return__.new_record is None or __return__.new_record.state is not AttemptState.FAILED
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_request_cancel(record: AttemptRow | None, command: RequestCancel, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_record_cancelled(record: AttemptRow | None, command: RecordCancelled, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_reconcile(record: AttemptRow | None, command: Reconcile, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_expire_submit_lease(record: AttemptRow | None, command: ExpireSubmitLease, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or __return__.new_record is None or __return__.new_record.state is not AttemptState.FAILED
    """
    return ATTEMPTS.decide(record, command, now_us)


def decide_release_reservation(record: AttemptRow | None, command: ReleaseReservation, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or record is None or record.state is not AttemptState.INDETERMINATE
    """
    return ATTEMPTS.decide(record, command, now_us)
