"""Stored rows to kernel records and back, through the table descriptions' codecs: every
record reads back as itself on both databases; a wrongly typed or shaped value is
refused as ``corrupt_row``, never coerced; SQLite instants are SQLAlchemy's DATETIME text."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure.adapters.core.tables import (
    POSTGRESQL_DIALECT,
    SQLITE_DIALECT,
    Dialect,
    instant_from_sqlite_text,
    instant_to_sqlite_text,
)
from tenure.adapters.queue.table import QUEUE_TABLES, binding_for, envelope_of, queue_codec
from tenure.conformance.strategies.queues import records
from tenure.kernel.queue.record import MAX_INSTANT_US, MIN_INSTANT_US, QueueRow
from tenure.model import ErrorCode, JobStatus, QueueKind, TenureError

DIALECTS = [SQLITE_DIALECT, POSTGRESQL_DIALECT]
WRONG_VALUES = [None, "text", 7, 1.5, True, b"bytes", b"\xff not utf-8", ["list"]]
EPOCH = dt.datetime(1970, 1, 1)


def outcome(read: Any) -> QueueRow | str:
    try:
        return read()  # type: ignore[no-any-return]
    except TenureError as error:
        assert error.code is ErrorCode.QUEUE_PERSISTENCE_FAILED
        return error.reason


def stored_values(record: QueueRow, dialect: Dialect) -> list[Any]:
    codec = queue_codec(record.queue, dialect)
    row = codec.write(record)
    return [row[column] for column in codec.spec.column_names]


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@given(record=records().filter(lambda r: r is not None), offset=st.integers(0, 3))
def test_a_stored_record_reads_back_as_itself(dialect: Dialect, record: QueueRow, offset: int) -> None:
    values = ["before"] * offset + stored_values(record, dialect)
    assert queue_codec(record.queue, dialect).read(values, offset) == record


def acceptable(column: Any, value: object, dialect: Dialect) -> bool:
    """Written independently of the codec: may this stored value hold this column?"""
    base, optional = column.codec.base, column.codec.optional
    if value is None:
        return optional
    if base == "flag":
        return value is True or value is False or (type(value) is int and value in (0, 1))
    if base == "int":
        return type(value) is int
    if base == "instant":
        if dialect is SQLITE_DIALECT:
            return type(value) is str and len(value) == 26 and value[4] == "-" and value[19] == "."
        return type(value) is int
    if base == "enum":
        return type(value) is str and value in {member.value for member in column.choices}
    if base == "json" and dialect is SQLITE_DIALECT and type(value) is bytes:
        # SQLite keeps a bare JSON number's text as a BLOB (its NUMERIC affinity would
        # convert the text): a BLOB of UTF-8 text is JSON text there.
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True
    return type(value) is str


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@given(record=records().filter(lambda r: r is not None), data=st.data())
def test_a_value_of_another_type_is_refused_exactly_when_the_column_cannot_hold_it(
    dialect: Dialect, record: QueueRow, data: st.DataObject
) -> None:
    values = stored_values(record, dialect)
    index = data.draw(st.integers(0, len(values) - 1))
    values[index] = data.draw(st.sampled_from(WRONG_VALUES))
    read = outcome(lambda: queue_codec(record.queue, dialect).read(values, 0))
    column = binding_for(record.queue).spec.columns[index]
    assert (read == "corrupt_row") == (not acceptable(column, values[index], dialect))


@pytest.mark.parametrize("text", ["42", "-7", "1.0", "1e+16", "12345678901234567890", "0.30000000000000004"])
def test_on_sqlite_a_bare_json_number_is_stored_as_a_blob_of_its_text_and_read_back_as_written(text: str) -> None:
    """A column declared JSON has NUMERIC affinity on SQLite: the text of a number would
    be stored as an INTEGER or a REAL ("1.0" as 1, a 20-digit integer rounded). A BLOB is
    never converted, so the text reads back exactly; other JSON texts stay text."""
    import sqlite3

    stored = SQLITE_DIALECT.json_to_stored(text)
    assert stored == text.encode()
    connection = sqlite3.connect(":memory:")
    connection.execute("CREATE TABLE t (result_json JSON)")
    connection.execute("INSERT INTO t VALUES (?)", (stored,))
    assert connection.execute("SELECT count(*) FROM t WHERE result_json = ?", (stored,)).fetchone() == (1,)
    [(value,)] = connection.execute("SELECT result_json FROM t").fetchall()
    assert SQLITE_DIALECT.json_from_stored(value) == text
    for other in ('{"a":1}', "[1]", '"42"', "true", "false", "null"):
        assert SQLITE_DIALECT.json_to_stored(other) == other
    assert POSTGRESQL_DIALECT.json_to_stored(text) == text


def test_wrongly_typed_values_are_corrupt_rows() -> None:
    """Concrete cases the property above must meet (so it cannot pass by refusing nothing)."""
    spec = QUEUE_TABLES[QueueKind.VALIDATION]
    good = {
        "id": "job-1", "contract_name": "c", "contract_version": "1", "data_json": '{"data_source":"s"}',
        "status": "pending", "fires_at": "2026-01-01 00:00:00.000000", "claimed_by": None, "claimed_at": None,
        "lease_expires_at": None, "dlq_record_id": None, "attempt": 0, "max_attempts": 3, "error_message": None,
        "idempotency_key": None, "created_at": "2026-01-01 00:00:00.000000", "completed_at": None,
        "result_json": None, "generation": 0, "claim_token": None, "submission_id": None, "fingerprint": None,
        "fence_required": 0, "authored_json": None,
    }
    codec = queue_codec(QueueKind.VALIDATION, SQLITE_DIALECT)
    assert codec.read([good[c] for c in spec.column_names], 0).fence_required is False
    for column, bad in [("generation", 1.0), ("generation", "0"), ("fires_at", None), ("status", "lost"),
                        ("fence_required", "false"), ("fence_required", 2), ("id", None), ("claimed_by", 5),
                        ("attempt", True), ("created_at", None), ("fires_at", 1_700_000_000),
                        ("fires_at", "2026-01-01T00:00:00"), ("fires_at", "2026-02-30 00:00:00.000000"),
                        ("fires_at", "2026-01-01 00:00:00"), ("data_json", 3)]:
        row = {**good, column: bad}
        assert outcome(lambda: codec.read([row[c] for c in spec.column_names], 0)) == "corrupt_row", column


@given(micros=st.integers(MIN_INSTANT_US, MAX_INSTANT_US))
def test_sqlite_datetime_text_is_sqlalchemys_and_round_trips(micros: int) -> None:
    text = instant_to_sqlite_text(micros)
    assert instant_from_sqlite_text(text) == micros
    # Exactly SQLAlchemy's SQLite DATETIME storage format for the same UTC instant.
    expected = EPOCH + dt.timedelta(microseconds=micros)
    assert text == (
        f"{expected.year:04d}-{expected.month:02d}-{expected.day:02d} "
        f"{expected.hour:02d}:{expected.minute:02d}:{expected.second:02d}.{expected.microsecond:06d}"
    )


@given(first=st.integers(MIN_INSTANT_US, MAX_INSTANT_US), second=st.integers(MIN_INSTANT_US, MAX_INSTANT_US))
def test_sqlite_datetime_text_orders_as_its_instants(first: int, second: int) -> None:
    """SQL compares these texts (fires_at <= now): their order must be the instants' order."""
    assert (instant_to_sqlite_text(first) < instant_to_sqlite_text(second)) == (first < second)


def _validation_record(payload: tuple[str | None, ...]) -> QueueRow:
    return QueueRow(
        queue=QueueKind.VALIDATION, job_id="job-1", run_id=None, status=JobStatus.PENDING, attempts=0,
        max_attempts=5, generation=0, owner_id=None, claim_token=None, claimed_at_us=None,
        lease_expires_at_us=None, fires_at_us=0, created_at_us=0, completed_at_us=None, cancel_requested=False,
        pid=None, fence_required=False, submission_id=None, fingerprint=None, idempotency_key=None,
        active_key=None, dlq_record_id=None, error_message=None, result_json=None, payload=payload,
    )


@pytest.mark.parametrize(
    "payload",
    [
        ("c", "1", "not json", None),
        ("c", "1", "[1, 2]", None),
        ("c", "1", '{"options": {}}', None),
        ("c", "1", '{"data_source": 5}', None),
        ("c", "1", '{"data_source": "s", "options": [1]}', None),
        ("c", "1", '{"data_source": "s"}', '{"fires_at": "yesterday"}'),
        ("c", "", '{"data_source": "s"}', None),
    ],
)
def test_a_payload_that_is_not_an_envelope_is_a_corrupt_row(payload: tuple[str | None, ...]) -> None:
    record = _validation_record(payload)
    assert outcome(lambda: envelope_of(record)) == "corrupt_row"  # type: ignore[arg-type, return-value]


def test_a_pycharter_payload_reads_as_its_envelope() -> None:
    record = _validation_record(("orders", "1.0", '{"data_source": "d.jsonl", "options": {"n": 1}}', None))
    envelope = envelope_of(record)
    assert (envelope.contract_name, envelope.data_source, envelope.options) == ("orders", "d.jsonl", {"n": 1})  # type: ignore[union-attr]
    assert envelope.job_id == record.job_id and envelope.fires_at is None


# --- every binding's codec: the row encoded whole and by changes, column by column -------


def _encoded_column_by_column(binding: Any, dialect: Dialect, record: Any) -> dict[str, Any]:
    """The reference: each column's record value (its part, for a tuple field) through the
    dialect's own writer for that column."""
    row = {}
    for column in binding.spec.columns:
        value = getattr(record, column.field)
        row[column.name] = dialect.value_writer(column)(value if column.part is None else value[column.part])
    return row


@pytest.mark.parametrize("dialect", DIALECTS, ids=lambda d: d.name)
@given(data=st.data())
def test_a_run_pairs_rows_encode_whole_and_by_changes_as_column_by_column(dialect: Dialect, data: st.DataObject) -> None:
    # The decided-ahead statements encode the old row whole and the new one by its
    # changes (tenure.adapters.postgres.statements.joined_ahead_parameters): both equal
    # the column-by-column reference, for the Run and its delivery, after any decision.
    from tenure.adapters.runs.table import DELIVERIES_BINDING, RUNS_BINDING
    from tenure.conformance.strategies.runs import run_situations
    from tenure.kernel.core import Applied, decide
    from tenure.kernel.runs.machine import RUNS

    record, command, now = data.draw(run_situations())
    if record is None:
        return
    decided = decide(RUNS, record, command, now)
    new = decided.new_record if isinstance(decided, Applied) and decided.new_record is not None else record
    for binding, old_row, new_row in ((RUNS_BINDING, record.run, new.run),
                                      (DELIVERIES_BINDING, record.current, new.deliveries[0])):
        codec = binding.codec(dialect)
        old_whole, new_whole = codec.write(old_row), codec.write(new_row)
        assert old_whole == _encoded_column_by_column(binding, dialect, old_row)
        assert new_whole == _encoded_column_by_column(binding, dialect, new_row)
        assert list(new_whole) == list(binding.spec.column_names), "in column order"
        changed = codec.changes(old_row, new_row)
        assert {**old_whole, **changed} == new_whole
        assert set(changed) == {column for column, value in new_whole.items() if value != old_whole[column]}
