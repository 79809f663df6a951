"""Commands of the owned-queue machine, and the replies an applied command returns.

A command carries everything the kernel needs besides the record and the database
time: caller inputs (fence, result, retry flag), policy (lease, backoff) and
observations the adapter made under the same lock (whether a nonce is already stored).
Fresh identifiers are inputs too: the kernel never generates anything.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar

from tenure.model import QueueClaimFence, QueueKind, bounds
from tenure.model.bounds import MAX_INSTANT_US
from tenure.model.validation import is_queue_name

__all__ = [
    "ClaimFence",
    "QueueCommandType",
    "SubmitOwned",
    "SubmitLegacy",
    "ReleaseKeyForOwned",
    "ReleaseKeyForLegacy",
    "ClaimOwned",
    "ClaimLegacy",
    "RecoverOwned",
    "ExpireLease",
    "HeartbeatOwned",
    "CompleteOwned",
    "FailOwned",
    "SetPidOwned",
    "ReadStateOwned",
    "AcknowledgeCancelOwned",
    "ReleaseOwned",
    "ProgressOwned",
    "RequestCancel",
    "CancelAdmin",
    "RetryFailed",
    "HeartbeatLegacy",
    "CompleteLegacy",
    "FailLegacy",
    "SetPidLegacy",
    "DeleteLegacy",
    "PurgeFinished",
    "Command",
    "FENCED_COMMANDS",
    "Ack",
    "Submitted",
    "ClaimGranted",
    "StreamingStateReply",
    "Reply",
    "command_violations",
    "is_well_formed_command",
    "MAX_LEASE_US",
    "MAX_JITTER_PER_MILLE",
    "MAX_DELAY_US",
    "MAX_NOW_US",
]

MAX_LEASE_US = bounds.MAX_LEASE_SECONDS * 1_000_000

MAX_DELAY_US = bounds.MAX_BACKOFF_MS * 1000
"""The longest delay a submission may ask for (a year, like a backoff)."""

MAX_JITTER_PER_MILLE = 500
"""A retry's jitter takes at most half of its delay."""

MAX_NOW_US = MAX_INSTANT_US - MAX_LEASE_US - bounds.MAX_BACKOFF_MS * 1000
"""The latest database time the kernel accepts: late enough (year 9997) that a lease or a
backoff added to it is still a representable instant."""


class QueueCommandType(enum.Enum):
    """Every command of the queue machine; values are the names the spec table uses."""

    SUBMIT_OWNED = "submit_owned"
    SUBMIT_LEGACY = "submit_legacy"
    RELEASE_KEY_FOR_OWNED = "release_key_for_owned"
    RELEASE_KEY_FOR_LEGACY = "release_key_for_legacy"
    CLAIM_OWNED = "claim_owned"
    CLAIM_LEGACY = "claim_legacy"
    RECOVER_OWNED = "recover_owned"
    EXPIRE_LEASE = "expire_lease"
    HEARTBEAT_OWNED = "heartbeat_owned"
    COMPLETE_OWNED = "complete_owned"
    FAIL_OWNED = "fail_owned"
    SET_PID_OWNED = "set_pid_owned"
    READ_STATE_OWNED = "read_state_owned"
    ACKNOWLEDGE_CANCEL_OWNED = "acknowledge_cancel_owned"
    RELEASE_OWNED = "release_owned"
    PROGRESS_OWNED = "progress_owned"
    REQUEST_CANCEL = "request_cancel"
    CANCEL_ADMIN = "cancel_admin"
    RETRY_FAILED = "retry_failed"
    HEARTBEAT_LEGACY = "heartbeat_legacy"
    COMPLETE_LEGACY = "complete_legacy"
    FAIL_LEGACY = "fail_legacy"
    SET_PID_LEGACY = "set_pid_legacy"
    DELETE_LEGACY = "delete_legacy"
    PURGE_FINISHED = "purge_finished"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClaimFence:
    """The five fence parts as plain values.

    The public :class:`~tenure.model.QueueClaimFence` validates itself on construction;
    the kernel takes the parts unvalidated and compares them exactly, so its guarantee
    does not depend on how the fence was built (and CrossHair can reason about it).
    """

    queue: QueueKind
    job_id: str
    owner_id: str
    generation: int
    claim_token: str

    @classmethod
    def of(cls, fence: QueueClaimFence) -> ClaimFence:
        return cls(
            queue=fence.queue,
            job_id=fence.job_id,
            owner_id=fence.owner_id,
            generation=fence.generation,
            claim_token=fence.claim_token,
        )


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SubmitOwned:
    """Insert an owned submission, or replay it. Met with the row that shares an identity
    with the request (its submission ID first, else its job ID, run ID or idempotency key)."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.SUBMIT_OWNED
    queue: QueueKind
    submission_id: str
    fingerprint: str
    job_id: str
    run_id: str | None
    fires_at_us: int | None
    max_attempts: int
    idempotency_key: str | None
    active_key: str | None
    payload: tuple[str | None, ...]
    queue_name: str | None = None
    """Tasks only: the task queue the row joins."""
    task_name: str | None = None
    """Tasks only: the task's name."""
    priority: int = 0
    """Tasks only: 0..100, higher claimed first."""
    delay_us: int = 0
    """Without an authored ``fires_at``: due this long after the database time of the
    insert (a task deferred ``schedule_in`` seconds; its replays fingerprint the delay,
    not an instant that moves with the client's clock)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SubmitLegacy:
    """Insert an unprotected submission, or return the row already holding its key."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.SUBMIT_LEGACY
    queue: QueueKind
    job_id: str
    run_id: str | None
    fires_at_us: int | None
    max_attempts: int
    idempotency_key: str | None
    active_key: str | None
    payload: tuple[str | None, ...]
    queue_name: str | None = None
    task_name: str | None = None
    priority: int = 0
    delay_us: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseKeyForOwned:
    """An owned streaming submission meets the row holding its config's active key."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.RELEASE_KEY_FOR_OWNED
    force: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseKeyForLegacy:
    """A legacy forced streaming submission meets the row holding the active key."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.RELEASE_KEY_FOR_LEGACY


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClaimOwned:
    """Claim the met row (the next eligible candidate, or none) with a fresh nonce."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.CLAIM_OWNED
    owner_id: str
    claim_token: str
    nonce_already_stored: bool
    """Observed under the lock: some row of this queue already stores this token."""
    lease_us: int
    queue_names: tuple[str, ...] | None = None
    """Tasks: the task queues this claim serves (None: any row of the table)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ClaimLegacy:
    """Claim the met row without a token (legacy workers; never a protected row)."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.CLAIM_LEGACY
    owner_id: str
    lease_us: int
    queue_names: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RecoverOwned:
    """Read back the live claim made with this owner and nonce (read-only)."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.RECOVER_OWNED
    owner_id: str
    claim_token: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExpireLease:
    """Settle a claim whose lease has run out (the sweep before every claim)."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.EXPIRE_LEASE


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatOwned:
    kind: ClassVar[QueueCommandType] = QueueCommandType.HEARTBEAT_OWNED
    fence: ClaimFence
    lease_us: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CompleteOwned:
    kind: ClassVar[QueueCommandType] = QueueCommandType.COMPLETE_OWNED
    fence: ClaimFence
    result_json: str | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FailOwned:
    kind: ClassVar[QueueCommandType] = QueueCommandType.FAIL_OWNED
    fence: ClaimFence
    error_message: str
    retry: bool
    dlq_record_id: str | None
    backoff_base_ms: int
    backoff_max_ms: int
    jitter_per_mille: int = 0
    """A retry's delay is shortened by this many thousandths (0..500), drawn by the caller
    (the kernel generates nothing): tasks failing together do not retry together."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SetPidOwned:
    kind: ClassVar[QueueCommandType] = QueueCommandType.SET_PID_OWNED
    fence: ClaimFence
    pid: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReadStateOwned:
    kind: ClassVar[QueueCommandType] = QueueCommandType.READ_STATE_OWNED
    fence: ClaimFence


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AcknowledgeCancelOwned:
    kind: ClassVar[QueueCommandType] = QueueCommandType.ACKNOWLEDGE_CANCEL_OWNED
    fence: ClaimFence


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReleaseOwned:
    """Give the exact current live claim back unfinished (a worker shutting down): the
    job is pending again at once and the attempt the claim spent is returned."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.RELEASE_OWNED
    fence: ClaimFence
    delay_us: int = 0
    """Due again this long after the database time (0: at its original due time, at
    once): a worker that cannot run the job (a Run hop of a workflow version it does not
    serve) gives it back for another worker without claiming it again at once itself."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProgressOwned:
    """Record a task handler's progress report (a small JSON text) on its live claim."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.PROGRESS_OWNED
    fence: ClaimFence
    progress_json: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RequestCancel:
    """Administrative cancel of a stream: pending ends at once, claimed gets a request."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.REQUEST_CANCEL


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CancelAdmin:
    """Administrative cancel of a validation or pipeline job; voids any live fence."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.CANCEL_ADMIN


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RetryFailed:
    """Administrative retry of a failed validation or pipeline job: pending again at
    once with a fresh attempt budget (the only way out of a terminal status)."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.RETRY_FAILED


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class HeartbeatLegacy:
    kind: ClassVar[QueueCommandType] = QueueCommandType.HEARTBEAT_LEGACY
    owner_id: str
    lease_us: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CompleteLegacy:
    kind: ClassVar[QueueCommandType] = QueueCommandType.COMPLETE_LEGACY
    result_json: str | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FailLegacy:
    kind: ClassVar[QueueCommandType] = QueueCommandType.FAIL_LEGACY
    error_message: str
    retry: bool
    dlq_record_id: str | None
    backoff_base_ms: int
    backoff_max_ms: int
    jitter_per_mille: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SetPidLegacy:
    kind: ClassVar[QueueCommandType] = QueueCommandType.SET_PID_LEGACY
    pid: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeleteLegacy:
    kind: ClassVar[QueueCommandType] = QueueCommandType.DELETE_LEGACY


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PurgeFinished:
    """Retention: delete a finished, unprotected row that finished before the cutoff."""

    kind: ClassVar[QueueCommandType] = QueueCommandType.PURGE_FINISHED
    older_than_us: int


Command = (
    SubmitOwned | SubmitLegacy | ReleaseKeyForOwned | ReleaseKeyForLegacy | ClaimOwned
    | ClaimLegacy | RecoverOwned | ExpireLease | HeartbeatOwned | CompleteOwned | FailOwned
    | SetPidOwned | ReadStateOwned | AcknowledgeCancelOwned | ReleaseOwned | ProgressOwned | RequestCancel | CancelAdmin | RetryFailed
    | HeartbeatLegacy | CompleteLegacy | FailLegacy | SetPidLegacy | DeleteLegacy | PurgeFinished
)

FENCED_COMMANDS = frozenset({
    QueueCommandType.HEARTBEAT_OWNED,
    QueueCommandType.COMPLETE_OWNED,
    QueueCommandType.FAIL_OWNED,
    QueueCommandType.SET_PID_OWNED,
    QueueCommandType.READ_STATE_OWNED,
    QueueCommandType.ACKNOWLEDGE_CANCEL_OWNED,
    QueueCommandType.RELEASE_OWNED,
    QueueCommandType.PROGRESS_OWNED,
})
"""Commands that present a fence and may apply only while it matches a live claim."""


@dataclasses.dataclass(frozen=True, slots=True)
class Ack:
    """The exact mutation applied (the caller sees True)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Submitted:
    """The submission's stored IDs; ``replayed`` when the row already existed."""

    job_id: str
    run_id: str | None
    replayed: bool


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimGranted:
    """The new record is the live claim (a fresh claim, or a recovered one)."""


@dataclasses.dataclass(frozen=True, slots=True)
class StreamingStateReply:
    cancel_requested: bool
    pid: int | None


Reply = Ack | Submitted | ClaimGranted | StreamingStateReply


# --- Well-formedness: what the kernel requires of a command (checked by its contract). --


def _text(value: object, max_chars: int) -> bool:
    return bounds.is_bounded_text(value, max_chars)


def _optional_text(value: object, max_chars: int) -> bool:
    return value is None or _text(value, max_chars)


_instant = bounds.is_instant


def _submission_violations(command: SubmitOwned | SubmitLegacy) -> list[str]:
    queue = command.queue
    checks = {
        "queue": type(queue) is QueueKind,
        "job_id": _text(command.job_id, bounds.MAX_JOB_ID_CHARS),
        "run_id": _text(command.run_id, bounds.MAX_RUN_ID_CHARS)
        if queue is QueueKind.PIPELINE
        else command.run_id is None,
        "fires_at_us": command.fires_at_us is None or _instant(command.fires_at_us),
        "max_attempts": bounds.is_strict_int(command.max_attempts)
        and 1 <= command.max_attempts <= bounds.INT32_MAX,
        "idempotency_key": command.idempotency_key is None
        if queue is QueueKind.STREAMING
        else _optional_text(command.idempotency_key, bounds.MAX_IDENTITY_CHARS),
        "active_key": type(command.active_key) is str
        if queue is QueueKind.STREAMING
        else command.active_key is None,
        "payload": type(command.payload) is tuple
        and all(part is None or type(part) is str for part in command.payload),
        "queue_name": is_queue_name(command.queue_name) if queue is QueueKind.TASK else command.queue_name is None,
        "task_name": _text(command.task_name, bounds.MAX_TASK_NAME_CHARS) if queue is QueueKind.TASK
        else command.task_name is None,
        "priority": bounds.is_strict_int(command.priority)
        and (0 <= command.priority <= bounds.MAX_PRIORITY if queue is QueueKind.TASK else command.priority == 0),
        "delay_us": bounds.is_strict_int(command.delay_us) and 0 <= command.delay_us <= MAX_DELAY_US
        and (command.delay_us == 0 or command.fires_at_us is None),
    }
    if isinstance(command, SubmitOwned):
        checks["submission_id"] = _text(command.submission_id, bounds.MAX_IDENTITY_CHARS)
        checks["fingerprint"] = _text(command.fingerprint, bounds.MAX_IDENTITY_CHARS)
    return [name for name, ok in checks.items() if not ok]


def _lease(value: object) -> bool:
    return bounds.is_strict_int(value) and 1 <= value <= MAX_LEASE_US  # type: ignore[operator]


def _backoff(command: FailOwned | FailLegacy) -> bool:
    return (
        bounds.is_strict_int(command.backoff_base_ms)
        and bounds.is_strict_int(command.backoff_max_ms)
        and 0 <= command.backoff_base_ms <= command.backoff_max_ms <= bounds.MAX_BACKOFF_MS
    )


def _failure(command: FailOwned | FailLegacy) -> bool:
    return (
        type(command.error_message) is str
        and type(command.retry) is bool
        and _optional_text(command.dlq_record_id, bounds.MAX_DLQ_ID_CHARS)
        and _backoff(command)
        and bounds.is_strict_int(command.jitter_per_mille)
        and 0 <= command.jitter_per_mille <= MAX_JITTER_PER_MILLE
    )


def _queue_names(value: object) -> bool:
    return value is None or (
        type(value) is tuple and len(value) > 0 and all(is_queue_name(name) for name in value)
    )


def _pid(value: object) -> bool:
    return bounds.is_strict_int(value) and 1 <= value <= bounds.INT32_MAX  # type: ignore[operator]


def _fence(value: object) -> bool:
    return (
        type(value) is ClaimFence
        and type(value.queue) is QueueKind
        and _text(value.job_id, bounds.MAX_JOB_ID_CHARS)
        and _text(value.owner_id, bounds.MAX_IDENTITY_CHARS)
        and bounds.is_strict_int(value.generation)
        and 1 <= value.generation <= bounds.INT64_MAX
        and _text(value.claim_token, bounds.MAX_IDENTITY_CHARS)
    )


def command_violations(command: Command) -> list[str]:
    """The fields of ``command`` outside their type or bound (empty when well formed)."""
    if isinstance(command, (SubmitOwned, SubmitLegacy)):
        return _submission_violations(command)
    checks: dict[str, bool]
    if isinstance(command, ReleaseKeyForOwned):
        checks = {"force": type(command.force) is bool}
    elif isinstance(command, ClaimOwned):
        checks = {
            "owner_id": _text(command.owner_id, bounds.MAX_IDENTITY_CHARS),
            "claim_token": _text(command.claim_token, bounds.MAX_IDENTITY_CHARS),
            "nonce_already_stored": type(command.nonce_already_stored) is bool,
            "lease_us": _lease(command.lease_us),
            "queue_names": _queue_names(command.queue_names),
        }
    elif isinstance(command, ClaimLegacy):
        checks = {
            "owner_id": _text(command.owner_id, bounds.MAX_IDENTITY_CHARS),
            "lease_us": _lease(command.lease_us),
            "queue_names": _queue_names(command.queue_names),
        }
    elif isinstance(command, HeartbeatLegacy):
        checks = {
            "owner_id": _text(command.owner_id, bounds.MAX_IDENTITY_CHARS),
            "lease_us": _lease(command.lease_us),
        }
    elif isinstance(command, RecoverOwned):
        checks = {
            "owner_id": _text(command.owner_id, bounds.MAX_IDENTITY_CHARS),
            "claim_token": _text(command.claim_token, bounds.MAX_IDENTITY_CHARS),
        }
    elif isinstance(command, HeartbeatOwned):
        checks = {"fence": _fence(command.fence), "lease_us": _lease(command.lease_us)}
    elif isinstance(command, CompleteOwned):
        checks = {
            "fence": _fence(command.fence),
            "result_json": command.result_json is None or type(command.result_json) is str,
        }
    elif isinstance(command, FailOwned):
        checks = {"fence": _fence(command.fence), "failure": _failure(command)}
    elif isinstance(command, SetPidOwned):
        checks = {"fence": _fence(command.fence), "pid": _pid(command.pid)}
    elif isinstance(command, ProgressOwned):
        checks = {"fence": _fence(command.fence), "progress_json": type(command.progress_json) is str}
    elif isinstance(command, ReleaseOwned):
        checks = {"fence": _fence(command.fence),
                  "delay_us": bounds.is_strict_int(command.delay_us) and 0 <= command.delay_us <= MAX_DELAY_US}
    elif isinstance(command, (ReadStateOwned, AcknowledgeCancelOwned)):
        checks = {"fence": _fence(command.fence)}
    elif isinstance(command, CompleteLegacy):
        checks = {"result_json": command.result_json is None or type(command.result_json) is str}
    elif isinstance(command, FailLegacy):
        checks = {"failure": _failure(command)}
    elif isinstance(command, SetPidLegacy):
        checks = {"pid": _pid(command.pid)}
    elif isinstance(command, PurgeFinished):
        checks = {"older_than_us": _instant(command.older_than_us)}
    else:
        checks = {}  # ReleaseKeyForLegacy, ExpireLease, RequestCancel, CancelAdmin, RetryFailed, DeleteLegacy
    return [name for name, ok in checks.items() if not ok]


def is_well_formed_command(command: Command) -> bool:
    """True when every field of ``command`` is within its type and bound."""
    return not command_violations(command)
