"""Rows to kernel records and back: one mapping for every store.

A row is a mapping of column name to a plain value (instants already converted to
integer microseconds by the store). Values are checked, not coerced: a row whose
column holds a value of the wrong type (a float generation, a text flag) is corrupt
and raises, it is never silently turned into something the kernel would accept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tenure.kernel import JobRecord
from tenure.model import ErrorCode, JobStatus, QueueKind, TenureError

__all__ = [
    "columns_for",
    "record_from_row",
    "record_from_columns",
    "row_from_record",
    "MUTABLE_COLUMNS_FOR",
    "INSTANT_COLUMNS",
]

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


_STATUS_BY_VALUE = {status.value: status for status in JobStatus}
_SLOTS = {field: getattr(JobRecord, field) for field in JobRecord.__dataclass_fields__}

# (record field, column, kind) for every queue; kinds: text, text?, int, int?, flag.
_FIELD_PLAN = {
    queue: tuple(
        (field, column, kind)
        for field, column, kind in (
            ("job_id", "id", "text"),
            ("run_id", "run_id", "text?"),
            ("attempts", "attempt", "int"),
            ("max_attempts", "max_attempts", "int"),
            ("generation", "generation", "int"),
            ("owner_id", "claimed_by", "text?"),
            ("claim_token", "claim_token", "text?"),
            ("claimed_at_us", "claimed_at", "int?"),
            ("lease_expires_at_us", "lease_expires_at", "int?"),
            ("fires_at_us", "fires_at", "int"),
            ("created_at_us", "created_at", "int"),
            ("completed_at_us", "completed_at", "int?"),
            ("cancel_requested", "cancel_requested", "flag"),
            ("pid", "pid", "int?"),
            ("fence_required", "fence_required", "flag"),
            ("submission_id", "submission_id", "text?"),
            ("fingerprint", "fingerprint", "text?"),
            ("idempotency_key", "idempotency_key", "text?"),
            ("active_key", "active_key", "text?"),
            ("dlq_record_id", "dlq_record_id", "text?"),
            ("error_message", "error_message", "text?"),
            ("result_json", "result_json", "text?"),
            ("payload_json", "payload_json", "text"),
        )
        if column in _COLUMNS[queue]
    )
    for queue in QueueKind
}
_ABSENT_FIELDS = {
    queue: tuple(
        (field, False if field == "cancel_requested" else None)
        for field in ("run_id", "cancel_requested", "pid", "idempotency_key", "active_key", "dlq_record_id")
        if all(plan_field != field for plan_field, _, _ in _FIELD_PLAN[queue])
    )
    for queue in QueueKind
}
_TEXT, _OPTIONAL_TEXT, _INT, _OPTIONAL_INT, _FLAG = "text", "text?", "int", "int?", "flag"
_POSITIONAL_PLAN = {
    queue: tuple((_SLOTS[field].__set__, _COLUMNS[queue].index(column), kind) for field, column, kind in _FIELD_PLAN[queue])
    for queue in QueueKind
}
_STATUS_INDEX = {queue: _COLUMNS[queue].index("status") for queue in QueueKind}
_ABSENT_SETTERS = {queue: tuple((_SLOTS[field].__set__, value) for field, value in _ABSENT_FIELDS[queue]) for queue in QueueKind}
_SET_QUEUE = _SLOTS["queue"].__set__
_SET_STATUS = _SLOTS["status"].__set__


def record_from_columns(queue: QueueKind, values: Sequence[Any], offset: int = 0) -> JobRecord:
    """The same as :func:`record_from_row` for the values of :func:`columns_for` in order
    (from ``offset``), built slot by slot: the stores' hot path. The same checks, inline;
    tests/test_records.py holds the two equal, on good rows and on corrupt ones."""
    record = object.__new__(JobRecord)
    status_value = values[offset + _STATUS_INDEX[queue]]
    status = _STATUS_BY_VALUE.get(status_value) if type(status_value) is str else None
    if status is None:
        raise _corrupt()
    _SET_QUEUE(record, queue)
    _SET_STATUS(record, status)
    for set_slot, index, kind in _POSITIONAL_PLAN[queue]:
        value = values[offset + index]
        if kind is _FLAG:
            value = _flag(value)
        elif value is None:
            if kind is _TEXT or kind is _INT:
                raise _corrupt()
        elif type(value) is not (str if kind is _TEXT or kind is _OPTIONAL_TEXT else int):
            raise _corrupt()
        set_slot(record, value)
    for set_slot, value in _ABSENT_SETTERS[queue]:
        set_slot(record, value)
    return record


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
