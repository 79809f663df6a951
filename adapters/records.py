"""Rows to kernel records and back: one mapping for every store.

A row is a mapping of column name to a plain value (instants already converted to
integer microseconds by the store). Values are checked, not coerced: a row whose
column holds a value of the wrong type (a float generation, a text flag) is corrupt
and raises, it is never silently turned into something the kernel would accept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tenure.kernel import JobRecord
from tenure.model import ErrorCode, JobStatus, QueueKind, TenureError

__all__ = ["columns_for", "record_from_row", "row_from_record", "MUTABLE_COLUMNS_FOR", "INSTANT_COLUMNS"]

_COMMON = (
    "id", "status", "payload_json", "fires_at", "created_at", "claimed_by", "claimed_at",
    "lease_expires_at", "completed_at", "attempt", "max_attempts", "error_message",
    "result_json", "generation", "claim_token", "submission_id", "fingerprint", "fence_required",
)
_EXTRA = {
    QueueKind.VALIDATION: ("idempotency_key", "dlq_record_id"),
    QueueKind.PIPELINE: ("run_id", "idempotency_key", "dlq_record_id"),
    QueueKind.STREAMING: ("active_key", "cancel_requested", "pid"),
}
_IDENTITY = ("id", "run_id", "payload_json", "created_at", "max_attempts", "submission_id", "fingerprint", "fence_required", "idempotency_key")

INSTANT_COLUMNS = frozenset({"fires_at", "created_at", "claimed_at", "lease_expires_at", "completed_at"})

_COLUMNS = {queue: _COMMON + _EXTRA[queue] for queue in QueueKind}

MUTABLE_COLUMNS_FOR: dict[QueueKind, tuple[str, ...]] = {
    queue: tuple(column for column in _COLUMNS[queue] if column not in _IDENTITY) for queue in QueueKind
}
"""Columns a decision may change; the compare-and-set compares all of them."""


def columns_for(queue: QueueKind) -> tuple[str, ...]:
    return _COLUMNS[queue]


def _corrupt() -> TenureError:
    return TenureError(ErrorCode.QUEUE_PERSISTENCE_FAILED, "corrupt_row")


def _text(value: Any, *, optional: bool = True) -> Any:
    if value is None and optional:
        return None
    if type(value) is not str:
        raise _corrupt()
    return value


def _integer(value: Any, *, optional: bool = False) -> Any:
    if value is None and optional:
        return None
    if type(value) is not int:
        raise _corrupt()
    return value


def _flag(value: Any) -> bool:
    # SQLite stores booleans as 0/1 integers, PostgreSQL returns bool.
    if value is True or value == 1 and type(value) is int:
        return True
    if value is False or value == 0 and type(value) is int:
        return False
    raise _corrupt()


def record_from_row(queue: QueueKind, row: Mapping[str, Any]) -> JobRecord:
    """The kernel record a stored row holds (raises ``corrupt_row`` on a wrongly typed value)."""
    try:
        status = JobStatus(row["status"])
    except (ValueError, KeyError):
        raise _corrupt() from None
    streaming = queue is QueueKind.STREAMING
    return JobRecord(
        queue=queue,
        job_id=_text(row["id"], optional=False),
        run_id=_text(row["run_id"]) if queue is QueueKind.PIPELINE else None,
        status=status,
        attempts=_integer(row["attempt"]),
        max_attempts=_integer(row["max_attempts"]),
        generation=_integer(row["generation"]),
        owner_id=_text(row["claimed_by"]),
        claim_token=_text(row["claim_token"]),
        claimed_at_us=_integer(row["claimed_at"], optional=True),
        lease_expires_at_us=_integer(row["lease_expires_at"], optional=True),
        fires_at_us=_integer(row["fires_at"]),
        created_at_us=_integer(row["created_at"]),
        completed_at_us=_integer(row["completed_at"], optional=True),
        cancel_requested=_flag(row["cancel_requested"]) if streaming else False,
        pid=_integer(row["pid"], optional=True) if streaming else None,
        fence_required=_flag(row["fence_required"]),
        submission_id=_text(row["submission_id"]),
        fingerprint=_text(row["fingerprint"]),
        idempotency_key=None if streaming else _text(row["idempotency_key"]),
        active_key=_text(row["active_key"]) if streaming else None,
        dlq_record_id=None if streaming else _text(row["dlq_record_id"]),
        error_message=_text(row["error_message"]),
        result_json=_text(row["result_json"]),
        payload_json=_text(row["payload_json"], optional=False),
    )


def row_from_record(record: JobRecord) -> dict[str, Any]:
    """The column values that store ``record`` (instants as integer microseconds)."""
    row: dict[str, Any] = {
        "id": record.job_id,
        "status": record.status.value,
        "payload_json": record.payload_json,
        "fires_at": record.fires_at_us,
        "created_at": record.created_at_us,
        "claimed_by": record.owner_id,
        "claimed_at": record.claimed_at_us,
        "lease_expires_at": record.lease_expires_at_us,
        "completed_at": record.completed_at_us,
        "attempt": record.attempts,
        "max_attempts": record.max_attempts,
        "error_message": record.error_message,
        "result_json": record.result_json,
        "generation": record.generation,
        "claim_token": record.claim_token,
        "submission_id": record.submission_id,
        "fingerprint": record.fingerprint,
        "fence_required": record.fence_required,
    }
    if record.queue is QueueKind.PIPELINE:
        row["run_id"] = record.run_id
    if record.queue is QueueKind.STREAMING:
        row["active_key"] = record.active_key
        row["cancel_requested"] = record.cancel_requested
        row["pid"] = record.pid
    else:
        row["idempotency_key"] = record.idempotency_key
        row["dlq_record_id"] = record.dlq_record_id
    return row
