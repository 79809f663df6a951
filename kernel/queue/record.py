"""The owned-queue job record and the invariants every stored record keeps.

A record is one row of a queue table, as plain values: statuses are enums, instants
are integer microseconds since the Unix epoch on the database clock. The kernel never
stores anything but records it has checked; adapters run :func:`record_violations` on
every row they read back (a pair assertion: the writer and the reader both check).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

from tenure.model import JobStatus, QueueKind, bounds
from tenure.model.states import TERMINAL_STATUSES
from tenure.model.validation import is_queue_name

from ..core import Bound, Invariants, replaced

__all__ = [
    "QueueRow",
    "QueueStep",
    "state_of",
    "replace_fields",
    "record_violations",
    "is_valid_record",
    "is_currently_owned",
    "cancelled_while_claimed",
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


def cancelled_while_claimed(record: QueueRow, generation: int) -> bool:
    """The claim of ``generation`` ended by a cancel (the row is CANCELLED at that claim's
    own generation: cancelled while that claim held it, or after its lease ran out and
    before anyone claimed it again, which the holder learns the same way): what a
    worker's cancel watch asks of the rows it holds claims on."""
    return record.status is JobStatus.CANCELLED and record.generation == generation


def dedupe_key_of(record: QueueRow) -> str | None:
    """The key a legacy submission deduplicates on: the active key for streaming."""
    if record.queue is QueueKind.STREAMING:
        return record.active_key
    return record.idempotency_key


def _payload(value: object) -> bool:
    return type(value) is tuple and all(part is None or type(part) is str for part in value)


def _identity(optional: bool = True) -> Bound:
    return Bound("text", optional=optional, high=bounds.MAX_IDENTITY_CHARS)


_INSTANT = Bound("instant")
_OPTIONAL_INSTANT = Bound("instant", optional=True)
_OPTIONAL_STR = Bound("str", optional=True)

_FIELD_BOUNDS: dict[str, Bound] = {
    # INV-Q1: every field has its type and bound (a test of the field's value alone).
    "queue": Bound("type", of=QueueKind),
    "job_id": Bound("text", high=bounds.MAX_JOB_ID_CHARS),
    "run_id": Bound("text", optional=True, high=bounds.MAX_RUN_ID_CHARS),
    "status": Bound("type", of=JobStatus),
    "attempts": Bound("int", low=0),
    "max_attempts": Bound("int", low=1, high=bounds.INT32_MAX),
    "generation": Bound("int", low=0, high=bounds.INT64_MAX),
    "owner_id": _identity(),
    "claim_token": _identity(),
    "claimed_at_us": _OPTIONAL_INSTANT,
    "lease_expires_at_us": _OPTIONAL_INSTANT,
    "fires_at_us": _INSTANT,
    "created_at_us": _INSTANT,
    "completed_at_us": _OPTIONAL_INSTANT,
    "cancel_requested": Bound("type", of=bool),
    "pid": Bound("int", optional=True, low=1, high=bounds.INT32_MAX),
    "fence_required": Bound("type", of=bool),
    "submission_id": _identity(),
    "fingerprint": _identity(),
    "idempotency_key": _identity(),
    "active_key": _OPTIONAL_STR,
    "dlq_record_id": Bound("text", optional=True, high=bounds.MAX_DLQ_ID_CHARS),
    "error_message": _OPTIONAL_STR,
    "result_json": _OPTIONAL_STR,
    "payload": Bound("test", test=_payload),
    "queue_name": Bound("test", optional=True, test=is_queue_name),
    "task_name": Bound("text", optional=True, high=bounds.MAX_TASK_NAME_CHARS),
    "priority": Bound("int", low=0, high=bounds.MAX_PRIORITY),
    "progress_json": _OPTIONAL_STR,
}

_RULES: dict[str, Callable[[QueueRow], bool]] = {
    # INV-Q2: a claim is live state: owner, start and lease exist exactly while claimed.
    "INV-Q2": lambda record: (record.lease_expires_at_us is not None) == (record.status is JobStatus.CLAIMED)
    and (record.status is not JobStatus.CLAIMED or (record.owner_id is not None and record.claimed_at_us is not None)),
    # INV-Q3: a claimed row has been claimed within budget (attempts at least 1), and
    # its generation counts the claim, except a legacy claim made before the owned
    # migration (generation 0), which carries no token.
    "INV-Q3": lambda record: record.status is not JobStatus.CLAIMED
    or ((record.generation >= 1 or record.claim_token is None) and 1 <= record.attempts <= record.max_attempts),
    # INV-Q4: a pending row can still be claimed: attempts remain.
    "INV-Q4": lambda record: record.status is not JobStatus.PENDING or record.attempts < record.max_attempts,
    # INV-Q5: cancel requests and PIDs exist only on a claimed streaming row.
    "INV-Q5": lambda record: (not record.cancel_requested and record.pid is None)
    or (record.status is JobStatus.CLAIMED and record.queue is QueueKind.STREAMING),
    # INV-Q6: an owned submission carries its whole identity, a legacy row none of it.
    "INV-Q6": lambda record: record.fence_required == (record.submission_id is not None)
    and record.fence_required == (record.fingerprint is not None),
    # INV-Q7: a token exists only with its owner, once the row has been claimed since
    # the owned migration (an owner without a token may date from before it).
    "INV-Q7": lambda record: record.claim_token is None or (record.owner_id is not None and record.generation >= 1),
    # INV-Q8: only streaming launches have an active key. (The kernel releases it on
    # every move into a terminal status; rows written by older binaries may still hold
    # one, and the forced-rerun rules release it.)
    "INV-Q8": lambda record: record.active_key is None or record.queue is QueueKind.STREAMING,
    # INV-Q9: terminal exactly when finished; run IDs only on pipelines, DLQ IDs never on streams.
    "INV-Q9": lambda record: (record.completed_at_us is not None) == (record.status in TERMINAL_STATUSES)
    and (record.run_id is not None) == (record.queue is QueueKind.PIPELINE)
    and (record.dlq_record_id is None or record.queue is not QueueKind.STREAMING),
    # INV-Q10: a task names its queue; priorities and progress exist only on tasks.
    "INV-Q10": lambda record: (record.queue_name is not None) == (record.queue is QueueKind.TASK)
    and (record.task_name is not None) == (record.queue is QueueKind.TASK)
    and (record.queue is QueueKind.TASK or (record.priority == 0 and record.progress_json is None)),
}

record_violations = Invariants("INV-Q1", _FIELD_BOUNDS, _RULES)
"""The invariants (``INV-Q1`` ... ``INV-Q10`` in specs/queue.md) a record breaks, as a
list of their names: ``INV-Q1.<field>`` for each field out of its type or bound, else
each rule across fields it breaks. Declared as data (:class:`~tenure.kernel.core.Invariants`),
so a decision is checked on the fields it changed (:meth:`~tenure.kernel.core.Invariants.kept_where_changed`)."""


def is_valid_record(record: QueueRow) -> bool:
    """True when the record keeps every invariant."""
    return not record_violations(record)
