"""The queue machine's compiled deciders, as tenure.kernel.compiled generates them.

Rendered for review, not imported: tenure builds the same source when first asked. Each
function returns exactly what tenure.kernel.ahead.decide_windowed returns for its command
(tests/kernel/test_compiled.py). Do not edit; re-render:

    .venv/bin/python -P tests/support/compiled_renderings.py --write
"""

# ruff: noqa
from tenure.kernel import ahead
from tenure.kernel.ahead import DEFAULT_SPAN_US, Ahead, at_path
from tenure.kernel.core import Refused
from tenure.model.bounds import is_instant
from tenure.kernel.queue.machine import QueueRefusal
from tenure.kernel.queue.record import QueueStep
from tenure.kernel.queue.machine import QUEUE as machine

REFUSED_CANCEL_REQUESTED = Refused(QueueRefusal.CANCEL_REQUESTED)
REFUSED_GENERATION_EXHAUSTED = Refused(QueueRefusal.GENERATION_EXHAUSTED)
REFUSED_LEASE_EXPIRED = Refused(QueueRefusal.LEASE_EXPIRED)
REFUSED_NONCE_REUSED = Refused(QueueRefusal.NONCE_REUSED)
REFUSED_NOT_CLAIMED = Refused(QueueRefusal.NOT_CLAIMED)
REFUSED_NOT_ELIGIBLE = Refused(QueueRefusal.NOT_ELIGIBLE)
REFUSED_NOT_FOUND = Refused(QueueRefusal.NOT_FOUND)
REFUSED_NO_ELIGIBLE_JOB = Refused(QueueRefusal.NO_ELIGIBLE_JOB)
REFUSED_OPERATION_INELIGIBLE = Refused(QueueRefusal.OPERATION_INELIGIBLE)
REFUSED_STALE_FENCE = Refused(QueueRefusal.STALE_FENCE)
STATE_ABSENT = QueueStep.ABSENT
STATE_CANCELLED = QueueStep.CANCELLED
STATE_CLAIMED = QueueStep.CLAIMED
STATE_COMPLETED = QueueStep.COMPLETED
STATE_FAILED = QueueStep.FAILED
STATE_PENDING = QueueStep.PENDING
effect_claim_owned = machine.effects['claim_owned']
effect_complete = machine.effects['complete']
effect_fail = machine.effects['fail']
effect_release = machine.effects['release']
effect_release_later = machine.effects['release_later']
effect_renew_lease = machine.effects['renew_lease']
effect_retry = machine.effects['retry']
guard_attempts_exhausted = machine.guards['attempts_exhausted']
guard_cancel_requested = machine.guards['cancel_requested']
guard_delayed = machine.guards['delayed']
guard_fence_mismatch = machine.guards['fence_mismatch']
guard_generation_exhausted = machine.guards['generation_exhausted']
guard_nonce_stored = machine.guards['nonce_stored']
guard_other_queue = machine.guards['other_queue']
guard_pid_recorded = machine.guards['pid_recorded']
guard_retry_allowed = machine.guards['retry_allowed']
record_violations = machine.record_violations
state_of = machine.state_of


def decide_heartbeat_owned(record, command, now_us, span_us=DEFAULT_SPAN_US):
    """queue: heartbeat_owned, compiled from the rows, guards, time guards and moving fields."""
    start = now_us - span_us
    end = now_us + span_us
    state = state_of(record)
    if state is STATE_CLAIMED:
        # fence_mismatch -> refused: stale_fence
        if guard_fence_mismatch(record, command, now_us):
            return Ahead(REFUSED_STALE_FENCE, start, end, {}, start, end)
        # lease_not_live -> refused: lease_expired (time guard on lease_expires_at_us)
        instant = record.lease_expires_at_us
        if instant is not None:
            if now_us < instant:
                if instant < end:
                    end = instant
            elif instant > start:
                start = instant
        held = instant is None or now_us >= instant
        if held:
            return Ahead(REFUSED_LEASE_EXPIRED, start, end, {}, start, end)
        # always -> renew_lease
        decided = effect_renew_lease(record, command, now_us)
        new = decided.new_record
        if new is None:
            return Ahead(decided, start, end, {}, start, end)
        offset_0 = new.lease_expires_at_us
        if type(offset_0) is not int:
            return None  # declared as moving, yet not a time here: decided by instrumenting
        offset_0 -= now_us
        relative = {'lease_expires_at_us': offset_0}
        if not (is_instant(start + offset_0) and is_instant(end - 1 + offset_0)):
            return None  # a moving field leaves the instant bounds inside the window
        if record is None or not record_violations.kept_where_changed(record, new):
            broken = record_violations(new)
            if broken and (record is None or not set(broken) <= set(record_violations(record))):
                return None  # the new record breaks an invariant the record decided on kept
        return Ahead(decided, start, end, relative, start, end, True)
    elif state is STATE_ABSENT:
        # always -> refused: not_found
        return Ahead(REFUSED_NOT_FOUND, start, end, {}, start, end)
    elif state is STATE_PENDING or state is STATE_COMPLETED or state is STATE_FAILED or state is STATE_CANCELLED:
        # always -> refused: not_claimed
        return Ahead(REFUSED_NOT_CLAIMED, start, end, {}, start, end)
    raise AssertionError("every state has a rule list")


def decide_complete_owned(record, command, now_us, span_us=DEFAULT_SPAN_US):
    """queue: complete_owned, compiled from the rows, guards, time guards and moving fields."""
    start = now_us - span_us
    end = now_us + span_us
    state = state_of(record)
    if state is STATE_CLAIMED:
        # fence_mismatch -> refused: stale_fence
        if guard_fence_mismatch(record, command, now_us):
            return Ahead(REFUSED_STALE_FENCE, start, end, {}, start, end)
        # lease_not_live -> refused: lease_expired (time guard on lease_expires_at_us)
        instant = record.lease_expires_at_us
        if instant is not None:
            if now_us < instant:
                if instant < end:
                    end = instant
            elif instant > start:
                start = instant
        held = instant is None or now_us >= instant
        if held:
            return Ahead(REFUSED_LEASE_EXPIRED, start, end, {}, start, end)
        # cancel_requested -> refused: cancel_requested
        if guard_cancel_requested(record, command, now_us):
            return Ahead(REFUSED_CANCEL_REQUESTED, start, end, {}, start, end)
        # always -> complete
        decided = effect_complete(record, command, now_us)
        new = decided.new_record
        if new is None:
            return Ahead(decided, start, end, {}, start, end)
        offset_0 = new.completed_at_us
        if type(offset_0) is not int:
            return None  # declared as moving, yet not a time here: decided by instrumenting
        offset_0 -= now_us
        relative = {'completed_at_us': offset_0}
        if not (is_instant(start + offset_0) and is_instant(end - 1 + offset_0)):
            return None  # a moving field leaves the instant bounds inside the window
        if record is None or not record_violations.kept_where_changed(record, new):
            broken = record_violations(new)
            if broken and (record is None or not set(broken) <= set(record_violations(record))):
                return None  # the new record breaks an invariant the record decided on kept
        return Ahead(decided, start, end, relative, start, end, True)
    elif state is STATE_ABSENT:
        # always -> refused: not_found
        return Ahead(REFUSED_NOT_FOUND, start, end, {}, start, end)
    elif state is STATE_PENDING or state is STATE_COMPLETED or state is STATE_FAILED or state is STATE_CANCELLED:
        # always -> refused: not_claimed
        return Ahead(REFUSED_NOT_CLAIMED, start, end, {}, start, end)
    raise AssertionError("every state has a rule list")


def decide_fail_owned(record, command, now_us, span_us=DEFAULT_SPAN_US):
    """queue: fail_owned, compiled from the rows, guards, time guards and moving fields."""
    start = now_us - span_us
    end = now_us + span_us
    state = state_of(record)
    if state is STATE_CLAIMED:
        # fence_mismatch -> refused: stale_fence
        if guard_fence_mismatch(record, command, now_us):
            return Ahead(REFUSED_STALE_FENCE, start, end, {}, start, end)
        # lease_not_live -> refused: lease_expired (time guard on lease_expires_at_us)
        instant = record.lease_expires_at_us
        if instant is not None:
            if now_us < instant:
                if instant < end:
                    end = instant
            elif instant > start:
                start = instant
        held = instant is None or now_us >= instant
        if held:
            return Ahead(REFUSED_LEASE_EXPIRED, start, end, {}, start, end)
        # cancel_requested -> refused: cancel_requested
        if guard_cancel_requested(record, command, now_us):
            return Ahead(REFUSED_CANCEL_REQUESTED, start, end, {}, start, end)
        # retry_allowed -> retry
        if guard_retry_allowed(record, command, now_us):
            decided = effect_retry(record, command, now_us)
            new = decided.new_record
            if new is None:
                return Ahead(decided, start, end, {}, start, end)
            offset_0 = new.fires_at_us
            if type(offset_0) is not int:
                return None  # declared as moving, yet not a time here: decided by instrumenting
            offset_0 -= now_us
            relative = {'fires_at_us': offset_0}
            if not (is_instant(start + offset_0) and is_instant(end - 1 + offset_0)):
                return None  # a moving field leaves the instant bounds inside the window
            if record is None or not record_violations.kept_where_changed(record, new):
                broken = record_violations(new)
                if broken and (record is None or not set(broken) <= set(record_violations(record))):
                    return None  # the new record breaks an invariant the record decided on kept
            return Ahead(decided, start, end, relative, start, end, True)
        # always -> fail
        decided = effect_fail(record, command, now_us)
        new = decided.new_record
        if new is None:
            return Ahead(decided, start, end, {}, start, end)
        offset_0 = new.completed_at_us
        if type(offset_0) is not int:
            return None  # declared as moving, yet not a time here: decided by instrumenting
        offset_0 -= now_us
        relative = {'completed_at_us': offset_0}
        if not (is_instant(start + offset_0) and is_instant(end - 1 + offset_0)):
            return None  # a moving field leaves the instant bounds inside the window
        if record is None or not record_violations.kept_where_changed(record, new):
            broken = record_violations(new)
            if broken and (record is None or not set(broken) <= set(record_violations(record))):
                return None  # the new record breaks an invariant the record decided on kept
        return Ahead(decided, start, end, relative, start, end, True)
    elif state is STATE_ABSENT:
        # always -> refused: not_found
        return Ahead(REFUSED_NOT_FOUND, start, end, {}, start, end)
    elif state is STATE_PENDING or state is STATE_COMPLETED or state is STATE_FAILED or state is STATE_CANCELLED:
        # always -> refused: not_claimed
        return Ahead(REFUSED_NOT_CLAIMED, start, end, {}, start, end)
    raise AssertionError("every state has a rule list")


def decide_release_owned(record, command, now_us, span_us=DEFAULT_SPAN_US):
    """queue: release_owned, compiled from the rows, guards, time guards and moving fields."""
    start = now_us - span_us
    end = now_us + span_us
    state = state_of(record)
    if state is STATE_CLAIMED:
        # fence_mismatch -> refused: stale_fence
        if guard_fence_mismatch(record, command, now_us):
            return Ahead(REFUSED_STALE_FENCE, start, end, {}, start, end)
        # lease_not_live -> refused: lease_expired (time guard on lease_expires_at_us)
        instant = record.lease_expires_at_us
        if instant is not None:
            if now_us < instant:
                if instant < end:
                    end = instant
            elif instant > start:
                start = instant
        held = instant is None or now_us >= instant
        if held:
            return Ahead(REFUSED_LEASE_EXPIRED, start, end, {}, start, end)
        # cancel_requested -> refused: cancel_requested
        if guard_cancel_requested(record, command, now_us):
            return Ahead(REFUSED_CANCEL_REQUESTED, start, end, {}, start, end)
        # pid_recorded -> refused: operation_ineligible
        if guard_pid_recorded(record, command, now_us):
            return Ahead(REFUSED_OPERATION_INELIGIBLE, start, end, {}, start, end)
        # delayed -> release_later
        if guard_delayed(record, command, now_us):
            decided = effect_release_later(record, command, now_us)
            new = decided.new_record
            if new is None:
                return Ahead(decided, start, end, {}, start, end)
            offset_0 = new.fires_at_us
            if type(offset_0) is not int:
                return None  # declared as moving, yet not a time here: decided by instrumenting
            offset_0 -= now_us
            relative = {'fires_at_us': offset_0}
            if not (is_instant(start + offset_0) and is_instant(end - 1 + offset_0)):
                return None  # a moving field leaves the instant bounds inside the window
            if record is None or not record_violations.kept_where_changed(record, new):
                broken = record_violations(new)
                if broken and (record is None or not set(broken) <= set(record_violations(record))):
                    return None  # the new record breaks an invariant the record decided on kept
            return Ahead(decided, start, end, relative, start, end, True)
        # always -> release
        decided = effect_release(record, command, now_us)
        return Ahead(decided, start, end, {}, start, end)
    elif state is STATE_ABSENT:
        # always -> refused: not_found
        return Ahead(REFUSED_NOT_FOUND, start, end, {}, start, end)
    elif state is STATE_PENDING or state is STATE_COMPLETED or state is STATE_FAILED or state is STATE_CANCELLED:
        # always -> refused: not_claimed
        return Ahead(REFUSED_NOT_CLAIMED, start, end, {}, start, end)
    raise AssertionError("every state has a rule list")


def decide_claim_owned(record, command, now_us, span_us=DEFAULT_SPAN_US):
    """queue: claim_owned, compiled from the rows, guards, time guards and moving fields."""
    start = now_us - span_us
    end = now_us + span_us
    state = state_of(record)
    if state is STATE_PENDING:
        # nonce_stored -> refused: nonce_reused
        if guard_nonce_stored(record, command, now_us):
            return Ahead(REFUSED_NONCE_REUSED, start, end, {}, start, end)
        # other_queue -> refused: not_eligible
        if guard_other_queue(record, command, now_us):
            return Ahead(REFUSED_NOT_ELIGIBLE, start, end, {}, start, end)
        # not_due -> refused: not_eligible (time guard on fires_at_us)
        instant = record.fires_at_us
        if instant is not None:
            if now_us < instant:
                if instant < end:
                    end = instant
            elif instant > start:
                start = instant
        held = instant is not None and now_us < instant
        if held:
            return Ahead(REFUSED_NOT_ELIGIBLE, start, end, {}, start, end)
        # attempts_exhausted -> refused: not_eligible
        if guard_attempts_exhausted(record, command, now_us):
            return Ahead(REFUSED_NOT_ELIGIBLE, start, end, {}, start, end)
        # generation_exhausted -> refused: generation_exhausted
        if guard_generation_exhausted(record, command, now_us):
            return Ahead(REFUSED_GENERATION_EXHAUSTED, start, end, {}, start, end)
        # always -> claim_owned
        decided = effect_claim_owned(record, command, now_us)
        new = decided.new_record
        if new is None:
            return Ahead(decided, start, end, {}, start, end)
        offset_0 = new.claimed_at_us
        if type(offset_0) is not int:
            return None  # declared as moving, yet not a time here: decided by instrumenting
        offset_0 -= now_us
        offset_1 = new.lease_expires_at_us
        if type(offset_1) is not int:
            return None  # declared as moving, yet not a time here: decided by instrumenting
        offset_1 -= now_us
        relative = {'claimed_at_us': offset_0, 'lease_expires_at_us': offset_1}
        if not (is_instant(start + offset_0) and is_instant(end - 1 + offset_0)):
            return None  # a moving field leaves the instant bounds inside the window
        if not (is_instant(start + offset_1) and is_instant(end - 1 + offset_1)):
            return None  # a moving field leaves the instant bounds inside the window
        if record is None or not record_violations.kept_where_changed(record, new):
            broken = record_violations(new)
            if broken and (record is None or not set(broken) <= set(record_violations(record))):
                return None  # the new record breaks an invariant the record decided on kept
        return Ahead(decided, start, end, relative, start, end, True)
    elif state is STATE_ABSENT:
        # nonce_stored -> refused: nonce_reused
        if guard_nonce_stored(record, command, now_us):
            return Ahead(REFUSED_NONCE_REUSED, start, end, {}, start, end)
        # always -> refused: no_eligible_job
        return Ahead(REFUSED_NO_ELIGIBLE_JOB, start, end, {}, start, end)
    elif state is STATE_CLAIMED or state is STATE_COMPLETED or state is STATE_FAILED or state is STATE_CANCELLED:
        # nonce_stored -> refused: nonce_reused
        if guard_nonce_stored(record, command, now_us):
            return Ahead(REFUSED_NONCE_REUSED, start, end, {}, start, end)
        # always -> refused: not_eligible
        return Ahead(REFUSED_NOT_ELIGIBLE, start, end, {}, start, end)
    raise AssertionError("every state has a rule list")
