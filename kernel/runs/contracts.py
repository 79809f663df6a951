"""Typed entry points to the Run kernel's ``decide``, one per command, carrying its
contract (checked by CrossHair: ``.ci/crosshair_kernel.py check --analysis_kind=PEP316
--per_condition_timeout=...``; see :mod:`tenure.kernel.queue.contracts` for why one per
command).

The shared postcondition is the list of transition rules (TR-R1 ... TR-R11 in
``specs/runs.md``). The commands add what the rules leave to the guards: a command that
names a hop applies only to the Run's current sequence (nothing an old hop does touches
a later one); a replay never changes the stored pair (nor its route); a claim of a Run
already running is only the same claimant's repeat, and changes nothing; a park records
an owner row of this Run (a timer's park carries none); a resume comes from the current,
complete owner; a settlement needs proven containment and never happens over CANCELLING;
CANCELLED needs the hop fenced and containment proven; a timeout elects the
cancellation only at or after the Run's deadline, with the reason ``timeout``. The precondition on the record is
the pair a command meets: the Run and its current delivery (two deliveries exist only in
a resume's decision). Record validity (INV-R1 ... INV-R9) is asserted by the property
tests.
"""

from __future__ import annotations

# Names used only inside the pre/post lines below: CrossHair evaluates those lines in
# this module's namespace (tests/kernel/test_contracts.py fails if one goes missing).
from tenure.model import BrokerJobState, RunStatus, WaitKind  # noqa: F401

from ..core import Decision, Refused  # noqa: F401
from ..queue.commands import MAX_NOW_US  # noqa: F401
from tenure.model.bounds import MIN_INSTANT_US  # noqa: F401
from .commands import (
    Admit,
    Release,
    FailHeld,
    RecordPublished,
    RecordPublishError,
    Claim,
    EnterHardwareWait,
    LeaveHardwareWait,
    Park,
    Resume,
    Settle,
    BeginCancel,
    FinishCancel,
    Rotate,
    RetryLost,
    TimeOut,
)
from .machine import RUNS, transition_violations  # noqa: F401
from .record import RunPair

__all__ = [
    "decide_admit",
    "decide_release",
    "decide_fail_held",
    "decide_record_published",
    "decide_record_publish_error",
    "decide_claim",
    "decide_enter_hardware_wait",
    "decide_leave_hardware_wait",
    "decide_park",
    "decide_resume",
    "decide_settle",
    "decide_begin_cancel",
    "decide_finish_cancel",
    "decide_rotate",
    "decide_retry_lost",
    "decide_time_out",
]


def decide_admit(record: RunPair | None, command: Admit, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or record is None or __return__.new_record == record
    """
    return RUNS.decide(record, command, now_us)


def decide_release(record: RunPair | None, command: Release, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or command.enqueue_seq == record.run.enqueue_seq
    """
    return RUNS.decide(record, command, now_us)


def decide_fail_held(record: RunPair | None, command: FailHeld, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (command.enqueue_seq == record.run.enqueue_seq and __return__.new_record.run.status is RunStatus.FAILED)
    """
    return RUNS.decide(record, command, now_us)


def decide_record_published(record: RunPair | None, command: RecordPublished, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or command.enqueue_seq == record.run.enqueue_seq
    """
    return RUNS.decide(record, command, now_us)


def decide_record_publish_error(record: RunPair | None, command: RecordPublishError, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (command.enqueue_seq == record.run.enqueue_seq and __return__.new_record.current.state is record.current.state)
    """
    return RUNS.decide(record, command, now_us)


def decide_claim(record: RunPair | None, command: Claim, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or command.enqueue_seq == record.run.enqueue_seq
    post: isinstance(__return__, Refused) or record.run.status is RunStatus.QUEUED or (command.claimant is not None and record.current.claimed_by == command.claimant and __return__.new_record == record)
    """
    return RUNS.decide(record, command, now_us)


def decide_enter_hardware_wait(record: RunPair | None, command: EnterHardwareWait, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or command.enqueue_seq == record.run.enqueue_seq
    """
    return RUNS.decide(record, command, now_us)


def decide_leave_hardware_wait(record: RunPair | None, command: LeaveHardwareWait, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or command.enqueue_seq == record.run.enqueue_seq
    """
    return RUNS.decide(record, command, now_us)


def decide_park(record: RunPair | None, command: Park, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (command.enqueue_seq == record.run.enqueue_seq and __return__.new_record.run.owner_id == command.owner_id and ((command.owner is None) if command.wait is WaitKind.TIMER else (command.owner is not None and command.owner.run_id == record.run.run_id)))
    """
    return RUNS.decide(record, command, now_us)


def decide_resume(record: RunPair | None, command: Resume, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (command.owner_id == record.run.owner_id and command.owner is not None and command.owner.complete)
    """
    return RUNS.decide(record, command, now_us)


def decide_settle(record: RunPair | None, command: Settle, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (command.enqueue_seq == record.run.enqueue_seq and command.containment.proven and record.run.status is not RunStatus.CANCELLING)
    """
    return RUNS.decide(record, command, now_us)


def decide_begin_cancel(record: RunPair | None, command: BeginCancel, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or record.run.status in (RunStatus.CANCELLING, RunStatus.CANCELLED) or __return__.new_record.run.status is RunStatus.CANCELLING
    """
    return RUNS.decide(record, command, now_us)


def decide_finish_cancel(record: RunPair | None, command: FinishCancel, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or record.run.status is RunStatus.CANCELLED or (command.enqueue_seq == record.run.enqueue_seq and command.containment.proven and command.hop is not None and command.hop not in (BrokerJobState.QUEUED, BrokerJobState.ACTIVE))
    """
    return RUNS.decide(record, command, now_us)


def decide_rotate(record: RunPair | None, command: Rotate, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (command.enqueue_seq == record.run.enqueue_seq and __return__.new_record.current.resume == record.current.resume and command.hop in (BrokerJobState.COMPLETE, BrokerJobState.FAILED, BrokerJobState.ABORTED))
    """
    return RUNS.decide(record, command, now_us)


def decide_retry_lost(record: RunPair | None, command: RetryLost, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (command.enqueue_seq == record.run.enqueue_seq and command.containment.proven and command.hop is not None and command.hop not in (BrokerJobState.QUEUED, BrokerJobState.ACTIVE) and record.run.hop_retries < record.run.max_hop_retries and __return__.new_record.run.hop_retries == record.run.hop_retries + 1)
    """
    return RUNS.decide(record, command, now_us)


def decide_time_out(record: RunPair | None, command: TimeOut, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: record is None or len(record.deliveries) == 1
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (record.run.deadline_us is not None and now_us >= record.run.deadline_us and __return__.new_record.run.status is RunStatus.CANCELLING)
    """
    return RUNS.decide(record, command, now_us)
