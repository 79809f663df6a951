"""Typed entry points to :func:`decide`, one per command, carrying its contract.

CrossHair checks these (``.ci/crosshair_kernel.py check --analysis_kind=PEP316
--per_condition_timeout=...``). One entry point per command type keeps each analysis
narrow: a symbolic union of 22 command types is too wide for CrossHair to reach deep
paths in its time budget, while a single typed command is not.

The shared postcondition is the list of transition rules (TR-Q1 ... TR-Q11 in
``specs/queue.md``): generation moves only by claims, identity is fixed, fenced writes
need the exact live fence, terminal is absorbing (but for an operator's retry of a failed
job), finishing releases the active key, a
live claim never changes hands, a cancel-requested stream only heartbeats or ends
cancelled, claims take only due and eligible rows with fresh nonces, and legacy paths
never touch protected or owned rows; a release gives a claim back with its attempt, and
a retry restarts only a failed job's budget. Record validity (INV-Q1 ... INV-Q9) is asserted by
the property tests, which can generate valid records; CrossHair cannot construct a
record meeting all nine invariants within its budget.
"""

from __future__ import annotations

# Names used only inside the pre/post lines below: CrossHair evaluates those lines in
# this module's namespace, so they must be imported here even though no code uses them
# (tests/kernel/test_contracts.py fails if one goes missing).
from tenure.model import JobStatus  # noqa: F401

from .commands import (
    MAX_NOW_US,  # noqa: F401
    AcknowledgeCancelOwned,
    CancelAdmin,
    ClaimLegacy,
    ClaimOwned,
    CompleteLegacy,
    CompleteOwned,
    DeleteLegacy,
    ExpireLease,
    FailLegacy,
    FailOwned,
    HeartbeatLegacy,
    HeartbeatOwned,
    ProgressOwned,
    PurgeFinished,
    ReadStateOwned,
    RecoverOwned,
    ReleaseKeyForLegacy,
    ReleaseKeyForOwned,
    ReleaseOwned,
    RequestCancel,
    RetryFailed,
    SetPidLegacy,
    SetPidOwned,
    SubmitLegacy,
    SubmitOwned,
)
from .machine import Decision, Refused, QUEUE, transition_violations  # noqa: F401
from .record import MIN_INSTANT_US, QueueRow  # noqa: F401

__all__ = [
    "decide_submit_owned",
    "decide_submit_legacy",
    "decide_release_key_for_owned",
    "decide_release_key_for_legacy",
    "decide_claim_owned",
    "decide_claim_legacy",
    "decide_recover_owned",
    "decide_expire_lease",
    "decide_heartbeat_owned",
    "decide_complete_owned",
    "decide_fail_owned",
    "decide_set_pid_owned",
    "decide_read_state_owned",
    "decide_acknowledge_cancel_owned",
    "decide_release_owned",
    "decide_progress_owned",
    "decide_retry_failed",
    "decide_request_cancel",
    "decide_cancel_admin",
    "decide_heartbeat_legacy",
    "decide_complete_legacy",
    "decide_fail_legacy",
    "decide_set_pid_legacy",
    "decide_delete_legacy",
    "decide_purge_finished",
]


def decide_submit_owned(record: QueueRow | None, command: SubmitOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_submit_legacy(record: QueueRow | None, command: SubmitLegacy, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_release_key_for_owned(record: QueueRow | None, command: ReleaseKeyForOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_release_key_for_legacy(record: QueueRow | None, command: ReleaseKeyForLegacy, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_claim_owned(record: QueueRow | None, command: ClaimOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: 1 <= command.lease_us
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (__return__.new_record is not None and __return__.new_record.claim_token == command.claim_token and __return__.new_record.lease_expires_at_us == now_us + command.lease_us)
    """
    return QUEUE.decide(record, command, now_us)


def decide_claim_legacy(record: QueueRow | None, command: ClaimLegacy, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: 1 <= command.lease_us
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (__return__.new_record is not None and __return__.new_record.claim_token is None)
    """
    return QUEUE.decide(record, command, now_us)


def decide_recover_owned(record: QueueRow | None, command: RecoverOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or __return__.new_record == record
    """
    return QUEUE.decide(record, command, now_us)


def decide_expire_lease(record: QueueRow | None, command: ExpireLease, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_heartbeat_owned(record: QueueRow | None, command: HeartbeatOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: 1 <= command.lease_us
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (__return__.new_record is not None and __return__.new_record.lease_expires_at_us == now_us + command.lease_us)
    """
    return QUEUE.decide(record, command, now_us)


def decide_complete_owned(record: QueueRow | None, command: CompleteOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (__return__.new_record is not None and __return__.new_record.status is JobStatus.COMPLETED and __return__.new_record.result_json == command.result_json)
    """
    return QUEUE.decide(record, command, now_us)


def decide_fail_owned(record: QueueRow | None, command: FailOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (__return__.new_record is not None and __return__.new_record.status in (JobStatus.PENDING, JobStatus.FAILED))
    """
    return QUEUE.decide(record, command, now_us)


def decide_set_pid_owned(record: QueueRow | None, command: SetPidOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_read_state_owned(record: QueueRow | None, command: ReadStateOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or __return__.new_record == record
    """
    return QUEUE.decide(record, command, now_us)


def decide_acknowledge_cancel_owned(record: QueueRow | None, command: AcknowledgeCancelOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_release_owned(record: QueueRow | None, command: ReleaseOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or __return__.new_record.generation == record.generation
    """
    return QUEUE.decide(record, command, now_us)


def decide_progress_owned(record: QueueRow | None, command: ProgressOwned, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or __return__.new_record.status == record.status
    """
    return QUEUE.decide(record, command, now_us)


def decide_retry_failed(record: QueueRow | None, command: RetryFailed, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_request_cancel(record: QueueRow | None, command: RequestCancel, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_cancel_admin(record: QueueRow | None, command: CancelAdmin, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_heartbeat_legacy(record: QueueRow | None, command: HeartbeatLegacy, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_complete_legacy(record: QueueRow | None, command: CompleteLegacy, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_fail_legacy(record: QueueRow | None, command: FailLegacy, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_set_pid_legacy(record: QueueRow | None, command: SetPidLegacy, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_delete_legacy(record: QueueRow | None, command: DeleteLegacy, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)


def decide_purge_finished(record: QueueRow | None, command: PurgeFinished, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    """
    return QUEUE.decide(record, command, now_us)
