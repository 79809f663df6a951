"""The Run tables hold their shape even against a writer that is not tenure.

Raw SQL plays that writer: on both databases the CHECK constraints refuse a status, a
priority, a sequence or a decision that no machine state has, and the partial unique
index refuses a second unsettled delivery of one Run, while the same statements with
values the machines allow pass (so a refusal is the constraint's, not the statement's).
Removing the runs step is refused while Runs exist; upgrading again changes nothing.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from adapter_support import kind_of, raw, stored_instant
from run_support import Runs, runs_db, succeeded  # noqa: F401 (runs_db: fixture)
from tenure.adapters import RunLedger, downgrade, upgrade
from tenure.adapters.queue.table import HOPS_TABLE
from tenure.adapters.runs.table import CHECKPOINTS_TABLE, RUNS_STEP
from tenure.adapters.wiring.registry import TABLES
from tenure.model import ConfigValidationError, DeliveryState, ErrorCode, RunStatus, TenureError, WaitKind, hop_key

NOW_US = 1_800_000_000_000_000


@pytest.fixture
async def runs(runs_db: str) -> Any:
    async with RunLedger(runs_db) as ledger:
        yield Runs(ledger, runs_db)


def refused(db_url: str, constraint: str, sql: str, parameters: tuple[Any, ...] = (), *, sqlite_says: str = "") -> None:
    """The raw statement fails on the named constraint (SQLite names a CHECK by its name
    and a unique index by its columns: ``sqlite_says``)."""
    with pytest.raises(Exception) as caught:
        raw(db_url, sql, parameters)
    error = caught.value
    if kind_of(db_url) == "sqlite":
        assert isinstance(error, sqlite3.IntegrityError), error
        assert (sqlite_says or constraint) in str(error), error
    else:
        import asyncpg

        assert isinstance(error, asyncpg.IntegrityConstraintViolationError), error
        assert error.constraint_name == constraint, error


def row_of(db_url: str, table: str, key_column: str, key: str) -> tuple[Any, ...]:
    found = raw(db_url, f"SELECT * FROM {table} WHERE {key_column} = ?", (key,))
    assert len(found) == 1
    return found[0]


# --- CHECK constraints -----------------------------------------------------------------------


@pytest.mark.parametrize("assignment, parameters, constraint, allowed", [
    ("status = ?", ("paused",), "ck_tenure_runs_status", ("failed",)),
    ("status = ?", ("QUEUED",), "ck_tenure_runs_status", ("cancelling",)),
    ("priority = ?", (101,), "ck_tenure_runs_priority", (100,)),
    ("priority = ?", (-1,), "ck_tenure_runs_priority", (0,)),
    ("enqueue_seq = ?", (-1,), "ck_tenure_runs_enqueue_seq", (7,)),
    ("status = 'awaiting_consent', owner_kind = 'consent', owner_id = ?", (None,), "ck_tenure_runs_wait_owner",
     ("consent-1",)),
    ("status = 'awaiting_service', owner_kind = NULL, owner_id = ?", (None,), "ck_tenure_runs_wait_owner",
     ("attempt-1",)),
    ("owner_kind = ?, owner_id = 'owner-1'", ("robot",), "ck_tenure_runs_owner_kind", ("hardware",)),
])
async def test_a_raw_writer_cannot_give_a_run_a_value_no_state_has(
    runs: Runs, assignment: str, parameters: tuple[Any, ...], constraint: str, allowed: tuple[Any, ...]
) -> None:
    run_id = (await runs.admit("run-1")).run.run_id
    before = row_of(runs.db_url, "tenure_runs", "run_id", run_id)
    sql = f"UPDATE tenure_runs SET {assignment} WHERE run_id = ?"
    refused(runs.db_url, constraint, sql, (*parameters, run_id))
    assert row_of(runs.db_url, "tenure_runs", "run_id", run_id) == before
    raw(runs.db_url, sql, (*allowed, run_id))
    assert row_of(runs.db_url, "tenure_runs", "run_id", run_id) != before


@pytest.mark.parametrize("assignment, bad, constraint, allowed", [
    ("state = ?", "lost", "ck_tenure_run_deliveries_state", "published"),
    ("publish_attempts = ?", -1, "ck_tenure_run_deliveries_attempts", 3),
    ("priority = ?", 101, "ck_tenure_run_deliveries_priority", 0),
])
async def test_a_raw_writer_cannot_give_a_delivery_a_value_no_state_has(
    runs: Runs, assignment: str, bad: Any, constraint: str, allowed: Any
) -> None:
    run_id = (await runs.admit("run-1")).run.run_id
    key = hop_key(run_id, 0)
    before = row_of(runs.db_url, "tenure_run_deliveries", "delivery_id", key)
    sql = f"UPDATE tenure_run_deliveries SET {assignment} WHERE delivery_id = ?"
    refused(runs.db_url, constraint, sql, (bad, key))
    assert row_of(runs.db_url, "tenure_run_deliveries", "delivery_id", key) == before
    raw(runs.db_url, sql, (allowed, key))
    assert row_of(runs.db_url, "tenure_run_deliveries", "delivery_id", key) != before


async def test_a_raw_writer_cannot_store_a_verdict_without_its_principal_and_time(runs: Runs) -> None:
    run_id = await runs.running("run-1")
    consent_id = await runs.consent(run_id)
    db = runs.db_url
    update = "UPDATE tenure_consents SET {} WHERE consent_id = ?"
    refused(db, "ck_tenure_consents_status",
            update.format("status = 'maybe', decided_by = 'bob', decided_at = created_at"), (consent_id,))
    refused(db, "ck_tenure_consents_decision", update.format("status = 'granted'"), (consent_id,))
    refused(db, "ck_tenure_consents_decision", update.format("status = 'granted', decided_by = 'bob'"), (consent_id,))
    refused(db, "ck_tenure_consents_decision", update.format("decided_by = 'bob', decided_at = created_at"),
            (consent_id,))
    assert (await runs.ledger.consents.get(consent_id)).status.value == "pending"  # type: ignore[union-attr]
    raw(db, update.format("status = 'granted', decided_by = 'bob', decided_at = created_at"), (consent_id,))
    assert (await runs.ledger.consents.get(consent_id)).decided_by == "bob"  # type: ignore[union-attr]
    refused(db, "ck_tenure_consents_decision", update.format("status = 'pending'"), (consent_id,))


async def test_a_raw_writer_cannot_end_a_job_without_a_result_or_open_one_with_one(runs: Runs) -> None:
    run_id = await runs.running("run-1")
    job_id = await runs.job(run_id)
    db = runs.db_url
    update = "UPDATE tenure_agent_jobs SET {} WHERE job_id = ?"
    refused(db, "ck_tenure_agent_jobs_status", update.format("status = 'exploded', result_json = '{}'"), (job_id,))
    refused(db, "ck_tenure_agent_jobs_result", update.format("status = 'succeeded'"), (job_id,))
    refused(db, "ck_tenure_agent_jobs_result", update.format("result_json = '{}'"), (job_id,))
    refused(db, "ck_tenure_agent_jobs_result", update.format("status = 'lost'"), (job_id,))
    assert (await runs.ledger.jobs.get(job_id)).status.value == "queued"  # type: ignore[union-attr]
    assert await runs.ledger.jobs.adopt_result(job_id, succeeded(job_id))
    refused(db, "ck_tenure_agent_jobs_result", update.format("status = 'running'"), (job_id,))
    refused(db, "ck_tenure_agent_jobs_result", update.format("result_json = NULL"), (job_id,))
    raw(db, update.format("status = 'cancelled'"), (job_id,))  # terminal with a result: the shape allows it


async def test_a_second_request_id_row_is_refused(runs: Runs) -> None:
    run_id = await runs.running("run-1")
    job_id = await runs.job(run_id, request_id="request-shared-" + runs.source)
    refused(runs.db_url, "ux_tenure_agent_jobs_request",
            "INSERT INTO tenure_agent_jobs SELECT 'another-job', request_id, run_id, runtime, profile, request_json, "
            "status, result_json, runtime_job_id, created_at, updated_at, 0 FROM tenure_agent_jobs WHERE job_id = ?",
            (job_id,), sqlite_says="UNIQUE constraint failed: tenure_agent_jobs.request_id")


# --- at most one unsettled delivery per Run -----------------------------------------------------


def delivery_insert(db_url: str, run_id: str, seq: int, state: str) -> tuple[str, tuple[Any, ...]]:
    settled = stored_instant(db_url, NOW_US) if state == "settled" else None
    sql = ("INSERT INTO tenure_run_deliveries (delivery_id, run_id, enqueue_seq, state, queue_name, priority, "
           "resume, publish_attempts, last_error, claimed_by, published_at, claimed_at, settled_at, created_at) "
           "VALUES (?, ?, ?, ?, 'agents', 50, ?, 0, NULL, NULL, NULL, NULL, ?, ?)")
    return sql, (hop_key(run_id, seq), run_id, seq, state, seq > 0, settled, stored_instant(db_url, NOW_US))


def insert_delivery(db_url: str, run_id: str, seq: int, state: str) -> None:
    raw(db_url, *delivery_insert(db_url, run_id, seq, state))


UNSETTLED = dict(constraint="ux_tenure_run_deliveries_unsettled",
                 sqlite_says="UNIQUE constraint failed: tenure_run_deliveries.run_id")


@pytest.mark.parametrize("state", [state.value for state in DeliveryState if state is not DeliveryState.SETTLED])
async def test_a_second_unsettled_delivery_of_one_run_is_refused(runs: Runs, state: str) -> None:
    run_id = (await runs.admit("run-1")).run.run_id
    db = runs.db_url
    sql, parameters = delivery_insert(db, run_id, 1, state)
    refused(db, sql=sql, parameters=parameters, **UNSETTLED)
    assert runs.count("tenure_run_deliveries", run_id) == 1
    # Settled ones may accumulate beside the unsettled one; another Run's is its own.
    insert_delivery(db, run_id, 1, "settled")
    insert_delivery(db, runs.run_id("run-other"), 0, state)
    assert runs.count("tenure_run_deliveries", run_id) == 2


async def test_the_unsettled_index_names_the_constraint_and_a_settled_run_accepts_a_next_hop(runs: Runs) -> None:
    run_id = (await runs.admit("run-1")).run.run_id
    db = runs.db_url
    refused(db, sql="INSERT INTO tenure_run_deliveries SELECT ?, run_id, 5, 'pending', queue_name, priority, resume, "
                    "publish_attempts, last_error, claimed_by, published_at, claimed_at, settled_at, created_at, 0 "
                    "FROM tenure_run_deliveries WHERE delivery_id = ?",
            parameters=("run:x:5", hop_key(run_id, 0)), **UNSETTLED)
    # Moving a settled delivery back to unsettled beside another unsettled one is refused too.
    raw(db, "UPDATE tenure_run_deliveries SET state = 'settled', settled_at = created_at WHERE delivery_id = ?",
        (hop_key(run_id, 0),))
    insert_delivery(db, run_id, 1, "pending")
    refused(db, sql="UPDATE tenure_run_deliveries SET state = 'pending', settled_at = NULL WHERE delivery_id = ?",
            parameters=(hop_key(run_id, 0),), **UNSETTLED)
    refused(db, "ux_tenure_run_deliveries_run_seq",
            sql="UPDATE tenure_run_deliveries SET enqueue_seq = 1 WHERE delivery_id = ?",
            parameters=(hop_key(run_id, 0),),
            sqlite_says="UNIQUE constraint failed: tenure_run_deliveries.run_id, tenure_run_deliveries.enqueue_seq")


async def test_the_ledger_answers_a_raw_second_delivery_with_its_own_error(runs: Runs) -> None:
    """A resume inserts the next delivery; if a raw writer already put an unsettled one
    there, the database refuses the insert and the ledger says so (nothing half-written)."""
    run_id, consent_id = await runs.waiting_on_consent("run-1", decided=True)
    insert_delivery(runs.db_url, run_id, 1, "pending")
    before = await runs.ledger.get(run_id)
    with pytest.raises(TenureError) as caught:
        await runs.ledger.resume(run_id, owner_id=consent_id)
    assert (caught.value.code, caught.value.reason) == (ErrorCode.RUN_PERSISTENCE_FAILED, "constraint_violated")
    assert await runs.ledger.get(run_id) == before
    assert before is not None and before.status is RunStatus.AWAITING_CONSENT


# --- the migration step ------------------------------------------------------------------------


RUN_TABLES = tuple(spec for spec in TABLES if spec.created_by == RUNS_STEP)
"""The tables step ``runs_v1`` creates: the Run machine's pair and its owners'."""
RUN_TABLE_NAMES = {spec.name for spec in RUN_TABLES} | {CHECKPOINTS_TABLE.name, HOPS_TABLE.name}


def tables_present(db_url: str) -> set[str]:
    names = RUN_TABLE_NAMES
    if kind_of(db_url) == "sqlite":
        found = raw(db_url, "SELECT name FROM sqlite_master WHERE type = 'table'")
    else:
        found = raw(db_url, "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()")
    return {name for (name,) in found} & names


async def test_downgrade_is_refused_while_runs_or_checkpoints_exist_and_removes_the_run_tables_once_none_do(db_url: str) -> None:
    async with RunLedger(db_url) as ledger:
        runs = Runs(ledger, db_url)
        run_id = await runs.running("run-1")
        consent_id = await runs.consent(run_id)
        assert await ledger.checkpoints.save(run_id, 0, state={"step": 1}, owner_kind=WaitKind.CONSENT, owner_id=consent_id)
        assert await ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent_id)
        with pytest.raises(ConfigValidationError) as caught:
            await downgrade(db_url)
        assert set(caught.value.problems) == {"runs_remain", "checkpoints_remain"}
        raw(db_url, "DELETE FROM tenure_run_checkpoints")
        with pytest.raises(ConfigValidationError) as caught:
            await downgrade(db_url)
        assert caught.value.problems == ("runs_remain",)
        assert tables_present(db_url) == RUN_TABLE_NAMES
        assert (await ledger.get(run_id)).status is RunStatus.AWAITING_CONSENT  # type: ignore[union-attr]
        with pytest.raises(ConfigValidationError):
            await downgrade(db_url, dry_run=True)
    raw(db_url, "DELETE FROM tenure_runs")
    report = await downgrade(db_url)
    assert report.changed[:13] == ("workers_v1", "runs_v8", "runs_v7", "attempts_v2", "versions_v1", "console_v1", "runs_v6", "tasks_v1", "runs_v5", "runs_v4", "runs_v3", "runs_v2", "runs_v1")
    assert tables_present(db_url) == set()
    report = await upgrade(db_url)
    assert "runs_v1" in report.applied and all(check.passed for check in report.checks)
    assert tables_present(db_url) == RUN_TABLE_NAMES
    async with RunLedger(db_url) as ledger:
        again = Runs(ledger, db_url)
        assert (await again.admit("run-1")).created is True


def indexes_of(db_url: str, table: str) -> list[str]:
    if kind_of(db_url) == "sqlite":
        found = raw(db_url, "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL",
                    (table,))
    else:
        found = raw(db_url, "SELECT indexname FROM pg_indexes WHERE tablename = ? AND indexname NOT LIKE '%pkey'",
                    (table,))
    return sorted(name for (name,) in found)


def checks_of(db_url: str, table: str) -> list[str]:
    if kind_of(db_url) == "sqlite":
        (sql,) = raw(db_url, "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,))[0]
        return sorted(part.split()[0] for part in sql.split("CONSTRAINT ")[1:] if " CHECK " in part)
    found = raw(db_url, "SELECT conname FROM pg_constraint WHERE conrelid = ?::regclass AND contype = 'c'", (table,))
    return sorted(name for (name,) in found)


async def test_upgrading_again_changes_nothing_and_keeps_every_run(db_url: str) -> None:
    shape = {spec.name: (indexes_of(db_url, spec.name), checks_of(db_url, spec.name)) for spec in RUN_TABLES}
    for spec in RUN_TABLES:
        indexes, checks = shape[spec.name]
        assert indexes == sorted(index.name for index in spec.indexes)
        assert checks == sorted(name for name, _ in spec.checks)
    async with RunLedger(db_url) as ledger:
        runs = Runs(ledger, db_url)
        run_id = await runs.running("run-1")
        before = await ledger.get(run_id)
        for _ in range(2):
            report = await upgrade(db_url)
            assert report.applied == () and all(check.passed for check in report.checks)
        assert await ledger.get(run_id) == before
        assert await ledger.settle(run_id, 0, RunStatus.DONE)
    assert {spec.name: (indexes_of(db_url, spec.name), checks_of(db_url, spec.name)) for spec in RUN_TABLES} == shape
    assert raw(db_url, "SELECT count(*) FROM tenure_migrations WHERE name = 'runs_v1'") == [(1,)]
