"""The owned-queue job record and the invariants every stored record keeps.

A record is one row of a queue table, as plain values: statuses are enums, instants
are integer microseconds since the Unix epoch on the database clock. The kernel never
stores anything but records it has checked; adapters run :func:`record_violations` on
every row they read back (a pair assertion: the writer and the reader both check).
"""

from __future__ import annotations

import dataclasses
import enum

from tenure.model import JobStatus, QueueKind, bounds
from tenure.model.states import TERMINAL_STATUSES
from tenure.model.validation import is_queue_name

from ..core import replaced

__all__ = [
    "QueueRow",
    "QueueStep",
    "state_of",
    "replace_fields",
    "record_violations",
    "is_valid_record",
    "is_currently_owned",
    "dedupe_key_of",
    "MIN_INSTANT_US",
    "MAX_INSTANT_US",
]

# The instant bounds are the model's (every machine's); kept importable from here.
MIN_INSTANT_US = bounds.MIN_INSTANT_US
MAX_INSTANT_US = bounds.MAX_INSTANT_US


class QueueStep(enum.Enum):
    """The state a command meets: the record's status, or ``absent`` when there is no row."""

    ABSENT = "absent"
    PENDING = "pending"
    CLAIMED = "claimed"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueRow:
    """One queue row.

    Identity (fixed at insert): ``queue``, ``job_id``, ``run_id`` (pipeline only),
    ``submission_id``, ``fingerprint``, ``fence_required`` (an owned submission),
    ``idempotency_key``, ``payload`` (the envelope as the queue table's domain columns
    store it, in the table description's order: opaque to the kernel), ``created_at_us``,
    ``max_attempts``.

    Claim: ``generation`` counts every successful claim and never decreases;
    ``owner_id`` and ``claim_token`` name the most recent claim (a legacy claim stores no
    token) and stay after it ends, so a stored nonce remains detectable; ``claimed_at_us``
    is when it began; ``lease_expires_at_us`` is set exactly while claimed.

    Streaming: ``cancel_requested`` and ``pid`` only while claimed; ``active_key`` while
    the launch is pending or claimed (every kernel move into a terminal status releases it).

    Tasks: ``queue_name`` and ``task_name`` (identity: which task queue, which task;
    None on pycharter's queues),
    ``priority`` (identity: 0..100, higher claimed first; 0 elsewhere) and
    ``progress_json`` (what the handler last reported through a fenced progress write).
    """

    queue: QueueKind
    job_id: str
    run_id: str | None
    status: JobStatus
    attempts: int
    max_attempts: int
    generation: int
    owner_id: str | None
    claim_token: str | None
    claimed_at_us: int | None
    lease_expires_at_us: int | None
    fires_at_us: int
    created_at_us: int
    completed_at_us: int | None
    cancel_requested: bool
    pid: int | None
    fence_required: bool
    submission_id: str | None
    fingerprint: str | None
    idempotency_key: str | None
    active_key: str | None
    dlq_record_id: str | None
    error_message: str | None
    result_json: str | None
    payload: tuple[str | None, ...]
    queue_name: str | None = None
    task_name: str | None = None
    priority: int = 0
    progress_json: str | None = None


_STATE_OF_STATUS = {status: QueueStep(status.value) for status in JobStatus}


def state_of(record: QueueRow | None) -> QueueStep:
    """The table key for a record: its status, or ABSENT."""
    if record is None:
        return QueueStep.ABSENT
    return _STATE_OF_STATUS[record.status]


def replace_fields(record: QueueRow, **changes: object) -> QueueRow:
    """``dataclasses.replace`` for the decision's hot path (see :func:`tenure.kernel.core.replaced`)."""
    return replaced(record, changes)


def is_currently_owned(record: QueueRow) -> bool:
    """Claimed by an owned claim (a token is stored): legacy writes must not touch it."""
    return record.status is JobStatus.CLAIMED and record.claim_token is not None


def dedupe_key_of(record: QueueRow) -> str | None:
    """The key a legacy submission deduplicates on: the active key for streaming."""
    if record.queue is QueueKind.STREAMING:
        return record.active_key
    return record.idempotency_key


def _optional_text(value: object, max_chars: int) -> bool:
    return value is None or bounds.is_bounded_text(value, max_chars)


def _optional_instant(value: object) -> bool:
    return value is None or _instant(value)


_instant = bounds.is_instant


def _types_and_bounds(record: QueueRow) -> list[str]:
    """INV-Q1: every field has its type and bound."""
    checks = {
        "queue": type(record.queue) is QueueKind,
        "job_id": bounds.is_bounded_text(record.job_id, bounds.MAX_JOB_ID_CHARS),
        "run_id": _optional_text(record.run_id, bounds.MAX_RUN_ID_CHARS),
        "status": type(record.status) is JobStatus,
        "attempts": bounds.is_strict_int(record.attempts) and record.attempts >= 0,
        "max_attempts": bounds.is_strict_int(record.max_attempts)
        and 1 <= record.max_attempts <= bounds.INT32_MAX,
        "generation": bounds.is_strict_int(record.generation)
        and 0 <= record.generation <= bounds.INT64_MAX,
        "owner_id": _optional_text(record.owner_id, bounds.MAX_IDENTITY_CHARS),
        "claim_token": _optional_text(record.claim_token, bounds.MAX_IDENTITY_CHARS),
        "claimed_at_us": _optional_instant(record.claimed_at_us),
        "lease_expires_at_us": _optional_instant(record.lease_expires_at_us),
        "fires_at_us": _instant(record.fires_at_us),
        "created_at_us": _instant(record.created_at_us),
        "completed_at_us": _optional_instant(record.completed_at_us),
        "cancel_requested": type(record.cancel_requested) is bool,
        "pid": record.pid is None
        or (bounds.is_strict_int(record.pid) and 1 <= record.pid <= bounds.INT32_MAX),
        "fence_required": type(record.fence_required) is bool,
        "submission_id": _optional_text(record.submission_id, bounds.MAX_IDENTITY_CHARS),
        "fingerprint": _optional_text(record.fingerprint, bounds.MAX_IDENTITY_CHARS),
        "idempotency_key": _optional_text(record.idempotency_key, bounds.MAX_IDENTITY_CHARS),
        "active_key": record.active_key is None or type(record.active_key) is str,
        "dlq_record_id": _optional_text(record.dlq_record_id, bounds.MAX_DLQ_ID_CHARS),
        "error_message": record.error_message is None or type(record.error_message) is str,
        "result_json": record.result_json is None or type(record.result_json) is str,
        "payload": type(record.payload) is tuple
        and all(part is None or type(part) is str for part in record.payload),
        "queue_name": record.queue_name is None or is_queue_name(record.queue_name),
        "task_name": _optional_text(record.task_name, bounds.MAX_TASK_NAME_CHARS),
        "priority": bounds.is_strict_int(record.priority) and 0 <= record.priority <= bounds.MAX_PRIORITY,
        "progress_json": record.progress_json is None or type(record.progress_json) is str,
    }
    return [f"INV-Q1.{name}" for name, ok in checks.items() if not ok]


def record_violations(record: QueueRow) -> list[str]:
    """The invariants (``INV-Q1`` ... ``INV-Q10`` in specs/queue.md) this record breaks."""
    broken = _types_and_bounds(record)
    if broken:
        return broken
    claimed = record.status is JobStatus.CLAIMED
    terminal = record.status in TERMINAL_STATUSES
    streaming = record.queue is QueueKind.STREAMING
    task = record.queue is QueueKind.TASK
    rules = {
        # INV-Q2: a claim is live state: owner, start and lease exist exactly while claimed.
        "INV-Q2": (record.lease_expires_at_us is not None) == claimed
        and (not claimed or (record.owner_id is not None and record.claimed_at_us is not None)),
        # INV-Q3: a claimed row has been claimed within budget (attempts at least 1), and
        # its generation counts the claim, except a legacy claim made before the owned
        # migration (generation 0), which carries no token.
        "INV-Q3": not claimed
        or ((record.generation >= 1 or record.claim_token is None) and 1 <= record.attempts <= record.max_attempts),
        # INV-Q4: a pending row can still be claimed: attempts remain.
        "INV-Q4": record.status is not JobStatus.PENDING or record.attempts < record.max_attempts,
        # INV-Q5: cancel requests and PIDs exist only on a claimed streaming row.
        "INV-Q5": (not record.cancel_requested and record.pid is None) or (claimed and streaming),
        # INV-Q6: an owned submission carries its whole identity, a legacy row none of it.
        "INV-Q6": record.fence_required == (record.submission_id is not None)
        and record.fence_required == (record.fingerprint is not None),
        # INV-Q7: a token exists only with its owner, once the row has been claimed since
        # the owned migration (an owner without a token may date from before it).
        "INV-Q7": record.claim_token is None
        or (record.owner_id is not None and record.generation >= 1),
        # INV-Q8: only streaming launches have an active key. (The kernel releases it on
        # every move into a terminal status; rows written by older binaries may still hold
        # one, and the forced-rerun rules release it.)
        "INV-Q8": record.active_key is None or streaming,
        # INV-Q9: terminal exactly when finished; run IDs only on pipelines, DLQ IDs never on streams.
        "INV-Q9": (record.completed_at_us is not None) == terminal
        and (record.run_id is not None) == (record.queue is QueueKind.PIPELINE)
        and (record.dlq_record_id is None or not streaming),
        # INV-Q10: a task names its queue; priorities and progress exist only on tasks.
        "INV-Q10": (record.queue_name is not None) == task
        and (record.task_name is not None) == task
        and (task or (record.priority == 0 and record.progress_json is None)),
    }
    return [name for name, ok in rules.items() if not ok]


def is_valid_record(record: QueueRow) -> bool:
    """True when the record keeps every invariant."""
    return not record_violations(record)
