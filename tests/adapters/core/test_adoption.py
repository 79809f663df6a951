"""Adopting databases other clients wrote: legacy claims in flight at migration time,
rows tenure cannot read, column types it cannot handle, the schema that holds the
tables, and a downgrade that leaves no trace. (tests/adapters/core/test_pycharter.py runs pycharter
itself; these tests write its shapes with raw SQL to reach the corners.)"""

from __future__ import annotations

import os
import pathlib
import time
import sqlite3
import subprocess
import sys
from typing import Any

import pytest

from adapter_support import kind_of, raw, row, stored_instant
import paths
from tenure.adapters import ValidationJobSource, downgrade, upgrade
from tenure.adapters.queue.operations import UNREADABLE_ERROR
from tenure.adapters.queue.table import TABLE_NAMES
from tenure.kernel.queue import machine as queue_machine
from tenure.model import ConfigValidationError, ErrorCode, JobStatus, QueueKind, TenureError, ValidationJob, WorkerConfig

NOW_US = time.time_ns() // 1000
ROOT = paths.ROOT


def insert_pycharter_row(db_url: str, job_id: str, *, status: str = "pending", owner: str | None = None,
                         lease_us: int | None = None, data_json: str = '{"data_source": "s", "options": {}}',
                         attempt: int = 0) -> None:
    """A validation row as pycharter 0.0.67 writes it (no generation or token yet)."""
    raw(
        db_url,
        "INSERT INTO validation_jobs (id, contract_name, contract_version, data_json, status, fires_at, claimed_by,"
        " claimed_at, lease_expires_at, attempt, max_attempts, created_at) VALUES (?, 'orders', '1.0', ?, ?, ?, ?, ?, ?, ?, 5, ?)",
        (job_id, data_json, status, stored_instant(db_url, NOW_US - 10**9), owner,
         None if owner is None else stored_instant(db_url, NOW_US - 10**8),
         None if lease_us is None else stored_instant(db_url, lease_us), attempt, stored_instant(db_url, NOW_US - 10**9)),
    )


def create_legacy_tables(fresh_db_url: str) -> None:
    from tenure.adapters.queue.table import legacy_ddl
    from tenure.adapters.core.tables import sql_dialect

    for statement in legacy_ddl(sql_dialect(kind_of(fresh_db_url)), None):
        raw(fresh_db_url, statement)


FAR_FUTURE_US = 4_000_000_000_000_000  # 2096


async def test_a_legacy_claim_in_flight_at_migration_is_heartbeated_completed_and_failed(fresh_db_url: str) -> None:
    create_legacy_tables(fresh_db_url)
    for name in ("in-flight-1", "in-flight-2"):
        insert_pycharter_row(fresh_db_url, name, status="claimed", owner="old-worker", lease_us=FAR_FUTURE_US, attempt=1)
    await upgrade(fresh_db_url)
    async with ValidationJobSource(fresh_db_url) as source:
        info = await source.get_job("in-flight-1")
        assert (info.status, info.generation, info.owner_id) == (JobStatus.CLAIMED, 0, "old-worker")
        assert await source.heartbeat("in-flight-1", "someone-else") is False
        assert await source.heartbeat("in-flight-1", "old-worker") is True
        assert await source.complete("in-flight-1", {"done": True}) is True
        assert await source.fail("in-flight-2", "gave up", retry=False) is True
        finished = {info.job_id: info for info in await source.list_jobs()}
        assert finished["in-flight-1"].status is JobStatus.COMPLETED and finished["in-flight-1"].generation == 0
        assert finished["in-flight-2"].status is JobStatus.FAILED and finished["in-flight-2"].error == "gave up"


def test_a_legacy_claim_is_completed_under_python_optimizations_too(tmp_path: pathlib.Path) -> None:
    """The record invariants are checks that raise, not asserts: under ``python -O`` the
    same legacy completion behaves the same (it answered True by accident before only
    because the assert that refused it had vanished)."""
    script = f"""
import asyncio, sqlite3, sys
sys.path.insert(0, {str(paths.SUPPORT)!r})
sys.path.insert(0, {str(pathlib.Path(__file__).resolve().parent)!r})
from adapter_support import raw
from tenure.adapters import ValidationJobSource, upgrade
from test_adoption import create_legacy_tables, insert_pycharter_row, FAR_FUTURE_US
url = "sqlite:///{tmp_path}/o.db"
sqlite3.connect("{tmp_path}/o.db").close()
create_legacy_tables(url)
insert_pycharter_row(url, "in-flight", status="claimed", owner="old", lease_us=FAR_FUTURE_US, attempt=1)
async def main():
    await upgrade(url)
    async with ValidationJobSource(url) as source:
        print(await source.complete("in-flight", {{"ok": True}}), (await source.get_job("in-flight")).status.value)
asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-O", "-P", "-c", script], capture_output=True, text=True, check=False,
                          env={**os.environ})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "completed"]


async def test_a_decision_breaking_the_record_invariants_raises_and_writes_nothing(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel bug that would store a claimed row with no lease is caught before the
    write (``invariant_broken``), always: the check is not an ``assert``."""
    original = queue_machine.EFFECTS["renew_lease"]

    def lose_the_lease(record: Any, command: Any, now_us: int) -> Any:
        applied = original(record, command, now_us)
        return queue_machine.Applied(
            queue_machine.replace_fields(applied.new_record, lease_expires_at_us=None), applied.reply
        )

    async with ValidationJobSource(db_url) as source:
        await source.submit_owned(ValidationJob("orders", "1", "s"), submission_id="sub-1")
        claim = await source.claim_next_owned("worker-a", claim_token="token-1")
        before = row(db_url, QueueKind.VALIDATION, claim.job_id)
        monkeypatch.setitem(queue_machine.EFFECTS, "renew_lease", lose_the_lease)
        with pytest.raises(TenureError) as caught:
            await source.heartbeat_owned(claim.claim_fence)
        assert (caught.value.code, caught.value.reason) == (ErrorCode.QUEUE_PERSISTENCE_FAILED, "invariant_broken")
        assert row(db_url, QueueKind.VALIDATION, claim.job_id) == before


@pytest.mark.parametrize("data_json", ['{"options": {}}', "[1, 2]", '{"data_source": 7}', '"text"'])
async def test_a_row_whose_payload_is_not_an_envelope_is_corrupt_and_a_claim_fails_it(
    db_url: str, data_json: str
) -> None:
    insert_pycharter_row(db_url, "odd-1", data_json=data_json)
    insert_pycharter_row(db_url, "odd-2", data_json=data_json)
    async with ValidationJobSource(db_url) as source:
        for call in (lambda: source.get_job("odd-1"), lambda: source.list_jobs()):
            with pytest.raises(TenureError) as caught:
                await call()
            assert caught.value.reason == "corrupt_row"
        # Left pending, the row would be met first by every claim: each claim fails the
        # one it meets and never hands it out (an owned claim spends its nonce on it; a
        # legacy claim, which has none, claims on); none is left.
        assert await source.claim_next_owned("worker-a", claim_token="token-1") is None
        assert await source.claim_next("worker-a") is None
        for job_id, token in (("odd-1", "token-1"), ("odd-2", None)):
            stored = row(db_url, QueueKind.VALIDATION, job_id)
            assert (stored["status"], stored["error_message"], stored["generation"], stored["claim_token"]) == (
                "failed", UNREADABLE_ERROR, 1, token)


async def test_a_row_whose_time_cannot_be_read_is_corrupt(db_url: str) -> None:
    insert_pycharter_row(db_url, "odd-2")
    if kind_of(db_url) == "sqlite":
        raw(db_url, "UPDATE validation_jobs SET created_at = '2026-13-01 00:00:00.000000' WHERE id = 'odd-2'")
    else:
        raw(db_url, "UPDATE validation_jobs SET created_at = 'infinity' WHERE id = 'odd-2'")
    async with ValidationJobSource(db_url) as source:
        with pytest.raises(TenureError) as caught:
            await source.get_job("odd-2")
        assert caught.value.reason == "corrupt_row"


def _legacy_column_as(db_url: str, column: str, declared: str) -> None:
    from tenure.adapters.queue.table import legacy_ddl
    from tenure.adapters.core.tables import sql_dialect

    for statement in legacy_ddl(sql_dialect(kind_of(db_url)), None):
        if statement.startswith("CREATE TABLE IF NOT EXISTS validation_jobs"):
            lines = statement.split("\n")
            lines = [f"\t{column} {declared}, " if line.strip().startswith(f"{column} ") else line for line in lines]
            statement = "\n".join(lines)
        raw(db_url, statement)


BAD_LEGACY_TYPES = {
    "sqlite": [("fires_at", "INTEGER NOT NULL", "not_datetime_type"), ("attempt", "TEXT NOT NULL", "not_integer_type"),
               ("data_json", "BLOB NOT NULL", "not_json_type")],
    "postgresql": [("data_json", "JSONB NOT NULL", "jsonb_rewrites_stored_text"),
                   ("fires_at", "TIMESTAMP NOT NULL", "not_timestamptz_type"),
                   ("max_attempts", "NUMERIC NOT NULL", "not_integer_type")],
}


@pytest.mark.parametrize("case", range(3))
async def test_an_existing_column_of_a_type_tenure_cannot_handle_is_refused_by_name(fresh_db_url: str, case: int) -> None:
    column, declared, problem = BAD_LEGACY_TYPES[kind_of(fresh_db_url)][case]
    _legacy_column_as(fresh_db_url, column, declared)
    with pytest.raises(ConfigValidationError) as caught:
        await upgrade(fresh_db_url)
    assert caught.value.reason == "migration_admission_refused"
    assert dict(zip(caught.value.fields, caught.value.problems))[f"validation_jobs.{column}"] == problem
    with pytest.raises(TenureError) as missing:
        async with ValidationJobSource(fresh_db_url) as source:
            await source.claim_next_owned("worker-a", claim_token="token-1")
    assert missing.value.reason == "schema_missing"  # refused whole: no owned column was added


async def test_a_sqlite_probe_row_the_database_refuses_is_reported_as_such(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "trigger.db"
    url = f"sqlite:///{path}"
    sqlite3.connect(path).close()
    create_legacy_tables(url)
    raw(url, "CREATE TRIGGER no_cancelled BEFORE INSERT ON streaming_jobs WHEN NEW.status = 'cancelled' "
             "BEGIN SELECT RAISE(ABORT, 'no'); END")
    with pytest.raises(ConfigValidationError) as caught:
        await upgrade(url)
    assert "probe_insert_refused" in caught.value.problems
    assert "identities_not_compared_exactly" not in caught.value.problems


async def test_downgrade_removes_everything_upgrade_added_and_keeps_the_journal_mode(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "journal.db"
    url = f"sqlite:///{path}"
    sqlite3.connect(path).close()
    create_legacy_tables(url)
    before = raw(url, "SELECT type, name, sql FROM sqlite_master ORDER BY name")
    assert raw(url, "PRAGMA journal_mode") == [("delete",)]
    await upgrade(url)
    assert {name for _, name, _ in raw(url, "SELECT type, name, sql FROM sqlite_master")} >= {
        "tenure_migrations", "tenure_clock", "ux_validation_jobs_claim_token", "ix_streaming_jobs_eligible",
    }
    report = await downgrade(url)
    assert report.changed == ("workers_v1", "runs_v8", "runs_v7", "attempts_v2", "versions_v1", "console_v1", "runs_v6", "tasks_v1", "runs_v5", "runs_v4", "runs_v3", "runs_v2", "runs_v1", "attempts_v1", "owned_v2") and report.summary().startswith("removed: workers_v1, runs_v8, runs_v7, attempts_v2, versions_v1, console_v1, runs_v6, tasks_v1, runs_v5, runs_v4, runs_v3, runs_v2, runs_v1, attempts_v1, owned_v2")
    assert raw(url, "SELECT type, name, sql FROM sqlite_master ORDER BY name") == before
    assert raw(url, "PRAGMA journal_mode") == [("delete",)]
    assert (await downgrade(url)).summary() == "removed: nothing to remove"


async def test_postgresql_schema_from_the_url_or_the_config_and_never_two(fresh_db_url: str) -> None:
    db_url = fresh_db_url
    if kind_of(db_url) == "sqlite":
        with pytest.raises(ConfigValidationError) as caught:
            ValidationJobSource(db_url, WorkerConfig(db_url, db_schema="pycharter"))
        assert caught.value.problems == ("sqlite_has_no_schemas",)
        return
    in_url = db_url + "?schema=queues"
    await upgrade(in_url)  # a schema the URL names is created when missing
    # The current schema (public) now has no queue tables while queues has them: a plain
    # upgrade refuses rather than create empty tables beside them.
    with pytest.raises(ConfigValidationError) as elsewhere:
        await upgrade(db_url)
    assert elsewhere.value.problems == ("tables_in_schema_queues",)
    assert raw(db_url, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'queues'")[0][0] >= 4
    async with ValidationJobSource(in_url) as by_url:
        job_id = await by_url.submit_owned(ValidationJob("orders", "1", "s"), submission_id="sub-1")
    async with ValidationJobSource(db_url, WorkerConfig(db_url, db_schema="queues")) as by_config:
        assert (await by_config.get_job(job_id)).status is JobStatus.PENDING
    async with ValidationJobSource(db_url) as public:
        with pytest.raises(TenureError) as missing:
            await public.get_job(job_id)  # the public schema has no queue tables
        assert missing.value.reason == "schema_missing"
    with pytest.raises(ConfigValidationError) as caught:
        ValidationJobSource(in_url, WorkerConfig(in_url, db_schema="other"))
    assert caught.value.problems == ("schema_differs_from_url",)
    for bad in ("1starts_with_digit", "has space", 'quote"d'):
        with pytest.raises(ConfigValidationError):
            ValidationJobSource(db_url, WorkerConfig(db_url, db_schema=bad))
    assert TABLE_NAMES[QueueKind.VALIDATION] == "validation_jobs"
