"""Stored rows to kernel records: the stores' fast positional reader agrees with the plain
one, on good rows and on corrupt ones (a wrongly typed value is refused, never coerced)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from queue_strategies import records
from tenure.adapters.records import columns_for, record_from_columns, record_from_row, row_from_record
from tenure.kernel import JobRecord
from tenure.model import ErrorCode, QueueKind, TenureError

WRONG_VALUES = [None, "text", 7, 1.5, True, b"bytes", ["list"]]


def outcome(read: Any) -> JobRecord | str:
    try:
        return read()  # type: ignore[no-any-return]
    except TenureError as error:
        assert error.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
        return error.reason


@given(record=records().filter(lambda r: r is not None), offset=st.integers(0, 3))
def test_a_stored_record_reads_back_as_itself(record: JobRecord, offset: int) -> None:
    row = row_from_record(record)
    values = ["before"] * offset + [row[column] for column in columns_for(record.queue)]
    assert record_from_columns(record.queue, values, offset) == record
    assert record_from_row(record.queue, row) == record


@given(
    record=records().filter(lambda r: r is not None),
    data=st.data(),
)
def test_a_changed_value_reads_the_same_through_both_readers(record: JobRecord, data: st.DataObject) -> None:
    """Swap one column for a value of another type: both readers refuse it, or both accept
    it as the same record (SQLite's 0/1 flags are the one accepted spelling change)."""
    columns = columns_for(record.queue)
    row = row_from_record(record)
    column = data.draw(st.sampled_from(columns))
    row[column] = data.draw(st.sampled_from(WRONG_VALUES))
    by_columns = outcome(lambda: record_from_columns(record.queue, [row[c] for c in columns]))
    by_name = outcome(lambda: record_from_row(record.queue, row))
    assert by_columns == by_name


def test_wrongly_typed_values_are_corrupt_rows() -> None:
    """Concrete cases the property above must meet (so it cannot pass by refusing nothing)."""
    queue = QueueKind.VALIDATION
    columns = columns_for(queue)
    good = {
        "id": "job-1", "status": "pending", "payload_json": "{}", "fires_at": 1, "created_at": 1,
        "claimed_by": None, "claimed_at": None, "lease_expires_at": None, "completed_at": None,
        "attempt": 0, "max_attempts": 3, "error_message": None, "result_json": None, "generation": 0,
        "claim_token": None, "submission_id": None, "fingerprint": None, "fence_required": 0,
        "idempotency_key": None, "dlq_record_id": None,
    }
    assert record_from_columns(queue, [good[c] for c in columns]).fence_required is False
    for column, bad in [("generation", 1.0), ("generation", "0"), ("fires_at", None), ("status", "lost"),
                        ("fence_required", "false"), ("fence_required", 2), ("id", None), ("claimed_by", 5),
                        ("attempt", True)]:
        row = {**good, column: bad}
        assert outcome(lambda: record_from_columns(queue, [row[c] for c in columns])) == "corrupt_row", column
