"""The owned-queue machine: every transition of a job row, as one table.

Theory of operation
-------------------
A job row moves ``pending -> claimed -> completed | failed | cancelled`` (a failed
attempt with budget left goes back to ``pending``; a released claim goes back too, and an
operator may retry a failed job). Three kinds of actor move it:

* submitters insert it (owned submissions are protected and replayable by their
  submission ID and fingerprint; legacy submissions are not);
* workers claim it and then write to it. An owned claim stores the caller's fresh nonce
  (the claim token) and advances the generation; every owned write presents the whole
  fence (queue, job ID, owner, generation, token) and applies only while the fence
  matches the row exactly and the lease is strictly after the database's ``now``;
* administrators and the lease sweep cancel, expire, delete and purge it.

The adapter locks the row, samples the database clock, calls ``QUEUE.decide`` and writes
the decision with a compare-and-set. ``decide`` is total: every ``(state, command)``
pair has an ordered list of rules in ``QUEUE.table``; the first rule whose guard holds
decides, and the last guard of every list is ``always``. A rule either applies a named
effect (a pure function producing the new record and a reply) or refuses with a named
reason; a refusal changes nothing. :data:`OUTCOMES` says what each refusal
means to a caller (a negative answer, or a conflict error).

Invariants kept: the record invariants of :mod:`tenure.kernel.queue.record` on every
output, and the transition rules of :func:`transition_violations` (generation never
decreases and grows by exactly one per claim; identity never changes; an applied fenced
command had a matching fence and a live lease; a terminal row never becomes live again,
but by an operator's retry of a failed job; every move into a terminal status releases
the active key).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from tenure.model import ErrorCode, JobStatus, QueueKind, bounds
from tenure.model.states import TERMINAL_STATUSES

from ..ahead import Ahead
from ..compiled import decider_of
from ..core import (
    SAME,
    Applied,
    AtTime,
    Declarations,
    Change,
    Decision,
    FromCommand,
    Increment,
    Machine,
    Refused,
    Rewrite,
    Row,
    Rule,
    SetValue,
    TimeGuard,
)
from .commands import (
    FENCED_COMMANDS,
    Ack,
    ClaimGranted,
    Command,
    QueueCommandType,
    Reply,
    StreamingStateReply,
    Submitted,
)
from .record import (
    QueueRow,
    QueueStep,
    dedupe_key_of,
    is_currently_owned,
    record_violations,
    replace_fields,
    state_of,
)

__all__ = [
    "QueueRefusal",
    "CLAIM_OWNED_REWRITE",
    "CLAIM_LEGACY_REWRITE",
    "OUTCOMES",
    "Applied",
    "Refused",
    "Decision",
    "Rule",
    "ROWS",
    "QUEUE",
    "GUARDS",
    "EFFECTS",
    "fence_matches",
    "claim_identity_problem",
    "backoff_delay_us",
    "jittered_us",
    "transition_violations",
    "LEASE_EXPIRED_ERROR",
    "UNREADABLE_ROW_ERROR",
    "SET_ASIDE",
    "COMPILED_COMMANDS",
    "deciders",
]


class QueueRefusal(enum.Enum):
    """Why a command changed nothing. Values are the names the spec table uses."""

    INCONSISTENT_PROTECTION = "inconsistent_protection"
    LEGACY_ROW_COLLISION = "legacy_row_collision"
    IDENTITY_COLLISION = "identity_collision"
    FINGERPRINT_MISMATCH = "fingerprint_mismatch"
    PROTECTED_KEY_COLLISION = "protected_key_collision"
    ACTIVE_KEY_HELD = "active_key_held"
    LEGACY_PREDECESSOR = "legacy_predecessor"
    PROTECTED_PREDECESSOR = "protected_predecessor"
    NO_PREDECESSOR = "no_predecessor"
    NONCE_REUSED = "nonce_reused"
    GENERATION_EXHAUSTED = "generation_exhausted"
    NO_ELIGIBLE_JOB = "no_eligible_job"
    NOT_ELIGIBLE = "not_eligible"
    NO_LIVE_CLAIM = "no_live_claim"
    LEASE_STILL_LIVE = "lease_still_live"
    NOT_FOUND = "not_found"
    NOT_CLAIMED = "not_claimed"
    STALE_FENCE = "stale_fence"
    LEASE_EXPIRED = "lease_expired"
    CANCEL_REQUESTED = "cancel_requested"
    NO_CANCEL_REQUEST = "no_cancel_request"
    OPERATION_INELIGIBLE = "operation_ineligible"
    ALREADY_FINISHED = "already_finished"
    PROTECTED_ROW = "protected_row"
    OWNED_INCARNATION = "owned_incarnation"
    OWNER_MISMATCH = "owner_mismatch"
    NOT_FINISHED = "not_finished"
    NOT_FAILED = "not_failed"
    RETAINED = "retained"


_CONFLICTS_ON_SUBMIT = {
    QueueRefusal.INCONSISTENT_PROTECTION,
    QueueRefusal.LEGACY_ROW_COLLISION,
    QueueRefusal.IDENTITY_COLLISION,
    QueueRefusal.FINGERPRINT_MISMATCH,
    QueueRefusal.PROTECTED_KEY_COLLISION,
    QueueRefusal.ACTIVE_KEY_HELD,
    QueueRefusal.LEGACY_PREDECESSOR,
    QueueRefusal.PROTECTED_PREDECESSOR,
    QueueRefusal.NO_PREDECESSOR,
}
_CONFLICTS_ON_CLAIM = {QueueRefusal.NONCE_REUSED, QueueRefusal.GENERATION_EXHAUSTED}

OUTCOMES: dict[QueueRefusal, ErrorCode | None] = {
    reason: (
        ErrorCode.QUEUE_SUBMISSION_CONFLICT if reason in _CONFLICTS_ON_SUBMIT
        else ErrorCode.QUEUE_CLAIM_CONFLICT if reason in _CONFLICTS_ON_CLAIM
        else None
    )
    for reason in QueueRefusal
}
"""What each refusal means to a caller: the error code it raises, or None for a known
negative answer (False, or None where the operation returns a value)."""


Guard = Callable[[Any, Any, int], bool]
Effect = Callable[[Any, Any, int], "Applied[QueueRow]"]


# --- Guards: named predicates over (record, command, now_us). ------------------------


def fence_matches(record: QueueRow, fence: Any) -> bool:
    """Exact comparison of all five fence parts with the row.

    Strings are compared as exact ``str`` values (no case folding, trimming or padding);
    the generation must be a real ``int`` (``True`` is not ``1``). A row without a token
    (a legacy claim) matches no fence.
    """
    return (
        type(fence.queue) is QueueKind
        and fence.queue is record.queue
        and type(fence.job_id) is str
        and fence.job_id == record.job_id
        and type(fence.owner_id) is str
        and fence.owner_id == record.owner_id
        and type(fence.generation) is int
        and fence.generation == record.generation
        and type(fence.claim_token) is str
        and record.claim_token is not None
        and fence.claim_token == record.claim_token
    )


def _lease_live(record: QueueRow, now_us: int) -> bool:
    return record.lease_expires_at_us is not None and record.lease_expires_at_us > now_us


GUARDS: Declarations[str, Guard] = Declarations({
    "always": lambda record, command, now_us: True,
    # Submission
    "protection_inconsistent": lambda record, command, now_us: (
        record.fence_required != (record.submission_id is not None)
        or record.fence_required != (record.fingerprint is not None)
    ),
    "legacy_row": lambda record, command, now_us: not record.fence_required,
    "other_submission": lambda record, command, now_us: record.submission_id != command.submission_id,
    "fingerprint_differs": lambda record, command, now_us: record.fingerprint != command.fingerprint,
    "key_differs": lambda record, command, now_us: (
        dedupe_key_of(record) is None
        or dedupe_key_of(record) != (
            command.active_key if record.queue is QueueKind.STREAMING else command.idempotency_key
        )
    ),
    "protected": lambda record, command, now_us: record.fence_required,
    "protected_or_owned": lambda record, command, now_us: (
        record.fence_required or is_currently_owned(record)
    ),
    "not_forced": lambda record, command, now_us: not command.force,
    "delayed": lambda record, command, now_us: command.delay_us > 0,
    # Claims
    "nonce_stored": lambda record, command, now_us: command.nonce_already_stored,
    "other_queue": lambda record, command, now_us: (
        command.queue_names is not None and record.queue_name not in command.queue_names
    ),
    "not_due": lambda record, command, now_us: record.fires_at_us > now_us,
    "attempts_exhausted": lambda record, command, now_us: record.attempts >= record.max_attempts,
    "generation_exhausted": lambda record, command, now_us: record.generation >= bounds.INT64_MAX,
    "owner_differs": lambda record, command, now_us: (
        type(command.owner_id) is not str or record.owner_id != command.owner_id
    ),
    "token_differs": lambda record, command, now_us: (
        type(command.claim_token) is not str
        or record.claim_token is None
        or record.claim_token != command.claim_token
    ),
    "lease_live": lambda record, command, now_us: _lease_live(record, now_us),
    "lease_not_live": lambda record, command, now_us: not _lease_live(record, now_us),
    # Fenced writes
    "fence_mismatch": lambda record, command, now_us: not fence_matches(record, command.fence),
    "cancel_requested": lambda record, command, now_us: record.cancel_requested,
    "pid_recorded": lambda record, command, now_us: record.pid is not None,
    "no_cancel_request": lambda record, command, now_us: not record.cancel_requested,
    "retry_allowed": lambda record, command, now_us: (
        command.retry and record.attempts < record.max_attempts
    ),
    "not_streaming": lambda record, command, now_us: record.queue is not QueueKind.STREAMING,
    "streaming": lambda record, command, now_us: record.queue is QueueKind.STREAMING,
    "not_task": lambda record, command, now_us: record.queue is not QueueKind.TASK,
    # Retention
    "finished_after_cutoff": lambda record, command, now_us: (
        record.completed_at_us is None or record.completed_at_us >= command.older_than_us
    ),
})


# --- Effects: named pure functions producing the new record and the reply. -----------


def jittered_us(delay_us: int, jitter_per_mille: int) -> int:
    """``delay_us`` shortened by ``jitter_per_mille`` thousandths (clamped to 0..500), so
    a jittered delay is never longer than the plain one nor shorter than half of it.

    post: 0 <= __return__ <= max(0, delay_us)
    """
    share = 0 if jitter_per_mille < 0 else (500 if jitter_per_mille > 500 else jitter_per_mille)
    delay = delay_us if delay_us > 0 else 0
    return delay - delay * share // 1000


def backoff_delay_us(attempts: int, base_ms: int, max_ms: int) -> int:
    """``min(max_ms, base_ms * 2**attempts)`` milliseconds, in microseconds.

    Total over all ints (negative inputs count as zero), so a malformed policy can delay
    a retry by nothing but can never move it into the past.

    post: 0 <= __return__ <= max(0, max_ms) * 1000
    """
    exponent = 0 if attempts < 0 else (attempts if attempts < 63 else 63)
    delay_ms = min(max_ms, max(0, base_ms) << exponent)
    return (delay_ms if delay_ms > 0 else 0) * 1000


def _finish(record: QueueRow, status: JobStatus, now_us: int, **changes: Any) -> QueueRow:
    """Leave the claim for a terminal status: no lease, PID or cancel request remain and
    the active key is released; owner and token stay as the last claim's identity."""
    return replace_fields(
        record,
        status=status,
        lease_expires_at_us=None,
        pid=None,
        cancel_requested=False,
        active_key=None,
        completed_at_us=now_us,
        **changes,
    )


def _requeue(record: QueueRow, fires_at_us: int, **changes: Any) -> QueueRow:
    """Leave the claim for ``pending``; the job becomes eligible at ``fires_at_us``."""
    return replace_fields(
        record,
        status=JobStatus.PENDING,
        lease_expires_at_us=None,
        pid=None,
        cancel_requested=False,
        fires_at_us=fires_at_us,
        **changes,
    )


def _insert(command: Any, now_us: int, *, owned: bool) -> Applied[QueueRow]:
    record = QueueRow(
        queue=command.queue,
        job_id=command.job_id,
        run_id=command.run_id,
        status=JobStatus.PENDING,
        attempts=0,
        max_attempts=command.max_attempts,
        generation=0,
        owner_id=None,
        claim_token=None,
        claimed_at_us=None,
        lease_expires_at_us=None,
        fires_at_us=now_us + command.delay_us if command.fires_at_us is None else command.fires_at_us,
        queue_name=command.queue_name,
        task_name=command.task_name,
        priority=command.priority,
        created_at_us=now_us,
        completed_at_us=None,
        cancel_requested=False,
        pid=None,
        fence_required=owned,
        submission_id=command.submission_id if owned else None,
        fingerprint=command.fingerprint if owned else None,
        idempotency_key=command.idempotency_key,
        active_key=command.active_key,
        dlq_record_id=None,
        error_message=None,
        result_json=None,
        payload=command.payload,
    )
    return Applied(record, Submitted(record.job_id, record.run_id, replayed=False))


def _unchanged(record: QueueRow, reply: Reply) -> Applied[QueueRow]:
    return Applied(record, reply)


def _claim_rewrite(name: str, claim_token: Change) -> Rewrite:
    return Rewrite(name, (
        ("status", SetValue(JobStatus.CLAIMED)),
        ("attempts", Increment(1)),
        ("generation", Increment(1)),
        ("owner_id", FromCommand("owner_id")),
        ("claim_token", claim_token),
        ("claimed_at_us", AtTime()),
        ("lease_expires_at_us", AtTime(plus="lease_us")),
        ("pid", SetValue(None)),
        ("cancel_requested", SetValue(False)),
    ))


CLAIM_OWNED_REWRITE = _claim_rewrite("claim_owned", FromCommand("claim_token"))
"""An owned claim, as data: a store may apply it in SQL to rows it picks (one statement)."""

CLAIM_LEGACY_REWRITE = _claim_rewrite("claim_legacy", SetValue(None))
"""A legacy claim: the same, storing no token."""


def _claim(rewrite: Rewrite, record: QueueRow, command: Any, now_us: int) -> Applied[QueueRow]:
    return Applied(rewrite.apply(record, command, now_us, replace_fields), ClaimGranted())


def _fail(record: QueueRow, command: Any, now_us: int, *, retry: bool) -> Applied[QueueRow]:
    if retry:
        delay_us = jittered_us(backoff_delay_us(record.attempts, command.backoff_base_ms, command.backoff_max_ms),
                               command.jitter_per_mille)
        return Applied(_requeue(record, now_us + delay_us, error_message=command.error_message), Ack())
    return Applied(
        _finish(
            record,
            JobStatus.FAILED,
            now_us,
            error_message=command.error_message,
            dlq_record_id=command.dlq_record_id,
        ),
        Ack(),
    )


def _released(record: QueueRow, fires_at_us: int | None = None) -> QueueRow:
    """A claim given back: pending at its original ``fires_at`` (due again at once) or at
    ``fires_at_us``, the attempt the claim spent returned (never below zero, for a row
    another client wrote)."""
    return _requeue(record, record.fires_at_us if fires_at_us is None else fires_at_us,
                    attempts=record.attempts - 1 if record.attempts > 0 else 0)


TIME_GUARDS: Declarations[str, TimeGuard] = Declarations({
    "not_due": TimeGuard("fires_at_us"),
    "lease_live": TimeGuard("lease_expires_at_us"),
    "lease_not_live": TimeGuard("lease_expires_at_us", holds_before=False),
})
"""The guards that read the time, as data (every other guard ignores it): a decision
made ahead holds while the time stays on the same side of each one's instant."""

_FINISHING = ("cancel_for_rerun", "fail_expired", "cancel_expired", "complete", "fail", "acknowledge_cancel", "cancel")

MOVING_FIELDS: Declarations[str, tuple[str, ...]] = Declarations({
    **{effect: ("completed_at_us",) for effect in _FINISHING},
    "renew_lease": ("lease_expires_at_us",),
    "retry": ("fires_at_us",),
    "retry_failed": ("fires_at_us",),
    "release_later": ("fires_at_us",),
    "claim_owned": ("claimed_at_us", "lease_expires_at_us"),
    "claim_legacy": ("claimed_at_us", "lease_expires_at_us"),
    **{effect: () for effect in ("replay", "release_key", "recover", "requeue_expired", "record_pid",
                                 "read_state", "request_cancel", "release", "record_progress", "delete")},
})
"""The fields each effect sets to the time plus an offset (the others keep or set fixed
values). Submissions are not declared (whether ``fires_at`` moves depends on the
command): they are decided ahead by instrumenting."""

LEASE_EXPIRED_ERROR = "lease expired with no attempts left"
"""The error a job gets when its last attempt is lost to lease expiry."""

UNREADABLE_ROW_ERROR = "corrupt_row: the stored row could not be read"
"""The error a row gets when a claim sets it aside (see :data:`SET_ASIDE`)."""

SET_ASIDE = Rewrite("set_aside", (
    ("status", SetValue(JobStatus.FAILED)),
    ("lease_expires_at_us", SetValue(None)),
    ("pid", SetValue(None)),
    ("cancel_requested", SetValue(False)),
    ("active_key", SetValue(None)),
    ("completed_at_us", AtTime()),
    ("error_message", SetValue(UNREADABLE_ROW_ERROR)),
))
"""What a claim (or the lease sweep inside it) writes to a row of a status it meets
(``finders.set_aside_guard``: pending or claimed) that it cannot read: a value of the
wrong type or shape written outside tenure, or values the claim's or the sweep's decision
would break the record invariants with (a negative generation). There is no record to
decide on, so this is not a row of the table: it is the rule of specs/queue.md's "Rows
tenure cannot read", as data the adapters spell in SQL without decoding the row. It
finishes the row as ``_finish`` finishes a failure (``failed`` at the database time,
no lease, PID or cancel request, the active key released) with a fixed error, so no
claim meets it again and a submission of its key is not blocked; its other columns,
the unreadable ones among them, are left as they are for an operator to inspect. The
claim hands nothing of it out."""

EFFECTS: Declarations[str, Effect] = Declarations({
    "insert_owned": lambda record, command, now_us: _insert(command, now_us, owned=True),
    "insert_legacy": lambda record, command, now_us: _insert(command, now_us, owned=False),
    "replay": lambda record, command, now_us: _unchanged(
        record, Submitted(record.job_id, record.run_id, replayed=True)
    ),
    "cancel_for_rerun": lambda record, command, now_us: Applied(
        _finish(record, JobStatus.CANCELLED, now_us), Ack()
    ),
    "release_key": lambda record, command, now_us: Applied(
        replace_fields(record, active_key=None), Ack()
    ),
    "claim_owned": lambda record, command, now_us: _claim(CLAIM_OWNED_REWRITE, record, command, now_us),
    "claim_legacy": lambda record, command, now_us: _claim(CLAIM_LEGACY_REWRITE, record, command, now_us),
    "recover": lambda record, command, now_us: _unchanged(record, ClaimGranted()),
    "requeue_expired": lambda record, command, now_us: Applied(
        _requeue(record, record.fires_at_us), Ack()
    ),
    "fail_expired": lambda record, command, now_us: Applied(
        _finish(record, JobStatus.FAILED, now_us, error_message=LEASE_EXPIRED_ERROR), Ack()
    ),
    "cancel_expired": lambda record, command, now_us: Applied(
        _finish(record, JobStatus.CANCELLED, now_us), Ack()
    ),
    "renew_lease": lambda record, command, now_us: Applied(
        replace_fields(record, lease_expires_at_us=now_us + command.lease_us), Ack()
    ),
    "complete": lambda record, command, now_us: Applied(
        _finish(record, JobStatus.COMPLETED, now_us, result_json=command.result_json), Ack()
    ),
    "retry": lambda record, command, now_us: _fail(record, command, now_us, retry=True),
    "fail": lambda record, command, now_us: _fail(record, command, now_us, retry=False),
    "record_pid": lambda record, command, now_us: Applied(
        replace_fields(record, pid=command.pid), Ack()
    ),
    "record_progress": lambda record, command, now_us: Applied(
        replace_fields(record, progress_json=command.progress_json), Ack()
    ),
    "read_state": lambda record, command, now_us: _unchanged(
        record, StreamingStateReply(record.cancel_requested, record.pid)
    ),
    "acknowledge_cancel": lambda record, command, now_us: Applied(
        _finish(record, JobStatus.CANCELLED, now_us), Ack()
    ),
    "cancel": lambda record, command, now_us: Applied(
        _finish(record, JobStatus.CANCELLED, now_us), Ack()
    ),
    "request_cancel": lambda record, command, now_us: Applied(
        replace_fields(record, cancel_requested=True), Ack()
    ),
    "release": lambda record, command, now_us: Applied(_released(record), Ack()),
    "release_later": lambda record, command, now_us: Applied(_released(record, now_us + command.delay_us), Ack()),
    "retry_failed": lambda record, command, now_us: Applied(
        replace_fields(record, status=JobStatus.PENDING, attempts=0, fires_at_us=now_us, completed_at_us=None,
                       dlq_record_id=None),
        Ack(),
    ),
    "delete": lambda record, command, now_us: Applied(None, Ack()),
})


# --- The table. ----------------------------------------------------------------------


S = QueueStep
C = QueueCommandType
R = QueueRefusal
_PRESENT = (S.PENDING, S.CLAIMED, S.COMPLETED, S.FAILED, S.CANCELLED)
_LIVE = (S.PENDING, S.CLAIMED)
_TERMINAL = (S.COMPLETED, S.FAILED, S.CANCELLED)
_UNCLAIMED = (S.PENDING, S.COMPLETED, S.FAILED, S.CANCELLED)
_CLAIMED_OR_FINISHED = (S.CLAIMED, S.COMPLETED, S.FAILED, S.CANCELLED)
_NOT_CLAIMED = (S.ABSENT, S.PENDING, S.COMPLETED, S.FAILED, S.CANCELLED)

ROWS: tuple[Row, ...] = (
    # One row per spec row of specs/queue.md, in its order: (from, command, guard, to,
    # effect or refusal). SAME is the spec's "same". The first row of a (state, command)
    # pair whose guard holds decides.
    Row((S.ABSENT,), C.SUBMIT_OWNED, "always", S.PENDING, "insert_owned"),
    Row(_PRESENT, C.SUBMIT_OWNED, "protection_inconsistent", SAME, R.INCONSISTENT_PROTECTION),
    Row(_PRESENT, C.SUBMIT_OWNED, "legacy_row", SAME, R.LEGACY_ROW_COLLISION),
    Row(_PRESENT, C.SUBMIT_OWNED, "other_submission", SAME, R.IDENTITY_COLLISION),
    Row(_PRESENT, C.SUBMIT_OWNED, "fingerprint_differs", SAME, R.FINGERPRINT_MISMATCH),
    Row(_PRESENT, C.SUBMIT_OWNED, "always", SAME, "replay"),
    Row((S.ABSENT,), C.SUBMIT_LEGACY, "always", S.PENDING, "insert_legacy"),
    Row(_PRESENT, C.SUBMIT_LEGACY, "protected", SAME, R.PROTECTED_KEY_COLLISION),
    Row(_PRESENT, C.SUBMIT_LEGACY, "key_differs", SAME, R.IDENTITY_COLLISION),
    Row(_PRESENT, C.SUBMIT_LEGACY, "always", SAME, "replay"),
    Row((S.ABSENT,), C.RELEASE_KEY_FOR_OWNED, "always", SAME, R.NO_PREDECESSOR),
    Row(_LIVE, C.RELEASE_KEY_FOR_OWNED, "legacy_row", SAME, R.LEGACY_PREDECESSOR),
    Row(_LIVE, C.RELEASE_KEY_FOR_OWNED, "not_forced", SAME, R.ACTIVE_KEY_HELD),
    Row(_LIVE, C.RELEASE_KEY_FOR_OWNED, "always", S.CANCELLED, "cancel_for_rerun"),
    Row(_TERMINAL, C.RELEASE_KEY_FOR_OWNED, "legacy_row", SAME, R.LEGACY_PREDECESSOR),
    Row(_TERMINAL, C.RELEASE_KEY_FOR_OWNED, "always", SAME, "release_key"),
    Row((S.ABSENT,), C.RELEASE_KEY_FOR_LEGACY, "always", SAME, R.NO_PREDECESSOR),
    Row(_LIVE, C.RELEASE_KEY_FOR_LEGACY, "protected_or_owned", SAME, R.PROTECTED_PREDECESSOR),
    Row(_LIVE, C.RELEASE_KEY_FOR_LEGACY, "always", S.CANCELLED, "cancel_for_rerun"),
    Row(_TERMINAL, C.RELEASE_KEY_FOR_LEGACY, "protected", SAME, R.PROTECTED_PREDECESSOR),
    Row(_TERMINAL, C.RELEASE_KEY_FOR_LEGACY, "always", SAME, "release_key"),
    Row((S.ABSENT,), C.CLAIM_OWNED, "nonce_stored", SAME, R.NONCE_REUSED),
    Row((S.ABSENT,), C.CLAIM_OWNED, "always", SAME, R.NO_ELIGIBLE_JOB),
    Row((S.PENDING,), C.CLAIM_OWNED, "nonce_stored", SAME, R.NONCE_REUSED),
    Row((S.PENDING,), C.CLAIM_OWNED, "other_queue", SAME, R.NOT_ELIGIBLE),
    Row((S.PENDING,), C.CLAIM_OWNED, "not_due", SAME, R.NOT_ELIGIBLE),
    Row((S.PENDING,), C.CLAIM_OWNED, "attempts_exhausted", SAME, R.NOT_ELIGIBLE),
    Row((S.PENDING,), C.CLAIM_OWNED, "generation_exhausted", SAME, R.GENERATION_EXHAUSTED),
    Row((S.PENDING,), C.CLAIM_OWNED, "always", S.CLAIMED, "claim_owned"),
    Row(_CLAIMED_OR_FINISHED, C.CLAIM_OWNED, "nonce_stored", SAME, R.NONCE_REUSED),
    Row(_CLAIMED_OR_FINISHED, C.CLAIM_OWNED, "always", SAME, R.NOT_ELIGIBLE),
    Row((S.ABSENT,), C.CLAIM_LEGACY, "always", SAME, R.NO_ELIGIBLE_JOB),
    Row((S.PENDING,), C.CLAIM_LEGACY, "protected", SAME, R.NOT_ELIGIBLE),
    Row((S.PENDING,), C.CLAIM_LEGACY, "other_queue", SAME, R.NOT_ELIGIBLE),
    Row((S.PENDING,), C.CLAIM_LEGACY, "not_due", SAME, R.NOT_ELIGIBLE),
    Row((S.PENDING,), C.CLAIM_LEGACY, "attempts_exhausted", SAME, R.NOT_ELIGIBLE),
    Row((S.PENDING,), C.CLAIM_LEGACY, "generation_exhausted", SAME, R.GENERATION_EXHAUSTED),
    Row((S.PENDING,), C.CLAIM_LEGACY, "always", S.CLAIMED, "claim_legacy"),
    Row(_CLAIMED_OR_FINISHED, C.CLAIM_LEGACY, "always", SAME, R.NOT_ELIGIBLE),
    Row(_NOT_CLAIMED, C.RECOVER_OWNED, "always", SAME, R.NO_LIVE_CLAIM),
    Row((S.CLAIMED,), C.RECOVER_OWNED, "owner_differs", SAME, R.NO_LIVE_CLAIM),
    Row((S.CLAIMED,), C.RECOVER_OWNED, "token_differs", SAME, R.NO_LIVE_CLAIM),
    Row((S.CLAIMED,), C.RECOVER_OWNED, "lease_not_live", SAME, R.NO_LIVE_CLAIM),
    Row((S.CLAIMED,), C.RECOVER_OWNED, "always", SAME, "recover"),
    Row((S.ABSENT,), C.EXPIRE_LEASE, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.EXPIRE_LEASE, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.EXPIRE_LEASE, "lease_live", SAME, R.LEASE_STILL_LIVE),
    Row((S.CLAIMED,), C.EXPIRE_LEASE, "cancel_requested", S.CANCELLED, "cancel_expired"),
    Row((S.CLAIMED,), C.EXPIRE_LEASE, "attempts_exhausted", S.FAILED, "fail_expired"),
    Row((S.CLAIMED,), C.EXPIRE_LEASE, "always", S.PENDING, "requeue_expired"),
    Row((S.ABSENT,), C.HEARTBEAT_OWNED, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.HEARTBEAT_OWNED, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.HEARTBEAT_OWNED, "fence_mismatch", SAME, R.STALE_FENCE),
    Row((S.CLAIMED,), C.HEARTBEAT_OWNED, "lease_not_live", SAME, R.LEASE_EXPIRED),
    Row((S.CLAIMED,), C.HEARTBEAT_OWNED, "always", SAME, "renew_lease"),
    Row((S.ABSENT,), C.COMPLETE_OWNED, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.COMPLETE_OWNED, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.COMPLETE_OWNED, "fence_mismatch", SAME, R.STALE_FENCE),
    Row((S.CLAIMED,), C.COMPLETE_OWNED, "lease_not_live", SAME, R.LEASE_EXPIRED),
    Row((S.CLAIMED,), C.COMPLETE_OWNED, "cancel_requested", SAME, R.CANCEL_REQUESTED),
    Row((S.CLAIMED,), C.COMPLETE_OWNED, "always", S.COMPLETED, "complete"),
    Row((S.ABSENT,), C.FAIL_OWNED, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.FAIL_OWNED, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.FAIL_OWNED, "fence_mismatch", SAME, R.STALE_FENCE),
    Row((S.CLAIMED,), C.FAIL_OWNED, "lease_not_live", SAME, R.LEASE_EXPIRED),
    Row((S.CLAIMED,), C.FAIL_OWNED, "cancel_requested", SAME, R.CANCEL_REQUESTED),
    Row((S.CLAIMED,), C.FAIL_OWNED, "retry_allowed", S.PENDING, "retry"),
    Row((S.CLAIMED,), C.FAIL_OWNED, "always", S.FAILED, "fail"),
    Row((S.ABSENT,), C.SET_PID_OWNED, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.SET_PID_OWNED, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.SET_PID_OWNED, "fence_mismatch", SAME, R.STALE_FENCE),
    Row((S.CLAIMED,), C.SET_PID_OWNED, "lease_not_live", SAME, R.LEASE_EXPIRED),
    Row((S.CLAIMED,), C.SET_PID_OWNED, "not_streaming", SAME, R.OPERATION_INELIGIBLE),
    Row((S.CLAIMED,), C.SET_PID_OWNED, "cancel_requested", SAME, R.CANCEL_REQUESTED),
    Row((S.CLAIMED,), C.SET_PID_OWNED, "always", SAME, "record_pid"),
    Row((S.ABSENT,), C.READ_STATE_OWNED, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.READ_STATE_OWNED, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.READ_STATE_OWNED, "fence_mismatch", SAME, R.STALE_FENCE),
    Row((S.CLAIMED,), C.READ_STATE_OWNED, "lease_not_live", SAME, R.LEASE_EXPIRED),
    Row((S.CLAIMED,), C.READ_STATE_OWNED, "not_streaming", SAME, R.OPERATION_INELIGIBLE),
    Row((S.CLAIMED,), C.READ_STATE_OWNED, "always", SAME, "read_state"),
    Row((S.ABSENT,), C.ACKNOWLEDGE_CANCEL_OWNED, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.ACKNOWLEDGE_CANCEL_OWNED, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.ACKNOWLEDGE_CANCEL_OWNED, "fence_mismatch", SAME, R.STALE_FENCE),
    Row((S.CLAIMED,), C.ACKNOWLEDGE_CANCEL_OWNED, "lease_not_live", SAME, R.LEASE_EXPIRED),
    Row((S.CLAIMED,), C.ACKNOWLEDGE_CANCEL_OWNED, "not_streaming", SAME, R.OPERATION_INELIGIBLE),
    Row((S.CLAIMED,), C.ACKNOWLEDGE_CANCEL_OWNED, "no_cancel_request", SAME, R.NO_CANCEL_REQUEST),
    Row((S.CLAIMED,), C.ACKNOWLEDGE_CANCEL_OWNED, "always", S.CANCELLED, "acknowledge_cancel"),
    Row((S.ABSENT,), C.RELEASE_OWNED, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.RELEASE_OWNED, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.RELEASE_OWNED, "fence_mismatch", SAME, R.STALE_FENCE),
    Row((S.CLAIMED,), C.RELEASE_OWNED, "lease_not_live", SAME, R.LEASE_EXPIRED),
    Row((S.CLAIMED,), C.RELEASE_OWNED, "cancel_requested", SAME, R.CANCEL_REQUESTED),
    Row((S.CLAIMED,), C.RELEASE_OWNED, "pid_recorded", SAME, R.OPERATION_INELIGIBLE),
    Row((S.CLAIMED,), C.RELEASE_OWNED, "delayed", S.PENDING, "release_later"),
    Row((S.CLAIMED,), C.RELEASE_OWNED, "always", S.PENDING, "release"),
    Row((S.ABSENT,), C.PROGRESS_OWNED, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.PROGRESS_OWNED, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.PROGRESS_OWNED, "fence_mismatch", SAME, R.STALE_FENCE),
    Row((S.CLAIMED,), C.PROGRESS_OWNED, "lease_not_live", SAME, R.LEASE_EXPIRED),
    Row((S.CLAIMED,), C.PROGRESS_OWNED, "not_task", SAME, R.OPERATION_INELIGIBLE),
    Row((S.CLAIMED,), C.PROGRESS_OWNED, "always", SAME, "record_progress"),
    Row((S.ABSENT,), C.REQUEST_CANCEL, "always", SAME, R.NOT_FOUND),
    Row((S.PENDING,), C.REQUEST_CANCEL, "not_streaming", SAME, R.OPERATION_INELIGIBLE),
    Row((S.PENDING,), C.REQUEST_CANCEL, "always", S.CANCELLED, "cancel"),
    Row((S.CLAIMED,), C.REQUEST_CANCEL, "not_streaming", SAME, R.OPERATION_INELIGIBLE),
    Row((S.CLAIMED,), C.REQUEST_CANCEL, "always", SAME, "request_cancel"),
    Row(_TERMINAL, C.REQUEST_CANCEL, "always", SAME, R.ALREADY_FINISHED),
    Row((S.ABSENT,), C.CANCEL_ADMIN, "always", SAME, R.NOT_FOUND),
    Row(_LIVE, C.CANCEL_ADMIN, "streaming", SAME, R.OPERATION_INELIGIBLE),
    Row(_LIVE, C.CANCEL_ADMIN, "always", S.CANCELLED, "cancel"),
    Row(_TERMINAL, C.CANCEL_ADMIN, "always", SAME, R.ALREADY_FINISHED),
    Row((S.ABSENT,), C.RETRY_FAILED, "always", SAME, R.NOT_FOUND),
    Row(_LIVE, C.RETRY_FAILED, "always", SAME, R.NOT_FINISHED),
    Row((S.COMPLETED, S.CANCELLED), C.RETRY_FAILED, "always", SAME, R.NOT_FAILED),
    Row((S.FAILED,), C.RETRY_FAILED, "streaming", SAME, R.OPERATION_INELIGIBLE),
    Row((S.FAILED,), C.RETRY_FAILED, "always", S.PENDING, "retry_failed"),
    Row((S.ABSENT,), C.HEARTBEAT_LEGACY, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.HEARTBEAT_LEGACY, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.HEARTBEAT_LEGACY, "protected", SAME, R.PROTECTED_ROW),
    Row((S.CLAIMED,), C.HEARTBEAT_LEGACY, "protected_or_owned", SAME, R.OWNED_INCARNATION),
    Row((S.CLAIMED,), C.HEARTBEAT_LEGACY, "owner_differs", SAME, R.OWNER_MISMATCH),
    Row((S.CLAIMED,), C.HEARTBEAT_LEGACY, "always", SAME, "renew_lease"),
    Row((S.ABSENT,), C.COMPLETE_LEGACY, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.COMPLETE_LEGACY, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.COMPLETE_LEGACY, "protected", SAME, R.PROTECTED_ROW),
    Row((S.CLAIMED,), C.COMPLETE_LEGACY, "protected_or_owned", SAME, R.OWNED_INCARNATION),
    Row((S.CLAIMED,), C.COMPLETE_LEGACY, "always", S.COMPLETED, "complete"),
    Row((S.ABSENT,), C.FAIL_LEGACY, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.FAIL_LEGACY, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.FAIL_LEGACY, "protected", SAME, R.PROTECTED_ROW),
    Row((S.CLAIMED,), C.FAIL_LEGACY, "protected_or_owned", SAME, R.OWNED_INCARNATION),
    Row((S.CLAIMED,), C.FAIL_LEGACY, "retry_allowed", S.PENDING, "retry"),
    Row((S.CLAIMED,), C.FAIL_LEGACY, "always", S.FAILED, "fail"),
    Row((S.ABSENT,), C.SET_PID_LEGACY, "always", SAME, R.NOT_FOUND),
    Row(_UNCLAIMED, C.SET_PID_LEGACY, "always", SAME, R.NOT_CLAIMED),
    Row((S.CLAIMED,), C.SET_PID_LEGACY, "protected", SAME, R.PROTECTED_ROW),
    Row((S.CLAIMED,), C.SET_PID_LEGACY, "protected_or_owned", SAME, R.OWNED_INCARNATION),
    Row((S.CLAIMED,), C.SET_PID_LEGACY, "not_streaming", SAME, R.OPERATION_INELIGIBLE),
    Row((S.CLAIMED,), C.SET_PID_LEGACY, "always", SAME, "record_pid"),
    Row((S.ABSENT,), C.DELETE_LEGACY, "always", SAME, R.NOT_FOUND),
    Row(_PRESENT, C.DELETE_LEGACY, "protected", SAME, R.PROTECTED_ROW),
    Row(_PRESENT, C.DELETE_LEGACY, "protected_or_owned", SAME, R.OWNED_INCARNATION),
    Row(_PRESENT, C.DELETE_LEGACY, "always", S.ABSENT, "delete"),
    Row((S.ABSENT,), C.PURGE_FINISHED, "always", SAME, R.NOT_FOUND),
    Row(_LIVE, C.PURGE_FINISHED, "always", SAME, R.NOT_FINISHED),
    Row(_TERMINAL, C.PURGE_FINISHED, "protected", SAME, R.PROTECTED_ROW),
    Row(_TERMINAL, C.PURGE_FINISHED, "finished_after_cutoff", SAME, R.RETAINED),
    Row(_TERMINAL, C.PURGE_FINISHED, "always", S.ABSENT, "delete"),
)


def claim_identity_problem(
    expected: QueueRow, stored_owner_id: object, stored_claim_token: object, stored_generation: object
) -> str | None:
    """After persisting a claim, compare what the database reads back with what was decided.

    A coercion, trigger or collation that changed the owner, token or generation means
    the claim must roll back whole (``claim_identity_changed``). Comparison is exact:
    ``str`` values by equality, the generation as a real ``int``.
    """
    if type(stored_owner_id) is not str or stored_owner_id != expected.owner_id:
        return "claim_identity_changed"
    if type(stored_claim_token) is not str or stored_claim_token != expected.claim_token:
        return "claim_identity_changed"
    if type(stored_generation) is not int or stored_generation != expected.generation:
        return "claim_identity_changed"
    return None


# --- Transition rules (checked by the contracts in queue_contracts and by the tests). --

_IDENTITY_FIELDS = (
    "queue", "job_id", "run_id", "submission_id", "fingerprint", "fence_required",
    "idempotency_key", "payload", "created_at_us", "max_attempts", "queue_name", "task_name", "priority",
)


def _presents_exact_live_fence(record: QueueRow, fence: Any, now_us: int) -> bool:
    # Written independently of fence_matches on purpose: a rule must not trust the code
    # it checks.
    parts_equal = (
        (fence.queue, fence.job_id, fence.owner_id, fence.claim_token)
        == (record.queue, record.job_id, record.owner_id, record.claim_token)
    )
    return (
        parts_equal
        and isinstance(fence.generation, int)
        and not isinstance(fence.generation, bool)
        and fence.generation == record.generation
        and record.status is JobStatus.CLAIMED
        and record.lease_expires_at_us is not None
        and now_us < record.lease_expires_at_us
    )


def transition_violations(
    record: QueueRow | None, command: Command, now_us: int, decision: Decision
) -> list[str]:
    """The transition rules (TR-Q1 ... TR-Q11 in specs/queue.md) a decision breaks."""
    if isinstance(decision, Refused):
        return []
    new = decision.new_record
    kind = command.kind
    broken: list[str] = []
    if record is None:
        if new is not None and (new.generation != 0 or new.status is not JobStatus.PENDING):
            broken.append("TR-Q1")  # a new row starts pending with generation 0
        return broken
    if new is None:
        if kind in (QueueCommandType.DELETE_LEGACY, QueueCommandType.PURGE_FINISHED) and (
            record.fence_required or is_currently_owned(record)
        ):
            broken.append("TR-Q9")  # deletion never removes protected or owned rows
        return broken
    claimed_now = kind in (QueueCommandType.CLAIM_OWNED, QueueCommandType.CLAIM_LEGACY)
    if new.generation != record.generation + (1 if claimed_now else 0) or (
        claimed_now and new.generation > bounds.INT64_MAX
    ):
        broken.append("TR-Q1")  # generation grows by exactly one per claim and never overflows
    if any(getattr(new, name) != getattr(record, name) for name in _IDENTITY_FIELDS):
        broken.append("TR-Q2")  # identity is fixed at insert (a legacy row is never promoted)
    if kind in FENCED_COMMANDS and not _presents_exact_live_fence(record, command.fence, now_us):  # type: ignore[union-attr]
        broken.append("TR-Q3")  # a fenced command applies only to its exact live claim
    retried_by_operator = kind is QueueCommandType.RETRY_FAILED
    if record.status in TERMINAL_STATUSES and new.status is not record.status and not (
        retried_by_operator and record.status is JobStatus.FAILED
    ):
        broken.append("TR-Q4")  # terminal is absorbing, but for an operator's retry of a failed job
    if retried_by_operator and not (
        record.status is JobStatus.FAILED
        and record.queue is not QueueKind.STREAMING
        and new.status is JobStatus.PENDING
        and new.attempts == 0
        and new.fires_at_us == now_us
    ):
        broken.append("TR-Q11")  # only a failed job is retried: pending at once, a fresh attempt budget
    if new.status in TERMINAL_STATUSES and record.status not in TERMINAL_STATUSES and new.active_key is not None:
        broken.append("TR-Q5")  # finishing releases the active key
    if record.status is JobStatus.CLAIMED and new.status is JobStatus.CLAIMED and (
        (new.owner_id, new.claim_token) != (record.owner_id, record.claim_token)
    ):
        broken.append("TR-Q6")  # a live claim never changes hands without a new claim
    if is_currently_owned(record) and record.cancel_requested and (
        new.status not in (JobStatus.CLAIMED, JobStatus.CANCELLED)
        or (new.status is JobStatus.CLAIMED and new.pid != record.pid)
    ):
        broken.append("TR-Q7")  # an owned cancel-requested stream only heartbeats or ends cancelled
    if claimed_now and not (
        record.status is JobStatus.PENDING
        and record.fires_at_us <= now_us
        and record.attempts < record.max_attempts
        and not (kind is QueueCommandType.CLAIM_OWNED and command.nonce_already_stored)  # type: ignore[union-attr]
        and not (kind is QueueCommandType.CLAIM_LEGACY and record.fence_required)
        and (command.queue_names is None or record.queue_name in command.queue_names)  # type: ignore[union-attr]
    ):
        broken.append("TR-Q8")  # a claim takes only a due, eligible row of its queues with a fresh nonce
    if kind is QueueCommandType.SUBMIT_OWNED and not (
        record.fence_required
        and record.submission_id == command.submission_id  # type: ignore[union-attr]
        and record.fingerprint == command.fingerprint  # type: ignore[union-attr]
    ):
        broken.append("TR-Q2")  # only the exact original is replayed
    if kind is QueueCommandType.RELEASE_OWNED and not (
        new.status is JobStatus.PENDING
        and new.attempts == max(0, record.attempts - 1)
        and new.fires_at_us == (now_us + command.delay_us if command.delay_us > 0  # type: ignore[union-attr]
                                else record.fires_at_us)
    ):
        broken.append("TR-Q10")  # a release gives the claim back as it was (due at once or after its delay), its attempt returned
    if kind is QueueCommandType.SUBMIT_LEGACY and record.fence_required:
        broken.append("TR-Q9")  # legacy paths never answer for a protected submission
    if kind in _LEGACY_WRITES and (record.fence_required or is_currently_owned(record)):
        broken.append("TR-Q9")  # legacy writes never touch protected or owned incarnations
    return broken


_LEGACY_WRITES = frozenset({
    QueueCommandType.HEARTBEAT_LEGACY,
    QueueCommandType.COMPLETE_LEGACY,
    QueueCommandType.FAIL_LEGACY,
    QueueCommandType.SET_PID_LEGACY,
    QueueCommandType.CLAIM_LEGACY,
    QueueCommandType.RELEASE_KEY_FOR_LEGACY,
})


COMPILED_COMMANDS: tuple[QueueCommandType, ...] = (
    QueueCommandType.HEARTBEAT_OWNED,
    QueueCommandType.COMPLETE_OWNED,
    QueueCommandType.FAIL_OWNED,
    QueueCommandType.RELEASE_OWNED,
    QueueCommandType.CLAIM_OWNED,
)
"""The hot commands whose decisions made ahead are compiled (:mod:`tenure.kernel.compiled`)."""


QUEUE = Machine.define(
    name="queue",
    states=QueueStep,
    commands=QueueCommandType,
    rows=ROWS,
    guards=GUARDS,
    effects=EFFECTS,
    outcomes=OUTCOMES,
    state_of=state_of,
    record_violations=record_violations,
    transition_violations=transition_violations,
    initial=QueueStep.ABSENT,
    rewrites={"claim_owned": CLAIM_OWNED_REWRITE, "claim_legacy": CLAIM_LEGACY_REWRITE},
    time_guards=TIME_GUARDS,
    moving_fields=MOVING_FIELDS,
    invariants_see_moving_fields_by_bounds=True,  # INV-Q1 bounds them; INV-Q2 asks only whether they are set
    compiled=COMPILED_COMMANDS,
)
"""The owned-queue machine: ``QUEUE.decide(record, command, now_us)`` is the decision
for ``command`` meeting ``record`` at database time ``now_us``.

The contract (checked by CrossHair through the typed entry points in
:mod:`tenure.kernel.queue.contracts`, and by the property tests): the transition rules
of :func:`transition_violations` hold for every record and command; for a valid record,
a well-formed command and ``MIN_INSTANT_US <= now_us <= MAX_NOW_US`` the new record is
valid too. The lines are not repeated as PEP 316 contracts because CrossHair enforces a
callee's contract inside its callers' analysis, which hides the callers' counterexamples."""


def deciders() -> dict[Any, Callable[..., Ahead | None]]:
    """``deciders()[kind](record, command, now_us)``: exactly
    ``decide_windowed(QUEUE, record, command, now_us)``, as one straight-line function per
    command generated from this machine's declarations (rendered for review in
    specs/compiled/queue.py; tests/kernel/test_compiled.py holds each equal to the
    reference). Each is generated on first use, once (:func:`~tenure.kernel.compiled.decider_of`,
    which the engine's decided-ahead statements call): importing the kernel does not pay for them."""
    found = {kind: decider_of(QUEUE, kind) for kind in COMPILED_COMMANDS}
    return {kind: decider for kind, decider in found.items() if decider is not None}  # every one is compiled
